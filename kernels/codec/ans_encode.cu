// GPU encoder of the ANS resident: byte-identical to ans::encode_group.
//
// measure: pixel_sums_kernel (sum + max per pixel, frame slices) [-> add_pattern_sum_kernel] ->
//          class_map_kernel (99.5 % quantile -> class scale -> class per pixel) ->
//          symbol_counts_kernel (per-class histograms, frame slices) ->
//          normalize_kernel (frequencies + cumulative, one thread per class) ->
//          encode_streams_kernel<measure> (words per stream; states and emitted words at
//          the seek points) -> stream_offsets_kernel (scan) -> seek_word_index_kernel
// write:   group_tables_kernel (header, class map, frequencies, offsets) ->
//          encode_streams_kernel<write> (same encode, words stored backwards)
#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "quantem/ans/ans_format.hpp"
#include "quantem/ans/ans_model.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/ans.hpp"
#include "quantem/kernels/scratch_layout.hpp"
#include "quantem/kernels/cuda_check.hpp"
#include "../common/warp_collectives.cuh"
#include "ans_device.cuh"
#include "../common/tuning.cuh"

namespace quantem::kernels {
namespace {

using namespace quantem::ans;

std::size_t align_up(std::size_t value, std::size_t alignment) { return (value + alignment - 1) / alignment * alignment; }

struct EncodeGeometry {
  std::uint64_t total_frames;
  std::uint32_t frames_per_group;
  std::uint32_t group_count;
  std::uint32_t rows;
  std::uint32_t cols;
  std::uint32_t pixels;
  std::uint32_t pixels_padded;  // class map row of the scratch
  std::uint32_t kept_words;     // per stream: capacity of its kept words (a multiple of 4)
  std::uint32_t seek_frames;    // frames between seek points; 0: no seek table
  std::uint32_t seek_points;    // per group (ans_seek_points_per_group)
  std::uint32_t* seek_table;    // [group][point - 1][5][stream] (ans_record_seek_points' layout)
  AnsGroupLayout layout;
};

struct EncodeScratch {
  std::uint64_t* d_pixel_sums;      // [group][pixel]
  std::uint32_t* d_max_values;      // [group]
  std::uint32_t* d_class_params;    // [group][2]: class_scale, raw_words
  std::uint8_t* d_classes;          // [group][pixels_padded]
  std::uint32_t* d_counts;          // [group][class][symbol]
  std::uint32_t* d_tables;          // [group][class][symbol]: frequency | cdf << 16
  std::uint32_t* d_stream_words;    // [group][stream]
  std::uint32_t* d_stream_offsets;  // [group][stream]
  std::uint64_t* d_blob_bytes;      // [group]
  std::uint64_t* d_data_bytes;      // [group]
  uint4* d_final_states;            // [group][stream]: the 4 states after encoding
  std::uint64_t* d_kept_words;      // [group][stream][kept_words / 4]: words in emission order, 4 per unit
};

// Offsets of the EncodeScratch parts in one device allocation, and its size.
struct ScratchPlan {
  std::size_t pixel_sums, max_values, class_params, classes, counts, tables, stream_words, stream_offsets,
      blob_bytes, data_bytes, final_states, kept_words;
  std::size_t total;
};

EncodeGeometry make_geometry(const AnsEncodeBatch& batch) {
  if (batch.d_frames == nullptr) throw bad_request("ANS encode: null frames pointer");
  if (batch.total_frames == 0 || batch.detector_rows == 0 || batch.detector_cols == 0)
    throw bad_request("ANS encode: empty batch");
  if (batch.frames_per_group == 0 || batch.frames_per_group > kAnsMaxFramesPerGroup)
    throw bad_request("ANS encode: frames_per_group must be 1.." + std::to_string(kAnsMaxFramesPerGroup));
  const std::uint64_t pixels = std::uint64_t{batch.detector_rows} * batch.detector_cols;
  if (pixels * batch.frames_per_group >= (std::uint64_t{1} << 32))
    throw bad_request("ANS encode: frames_per_group * detector pixels must stay below 2^32");
  const std::uint64_t groups = ans_group_count(batch.total_frames, batch.frames_per_group);
  if (groups > 65535) throw bad_request("ANS encode: more than 65535 groups in one batch");
  EncodeGeometry geometry{};
  geometry.total_frames = batch.total_frames;
  geometry.frames_per_group = batch.frames_per_group;
  geometry.group_count = static_cast<std::uint32_t>(groups);
  geometry.rows = batch.detector_rows;
  geometry.cols = batch.detector_cols;
  geometry.pixels = static_cast<std::uint32_t>(pixels);
  geometry.pixels_padded = static_cast<std::uint32_t>(align_up(pixels, 16));
  geometry.layout = ans_group_layout(batch.detector_rows, batch.detector_cols);
  const std::uint64_t kept = align_up(std::uint64_t{batch.kept_words_per_frame} * batch.frames_per_group, 4);
  if (kept > 0xffffffffu) throw bad_request("ANS encode: kept_words_per_frame too large");
  geometry.kept_words = static_cast<std::uint32_t>(kept);
  if (batch.d_seek_points != nullptr && batch.frames_per_seek_point != 0) {
    geometry.seek_frames = batch.frames_per_seek_point;
    geometry.seek_points = ans_seek_points_per_group(batch.frames_per_group, batch.frames_per_seek_point);
    geometry.seek_table = geometry.seek_points != 0 ? batch.d_seek_points : nullptr;
  }
  if (geometry.seek_table == nullptr) geometry.seek_frames = geometry.seek_points = 0;

  return geometry;
}

ScratchPlan plan_scratch(const EncodeGeometry& geometry) {
  const std::size_t groups = geometry.group_count;
  const std::size_t table_entries = std::size_t{kAnsClassCount} * kAnsAlphabetSize;
  const std::size_t streams = groups * geometry.layout.stream_count;
  ScratchLayout layout;
  ScratchPlan plan{};
  plan.pixel_sums = layout.add(groups * geometry.pixels * sizeof(std::uint64_t));
  plan.max_values = layout.add(groups * sizeof(std::uint32_t));
  plan.class_params = layout.add(groups * 2 * sizeof(std::uint32_t));
  plan.classes = layout.add(groups * geometry.pixels_padded);
  plan.counts = layout.add(groups * table_entries * sizeof(std::uint32_t));
  plan.tables = layout.add(groups * table_entries * sizeof(std::uint32_t));
  plan.stream_words = layout.add(streams * sizeof(std::uint32_t));
  plan.stream_offsets = layout.add(streams * sizeof(std::uint32_t));
  plan.blob_bytes = layout.add(groups * sizeof(std::uint64_t));
  plan.data_bytes = layout.add(groups * sizeof(std::uint64_t));
  plan.final_states = layout.add(streams * sizeof(uint4));
  plan.kept_words = layout.add(streams * std::size_t{geometry.kept_words} * 2);
  plan.total = layout.total();
  return plan;
}

EncodeScratch scratch_pointers(void* base, const ScratchPlan& plan) {
  EncodeScratch s{};
  s.d_pixel_sums = scratch_part<std::uint64_t>(base, plan.pixel_sums);
  s.d_max_values = scratch_part<std::uint32_t>(base, plan.max_values);
  s.d_class_params = scratch_part<std::uint32_t>(base, plan.class_params);
  s.d_classes = scratch_part<std::uint8_t>(base, plan.classes);
  s.d_counts = scratch_part<std::uint32_t>(base, plan.counts);
  s.d_tables = scratch_part<std::uint32_t>(base, plan.tables);
  s.d_stream_words = scratch_part<std::uint32_t>(base, plan.stream_words);
  s.d_stream_offsets = scratch_part<std::uint32_t>(base, plan.stream_offsets);
  s.d_blob_bytes = scratch_part<std::uint64_t>(base, plan.blob_bytes);
  s.d_data_bytes = scratch_part<std::uint64_t>(base, plan.data_bytes);
  s.d_final_states = scratch_part<uint4>(base, plan.final_states);
  s.d_kept_words = scratch_part<std::uint64_t>(base, plan.kept_words);
  return s;
}

__device__ std::uint32_t frames_in_group(const EncodeGeometry& geometry, std::uint32_t group) {
  const std::uint64_t first = std::uint64_t{group} * geometry.frames_per_group;
  const std::uint64_t left = geometry.total_frames - first;
  return left < geometry.frames_per_group ? static_cast<std::uint32_t>(left) : geometry.frames_per_group;
}

// The frames [first, last) of this CTA's slice (blockIdx.y, `per_slice`
// frames each) of group blockIdx.z; false when the slice starts past the group's end.
__device__ __forceinline__ bool slice_frames(const EncodeGeometry& geometry, std::uint32_t per_slice,
                                             std::uint32_t& first, std::uint32_t& last) {
  const std::uint32_t frame_count = frames_in_group(geometry, blockIdx.z);
  first = blockIdx.y * per_slice;
  last = min(first + per_slice, frame_count);
  return first < frame_count;
}

template <class T>
__device__ __forceinline__ std::uint32_t frame_value(const T* frames, const EncodeGeometry& geometry, std::uint32_t group,
                                                     std::uint32_t frame, std::uint32_t pixel) {
  return __ldg(frames + (std::uint64_t{group} * geometry.frames_per_group + frame) * geometry.pixels + pixel);
}

// Four consecutive pixels of a frame in one load (kVectorPixels values of T):
// the vectorised passes over the dense frames take a quad of pixels per
// thread when the frame's pixels are a multiple of four (every frame then
// starts at a multiple of the load's size).
inline constexpr std::uint32_t kVectorPixels = 4;
template <class T>
using PixelQuad = std::conditional_t<sizeof(T) == 1, std::uint32_t, std::conditional_t<sizeof(T) == 2, uint2, uint4>>;

template <class T>
__device__ __forceinline__ void unpack_quad(const PixelQuad<T>& loaded, std::uint32_t values[4]) {
  if constexpr (sizeof(T) == 1) {
#pragma unroll
    for (int k = 0; k < 4; ++k) values[k] = (loaded >> (8 * k)) & 0xffu;
  } else if constexpr (sizeof(T) == 2) {
    values[0] = loaded.x & 0xffffu;
    values[1] = loaded.x >> 16;
    values[2] = loaded.y & 0xffffu;
    values[3] = loaded.y >> 16;
  } else {
    values[0] = loaded.x;
    values[1] = loaded.y;
    values[2] = loaded.z;
    values[3] = loaded.w;
  }
}

// The quad loads of group `group`, frame 0, quad 0 (consecutive frames are
// geometry.pixels / 4 quads apart).
template <class T>
__device__ __forceinline__ const PixelQuad<T>* group_quads(const T* frames, const EncodeGeometry& geometry,
                                                          std::uint32_t group) {
  return reinterpret_cast<const PixelQuad<T>*>(frames + std::uint64_t{group} * geometry.frames_per_group * geometry.pixels);
}

// grid: (pixel blocks, frame slices, groups)
template <class T>
__global__ void pixel_sums_kernel(const T* __restrict__ frames, EncodeGeometry geometry, EncodeScratch s) {
  const std::uint32_t group = blockIdx.z;
  const std::uint32_t pixel = blockIdx.x * blockDim.x + threadIdx.x;
  std::uint32_t first = 0, last = 0;
  if (!slice_frames(geometry, device::tuning::kAnsSumFramesPerSlice, first, last)) return;
  std::uint64_t sum = 0;
  std::uint32_t max_value = 0;
  if (pixel < geometry.pixels) {
    for (std::uint32_t f = first; f < last; ++f) {
      const std::uint32_t v = frame_value(frames, geometry, group, f, pixel);
      sum += v;
      max_value = max(max_value, v);
    }
    atomicAdd(reinterpret_cast<unsigned long long*>(s.d_pixel_sums + std::uint64_t{group} * geometry.pixels + pixel),
              static_cast<unsigned long long>(sum));
  }
  max_value = device::warp_max_u32(max_value);
  if (threadIdx.x % 32 == 0) atomicMax(s.d_max_values + group, max_value);
}

// pixel_sums_kernel, a quad of pixels per thread (geometry.pixels % 4 == 0).
// Sums of 8- and 16-bit values over a slice are exact in 32 bits.
// grid: (quad blocks, frame slices, groups)
template <class T>
__global__ void pixel_sums_quads_kernel(const T* __restrict__ frames, EncodeGeometry geometry, EncodeScratch s) {
  using Partial = std::conditional_t<sizeof(T) == 4, unsigned long long, std::uint32_t>;
  static_assert(sizeof(T) == 4 || device::tuning::kAnsSumFramesPerSlice * 0xffffull < (1ull << 32), "exact partial sums");
  const std::uint32_t group = blockIdx.z;
  const std::uint32_t quad = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint32_t quads = geometry.pixels / kVectorPixels;
  std::uint32_t first = 0, last = 0;
  if (!slice_frames(geometry, device::tuning::kAnsSumFramesPerSlice, first, last)) return;
  Partial sum[4] = {0, 0, 0, 0};
  std::uint32_t max_value = 0;
  if (quad < quads) {
    const PixelQuad<T>* at = group_quads(frames, geometry, group) + std::uint64_t{first} * quads + quad;
#pragma unroll 8
    for (std::uint32_t f = first; f < last; ++f, at += quads) {
      std::uint32_t values[4];
      unpack_quad<T>(__ldg(at), values);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        sum[k] += values[k];
        max_value = max(max_value, values[k]);
      }
    }
    auto* sums = reinterpret_cast<unsigned long long*>(s.d_pixel_sums + std::uint64_t{group} * geometry.pixels) +
                 std::uint64_t{quad} * kVectorPixels;
#pragma unroll
    for (int k = 0; k < 4; ++k) atomicAdd(sums + k, static_cast<unsigned long long>(sum[k]));
  }
  max_value = device::warp_max_u32(max_value);
  if (threadIdx.x % 32 == 0) atomicMax(s.d_max_values + group, max_value);
}

// grid: pixel blocks. pattern[p] += Σ over the batch's groups of their pixel sums.
__global__ void add_pattern_sum_kernel(EncodeGeometry geometry, EncodeScratch s, unsigned long long* pattern) {
  const std::uint32_t pixel = blockIdx.x * blockDim.x + threadIdx.x;
  if (pixel >= geometry.pixels) return;
  unsigned long long sum = 0;
  for (std::uint32_t g = 0; g < geometry.group_count; ++g) sum += s.d_pixel_sums[std::uint64_t{g} * geometry.pixels + pixel];
  pattern[pixel] += sum;
}

// grid: groups; one CTA of kAnsClassMapThreads threads.
__global__ void __launch_bounds__(device::tuning::kAnsClassMapThreads) class_map_kernel(EncodeGeometry geometry, EncodeScratch s) {
  __shared__ std::uint32_t histogram[kAnsClassHistogramBins];
  __shared__ std::uint32_t high_bin;
  const std::uint32_t group = blockIdx.x;
  const std::uint32_t frame_count = frames_in_group(geometry, group);
  const std::uint64_t* sums = s.d_pixel_sums + std::uint64_t{group} * geometry.pixels;
  for (std::uint32_t i = threadIdx.x; i < kAnsClassHistogramBins; i += blockDim.x) histogram[i] = 0;
  __syncthreads();
  for (std::uint32_t p = threadIdx.x; p < geometry.pixels; p += blockDim.x) atomicAdd(&histogram[class_histogram_bin(sums[p], frame_count)], 1u);
  __syncthreads();
  if (threadIdx.x < 32) {  // warp 0: the smallest bin whose cumulative count reaches the quantile
    const std::uint32_t lane = threadIdx.x;
    constexpr std::uint32_t kBinsPerLane = kAnsClassHistogramBins / 32;
    std::uint32_t local = 0;
    for (std::uint32_t i = 0; i < kBinsPerLane; ++i) local += histogram[lane * kBinsPerLane + i];
    const std::uint32_t inclusive = device::warp_inclusive_scan_u32(local, lane);
    const std::uint64_t quantile = class_quantile_pixels(geometry.pixels);
    const std::uint32_t reached = __ballot_sync(0xffffffffu, inclusive >= quantile);
    const std::uint32_t owner = __ffs(reached) - 1;  // the last lane always reaches it
    if (lane == owner) {
      std::uint64_t cumulative = inclusive - local;
      std::uint32_t bin = lane * kBinsPerLane;
      for (;; ++bin) {
        cumulative += histogram[bin];
        if (cumulative >= quantile) break;
      }
      high_bin = bin;
    }
  }
  __syncthreads();
  const std::uint32_t scale = class_scale_from_bin(high_bin);
  if (threadIdx.x == 0) {
    s.d_class_params[2 * group] = scale;
    s.d_class_params[2 * group + 1] = s.d_max_values[group] > 0xffffu ? 2u : 1u;
  }
  std::uint8_t* classes = s.d_classes + std::uint64_t{group} * geometry.pixels_padded;
  for (std::uint32_t p = threadIdx.x; p < geometry.pixels_padded; p += blockDim.x)
    classes[p] = p < geometry.pixels ? static_cast<std::uint8_t>(pixel_class(sums[p], frame_count, scale)) : 0;
}

// Symbols 0..7 of one pixel counted in registers: 8 bits per symbol in two
// packed words (a slice has at most kAnsCountFramesPerSlice < 2^8 frames);
// larger symbols go to the CTA's shared histogram at once. (16-bit counters in
// two 64-bit words would need 64-bit shifts and adds for every count.)
struct SmallSymbolCounts {
  std::uint32_t low = 0;   // symbols 0..3
  std::uint32_t high = 0;  // symbols 4..7

