// Per-frame tables of dense frames at load time — ring sums (and their use in
// masked sums) and frame moments — declared in
// include/quantem/kernels/resident_products.hpp; the ring partition and the mask
// split are host code: include/quantem/backend/ring_partition.hpp.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "quantem/core/error.hpp"
#include "quantem/kernels/resident_products.hpp"
#include "quantem/kernels/cuda_check.hpp"
#include "../common/warp_collectives.cuh"
#include "../common/tuning.cuh"

namespace quantem::kernels {
namespace {

namespace tuning = quantem::kernels::device::tuning;

// The moments of one frame (CTA-wide; every thread calls it): Σ I, Σ row·I
// and Σ col·I over its pixels, exact in 64 bits, written as row `frame_index`
// of the moments table. Each thread walks the frame with a stride of
// blockDim.x 16-byte loads (a stride of blockDim.x pixels when the columns are
// not a multiple of a load's values, or the frame is not 16-byte aligned),
// keeping its row and column incrementally; warp reductions, then one thread
// per moment adds the warps' partial sums.
// A thread's walk over a frame in steps of `stride` pixels whose pixels
// k = 0.. lie in one row: its partial Σ I, Σ row·I and Σ col·I, each step
// adding its Σ v and Σ k·v with its row and first column, kept incrementally.
struct MomentsWalk {
  std::uint32_t cols, stride_rows, stride_cols, row, col;
  unsigned long long total = 0, row_moment = 0, col_moment = 0;

