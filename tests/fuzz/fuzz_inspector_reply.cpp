// libFuzzer target: the daemon's side of the inspector protocol
// (inspector/wire.hpp) on arbitrary worker replies. The worker runs libhdf5
// on crafted files and may be corrupted, so the daemon treats its reply as
// hostile. Contract: parse_reply returns an acquisition that keeps the
// invariants the loaders rely on, or throws quantem::Error (corrupt_data for
// a malformed reply, internal for the worker's error reply); nothing else
// escapes, and an accepted acquisition serialises back to what was read.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "quantem/core/error.hpp"
#include "quantem/inspector/wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The seeds were written for this path (fuzz_seed_writer).
  static const std::string requested = "/fuzz/fuzz_master.h5";
  const std::string line(reinterpret_cast<const char*>(data), size);
  quantem::catalog::Acquisition acquisition;
  try {
    acquisition = quantem::inspector::parse_reply(line, requested);
  } catch (const quantem::Error& error) {
    if (error.kind() != quantem::ErrorKind::corrupt_data && error.kind() != quantem::ErrorKind::internal) std::abort();
    return 0;
  }
  if (acquisition.master_path != requested) std::abort();
  if (!acquisition.pixel_mask.empty() && acquisition.pixel_mask.size() != acquisition.frame_pixels()) std::abort();
  if (acquisition.status.loadable) {
    std::uint64_t frames = 0;
    for (const auto& shard : acquisition.shards) frames += shard.frame_count;
    if (frames != acquisition.stored_frames) std::abort();
    if (acquisition.scan_shape_known() && acquisition.frame_count() != acquisition.stored_frames) std::abort();
  }
  // What was accepted survives another trip unchanged.
  const auto again = quantem::inspector::acquisition_from_json(quantem::inspector::acquisition_to_json(acquisition));
  if (quantem::inspector::acquisition_to_json(again) != quantem::inspector::acquisition_to_json(acquisition)) std::abort();
  return 0;
}