  __device__ __forceinline__ void add(std::uint32_t symbol, std::uint32_t* class_counts) {
    const std::uint32_t one = 1u << (8 * (symbol & 3u));
    low += symbol < 4 ? one : 0u;
    high += symbol - 4u < 4u ? one : 0u;
    if (symbol >= 8) atomicAdd(class_counts + symbol, 1u);
  }
  __device__ __forceinline__ void flush(std::uint32_t* class_counts) const {
#pragma unroll
    for (std::uint32_t k = 0; k < 4; ++k) {
      const std::uint32_t low_count = (low >> (8 * k)) & 0xffu;
      const std::uint32_t high_count = (high >> (8 * k)) & 0xffu;
      if (low_count != 0) atomicAdd(class_counts + k, low_count);
      if (high_count != 0) atomicAdd(class_counts + 4 + k, high_count);
    }
  }
};
static_assert(device::tuning::kAnsCountFramesPerSlice < (1u << 8), "packed 8-bit counters");

// The CTA's per-class histograms of a symbol-count kernel: zeroed before the
// slice, then added to the group's counts (their non-zero entries). The
// classes' shifts are worked out once per CTA beside them (per pixel, the
// integer square root in class_shift was a tenth of the kernel's instructions).
__device__ __forceinline__ void zero_class_counts(std::uint32_t* counts, std::uint32_t* class_shifts,
                                                  std::uint32_t class_scale) {
  for (std::uint32_t i = threadIdx.x; i < kAnsClassCount * kAnsAlphabetSize; i += blockDim.x) counts[i] = 0;
  for (std::uint32_t cls = threadIdx.x; cls < kAnsClassCount; cls += blockDim.x) class_shifts[cls] = class_shift(cls, class_scale);
  __syncthreads();
}
__device__ __forceinline__ void add_class_counts(const std::uint32_t* counts, const EncodeScratch& s, std::uint32_t group) {
  __syncthreads();
  std::uint32_t* out = s.d_counts + std::uint64_t{group} * kAnsClassCount * kAnsAlphabetSize;
  for (std::uint32_t i = threadIdx.x; i < kAnsClassCount * kAnsAlphabetSize; i += blockDim.x)
    if (counts[i] != 0) atomicAdd(out + i, counts[i]);
}

// grid: (pixel blocks, frame slices, groups); per-CTA histograms in shared memory.
template <class T>
__global__ void __launch_bounds__(device::tuning::kAnsCountThreads)
    symbol_counts_kernel(const T* __restrict__ frames, EncodeGeometry geometry, EncodeScratch s) {
  __shared__ std::uint32_t counts[kAnsClassCount * kAnsAlphabetSize];
  __shared__ std::uint32_t class_shifts[kAnsClassCount];
  const std::uint32_t group = blockIdx.z;
  std::uint32_t first = 0, last = 0;
  if (!slice_frames(geometry, device::tuning::kAnsCountFramesPerSlice, first, last)) return;
  zero_class_counts(counts, class_shifts, s.d_class_params[2 * group]);
  const std::uint32_t pixel = blockIdx.x * blockDim.x + threadIdx.x;
  if (pixel < geometry.pixels) {
    const std::uint32_t cls = s.d_classes[std::uint64_t{group} * geometry.pixels_padded + pixel];
    const std::uint32_t shift = class_shifts[cls];
    SmallSymbolCounts small;
    for (std::uint32_t f = first; f < last; ++f)
      small.add(value_symbol<(sizeof(T) > 2)>(frame_value(frames, geometry, group, f, pixel), shift),
                counts + cls * kAnsAlphabetSize);
    small.flush(counts + cls * kAnsAlphabetSize);
  }
  add_class_counts(counts, s, group);
}

// symbol_counts_kernel, a quad of pixels per thread (geometry.pixels % 4 == 0).
// grid: (quad blocks, frame slices, groups)
template <class T>
__global__ void __launch_bounds__(device::tuning::kAnsCountThreads)
    symbol_counts_quads_kernel(const T* __restrict__ frames, EncodeGeometry geometry, EncodeScratch s) {
  __shared__ std::uint32_t counts[kAnsClassCount * kAnsAlphabetSize];
  __shared__ std::uint32_t class_shifts[kAnsClassCount];
  const std::uint32_t group = blockIdx.z;
  std::uint32_t first = 0, last = 0;
  if (!slice_frames(geometry, device::tuning::kAnsCountFramesPerSlice, first, last)) return;
  zero_class_counts(counts, class_shifts, s.d_class_params[2 * group]);
  const std::uint32_t quad = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint32_t quads = geometry.pixels / kVectorPixels;
  if (quad < quads) {
    const std::uint32_t packed_classes = *reinterpret_cast<const std::uint32_t*>(
        s.d_classes + std::uint64_t{group} * geometry.pixels_padded + std::uint64_t{quad} * kVectorPixels);
    std::uint32_t* class_counts[4];
    std::uint32_t shift[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const std::uint32_t cls = (packed_classes >> (8 * k)) & 0xffu;
      class_counts[k] = counts + cls * kAnsAlphabetSize;
      shift[k] = class_shifts[cls];
    }
    SmallSymbolCounts small[4];
    const PixelQuad<T>* at = group_quads(frames, geometry, group) + std::uint64_t{first} * quads + quad;
#pragma unroll 4
    for (std::uint32_t f = first; f < last; ++f, at += quads) {
      std::uint32_t values[4];
      unpack_quad<T>(__ldg(at), values);
#pragma unroll
      for (int k = 0; k < 4; ++k) small[k].add(value_symbol<(sizeof(T) > 2)>(values[k], shift[k]), class_counts[k]);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) small[k].flush(class_counts[k]);
  }
  add_class_counts(counts, s, group);
}

// grid: groups; kAnsClassCount threads, one per class.
__global__ void normalize_kernel(EncodeGeometry geometry, EncodeScratch s) {
  const std::uint32_t group = blockIdx.x;
  const std::uint32_t cls = threadIdx.x;
  if (cls >= kAnsClassCount) return;
  const std::uint64_t base = (std::uint64_t{group} * kAnsClassCount + cls) * kAnsAlphabetSize;
  std::uint64_t counts[kAnsAlphabetSize];
  std::uint16_t frequencies[kAnsAlphabetSize];
  for (std::uint32_t i = 0; i < kAnsAlphabetSize; ++i) counts[i] = s.d_counts[base + i];
  normalize_frequencies(counts, frequencies);
  std::uint32_t cumulative = 0;
  for (std::uint32_t i = 0; i < kAnsAlphabetSize; ++i) {
    s.d_tables[base + i] = frequencies[i] | (cumulative << 16);
    cumulative += frequencies[i];
  }
}

// The stream of thread `stream` in a written group: header (4 states), words
// (4 per 8-byte unit, read order), zero padding to 16 bytes.
struct StreamOutput {
  uint4* states;
  std::uint64_t* units;
  std::uint32_t word_count;
  std::uint32_t unit_count;  // units up to the stream's padded end

