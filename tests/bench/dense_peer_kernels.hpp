#pragma once
// The dense peers of the viewer's products (bench_dense_peers): plain CUDA
// kernels over a volume of uint16 frames held dense on the device,
// d_volume[frame][pixel], frame = scan_row * scan_cols + scan_col. Every sum is
// exact (uint64). Detector sizes must have an even pixel count per frame (the
// kernels read two pixels per 32-bit word). All launches are asynchronous on
// `stream` and checked (quantem::kernels::CudaError).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quantem/kernels/device.hpp"

namespace quantem::bench {

// A rectangle of scan positions: rows [first_row, first_row + rows), columns
// [first_col, first_col + cols) of a scan `scan_cols` wide. Outputs over a
// region are row-major, rows * cols values.
struct ScanRegion {
  std::uint64_t scan_cols = 0;
  std::uint64_t first_row = 0;
  std::uint64_t first_col = 0;
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  std::uint64_t positions() const { return rows * cols; }
};

// A detector mask as the kernels read it: one entry per 32-bit word holding at
// least one masked pixel, word index | low pixel masked << 30 | high pixel
// masked << 31, in word order.
std::vector<std::uint32_t> mask_word_entries(const std::vector<std::uint8_t>& mask);

// d_sums[p] = sum of the masked pixels of the frame at region position p.
// `d_entries` (device) holds entry_count entries (at most frame_pixels / 2).
void dense_masked_sums(const std::uint16_t* d_volume, std::uint32_t frame_pixels, const ScanRegion& region,
                       const std::uint32_t* d_entries, std::uint32_t entry_count, std::uint64_t* d_sums,
                       kernels::StreamHandle stream);

// Scan binning of a per-position image (rows x cols) by `bin`: d_binned has
// ceil(rows / bin) x ceil(cols / bin) values, each the sum of its block.
void bin_scan_sums(const std::uint64_t* d_sums, std::uint64_t rows, std::uint64_t cols, std::uint32_t bin,
                   std::uint64_t* d_binned, kernels::StreamHandle stream);

// Per region position: Σ I, Σ r·I, Σ c·I over the frame (r, c detector row
// and column). d_total, d_row_moment, d_col_moment hold region.positions() each.
void dense_moments(const std::uint16_t* d_volume, std::uint32_t detector_rows, std::uint32_t detector_cols,
                   const ScanRegion& region, std::uint64_t* d_total, std::uint64_t* d_row_moment,
                   std::uint64_t* d_col_moment, kernels::StreamHandle stream);

// d_pattern[pixel] = sum over the region's frames (zeroed here first).
void dense_pattern_sum(const std::uint16_t* d_volume, std::uint32_t frame_pixels, const ScanRegion& region,
                       std::uint64_t* d_pattern, kernels::StreamHandle stream);

// d_pattern[pixel] = sum over the frames listed in d_frames (device, `count` frame indices).
void dense_frames_sum(const std::uint16_t* d_volume, std::uint32_t frame_pixels, const std::uint64_t* d_frames,
                      std::uint32_t count, std::uint64_t* d_pattern, kernels::StreamHandle stream);

// Synchronous device-to-device copy (filling the volume from its first frames).
void copy_within_device(void* d_destination, const void* d_source, std::size_t bytes);

}  // namespace quantem::bench