  __device__ MomentsWalk(std::uint32_t detector_cols, std::uint32_t stride, std::uint32_t first_pixel)
      : cols(detector_cols),
        stride_rows(stride / detector_cols),
        stride_cols(stride % detector_cols),
        row(first_pixel / detector_cols),
        col(first_pixel % detector_cols) {}
  // The step's Σ v and Σ k·v; then on to the next step.
  __device__ __forceinline__ void add(unsigned long long sum, unsigned long long weighted) {
    total += sum;
    row_moment += sum * row;
    col_moment += sum * col + weighted;
    row += stride_rows;
    col += stride_cols;
    if (col >= cols) {
      col -= cols;
      ++row;
    }
  }
};

// The threads' partial moments of one frame summed (CTA-wide; every thread
// calls it; at most 32 warps) and written as row `frame_index` of the table.
__device__ void store_frame_moments(unsigned long long total, unsigned long long row_moment,
                                    unsigned long long col_moment, const FrameMomentsTarget& target,
                                    std::uint64_t frame_index) {
  __shared__ unsigned long long partial[3][32];
  total = device::warp_sum_u64(total);
  row_moment = device::warp_sum_u64(row_moment);
  col_moment = device::warp_sum_u64(col_moment);
  const std::uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    partial[0][warp] = total;
    partial[1][warp] = row_moment;
    partial[2][warp] = col_moment;
  }
  __syncthreads();
  if (threadIdx.x < 3) {
    unsigned long long sum = 0;
    for (std::uint32_t w = 0; w < blockDim.x / 32; ++w) sum += partial[threadIdx.x][w];
    target.d_moments[std::uint64_t{threadIdx.x} * target.table_stride + frame_index] = sum;
  }
}

template <class T>
__device__ void frame_moments_of(const T* frame, std::uint32_t pixels, const FrameMomentsTarget& target,
                                 std::uint64_t frame_index) {
  const std::uint32_t cols = target.detector_cols;
  constexpr std::uint32_t kPerVector = 16 / sizeof(T);
  if (cols % kPerVector == 0 && (reinterpret_cast<std::uintptr_t>(frame) & 15u) == 0) {
    // 16 bytes at a time, all in one row (cols is a multiple of the values per
    // load): Σ v and Σ k·v over the load's values k = 0.., then one update of
    // each moment with the load's row and first column.
    using Partial = std::conditional_t<sizeof(T) == 4, unsigned long long, std::uint32_t>;  // exact: 16 values of < 2^16
    MomentsWalk walk(cols, blockDim.x * kPerVector, threadIdx.x * kPerVector);
    const auto* vectors = reinterpret_cast<const uint4*>(frame);
    for (std::uint32_t v = threadIdx.x; v < pixels / kPerVector; v += blockDim.x) {
      const uint4 loaded = vectors[v];
      const T* values = reinterpret_cast<const T*>(&loaded);
      Partial sum = 0, weighted = 0;
#pragma unroll
      for (std::uint32_t k = 0; k < kPerVector; ++k) {
        sum += values[k];
        weighted += static_cast<Partial>(values[k]) * k;
      }
      walk.add(sum, weighted);
    }
    store_frame_moments(walk.total, walk.row_moment, walk.col_moment, target, frame_index);
  } else {
    MomentsWalk walk(cols, blockDim.x, threadIdx.x);  // a pixel per step
    for (std::uint32_t p = threadIdx.x; p < pixels; p += blockDim.x) walk.add(frame[p], 0);
    store_frame_moments(walk.total, walk.row_moment, walk.col_moment, target, frame_index);
  }
}

// The CTA copies one frame into shared memory (16-byte loads when it is aligned).
template <class T>
__device__ __forceinline__ void stage_frame(const T* frame, std::uint32_t frame_pixels, T* staged) {
  const std::uint64_t bytes = std::uint64_t{frame_pixels} * sizeof(T);
  const auto* source = reinterpret_cast<const std::uint8_t*>(frame);
  auto* target = reinterpret_cast<std::uint8_t*>(staged);
  if ((reinterpret_cast<std::uintptr_t>(source) & 15u) == 0) {
    const std::uint64_t vectors = bytes / 16;
    for (std::uint64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
      reinterpret_cast<uint4*>(target)[v] = __ldg(reinterpret_cast<const uint4*>(source) + v);
    }
    for (std::uint64_t b = vectors * 16 + threadIdx.x; b < bytes; b += blockDim.x) target[b] = source[b];
  } else {
    for (std::uint32_t p = threadIdx.x; p < frame_pixels; p += blockDim.x) staged[p] = frame[p];
  }
}

// One CTA per frame. Each warp takes a contiguous share of the pixels sorted
// by ring and reads it 128 at a time (lane l the 4 pixels from 4l: one 16-byte
// index load each): when the chunk's first and last pixels lie in the same
// ring, so does the whole chunk (most of the time: a ring holds hundreds of
// pixels), and the warp sums it with one reduction while lane 0 keeps the
// running sum of the ring in a register; at a ring boundary inside the chunk
// every lane adds its values to the CTA's bins in shared memory. The bins are
// `Bin` (32-bit: native shared atomics, exact when sums fit in 32 bits).
// kStaged: the frame is first copied into shared memory with coalesced 16-byte
// loads, so the gathers in ring order hit shared memory instead of sectors of
// global memory fetched again and again (used when the frame fits).
// With moments.d_moments set, the frame's Σ I, Σ row·I, Σ col·I (what
// dense_frame_moments_kernel computes) are summed in the same pass, from the
// staged frame.
template <class T, class Bin, bool kStaged>
__global__ void __launch_bounds__(tuning::kRingSumThreads)
    dense_ring_sums_kernel(const T* __restrict__ frames, std::uint32_t frame_pixels,
                           const std::uint32_t* __restrict__ pixels_by_ring,
                           const std::uint16_t* __restrict__ ring_of_sorted, std::uint32_t ring_count, Bin* ring_sums,
                           std::uint64_t ring_stride, std::uint64_t first_frame, FrameMomentsTarget moments) {
  extern __shared__ __align__(16) std::uint8_t shared_bytes[];
  Bin* bins = reinterpret_cast<Bin*>(shared_bytes);
  for (std::uint32_t r = threadIdx.x; r < ring_count; r += blockDim.x) bins[r] = 0;
  const T* frame = frames + std::uint64_t{blockIdx.x} * frame_pixels;
  if constexpr (kStaged) {
    T* staged = reinterpret_cast<T*>(shared_bytes + (std::size_t{ring_count} * sizeof(Bin) + 15) / 16 * 16);
    stage_frame(frame, frame_pixels, staged);
    frame = staged;
  }
  __syncthreads();
  if (moments.d_moments != nullptr) frame_moments_of(frame, frame_pixels, moments, first_frame + blockIdx.x);
  const std::uint32_t lane = threadIdx.x % 32;
  const std::uint32_t warps = blockDim.x / 32;
  constexpr std::uint32_t kChunk = 128;  // sorted pixels per warp step: 4 per lane
  const std::uint32_t share = (frame_pixels + warps * kChunk - 1) / (warps * kChunk) * kChunk;
  const std::uint32_t begin = threadIdx.x / 32 * share;
  const std::uint32_t end = min(begin + share, frame_pixels);
  Bin running = 0;                   // lane 0: the running sum of running_ring
  std::uint32_t running_ring = 0xffffffffu;
  for (std::uint32_t base = begin; base < end; base += kChunk) {
    const std::uint32_t i = base + 4 * lane;
    Bin value[4];
    std::uint32_t ring[4];
    if (base + kChunk <= end) {  // a whole chunk (the same for every lane)
      const uint4 pixel = __ldg(reinterpret_cast<const uint4*>(pixels_by_ring + i));
      value[0] = frame[pixel.x];
      value[1] = frame[pixel.y];
      value[2] = frame[pixel.z];
      value[3] = frame[pixel.w];
      // Sorted by ring: the chunk lies in one ring when its first and last do.
      const std::uint32_t first_ring = __ldg(ring_of_sorted + base);
      if (first_ring == __ldg(ring_of_sorted + base + kChunk - 1)) {
        const Bin mine = value[0] + value[1] + value[2] + value[3];
        Bin sum;
        if constexpr (sizeof(Bin) == 4) {
          sum = __reduce_add_sync(device::kFullWarp, mine);
        } else {
          sum = device::warp_sum_u64(mine);
        }
        if (lane == 0) {
          if (first_ring != running_ring) {
            if (running != 0) atomicAdd(bins + running_ring, running);
            running = 0;
            running_ring = first_ring;
          }
          running += sum;
        }
        continue;
      }
      const uint2 rings = __ldg(reinterpret_cast<const uint2*>(ring_of_sorted + i));
      ring[0] = rings.x & 0xffffu;
      ring[1] = rings.x >> 16;
      ring[2] = rings.y & 0xffffu;
      ring[3] = rings.y >> 16;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const bool inside = i + k < end;
        ring[k] = inside ? __ldg(ring_of_sorted + i + k) : 0u;
        value[k] = inside ? static_cast<Bin>(frame[__ldg(pixels_by_ring + i + k)]) : Bin{0};
      }
    }
    // A ring boundary inside the chunk: every value to its ring's bin.
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (value[k] != 0) atomicAdd(bins + ring[k], value[k]);
    }
  }
  if (lane == 0 && running != 0) atomicAdd(bins + running_ring, running);
  __syncthreads();
  for (std::uint32_t r = threadIdx.x; r < ring_count; r += blockDim.x) {
    ring_sums[std::uint64_t{r} * ring_stride + first_frame + blockIdx.x] = bins[r];
  }
}