  __device__ StreamOutput(std::uint8_t* stream_base, std::uint32_t words)
      : states(reinterpret_cast<uint4*>(stream_base)),
        units(reinterpret_cast<std::uint64_t*>(stream_base + kAnsStreamHeaderBytes)),
        word_count(words),
        unit_count(((kAnsStreamHeaderBytes + 2 * words + kAnsStreamAlignment - 1) / kAnsStreamAlignment *
                        kAnsStreamAlignment -
                    kAnsStreamHeaderBytes) /
                   8) {}
};

// The write pass: the warp copies its lanes' kept streams one after the
// other, lane l the units l, l + 32, ... of each (coalesced; one thread per
// stream would walk its own stream alone), with the kept words in read order
// (last emitted first). `copied`: this lane's stream was kept whole.
__device__ __forceinline__ void copy_kept_streams(const EncodeGeometry& geometry, const EncodeScratch& s,
                                         std::uint8_t* streams_base, std::uint64_t stream_index, std::uint32_t words,
                                         bool copied) {
  for (std::uint32_t lanes = __ballot_sync(device::kFullWarp, copied); lanes != 0; lanes &= lanes - 1) {
    const std::uint32_t owner = __ffs(lanes) - 1;
    const std::uint32_t owner_words = __shfl_sync(device::kFullWarp, words, owner);
    const std::uint64_t owner_index = __shfl_sync(device::kFullWarp, stream_index, owner);
    const StreamOutput target(streams_base + s.d_stream_offsets[owner_index], owner_words);
    const auto* kept_halves =
        reinterpret_cast<const std::uint16_t*>(s.d_kept_words + owner_index * (geometry.kept_words / 4));
    for (std::uint32_t u = threadIdx.x % 32; u < target.unit_count; u += 32) {
      std::uint64_t unit = 0;
#pragma unroll
      for (std::uint32_t t = 0; t < 4; ++t) {
        const std::uint32_t index = 4 * u + t;  // read position
        if (index < owner_words) unit |= std::uint64_t{kept_halves[owner_words - 1 - index]} << (16 * t);
      }
      target.units[u] = unit;
    }
    if (threadIdx.x % 32 == owner) *target.states = s.d_final_states[owner_index];
  }
}

// A stream's quad as the encoder sees it: its pixels (an absent one points at
// pixel 0, never encoded), their class tables' offsets and shifts.
struct EncodeQuad {
  std::uint32_t pixels[4];
  std::uint32_t present;
  std::uint32_t table_offset[4];
  std::uint32_t shift[4];
};

__device__ __forceinline__ EncodeQuad encode_quad(const EncodeGeometry& geometry, const EncodeScratch& s, std::uint32_t group,
                                         std::uint32_t stream) {
  EncodeQuad quad;
  const std::uint32_t class_scale = s.d_class_params[2 * group];
  quad.present =
      device::ans_device::quad_pixels(stream, geometry.layout.quad_cols, geometry.rows, geometry.cols, quad.pixels);
  const std::uint8_t* classes = s.d_classes + std::uint64_t{group} * geometry.pixels_padded;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const bool here = ((quad.present >> k) & 1u) != 0;
    const std::uint32_t cls = here ? classes[quad.pixels[k]] : 0u;
    quad.table_offset[k] = cls * kAnsAlphabetSize;
    quad.shift[k] = class_shift(cls, class_scale);
    if (!here) quad.pixels[k] = quad.pixels[0];  // a valid address; the value is never encoded
  }
  return quad;
}

