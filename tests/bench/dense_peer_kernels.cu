#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "dense_peer_kernels.hpp"
#include "quantem/kernels/cuda_check.hpp"
#include "../../kernels/common/warp_collectives.cuh"

namespace quantem::bench {
namespace {

using kernels::device::warp_sum_u64;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

int multiprocessor_count() {
  static const int count = [] {
    int device = 0;
    int value = 0;
    QUANTEM_CUDA_TRY(cudaGetDevice(&device));
    QUANTEM_CUDA_TRY(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device));
    return value;
  }();
  return count;
}

// Grid-stride blocks for `work` items of `per_block` each, at most `per_sm` blocks per multiprocessor.
unsigned blocks_for(std::uint64_t work, std::uint64_t per_block, int per_sm) {
  const std::uint64_t wanted = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(std::max<std::uint64_t>(
      1, std::min<std::uint64_t>(wanted, static_cast<std::uint64_t>(multiprocessor_count()) * per_sm)));
}

__device__ __forceinline__ std::uint64_t frame_of(std::uint64_t position, std::uint64_t scan_cols,
                                                  std::uint64_t first_row, std::uint64_t first_col,
                                                  std::uint64_t region_cols) {
  return (first_row + position / region_cols) * scan_cols + first_col + position % region_cols;
}

// One warp per position; the mask's word entries staged in shared memory once per block.
__global__ void __launch_bounds__(kThreads)
    masked_sums_kernel(const std::uint32_t* __restrict__ words, std::uint32_t frame_words, std::uint64_t scan_cols,
                       std::uint64_t first_row, std::uint64_t first_col, std::uint64_t region_cols,
                       std::uint64_t positions, const std::uint32_t* __restrict__ word_entries,
                       std::uint32_t entry_count, unsigned long long* __restrict__ sums) {
  extern __shared__ std::uint32_t entries[];
  for (std::uint32_t i = threadIdx.x; i < entry_count; i += blockDim.x) entries[i] = word_entries[i];
  __syncthreads();
  const std::uint32_t lane = threadIdx.x % 32;
  for (std::uint64_t position = std::uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; position < positions;
       position += std::uint64_t{gridDim.x} * kWarpsPerBlock) {
    const std::uint32_t* frame =
        words + frame_of(position, scan_cols, first_row, first_col, region_cols) * frame_words;
    unsigned long long sum = 0;
#pragma unroll 4
    for (std::uint32_t i = lane; i < entry_count; i += 32) {
      const std::uint32_t entry = entries[i];
      const std::uint32_t word = __ldg(frame + (entry & 0x3fffffffu));
      sum += ((entry >> 30) & 1u ? (word & 0xffffu) : 0u) + ((entry >> 31) ? (word >> 16) : 0u);
    }
    sum = warp_sum_u64(sum);
    if (lane == 0) sums[position] = sum;
  }
}

__global__ void bin_kernel(const unsigned long long* __restrict__ sums, std::uint64_t rows, std::uint64_t cols,
                           std::uint32_t bin, unsigned long long* __restrict__ binned) {
  const std::uint64_t binned_rows = (rows + bin - 1) / bin;
  const std::uint64_t binned_cols = (cols + bin - 1) / bin;
  for (std::uint64_t out = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; out < binned_rows * binned_cols;
       out += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t row0 = out / binned_cols * bin;
    const std::uint64_t col0 = out % binned_cols * bin;
    unsigned long long sum = 0;
    const std::uint64_t row_end = row0 + bin < rows ? row0 + bin : rows;
    const std::uint64_t col_end = col0 + bin < cols ? col0 + bin : cols;
    for (std::uint64_t r = row0; r < row_end; ++r)
      for (std::uint64_t c = col0; c < col_end; ++c) sum += sums[r * cols + c];
    binned[out] = sum;
  }
}

// One warp per position; a lane walks words i = lane, lane + 32, ... keeping
// the word's detector row and column incrementally (half_cols = words per row).
__global__ void __launch_bounds__(kThreads)
    moments_kernel(const std::uint32_t* __restrict__ words, std::uint32_t frame_words, std::uint32_t half_cols,
                   std::uint64_t scan_cols, std::uint64_t first_row, std::uint64_t first_col,
                   std::uint64_t region_cols, std::uint64_t positions, unsigned long long* __restrict__ total,
                   unsigned long long* __restrict__ row_moment, unsigned long long* __restrict__ col_moment) {
  const std::uint32_t lane = threadIdx.x % 32;
  for (std::uint64_t position = std::uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; position < positions;
       position += std::uint64_t{gridDim.x} * kWarpsPerBlock) {
    const std::uint32_t* frame =
        words + frame_of(position, scan_cols, first_row, first_col, region_cols) * frame_words;
    unsigned long long sum = 0, row_sum = 0, col_sum = 0;
    std::uint32_t row = lane / half_cols;
    std::uint32_t word_in_row = lane % half_cols;
#pragma unroll 4
    for (std::uint32_t i = lane; i < frame_words; i += 32) {
      const std::uint32_t word = __ldg(frame + i);
      const std::uint32_t low = word & 0xffffu;
      const std::uint32_t high = word >> 16;
      const std::uint32_t pair = low + high;
      sum += pair;
      row_sum += static_cast<unsigned long long>(row) * pair;
      col_sum += static_cast<unsigned long long>(2 * word_in_row) * pair + high;
      word_in_row += 32;
      while (word_in_row >= half_cols) {
        word_in_row -= half_cols;
        ++row;
      }
    }
    sum = warp_sum_u64(sum);
    row_sum = warp_sum_u64(row_sum);
    col_sum = warp_sum_u64(col_sum);
    if (lane == 0) {
      total[position] = sum;
      row_moment[position] = row_sum;
      col_moment[position] = col_sum;
    }
  }
}

// Block (x: a run of words, y: a slice of positions): each thread sums its
// word's two pixels over the slice's positions, then adds them to the pattern.
__global__ void __launch_bounds__(kThreads)
    pattern_sum_kernel(const std::uint32_t* __restrict__ words, std::uint32_t frame_words, std::uint64_t scan_cols,
                       std::uint64_t first_row, std::uint64_t first_col, std::uint64_t region_cols,
                       std::uint64_t positions, unsigned long long* __restrict__ pattern) {
  const std::uint32_t w = blockIdx.x * kThreads + threadIdx.x;
  if (w >= frame_words) return;
  unsigned long long low = 0, high = 0;
  // The position's region row and column, stepped without a division per frame.
  const std::uint64_t step_rows = gridDim.y / region_cols;
  const std::uint64_t step_cols = gridDim.y % region_cols;
  std::uint64_t row = blockIdx.y / region_cols;
  std::uint64_t col = blockIdx.y % region_cols;
#pragma unroll 8
  for (std::uint64_t position = blockIdx.y; position < positions; position += gridDim.y) {
    const std::uint64_t frame = (first_row + row) * scan_cols + first_col + col;
    const std::uint32_t word = __ldg(words + frame * frame_words + w);
    low += word & 0xffffu;
    high += word >> 16;
    row += step_rows;
    col += step_cols;
    if (col >= region_cols) {
      col -= region_cols;
      ++row;
    }
  }
  atomicAdd(pattern + 2 * std::uint64_t{w}, low);
  atomicAdd(pattern + 2 * std::uint64_t{w} + 1, high);
}

__global__ void __launch_bounds__(kThreads)
    frames_sum_kernel(const std::uint32_t* __restrict__ words, std::uint32_t frame_words,
                      const std::uint64_t* __restrict__ frames, std::uint32_t count,
                      unsigned long long* __restrict__ pattern) {
  const std::uint32_t w = blockIdx.x * kThreads + threadIdx.x;
  if (w >= frame_words) return;
  unsigned long long low = 0, high = 0;
#pragma unroll 4
  for (std::uint32_t k = 0; k < count; ++k) {
    const std::uint32_t word = __ldg(words + frames[k] * frame_words + w);
    low += word & 0xffffu;
    high += word >> 16;
  }
  pattern[2 * std::uint64_t{w}] = low;
  pattern[2 * std::uint64_t{w} + 1] = high;
}

void check_even(std::uint32_t frame_pixels) {
  if (frame_pixels % 2 != 0 || frame_pixels == 0) {
    throw std::runtime_error("dense peers: a frame of " + std::to_string(frame_pixels) +
                             " pixels (the kernels read pixel pairs: an even count is needed)");
  }
}

}  // namespace

