#pragma once
// Small real acquisitions for server tests, written by `synth` in process.
#include <filesystem>
#include <string>

#include "quantem/synth/synth.hpp"

namespace quantem::test {

inline std::string write_synth(const std::string& folder, const std::string& prefix, std::uint64_t scan_rows = 3,
                               std::uint64_t scan_cols = 4, std::uint64_t seed = 1) {
  synth::SynthOptions options;
  options.output_dir = folder;
  options.prefix = prefix;
  options.scan_rows = scan_rows;
  options.scan_cols = scan_cols;
  options.detector_rows = 8;
  options.detector_cols = 8;
  options.threads = 1;
  options.seed = seed;
  options.bad_pixels = 1;
  return synth::write_acquisition(options).master_path;
}

}  // namespace quantem::test
