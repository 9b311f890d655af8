// libFuzzer target: master-file inspection (catalog::inspect_master, through
// libhdf5) on an arbitrary master file, beside a valid synthesized shard set of
// the same stem, so links that survive mutation reach real data files. When
// the inspection calls the master loadable, the frame index is built too.
// Contract (acquisition.hpp): inspect_master never throws for a malformed file;
// build_frame_index throws only quantem::Error. libhdf5 itself is not
// instrumented: a crash inside it still stops the run (decision 0012).
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
#include "quantem/core/error.hpp"
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
  const quantem::catalog::Acquisition acquisition = quantem::catalog::inspect_master(master_path);
  if (acquisition.status.loadable) {
    try {
      (void)quantem::catalog::build_frame_index(acquisition);
    } catch (const quantem::Error&) {
    }
  }
  return 0;
}
