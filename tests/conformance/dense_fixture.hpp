#pragma once
// Test data for resident and product tests: a small acquisition described in
// memory (no files) and dense counts with a bright-field disk, background
// noise, hot pixels and masked pixels. Counts are held as uint64 here and
// converted to the source dtype when a resident is built.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/dtype.hpp"

namespace quantem::test {

struct DenseCase {
  std::string name;
  DType dtype = DType::uint16;
  std::uint64_t scan_rows = 0, scan_cols = 0, detector_rows = 0, detector_cols = 0;
  std::vector<std::uint64_t> counts;       // source values, [scan_row][scan_col][det_row][det_col]
  std::vector<std::uint8_t> pixel_mask;    // empty or detector_rows*detector_cols, 1 = masked

  std::uint64_t frames() const { return scan_rows * scan_cols; }
  std::uint64_t frame_pixels() const { return detector_rows * detector_cols; }

  catalog::Acquisition acquisition() const {
    catalog::Acquisition a;
    a.name = name + "_master.h5";
    a.stem = name;
    a.master_path = "/memory/" + a.name;
    a.scan_rows = scan_rows;
    a.scan_cols = scan_cols;
    a.detector_rows = detector_rows;
    a.detector_cols = detector_cols;
    a.dtype = dtype;
    a.chunk_format.element_size = dtype_size(dtype);
    a.pixel_mask = pixel_mask;
    for (const std::uint8_t m : pixel_mask) a.masked_pixel_count += m != 0;
    a.stored_frames = frames();
    a.status.loadable = true;
    return a;
  }

  // The counts as little-endian bytes of the source dtype.
  std::vector<std::uint8_t> source_bytes() const {
    const std::size_t element = dtype_size(dtype);
    std::vector<std::uint8_t> bytes(counts.size() * element);
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const std::uint32_t value = static_cast<std::uint32_t>(counts[i]);
      std::memcpy(bytes.data() + i * element, &value, element);  // little-endian host
    }
    return bytes;
  }

  // What a resident must hold: masked pixels zeroed in every frame.
  std::vector<std::uint64_t> masked_counts() const {
    std::vector<std::uint64_t> out = counts;
    if (pixel_mask.empty()) return out;
    for (std::uint64_t f = 0; f < frames(); ++f) {
      for (std::uint64_t p = 0; p < frame_pixels(); ++p) {
        if (pixel_mask[p] != 0) out[f * frame_pixels() + p] = 0;
      }
    }
    return out;
  }
};

// A diffraction-like random acquisition: a disk of radius ~detector/4 whose
// centre drifts with the scan position, Poisson-ish background, a few hot
// pixels. `peak` scales the disk counts; `hot_value` is written into masked
// pixels (and into one unmasked pixel per frame when `unmasked_hot` is set).
inline DenseCase random_case(const std::string& name, DType dtype, std::uint64_t scan_rows, std::uint64_t scan_cols,
                             std::uint64_t detector_rows, std::uint64_t detector_cols, std::uint64_t seed,
                             std::uint64_t peak, std::uint64_t masked_pixels, std::uint64_t hot_value,
                             bool unmasked_hot = false) {
  DenseCase c;
  c.name = name;
  c.dtype = dtype;
  c.scan_rows = scan_rows;
  c.scan_cols = scan_cols;
  c.detector_rows = detector_rows;
  c.detector_cols = detector_cols;
  std::mt19937_64 random(seed);
  const std::uint64_t max_value = dtype_max(dtype);
  c.counts.assign(c.frames() * c.frame_pixels(), 0);
  const double radius = static_cast<double>(std::min(detector_rows, detector_cols)) / 4.0 + 0.3;
  std::uniform_int_distribution<std::uint64_t> background(0, 2);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (std::uint64_t f = 0; f < c.frames(); ++f) {
    const double center_row = static_cast<double>(detector_rows) / 2.0 - 0.3 + 0.6 * unit(random);
    const double center_col = static_cast<double>(detector_cols) / 2.0 + 0.4 - 0.8 * unit(random);
    for (std::uint64_t r = 0; r < detector_rows; ++r) {
      for (std::uint64_t col = 0; col < detector_cols; ++col) {
        const double dr = static_cast<double>(r) - center_row;
        const double dc = static_cast<double>(col) - center_col;
        std::uint64_t value = background(random);
        if (dr * dr + dc * dc <= radius * radius) {
          value += peak / 2 + static_cast<std::uint64_t>(unit(random) * static_cast<double>(peak / 2));
        }
        c.counts[f * c.frame_pixels() + r * detector_cols + col] = std::min(value, max_value);
      }
    }
    if (unmasked_hot) {
      c.counts[f * c.frame_pixels() + (f * 7) % c.frame_pixels()] = std::min(hot_value, max_value);
    }
  }
  if (masked_pixels > 0) {
    c.pixel_mask.assign(c.frame_pixels(), 0);
    for (std::uint64_t i = 0; i < masked_pixels; ++i) c.pixel_mask[(i * 37 + 5) % c.frame_pixels()] = 1;
    for (std::uint64_t f = 0; f < c.frames(); ++f) {
      for (std::uint64_t p = 0; p < c.frame_pixels(); ++p) {
        if (c.pixel_mask[p] != 0) c.counts[f * c.frame_pixels() + p] = std::min(hot_value, max_value);
      }
    }
  }
  return c;
}

}  // namespace quantem::test
