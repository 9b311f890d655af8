// libFuzzer target: the daemon's side of the inspector protocol
// (inspector/wire.hpp) on arbitrary worker replies. The worker runs libhdf5
// on crafted files and may be corrupted, so the daemon treats its reply as
// hostile. Input: a selector byte (even: a reply to an inspection, odd: to a
// storage request), then the reply line.
// Contract: parse_reply returns an acquisition that keeps the invariants the
// loaders rely on, parse_storage_reply facts whose chunks match the rank, or
// they throw quantem::Error (ProtocolError for a malformed reply, internal for
// the worker's error reply, the worker's own kind for a storage failure);
// nothing else escapes, and what was accepted serialises back to itself.
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
  if (size == 0) return 0;
  const std::string line(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 1) {
    quantem::catalog::ShardStorage storage;
    try {
      storage = quantem::inspector::parse_storage_reply(line);
    } catch (const quantem::Error& error) {
      if (error.kind() == quantem::ErrorKind::unavailable || error.kind() == quantem::ErrorKind::bad_request) std::abort();
      return 0;
    }
    if (storage.max_dims.size() != storage.dims.size()) std::abort();
    for (const auto& chunk : storage.chunks)
      if (chunk.element_offsets.size() != storage.dims.size()) std::abort();
    const auto json = quantem::inspector::shard_storage_to_json(storage);
    if (quantem::inspector::shard_storage_to_json(quantem::inspector::shard_storage_from_json(json)) != json) std::abort();
    return 0;
  }
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
