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
  // Calibrations written as entry/data attributes when set (the catalog's
  // scan_sampling_A and k_pixel_size_mrad); absent by default.
  std::optional<double> scan_sampling_A;
  std::optional<double> k_pixel_size_mrad;
  // The microscope's high tension (the sidecar's High Tension, and the
  // master's photon_energy in eV) and camera length (the sidecar's Camera
  // Length); 300 kV and 0.115 m when not given.
  std::optional<double> high_tension_V;
  std::optional<double> camera_length_m;
};

struct SynthReport {
  std::string master_path;
  std::uint64_t frames = 0;
  std::uint64_t dense_bytes = 0;
  std::uint64_t stored_bytes = 0;  // sum of compressed chunk bytes
  double seconds = 0.0;            // the whole call
  double writer_seconds = 0.0;     // time the one writer thread spent in HDF5 (the serial part)
};

std::optional<Preset> preset_from_name(const std::string& name);

// Writes <output_dir>/<prefix>_data_NNNNNN.h5 (frames_per_shard frames each),
// then <prefix>.h5, then <prefix>_master.h5 (written aside and renamed, so a
// folder watcher never sees a master whose data is incomplete; an existing master
// of that prefix is removed first). Creates output_dir if needed and overwrites
// files of the same names. The model is described in pattern_model.hpp.
//
// Threads: `threads` workers (0: hardware concurrency) render and encode frames
// (codec::encode_bitshuffle_lz4); the calling thread alone makes every HDF5 call,
// in frame order. The files are byte-identical for a given seed and shape,
// whatever the thread count. While it runs, filter 32008 is registered in this
// process as a write-only class (see include/quantem/export/arina_writer.hpp): do not read
// bitshuffle data through HDF5 on other threads meanwhile.
//
// Throws quantem::Error: bad_request for invalid options (empty scan or
// detector, a side above 4096, a calibration, high tension or camera length that is not a positive finite number, more than half the pixels bad, a prefix that is
// not a plain file name, more than 999999 data files, more than 1024 threads),
// io (IoError/HdfError) when a folder or file cannot be created or written.
SynthReport write_acquisition(const SynthOptions& options);

}  // namespace quantem::synth