std::vector<std::uint32_t> mask_word_entries(const std::vector<std::uint8_t>& mask) {
  std::vector<std::uint32_t> entries;
  for (std::size_t w = 0; 2 * w + 1 < mask.size(); ++w) {
    const std::uint32_t low = mask[2 * w] != 0 ? 1u : 0u;
    const std::uint32_t high = mask[2 * w + 1] != 0 ? 1u : 0u;
    if (low | high) entries.push_back(static_cast<std::uint32_t>(w) | low << 30 | high << 31);
  }
  return entries;
}

void dense_masked_sums(const std::uint16_t* d_volume, std::uint32_t frame_pixels, const ScanRegion& region,
                       const std::uint32_t* d_entries, std::uint32_t entry_count, std::uint64_t* d_sums,
                       kernels::StreamHandle stream) {
  check_even(frame_pixels);
  if (entry_count > frame_pixels / 2) throw std::runtime_error("dense_masked_sums: more entries than words");
  if (region.positions() == 0) return;
  const std::size_t shared_bytes = std::size_t{entry_count} * 4;
  static std::size_t shared_allowed = 48 << 10;
  if (shared_bytes > shared_allowed) {
    QUANTEM_CUDA_TRY(cudaFuncSetAttribute(masked_sums_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shared_bytes)));
    shared_allowed = shared_bytes;
  }
  masked_sums_kernel<<<blocks_for(region.positions(), kWarpsPerBlock, 16), kThreads, shared_bytes, stream>>>(
      reinterpret_cast<const std::uint32_t*>(d_volume), frame_pixels / 2, region.scan_cols, region.first_row,
      region.first_col, region.cols, region.positions(), d_entries, entry_count,
      reinterpret_cast<unsigned long long*>(d_sums));
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "masked_sums_kernel");
}