// The measure pass's seek point at frame f: a decoder about to decode frame f
// holds these states; its next word is the one emitted before all `emitted`
// so far: index word_count - emitted, which seek_word_index_kernel writes once
// word_count is known.
__device__ __forceinline__ void record_seek_point(const EncodeGeometry& geometry, std::uint32_t group, std::uint32_t stream,
                                         std::uint32_t point, const std::uint32_t state[4], std::uint32_t emitted) {
  std::uint32_t* at = geometry.seek_table +
                      (std::uint64_t{group} * geometry.seek_points + point - 1) * 5 * geometry.layout.stream_count +
                      stream;
#pragma unroll
  for (std::uint32_t k = 0; k < 4; ++k) at[std::uint64_t{k} * geometry.layout.stream_count] = state[k];
  at[std::uint64_t{4} * geometry.layout.stream_count] = emitted;
}

// Encodes the stream's quad backwards over the group's frames, one state per
// quad position, into `sink`; the measure pass records the seek points.
// Write pass: the words packed 4 to a unit of `out` in read order (last
// emitted first). Measure pass: each kept word stored in `kept_halves` as it
// comes, predicated, no branch (the units are little-endian, so word i of a
// stream is its kept halves' element i; packing into units with the address
// and shift recomputed at every emit was a large share of the kernel's
// instructions: `scripts/device/run.sh profile`, source part). Returns the
// words emitted.
template <class T, bool kWrite>
__device__ __forceinline__ std::uint32_t encode_stream_frames(const T* group_frames, const EncodeGeometry& geometry,
                                                              std::uint32_t group, std::uint32_t stream,
                                                              const EncodeQuad& quad, const std::uint32_t* tables,
                                                              const std::uint64_t* reciprocals, const StreamOutput& out,
                                                              std::uint16_t* kept_halves, std::uint32_t state[4]) {
  std::uint32_t emitted = 0;
  std::uint64_t pending = 0;  // write pass: the 4-word unit being filled
  auto emit = [&](std::uint32_t word) {
    if constexpr (kWrite) {
      if (word == kAnsNoWord) return;
      const std::uint32_t index = out.word_count - 1 - emitted;  // read position of this word
      pending |= std::uint64_t{word} << (16 * (index % 4));
      if (index % 4 == 0) {
        out.units[index / 4] = pending;
        pending = 0;
      }
      ++emitted;
    } else {
      const bool emitted_one = word != kAnsNoWord;
      if (emitted_one && emitted < geometry.kept_words) kept_halves[emitted] = static_cast<std::uint16_t>(word);
      emitted += emitted_one ? 1u : 0u;
    }
  };
  const std::uint32_t frame_count = frames_in_group(geometry, group);
  // Measure pass: the seek points of this stream, highest first (the frames
  // are encoded last to first). point 0: none left.
  std::uint32_t point = !kWrite && geometry.seek_frames != 0 ? (frame_count - 1) / geometry.seek_frames : 0;
  std::uint32_t point_frame = point * geometry.seek_frames;
  // The frame whose values `next` holds; one pointer step per frame.
  const T* frame_row = group_frames + std::uint64_t{frame_count - 1} * geometry.pixels;
  std::uint32_t next[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) next[k] = __ldg(frame_row + quad.pixels[k]);
  for (std::uint32_t f = frame_count; f-- > 0;) {
    std::uint32_t value[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) value[k] = next[k];
    if (f > 0) {  // the previous frame's values load while this frame encodes
      frame_row -= geometry.pixels;
#pragma unroll
      for (int k = 0; k < 4; ++k) next[k] = __ldg(frame_row + quad.pixels[k]);
    }
#pragma unroll
    for (int k = 3; k >= 0; --k) {
      if (!((quad.present >> k) & 1u)) continue;
      encode_value<(sizeof(T) > 2)>(
          state[k], value[k], quad.shift[k],
          [&](std::uint32_t& x, std::uint32_t symbol) {
            const std::uint32_t entry = tables[quad.table_offset[k] + symbol];
            const std::uint32_t frequency = entry & 0xffffu;
            return encode_symbol_reciprocal(x, frequency, entry >> 16, reciprocals[frequency]);
          },
          emit);
    }
    if (!kWrite && point != 0 && f == point_frame) {
      record_seek_point(geometry, group, stream, point, state, emitted);
      --point;
      point_frame -= geometry.seek_frames;
    }
  }
  return emitted;
}

