// libFuzzer target: master-file inspection through the inspector protocol
// (decision 0012) on an arbitrary master file, beside a valid synthesized
// shard set of the same stem, so links that survive mutation reach real data
// files. The worker's request handler (inspector::answer_request, which runs
// catalog::inspect_master through libhdf5) answers in this process, and the
// daemon's parser (inspector::parse_reply) must accept that answer: a reply
// of a real inspection that the daemon refuses is a bug of one side. When the
// acquisition is loadable, the frame index is built too, with each shard's
// libhdf5 facts through the protocol (storage request, parse_storage_reply).
// Contract: inspect_master never throws for a malformed file; the reply
// round-trips; build_frame_index throws only quantem::Error. libhdf5 itself is
// not instrumented and runs in this process here: a crash inside it stops the
// run (in the daemon it stops only the worker; tests/fuzz/known-crashes/).
#include <stdlib.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/shard_storage.hpp"
#include "quantem/core/error.hpp"
#include "quantem/inspector/wire.hpp"
#include "quantem/inspector/worker.hpp"
#include "quantem/synth/synth.hpp"

namespace {

std::string master_path;

std::string directory;

void remove_directory() { std::filesystem::remove_all(directory); }

std::string make_directory() {
  for (const char* base : {"/dev/shm", "/tmp"}) {
    std::string pattern = std::string(base) + "/quantem-fuzz-master-XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) return pattern;
  }
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // inspection logs every odd master it meets
  directory = make_directory();
  std::atexit(remove_directory);
  quantem::synth::SynthOptions options;
  options.output_dir = directory;
  options.prefix = "fuzz";
  options.scan_rows = 3;
  options.scan_cols = 3;
  options.detector_rows = 8;
  options.detector_cols = 8;
  options.frames_per_shard = 5;  // two shards
  options.threads = 1;
  options.bad_pixels = 1;
  quantem::synth::write_acquisition(options);
  master_path = directory + "/fuzz_master.h5";
  std::remove(master_path.c_str());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::FILE* file = std::fopen(master_path.c_str(), "wb");
  if (file == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, file) != size) std::abort();
  std::fclose(file);
  const std::string reply = quantem::inspector::answer_request(quantem::inspector::inspect_request(master_path));
  quantem::catalog::Acquisition acquisition;
  try {
    acquisition = quantem::inspector::parse_reply(reply, master_path);
  } catch (const quantem::Error& error) {
    std::fprintf(stderr, "the daemon refused the worker's reply (%s): %.2000s\n", error.what(), reply.c_str());
    std::abort();
  }
  if (acquisition.status.loadable) {
    // Each shard's libhdf5 facts through the protocol as well, as in the daemon.
    const auto storage_through_protocol = [](const std::string& file_path, const std::string& dataset_path) {
      const std::string storage_reply =
          quantem::inspector::answer_request(quantem::inspector::storage_request(file_path, dataset_path));
      try {
        return quantem::inspector::parse_storage_reply(storage_reply);
      } catch (const quantem::inspector::ProtocolError& error) {
        std::fprintf(stderr, "the daemon refused the worker's reply (%s): %.2000s\n", error.what(), storage_reply.c_str());
        std::abort();
      }
    };
    try {
      (void)quantem::catalog::build_frame_index(acquisition, storage_through_protocol);
    } catch (const quantem::inspector::ProtocolError&) {
      std::abort();
    } catch (const quantem::Error&) {
    }
  }
  return 0;
}