// Eight consecutive pixels of a frame (one unit of the row-order pass) as
// 32-bit values: 8 bytes (uint8), 16 bytes (uint16) or 2 x 16 bytes (uint32).
template <class T>
__device__ __forceinline__ void load_unit(const T* __restrict__ frame, std::uint32_t unit, std::uint32_t values[8]) {
  if constexpr (sizeof(T) == 1) {
    const uint2 loaded = __ldg(reinterpret_cast<const uint2*>(frame) + unit);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      values[k] = (loaded.x >> (8 * k)) & 0xffu;
      values[4 + k] = (loaded.y >> (8 * k)) & 0xffu;
    }
  } else if constexpr (sizeof(T) == 2) {
    const uint4 loaded = __ldg(reinterpret_cast<const uint4*>(frame) + unit);
    const std::uint32_t words[4] = {loaded.x, loaded.y, loaded.z, loaded.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      values[2 * k] = words[k] & 0xffffu;
      values[2 * k + 1] = words[k] >> 16;
    }
  } else {
    const uint4 low = __ldg(reinterpret_cast<const uint4*>(frame) + 2 * unit);
    const uint4 high = __ldg(reinterpret_cast<const uint4*>(frame) + 2 * unit + 1);
    values[0] = low.x, values[1] = low.y, values[2] = low.z, values[3] = low.w;
    values[4] = high.x, values[5] = high.y, values[6] = high.z, values[7] = high.w;
  }
}