// One thread per stream; encodes the quad backwards with one state per quad
// position. kWrite = false (measure) counts the words and keeps the first
// geometry.kept_words of them, in emission order, in the scratch. kWrite = true copies
// a stream's kept words in read order (last emitted first) when they are all
// there, and otherwise encodes the stream again, storing 4 words per 8 bytes.
// grid: (stream blocks, groups)
template <class T, bool kWrite>
__global__ void __launch_bounds__(device::tuning::kAnsEncodeThreads, device::tuning::kAnsEncodeMinBlocksPerSm)
    encode_streams_kernel(const T* __restrict__ frames, EncodeGeometry geometry, EncodeScratch s, std::uint8_t* output,
                          const std::uint64_t* group_offsets) {
  __shared__ std::uint32_t tables[kAnsClassCount * kAnsAlphabetSize];  // frequency | cdf << 16
  __shared__ std::uint64_t reciprocals[kAnsProbabilityScale + 1];     // frequency_reciprocal(f), by frequency
  const std::uint32_t group = blockIdx.y;
  const std::uint64_t table_base = std::uint64_t{group} * kAnsClassCount * kAnsAlphabetSize;
  for (std::uint32_t i = threadIdx.x; i < kAnsClassCount * kAnsAlphabetSize; i += blockDim.x)
    tables[i] = s.d_tables[table_base + i];
  for (std::uint32_t f = threadIdx.x; f <= kAnsProbabilityScale; f += blockDim.x) reciprocals[f] = frequency_reciprocal(f);
  __syncthreads();
  const std::uint32_t stream = blockIdx.x * blockDim.x + threadIdx.x;
  const bool valid = stream < geometry.layout.stream_count;
  const std::uint64_t stream_index = std::uint64_t{group} * geometry.layout.stream_count + stream;
  auto* kept_halves = reinterpret_cast<std::uint16_t*>(s.d_kept_words + stream_index * (geometry.kept_words / 4));
  StreamOutput out(nullptr, 0);
  if constexpr (kWrite) {
    std::uint8_t* const streams_base = output + group_offsets[group] + geometry.layout.stream_data_offset;
    const std::uint32_t words = valid ? s.d_stream_words[stream_index] : 0;
    const bool copied = valid && words <= geometry.kept_words;
    copy_kept_streams(geometry, s, streams_base, stream_index, words, copied);
    if (!valid || copied) return;
    out = StreamOutput(streams_base + s.d_stream_offsets[stream_index], words);
  } else {
    if (!valid) return;
  }
  const EncodeQuad quad = encode_quad(geometry, s, group, stream);
  const T* group_frames = frames + std::uint64_t{group} * geometry.frames_per_group * geometry.pixels;
  std::uint32_t state[4] = {kAnsStateLower, kAnsStateLower, kAnsStateLower, kAnsStateLower};
  const std::uint32_t emitted = encode_stream_frames<T, kWrite>(group_frames, geometry, group, stream, quad, tables,
                                                                reciprocals, out, kept_halves, state);
  if constexpr (kWrite) {
    *out.states = uint4{state[0], state[1], state[2], state[3]};
    // The unit holding word 0 is stored; a partial last-emitted unit was stored
    // with zeros above its words. Zero the padding units after them.
    for (std::uint32_t u = (out.word_count + 3) / 4; u < out.unit_count; ++u) out.units[u] = 0;
  } else {
    s.d_stream_words[stream_index] = emitted;
    s.d_final_states[stream_index] = uint4{state[0], state[1], state[2], state[3]};
  }
}