void bin_scan_sums(const std::uint64_t* d_sums, std::uint64_t rows, std::uint64_t cols, std::uint32_t bin,
                   std::uint64_t* d_binned, kernels::StreamHandle stream) {
  if (bin == 0) throw std::runtime_error("bin_scan_sums: bin 0");
  const std::uint64_t outputs = ((rows + bin - 1) / bin) * ((cols + bin - 1) / bin);
  if (outputs == 0) return;
  bin_kernel<<<blocks_for(outputs, kThreads, 8), kThreads, 0, stream>>>(
      reinterpret_cast<const unsigned long long*>(d_sums), rows, cols, bin,
      reinterpret_cast<unsigned long long*>(d_binned));
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "bin_kernel");
}

void dense_moments(const std::uint16_t* d_volume, std::uint32_t detector_rows, std::uint32_t detector_cols,
                   const ScanRegion& region, std::uint64_t* d_total, std::uint64_t* d_row_moment,
                   std::uint64_t* d_col_moment, kernels::StreamHandle stream) {
  if (detector_cols % 2 != 0 || detector_rows == 0 || detector_cols == 0) {
    throw std::runtime_error("dense_moments: the detector needs an even number of columns");
  }
  if (region.positions() == 0) return;
  const std::uint32_t frame_words = detector_rows * detector_cols / 2;
  moments_kernel<<<blocks_for(region.positions(), kWarpsPerBlock, 16), kThreads, 0, stream>>>(
      reinterpret_cast<const std::uint32_t*>(d_volume), frame_words, detector_cols / 2, region.scan_cols,
      region.first_row, region.first_col, region.cols, region.positions(),
      reinterpret_cast<unsigned long long*>(d_total), reinterpret_cast<unsigned long long*>(d_row_moment),
      reinterpret_cast<unsigned long long*>(d_col_moment));
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "moments_kernel");
}

void dense_pattern_sum(const std::uint16_t* d_volume, std::uint32_t frame_pixels, const ScanRegion& region,
                       std::uint64_t* d_pattern, kernels::StreamHandle stream) {
  check_even(frame_pixels);
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_pattern, 0, std::size_t{frame_pixels} * 8, stream));
  if (region.positions() == 0) return;
  const std::uint32_t frame_words = frame_pixels / 2;
  const unsigned word_blocks = (frame_words + kThreads - 1) / kThreads;
  // Enough blocks to fill the device several times over; at most one slice per position.
  const std::uint64_t wanted_slices = std::uint64_t{static_cast<unsigned>(multiprocessor_count())} * 64 / word_blocks + 1;
  const unsigned slices =
      static_cast<unsigned>(std::min<std::uint64_t>({wanted_slices, region.positions(), 65535}));
  pattern_sum_kernel<<<dim3(word_blocks, slices), kThreads, 0, stream>>>(
      reinterpret_cast<const std::uint32_t*>(d_volume), frame_words, region.scan_cols, region.first_row,
      region.first_col, region.cols, region.positions(), reinterpret_cast<unsigned long long*>(d_pattern));
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "pattern_sum_kernel");
}

void dense_frames_sum(const std::uint16_t* d_volume, std::uint32_t frame_pixels, const std::uint64_t* d_frames,
                      std::uint32_t count, std::uint64_t* d_pattern, kernels::StreamHandle stream) {
  check_even(frame_pixels);
  const std::uint32_t frame_words = frame_pixels / 2;
  frames_sum_kernel<<<(frame_words + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      reinterpret_cast<const std::uint32_t*>(d_volume), frame_words, d_frames, count,
      reinterpret_cast<unsigned long long*>(d_pattern));
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "frames_sum_kernel");
}

void copy_within_device(void* d_destination, const void* d_source, std::size_t bytes) {
  QUANTEM_CUDA_TRY(cudaMemcpy(d_destination, d_source, bytes, cudaMemcpyDeviceToDevice));
}

}  // namespace quantem::bench