// One CTA per frame, read once in row order, 8 pixels per thread and step
// with their 8 rings (one 16-byte load of the row-major ring of every pixel,
// a table small enough to stay in L1): the thread adds each run of equal
// rings among its 8 pixels to the CTA's bin of that ring in shared memory
// (one atomic per non-zero run: rings are one pixel wide, so a run is a few
// pixels). No staging and no gathers: the frame's bytes go through registers
// once (the gathering pass, dense_ring_sums_kernel, staged every frame in
// shared memory and read it back in ring order with 4-byte pixel indices,
// its shared loads conflicting where a ring runs down a column). The
// moments, with moments.d_moments set, from the same registers.
// Needs frame_pixels % 8 == 0, 16-byte aligned frames and ring table, and
// with moments detector_cols % 8 == 0 (a unit lies in one row).
template <class T, class Bin>
__global__ void __launch_bounds__(tuning::kRowRingSumThreads)
    row_ring_sums_kernel(const T* __restrict__ frames, std::uint32_t frame_pixels,
                         const std::uint16_t* __restrict__ ring_of_pixel, std::uint32_t ring_count, Bin* ring_sums,
                         std::uint64_t ring_stride, std::uint64_t first_frame, FrameMomentsTarget moments) {
  extern __shared__ __align__(16) std::uint8_t shared_bytes[];
  Bin* bins = reinterpret_cast<Bin*>(shared_bytes);
  for (std::uint32_t r = threadIdx.x; r < ring_count; r += blockDim.x) bins[r] = 0;
  __syncthreads();
  const T* frame = frames + std::uint64_t{blockIdx.x} * frame_pixels;
  const auto* rings_of_units = reinterpret_cast<const uint4*>(ring_of_pixel);
  const std::uint32_t units = frame_pixels / 8;
  // The moments: a unit's Σ v and Σ k·v (k = 0..7 its pixels), then one
  // update with its row and first column, kept incrementally. Exact: 8
  // values below 2^16 times at most 7 fit in 32 bits.
  using Partial = std::conditional_t<sizeof(T) == 4, unsigned long long, std::uint32_t>;
  MomentsWalk walk(moments.d_moments != nullptr ? moments.detector_cols : frame_pixels, blockDim.x * 8,
                   threadIdx.x * 8);
#pragma unroll 2
  for (std::uint32_t unit = threadIdx.x; unit < units; unit += blockDim.x) {
    std::uint32_t value[8];
    load_unit(frame, unit, value);
    const uint4 packed = __ldg(rings_of_units + unit);
    const std::uint32_t ring_words[4] = {packed.x, packed.y, packed.z, packed.w};
    Partial sum = 0, weighted = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      sum += value[k];
      weighted += static_cast<Partial>(value[k]) * k;
    }
    walk.add(sum, weighted);
    if (sum == 0) continue;  // dark pixels: nothing to add
    std::uint32_t ring = ring_words[0] & 0xffffu;
    Bin run = value[0];
#pragma unroll
    for (int k = 1; k < 8; ++k) {
      const std::uint32_t next = (ring_words[k / 2] >> (16 * (k % 2))) & 0xffffu;
      if (next != ring) {
        if (run != 0) atomicAdd(bins + ring, run);
        ring = next;
        run = 0;
      }
      run += value[k];
    }
    if (run != 0) atomicAdd(bins + ring, run);
  }
  if (moments.d_moments != nullptr)
    store_frame_moments(walk.total, walk.row_moment, walk.col_moment, moments, first_frame + blockIdx.x);
  __syncthreads();
  for (std::uint32_t r = threadIdx.x; r < ring_count; r += blockDim.x) {
    ring_sums[std::uint64_t{r} * ring_stride + first_frame + blockIdx.x] = bins[r];
  }
}