// grid: groups; one CTA scans the stream sizes (4 + 2 * words bytes) into offsets.
__global__ void __launch_bounds__(device::tuning::kAnsScanThreads) stream_offsets_kernel(EncodeGeometry geometry, EncodeScratch s) {
  using BlockScan = cub::BlockScan<std::uint64_t, device::tuning::kAnsScanThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  const std::uint32_t group = blockIdx.x;
  const std::uint32_t streams = geometry.layout.stream_count;
  const std::uint32_t per_thread = (streams + blockDim.x - 1) / blockDim.x;
  const std::uint32_t begin = min(threadIdx.x * per_thread, streams);
  const std::uint32_t end = min(begin + per_thread, streams);
  const std::uint32_t* words = s.d_stream_words + std::uint64_t{group} * streams;
  std::uint64_t local = 0;
  for (std::uint32_t i = begin; i < end; ++i) local += ans_stream_bytes(words[i]);
  std::uint64_t inclusive = 0;
  BlockScan(scan_storage).InclusiveSum(local, inclusive);
  std::uint64_t running = inclusive - local;
  std::uint32_t* offsets = s.d_stream_offsets + std::uint64_t{group} * streams;
  for (std::uint32_t i = begin; i < end; ++i) {
    offsets[i] = static_cast<std::uint32_t>(running);
    running += ans_stream_bytes(words[i]);
  }
  if (threadIdx.x == blockDim.x - 1) {
    s.d_data_bytes[group] = inclusive;
    s.d_blob_bytes[group] = geometry.layout.stream_data_offset + inclusive;
  }
}

