#pragma once
// `quantem-gpu synth`: writes a physically plausible Arina-style acquisition
// (master with external links + detectorSpecific metadata + pixel_mask, the
// <prefix>.h5 STEM Metadata sidecar, bitshuffle/LZ4 shards written with
// H5Dwrite_chunk from our own encoder).
#include <cstdint>
#include <optional>
#include <string>

#include "quantem/core/dtype.hpp"

namespace quantem::synth {

enum class Preset { sparse, realistic, dense };

struct SynthOptions {
  std::string output_dir;
  std::string prefix = "synth";       // files: <prefix>_master.h5, <prefix>_data_000001.h5, <prefix>.h5
  std::uint64_t scan_rows = 16;
  std::uint64_t scan_cols = 16;
  std::uint64_t detector_rows = 64;
  std::uint64_t detector_cols = 64;
  DType dtype = DType::uint16;
  std::uint64_t frames_per_shard = 0;  // 0: 100000 frames (one shard for most scans)
  Preset preset = Preset::realistic;
  std::uint64_t seed = 1;
  unsigned threads = 0;                // 0: hardware concurrency
  std::uint64_t bad_pixels = 3;        // pixels flagged in pixel_mask and written as all-ones
};

struct SynthReport {
  std::string master_path;
  std::uint64_t frames = 0;
  std::uint64_t dense_bytes = 0;
  std::uint64_t stored_bytes = 0;  // sum of compressed chunk bytes
  double seconds = 0.0;
};

std::optional<Preset> preset_from_name(const std::string& name);

// Throws quantem::Error on invalid options or I/O failure.
SynthReport write_acquisition(const SynthOptions& options);

}  // namespace quantem::synth