// One CTA per frame: the frame's moments alone (frame_moments_of).
template <class T>
__global__ void __launch_bounds__(tuning::kDenseFrameMomentsThreads)
    dense_frame_moments_kernel(const T* __restrict__ frames, std::uint32_t rows, std::uint32_t cols,
                               unsigned long long* moments, std::uint64_t table_stride, std::uint64_t first_frame) {
  const std::uint32_t pixels = rows * cols;
  const FrameMomentsTarget target{reinterpret_cast<std::uint64_t*>(moments), cols, table_stride};
  frame_moments_of(frames + std::uint64_t{blockIdx.x} * pixels, pixels, target, first_frame + blockIdx.x);
}

template <class Sum>
__global__ void add_ring_sums_kernel(const Sum* __restrict__ ring_sums, std::uint64_t ring_stride,
                                     const std::uint32_t* __restrict__ rings, std::uint32_t ring_list_count,
                                     std::uint64_t first_frame, std::uint64_t frame_count, unsigned long long* sums) {
  for (std::uint64_t f = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; f < frame_count;
       f += std::uint64_t{gridDim.x} * blockDim.x) {
    unsigned long long total = 0;
    for (std::uint32_t k = 0; k < ring_list_count; ++k) {
      total += ring_sums[std::uint64_t{__ldg(rings + k)} * ring_stride + first_frame + f];
    }
    sums[f] += total;
  }
}

// Frames up to this many bytes are staged in shared memory (with the bins,
// below the 227 KiB a CTA may have on sm_90 and sm_120).
inline constexpr std::size_t kStagedFrameBytes = 160 * 1024;

template <class T, class Sum>
void launch_ring_sums(const T* frames, std::uint64_t frame_count, std::uint32_t frame_pixels,
                      const std::uint32_t* pixels_by_ring, const std::uint16_t* ring_of_sorted,
                      const std::uint16_t* ring_of_pixel, std::uint32_t ring_count, Sum* ring_sums,
                      std::uint64_t ring_stride, std::uint64_t first_frame, const FrameMomentsTarget& moments,
                      cudaStream_t stream) {
  const std::size_t bins_bytes = (std::size_t{ring_count} * sizeof(Sum) + 15) / 16 * 16;
  const std::size_t frame_bytes = std::size_t{frame_pixels} * sizeof(T);
  const unsigned ctas = static_cast<unsigned>(frame_count);
  const bool row_order = ring_of_pixel != nullptr && frame_pixels % 8 == 0 &&
                         (reinterpret_cast<std::uintptr_t>(frames) & 15u) == 0 &&
                         (reinterpret_cast<std::uintptr_t>(ring_of_pixel) & 15u) == 0 &&
                         (moments.d_moments == nullptr || moments.detector_cols % 8 == 0);
  if (row_order) {
    QUANTEM_CUDA_TRY(cudaFuncSetAttribute(row_ring_sums_kernel<T, Sum>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bins_bytes)));
    row_ring_sums_kernel<T, Sum><<<ctas, tuning::kRowRingSumThreads, bins_bytes, stream>>>(
        frames, frame_pixels, ring_of_pixel, ring_count, ring_sums, ring_stride, first_frame, moments);
    QUANTEM_CUDA_CHECK_LAUNCH(stream, "row_ring_sums_kernel");
    return;
  }
  if (frame_bytes <= kStagedFrameBytes) {
    const std::size_t shared_bytes = bins_bytes + frame_bytes;
    QUANTEM_CUDA_TRY(cudaFuncSetAttribute(dense_ring_sums_kernel<T, Sum, true>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)));
    dense_ring_sums_kernel<T, Sum, true><<<ctas, tuning::kRingSumThreads, shared_bytes, stream>>>(
        frames, frame_pixels, pixels_by_ring, ring_of_sorted, ring_count, ring_sums, ring_stride, first_frame, moments);
  } else {
    QUANTEM_CUDA_TRY(cudaFuncSetAttribute(dense_ring_sums_kernel<T, Sum, false>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bins_bytes)));
    dense_ring_sums_kernel<T, Sum, false><<<ctas, tuning::kRingSumThreads, bins_bytes, stream>>>(
        frames, frame_pixels, pixels_by_ring, ring_of_sorted, ring_count, ring_sums, ring_stride, first_frame, moments);
  }
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "dense_ring_sums_kernel");
}