static_assert(kAnsMaxFramesPerGroup - 1 <= 65535, "seek_word_index_kernel's grid.y holds every seek point of a group");

// grid: (stream blocks, seek points, groups): a point's emitted-word count,
// as encode_streams_kernel<measure> left it, becomes the decoder's word index.
// Points past a short last group's frames (never read) are zeroed, as
// ans_record_seek_points leaves them.
__global__ void seek_word_index_kernel(EncodeGeometry geometry, EncodeScratch s) {
  const std::uint32_t group = blockIdx.z;
  const std::uint32_t point = blockIdx.y + 1;
  const std::uint32_t stream = blockIdx.x * blockDim.x + threadIdx.x;
  if (stream >= geometry.layout.stream_count) return;
  std::uint32_t* at =
      geometry.seek_table + (std::uint64_t{group} * geometry.seek_points + point - 1) * 5 * geometry.layout.stream_count + stream;
  if (point * geometry.seek_frames >= frames_in_group(geometry, group)) {
    for (std::uint32_t k = 0; k < 5; ++k) at[std::uint64_t{k} * geometry.layout.stream_count] = 0;
    return;
  }
  std::uint32_t* word = at + std::uint64_t{4} * geometry.layout.stream_count;
  *word = s.d_stream_words[std::uint64_t{group} * geometry.layout.stream_count + stream] - *word;
}

// grid: (blocks, groups); header, class map (zero padding), frequencies, offsets.
__global__ void group_tables_kernel(EncodeGeometry geometry, EncodeScratch s, std::uint8_t* output,
                                    const std::uint64_t* group_offsets) {
  const std::uint32_t group = blockIdx.y;
  std::uint8_t* blob = output + group_offsets[group];
  const std::uint32_t thread = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint32_t threads = gridDim.x * blockDim.x;
  if (thread == 0) {
    const AnsGroupHeader header =
        ans_group_header(geometry.layout, frames_in_group(geometry, group), geometry.rows, geometry.cols, s.d_class_params[2 * group + 1],
                         s.d_class_params[2 * group], s.d_data_bytes[group]);
    *reinterpret_cast<AnsGroupHeader*>(blob) = header;
  }
  const std::uint32_t class_map_bytes = geometry.layout.freq_table_offset - geometry.layout.class_map_offset;
  const std::uint8_t* classes = s.d_classes + std::uint64_t{group} * geometry.pixels_padded;
  for (std::uint32_t i = thread; i < class_map_bytes; i += threads)
    blob[geometry.layout.class_map_offset + i] = i < geometry.pixels ? classes[i] : 0;
  auto* frequencies = reinterpret_cast<std::uint16_t*>(blob + geometry.layout.freq_table_offset);
  const std::uint32_t* tables = s.d_tables + std::uint64_t{group} * kAnsClassCount * kAnsAlphabetSize;
  for (std::uint32_t i = thread; i < kAnsClassCount * kAnsAlphabetSize; i += threads)
    frequencies[i] = static_cast<std::uint16_t>(tables[i] & 0xffffu);
  auto* offsets = reinterpret_cast<std::uint32_t*>(blob + geometry.layout.stream_offsets_offset);
  const std::uint32_t* scratch_offsets = s.d_stream_offsets + std::uint64_t{group} * geometry.layout.stream_count;
  const std::uint32_t offset_slots = (geometry.layout.stream_data_offset - geometry.layout.stream_offsets_offset) / 4;
  for (std::uint32_t i = thread; i < offset_slots; i += threads)
    offsets[i] = i < geometry.layout.stream_count ? scratch_offsets[i] : 0u;
}

template <class T>
void launch_measure(const T* frames, const EncodeGeometry& geometry, const EncodeScratch& s,
                    std::uint64_t* pattern_sum, cudaStream_t stream) {
  using namespace device::tuning;
  // A quad of pixels per thread and load where every frame starts at a
  // multiple of a quad's bytes (cudaMalloc'd frames of 4k pixels).
  const bool by_quads = geometry.pixels % kVectorPixels == 0 &&
                        reinterpret_cast<std::uintptr_t>(frames) % (kVectorPixels * sizeof(T)) == 0;
  const std::uint32_t sum_items = by_quads ? geometry.pixels / kVectorPixels : geometry.pixels;
  const dim3 sum_grid((sum_items + kAnsSumThreads - 1) / kAnsSumThreads,
                      (geometry.frames_per_group + kAnsSumFramesPerSlice - 1) / kAnsSumFramesPerSlice, geometry.group_count);
  if (by_quads) {
    pixel_sums_quads_kernel<T><<<sum_grid, kAnsSumThreads, 0, stream>>>(frames, geometry, s);
  } else {
    pixel_sums_kernel<T><<<sum_grid, kAnsSumThreads, 0, stream>>>(frames, geometry, s);
  }
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "pixel_sums_kernel");
  if (pattern_sum != nullptr) {
    add_pattern_sum_kernel<<<(geometry.pixels + kAnsPatternSumThreads - 1) / kAnsPatternSumThreads, kAnsPatternSumThreads,
                             0, stream>>>(
        geometry, s, reinterpret_cast<unsigned long long*>(pattern_sum));
    QUANTEM_CUDA_CHECK_LAUNCH(stream, "add_pattern_sum_kernel");
  }
  class_map_kernel<<<geometry.group_count, kAnsClassMapThreads, 0, stream>>>(geometry, s);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "class_map_kernel");
  const dim3 count_grid((sum_items + kAnsCountThreads - 1) / kAnsCountThreads,
                        (geometry.frames_per_group + kAnsCountFramesPerSlice - 1) / kAnsCountFramesPerSlice, geometry.group_count);
  if (by_quads) {
    symbol_counts_quads_kernel<T><<<count_grid, kAnsCountThreads, 0, stream>>>(frames, geometry, s);
  } else {
    symbol_counts_kernel<T><<<count_grid, kAnsCountThreads, 0, stream>>>(frames, geometry, s);
  }
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "symbol_counts_kernel");
  normalize_kernel<<<geometry.group_count, kAnsClassCount, 0, stream>>>(geometry, s);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "normalize_kernel");
  const dim3 encode_grid((geometry.layout.stream_count + kAnsEncodeThreads - 1) / kAnsEncodeThreads, geometry.group_count);
  encode_streams_kernel<T, false><<<encode_grid, kAnsEncodeThreads, 0, stream>>>(frames, geometry, s, nullptr, nullptr);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "encode_streams_kernel<measure>");
  stream_offsets_kernel<<<geometry.group_count, kAnsScanThreads, 0, stream>>>(geometry, s);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "stream_offsets_kernel");
  if (geometry.seek_points != 0) {
    const dim3 seek_grid((geometry.layout.stream_count + kAnsSeekWordIndexThreads - 1) / kAnsSeekWordIndexThreads,
                         geometry.seek_points, geometry.group_count);
    seek_word_index_kernel<<<seek_grid, kAnsSeekWordIndexThreads, 0, stream>>>(geometry, s);
    QUANTEM_CUDA_CHECK_LAUNCH(stream, "seek_word_index_kernel");
  }
}