template <class Sum>
void launch_for_dtype(const void* d_frames, DType dtype, std::uint64_t frame_count, std::uint32_t frame_pixels,
                      const std::uint32_t* d_pixels_by_ring, const std::uint16_t* d_ring_of_sorted,
                      const std::uint16_t* d_ring_of_pixel, std::uint32_t ring_count, Sum* d_ring_sums,
                      std::uint64_t ring_stride, std::uint64_t first_frame, const FrameMomentsTarget& moments,
                      cudaStream_t stream) {
  switch (dtype) {
    case DType::uint8:
      launch_ring_sums(static_cast<const std::uint8_t*>(d_frames), frame_count, frame_pixels, d_pixels_by_ring,
                       d_ring_of_sorted, d_ring_of_pixel, ring_count, d_ring_sums, ring_stride, first_frame, moments,
                       stream);
      break;
    case DType::uint16:
      launch_ring_sums(static_cast<const std::uint16_t*>(d_frames), frame_count, frame_pixels, d_pixels_by_ring,
                       d_ring_of_sorted, d_ring_of_pixel, ring_count, d_ring_sums, ring_stride, first_frame, moments,
                       stream);
      break;
    case DType::uint32:
      launch_ring_sums(static_cast<const std::uint32_t*>(d_frames), frame_count, frame_pixels, d_pixels_by_ring,
                       d_ring_of_sorted, d_ring_of_pixel, ring_count, d_ring_sums, ring_stride, first_frame, moments,
                       stream);
      break;
  }
}

}  // namespace

void dense_ring_sums(const void* d_frames, DType dtype, std::uint64_t frame_count, std::uint32_t frame_pixels,
                     const std::uint32_t* d_pixels_by_ring, const std::uint16_t* d_ring_of_sorted,
                     const std::uint16_t* d_ring_of_pixel, std::uint32_t ring_count, void* d_ring_sums, std::uint32_t sum_bytes, std::uint64_t ring_stride,
                     std::uint64_t first_frame, StreamHandle stream, const FrameMomentsTarget& moments) {
  if (frame_count == 0) return;
  if (moments.d_moments != nullptr &&
      (moments.detector_cols == 0 || frame_pixels % moments.detector_cols != 0 ||
       first_frame + frame_count > moments.table_stride))
    throw bad_request("dense_ring_sums: bad frame moments target");
  if (d_frames == nullptr || d_pixels_by_ring == nullptr || d_ring_of_sorted == nullptr || d_ring_sums == nullptr)
    throw bad_request("dense_ring_sums: null pointer");
  if (ring_count == 0 || frame_count > 0x7fffffffu) throw bad_request("dense_ring_sums: bad ring or frame count");
  if (std::uint64_t{ring_count} * sum_bytes > 96 * 1024) throw bad_request("dense_ring_sums: too many rings");
  if (first_frame + frame_count > ring_stride) throw bad_request("dense_ring_sums: frames outside the ring table");
  if ((reinterpret_cast<std::uintptr_t>(d_pixels_by_ring) & 15u) != 0 || (reinterpret_cast<std::uintptr_t>(d_ring_of_sorted) & 7u) != 0)
    throw bad_request("dense_ring_sums: the ring tables must be 16-byte (pixels) and 8-byte (rings) aligned");
  if (sum_bytes == 4) {
    launch_for_dtype(d_frames, dtype, frame_count, frame_pixels, d_pixels_by_ring, d_ring_of_sorted, d_ring_of_pixel,
                     ring_count,
                     static_cast<unsigned int*>(d_ring_sums), ring_stride, first_frame, moments, stream);
  } else if (sum_bytes == 8) {
    launch_for_dtype(d_frames, dtype, frame_count, frame_pixels, d_pixels_by_ring, d_ring_of_sorted, d_ring_of_pixel,
                     ring_count,
                     static_cast<unsigned long long*>(d_ring_sums), ring_stride, first_frame, moments, stream);
  } else {
    throw bad_request("dense_ring_sums: sums are 4 or 8 bytes");
  }
}

void dense_frame_moments(const void* d_frames, DType dtype, std::uint64_t frame_count, std::uint32_t detector_rows,
                         std::uint32_t detector_cols, std::uint64_t* d_moments, std::uint64_t table_stride,
                         std::uint64_t first_frame, StreamHandle stream) {
  if (frame_count == 0) return;
  if (d_frames == nullptr || d_moments == nullptr) throw bad_request("dense_frame_moments: null pointer");
  if (detector_rows == 0 || detector_cols == 0 || frame_count > 0x7fffffffu)
    throw bad_request("dense_frame_moments: bad shape or frame count");
  if (first_frame + frame_count > table_stride) throw bad_request("dense_frame_moments: frames outside the table");
  constexpr unsigned threads = tuning::kDenseFrameMomentsThreads;
  const unsigned ctas = static_cast<unsigned>(frame_count);
  auto* out = reinterpret_cast<unsigned long long*>(d_moments);
  switch (dtype) {
    case DType::uint8:
      dense_frame_moments_kernel<<<ctas, threads, 0, stream>>>(static_cast<const std::uint8_t*>(d_frames),
                                                               detector_rows, detector_cols, out, table_stride,
                                                               first_frame);
      break;
    case DType::uint16:
      dense_frame_moments_kernel<<<ctas, threads, 0, stream>>>(static_cast<const std::uint16_t*>(d_frames),
                                                               detector_rows, detector_cols, out, table_stride,
                                                               first_frame);
      break;
    case DType::uint32:
      dense_frame_moments_kernel<<<ctas, threads, 0, stream>>>(static_cast<const std::uint32_t*>(d_frames),
                                                               detector_rows, detector_cols, out, table_stride,
                                                               first_frame);
      break;
  }
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "dense_frame_moments_kernel");
}

void add_ring_sums(const void* d_ring_sums, std::uint32_t sum_bytes, std::uint64_t ring_stride,
                   const std::uint32_t* d_rings, std::uint32_t ring_list_count, std::uint64_t first_frame,
                   std::uint64_t frame_count, std::uint64_t* d_sums, StreamHandle stream) {
  if (frame_count == 0 || ring_list_count == 0) return;
  if (d_ring_sums == nullptr || d_rings == nullptr || d_sums == nullptr) throw bad_request("add_ring_sums: null pointer");
  if (first_frame + frame_count > ring_stride) throw bad_request("add_ring_sums: frames outside the ring table");
  const int threads = tuning::kAddRingSumsThreads;
  const unsigned ctas = tuning::elementwise_ctas(frame_count, threads, current_sm_count());
  auto* sums = reinterpret_cast<unsigned long long*>(d_sums);
  if (sum_bytes == 4) {
    add_ring_sums_kernel<<<ctas, threads, 0, stream>>>(static_cast<const std::uint32_t*>(d_ring_sums), ring_stride,
                                                       d_rings, ring_list_count, first_frame, frame_count, sums);
  } else if (sum_bytes == 8) {
    add_ring_sums_kernel<<<ctas, threads, 0, stream>>>(static_cast<const unsigned long long*>(d_ring_sums),
                                                       ring_stride, d_rings, ring_list_count, first_frame, frame_count,
                                                       sums);
  } else {
    throw bad_request("add_ring_sums: sums are 4 or 8 bytes");
  }
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "add_ring_sums_kernel");
}

}  // namespace quantem::kernels