template <class T>
void launch_write(const T* frames, const EncodeGeometry& geometry, const EncodeScratch& s, std::uint8_t* output,
                  const std::uint64_t* group_offsets, cudaStream_t stream) {
  using namespace device::tuning;
  group_tables_kernel<<<dim3(kAnsGroupTablesCtas, geometry.group_count), kAnsGroupTablesThreads, 0, stream>>>(
      geometry, s, output, group_offsets);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "group_tables_kernel");
  const dim3 encode_grid((geometry.layout.stream_count + kAnsEncodeThreads - 1) / kAnsEncodeThreads, geometry.group_count);
  encode_streams_kernel<T, true><<<encode_grid, kAnsEncodeThreads, 0, stream>>>(frames, geometry, s, output, group_offsets);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "encode_streams_kernel<write>");
}

}  // namespace

std::size_t ans_group_count(std::uint64_t total_frames, std::uint32_t frames_per_group) noexcept {
  if (frames_per_group == 0) return 0;
  return static_cast<std::size_t>((total_frames + frames_per_group - 1) / frames_per_group);
}

std::size_t ans_encode_scratch_bytes(const AnsEncodeBatch& batch) { return plan_scratch(make_geometry(batch)).total; }

void ans_encode_measure_async(const AnsEncodeBatch& batch, void* d_scratch, std::size_t scratch_bytes,
                              std::uint64_t* h_blob_bytes, StreamHandle stream) {
  const EncodeGeometry geometry = make_geometry(batch);
  const ScratchPlan plan = plan_scratch(geometry);
  if (d_scratch == nullptr || scratch_bytes < plan.total) throw bad_request("ANS encode: scratch too small");
  const EncodeScratch s = scratch_pointers(d_scratch, plan);
  // Zero the accumulators (sums, maxima, counts).
  QUANTEM_CUDA_TRY(cudaMemsetAsync(s.d_pixel_sums, 0, std::size_t{geometry.group_count} * geometry.pixels * sizeof(std::uint64_t), stream));
  QUANTEM_CUDA_TRY(cudaMemsetAsync(s.d_max_values, 0, std::size_t{geometry.group_count} * sizeof(std::uint32_t), stream));
  QUANTEM_CUDA_TRY(cudaMemsetAsync(s.d_counts, 0,
                                   std::size_t{geometry.group_count} * kAnsClassCount * kAnsAlphabetSize * sizeof(std::uint32_t),
                                   stream));
  switch (batch.dtype) {
    case DType::uint8: launch_measure(static_cast<const std::uint8_t*>(batch.d_frames), geometry, s, batch.d_pattern_sum, stream); break;
    case DType::uint16: launch_measure(static_cast<const std::uint16_t*>(batch.d_frames), geometry, s, batch.d_pattern_sum, stream); break;
    case DType::uint32: launch_measure(static_cast<const std::uint32_t*>(batch.d_frames), geometry, s, batch.d_pattern_sum, stream); break;
  }
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(h_blob_bytes, s.d_blob_bytes, std::size_t{geometry.group_count} * sizeof(std::uint64_t),
                                   cudaMemcpyDeviceToHost, stream));
}

void ans_encode_check_sizes(const std::vector<std::uint64_t>& blob_bytes) {
  for (std::uint64_t bytes : blob_bytes)
    if (bytes > 0xffffffffull) throw bad_request("ANS encode: a group exceeds 4 GiB; use fewer frames per group");
}

std::vector<std::uint64_t> ans_encode_measure(const AnsEncodeBatch& batch, void* d_scratch, std::size_t scratch_bytes,
                                              StreamHandle stream) {
  std::vector<std::uint64_t> blob_bytes(ans_group_count(batch.total_frames, batch.frames_per_group));
  ans_encode_measure_async(batch, d_scratch, scratch_bytes, blob_bytes.data(), stream);
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  ans_encode_check_sizes(blob_bytes);
  return blob_bytes;
}

void ans_encode_write(const AnsEncodeBatch& batch, const void* d_scratch, std::size_t scratch_bytes,
                      std::uint8_t* d_output, const std::uint64_t* d_group_offsets, StreamHandle stream) {
  const EncodeGeometry geometry = make_geometry(batch);
  const ScratchPlan plan = plan_scratch(geometry);
  if (d_scratch == nullptr || scratch_bytes < plan.total) throw bad_request("ANS encode: scratch too small");
  if (d_output == nullptr || d_group_offsets == nullptr) throw bad_request("ANS encode: null output");
  const EncodeScratch s = scratch_pointers(const_cast<void*>(d_scratch), plan);
  switch (batch.dtype) {
    case DType::uint8:
      launch_write(static_cast<const std::uint8_t*>(batch.d_frames), geometry, s, d_output, d_group_offsets, stream);
      break;
    case DType::uint16:
      launch_write(static_cast<const std::uint16_t*>(batch.d_frames), geometry, s, d_output, d_group_offsets, stream);
      break;
    case DType::uint32:
      launch_write(static_cast<const std::uint32_t*>(batch.d_frames), geometry, s, d_output, d_group_offsets, stream);
      break;
  }
}

}  // namespace quantem::kernels
