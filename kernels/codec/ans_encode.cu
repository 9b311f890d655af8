// GPU encoder of the ANS resident: byte-identical to ans::encode_group.
//
// measure: pixel_sums_kernel (sum + max per pixel, frame slices) ->
//          class_map_kernel (99.5 % quantile -> class scale -> class per pixel) ->
//          symbol_counts_kernel (per-class histograms, frame slices) ->
//          normalize_kernel (frequencies + cumulative, one thread per class) ->
//          encode_streams_kernel<measure> (words per stream) -> stream_offsets_kernel (scan)
// write:   group_tables_kernel (header, class map, frequencies, offsets) ->
//          encode_streams_kernel<write> (same encode, words stored backwards)
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "quantem/ans/ans_format.hpp"
#include "quantem/ans/ans_model.hpp"
#include "quantem/core/error.hpp"
#include "quantem/cuda/ans.hpp"
#include "../common/cuda_check.cuh"
#include "ans_device.cuh"
#include "tuning.cuh"

namespace quantem::cuda {
namespace {

using namespace quantem::ans;

constexpr std::size_t kScratchAlignment = 256;

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
  AnsGroupLayout layout;
};

struct EncodeScratch {
  std::uint64_t* pixel_sums;      // [group][pixel]
  std::uint32_t* max_values;      // [group]
  std::uint32_t* class_params;    // [group][2]: class_scale, raw_words
  std::uint8_t* classes;          // [group][pixels_padded]
  std::uint32_t* counts;          // [group][class][symbol]
  std::uint32_t* tables;          // [group][class][symbol]: frequency | cdf << 16
  std::uint32_t* stream_words;    // [group][stream]
  std::uint32_t* stream_offsets;  // [group][stream]
  std::uint64_t* blob_bytes;      // [group]
  std::uint64_t* data_bytes;      // [group]
  uint4* final_states;            // [group][stream]: the 4 states after encoding
  std::uint64_t* kept_words;      // [group][stream][kept_words / 4]: words in emission order, 4 per unit
};

inline constexpr int kScratchParts = 12;

struct ScratchPlan {
  std::size_t offsets[kScratchParts];
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
  return geometry;
}

ScratchPlan plan_scratch(const EncodeGeometry& g) {
  const std::size_t groups = g.group_count;
  const std::size_t table_entries = std::size_t{kAnsClassCount} * kAnsAlphabetSize;
  const std::size_t streams = std::size_t{groups} * g.layout.stream_count;
  const std::size_t sizes[kScratchParts] = {
      groups * g.pixels * sizeof(std::uint64_t),
      groups * sizeof(std::uint32_t),
      groups * 2 * sizeof(std::uint32_t),
      groups * g.pixels_padded,
      groups * table_entries * sizeof(std::uint32_t),
      groups * table_entries * sizeof(std::uint32_t),
      groups * g.layout.stream_count * sizeof(std::uint32_t),
      groups * g.layout.stream_count * sizeof(std::uint32_t),
      groups * sizeof(std::uint64_t),
      groups * sizeof(std::uint64_t),
      streams * sizeof(uint4),
      streams * std::size_t{g.kept_words} * 2,
  };
  ScratchPlan plan{};
  std::size_t offset = 0;
  for (int i = 0; i < kScratchParts; ++i) {
    plan.offsets[i] = offset;
    offset = align_up(offset + sizes[i], kScratchAlignment);
  }
  plan.total = offset;
  return plan;
}

EncodeScratch scratch_pointers(void* base, const ScratchPlan& plan) {
  auto* bytes = static_cast<std::uint8_t*>(base);
  EncodeScratch s{};
  s.pixel_sums = reinterpret_cast<std::uint64_t*>(bytes + plan.offsets[0]);
  s.max_values = reinterpret_cast<std::uint32_t*>(bytes + plan.offsets[1]);
  s.class_params = reinterpret_cast<std::uint32_t*>(bytes + plan.offsets[2]);
  s.classes = bytes + plan.offsets[3];
  s.counts = reinterpret_cast<std::uint32_t*>(bytes + plan.offsets[4]);
  s.tables = reinterpret_cast<std::uint32_t*>(bytes + plan.offsets[5]);
  s.stream_words = reinterpret_cast<std::uint32_t*>(bytes + plan.offsets[6]);
  s.stream_offsets = reinterpret_cast<std::uint32_t*>(bytes + plan.offsets[7]);
  s.blob_bytes = reinterpret_cast<std::uint64_t*>(bytes + plan.offsets[8]);
  s.data_bytes = reinterpret_cast<std::uint64_t*>(bytes + plan.offsets[9]);
  s.final_states = reinterpret_cast<uint4*>(bytes + plan.offsets[10]);
  s.kept_words = reinterpret_cast<std::uint64_t*>(bytes + plan.offsets[11]);
  return s;
}

__device__ std::uint32_t frames_in_group(const EncodeGeometry& g, std::uint32_t group) {
  const std::uint64_t first = std::uint64_t{group} * g.frames_per_group;
  const std::uint64_t left = g.total_frames - first;
  return left < g.frames_per_group ? static_cast<std::uint32_t>(left) : g.frames_per_group;
}

template <class T>
__device__ __forceinline__ std::uint32_t frame_value(const T* frames, const EncodeGeometry& g, std::uint32_t group,
                                                     std::uint32_t frame, std::uint32_t pixel) {
  return __ldg(frames + (std::uint64_t{group} * g.frames_per_group + frame) * g.pixels + pixel);
}

// grid: (pixel blocks, frame slices, groups)
template <class T>
__global__ void pixel_sums_kernel(const T* __restrict__ frames, EncodeGeometry g, EncodeScratch s) {
  const std::uint32_t group = blockIdx.z;
  const std::uint32_t pixel = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint32_t frame_count = frames_in_group(g, group);
  const std::uint32_t first = blockIdx.y * kernels::tuning::kAnsSumFramesPerSlice;
  if (first >= frame_count) return;
  const std::uint32_t last = min(first + kernels::tuning::kAnsSumFramesPerSlice, frame_count);
  std::uint64_t sum = 0;
  std::uint32_t max_value = 0;
  if (pixel < g.pixels) {
    for (std::uint32_t f = first; f < last; ++f) {
      const std::uint32_t v = frame_value(frames, g, group, f, pixel);
      sum += v;
      max_value = max(max_value, v);
    }
    atomicAdd(reinterpret_cast<unsigned long long*>(s.pixel_sums + std::uint64_t{group} * g.pixels + pixel),
              static_cast<unsigned long long>(sum));
  }
  for (int delta = 16; delta > 0; delta /= 2) max_value = max(max_value, __shfl_xor_sync(0xffffffffu, max_value, delta));
  if (threadIdx.x % 32 == 0) atomicMax(s.max_values + group, max_value);
}

// grid: groups; one CTA of kAnsClassMapThreads threads.
__global__ void __launch_bounds__(kernels::tuning::kAnsClassMapThreads) class_map_kernel(EncodeGeometry g, EncodeScratch s) {
  __shared__ std::uint32_t histogram[kAnsClassHistogramBins];
  __shared__ std::uint32_t high_bin;
  const std::uint32_t group = blockIdx.x;
  const std::uint32_t frame_count = frames_in_group(g, group);
  const std::uint64_t* sums = s.pixel_sums + std::uint64_t{group} * g.pixels;
  for (std::uint32_t i = threadIdx.x; i < kAnsClassHistogramBins; i += blockDim.x) histogram[i] = 0;
  __syncthreads();
  for (std::uint32_t p = threadIdx.x; p < g.pixels; p += blockDim.x) atomicAdd(&histogram[class_histogram_bin(sums[p], frame_count)], 1u);
  __syncthreads();
  if (threadIdx.x < 32) {  // warp 0: the smallest bin whose cumulative count reaches the quantile
    const std::uint32_t lane = threadIdx.x;
    constexpr std::uint32_t kBinsPerLane = kAnsClassHistogramBins / 32;
    std::uint32_t local = 0;
    for (std::uint32_t i = 0; i < kBinsPerLane; ++i) local += histogram[lane * kBinsPerLane + i];
    std::uint32_t inclusive = local;
    for (int delta = 1; delta < 32; delta *= 2) {
      const std::uint32_t other = __shfl_up_sync(0xffffffffu, inclusive, delta);
      if (lane >= static_cast<std::uint32_t>(delta)) inclusive += other;
    }
    const std::uint64_t quantile = class_quantile_pixels(g.pixels);
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
    s.class_params[2 * group] = scale;
    s.class_params[2 * group + 1] = s.max_values[group] > 0xffffu ? 2u : 1u;
  }
  std::uint8_t* classes = s.classes + std::uint64_t{group} * g.pixels_padded;
  for (std::uint32_t p = threadIdx.x; p < g.pixels_padded; p += blockDim.x)
    classes[p] = p < g.pixels ? static_cast<std::uint8_t>(pixel_class(sums[p], frame_count, scale)) : 0;
}

// grid: (pixel blocks, frame slices, groups); per-CTA histograms in shared memory.
template <class T>
__global__ void __launch_bounds__(kernels::tuning::kAnsCountThreads)
    symbol_counts_kernel(const T* __restrict__ frames, EncodeGeometry g, EncodeScratch s) {
  __shared__ std::uint32_t counts[kAnsClassCount * kAnsAlphabetSize];
  const std::uint32_t group = blockIdx.z;
  const std::uint32_t frame_count = frames_in_group(g, group);
  const std::uint32_t first = blockIdx.y * kernels::tuning::kAnsCountFramesPerSlice;
  if (first >= frame_count) return;
  const std::uint32_t last = min(first + kernels::tuning::kAnsCountFramesPerSlice, frame_count);
  for (std::uint32_t i = threadIdx.x; i < kAnsClassCount * kAnsAlphabetSize; i += blockDim.x) counts[i] = 0;
  __syncthreads();
  const std::uint32_t pixel = blockIdx.x * blockDim.x + threadIdx.x;
  if (pixel < g.pixels) {
    const std::uint32_t cls = s.classes[std::uint64_t{group} * g.pixels_padded + pixel];
    const std::uint32_t shift = class_shift(cls, s.class_params[2 * group]);
    // Symbols 0..7 (nearly every value of counting data) are counted in
    // registers, 16 bits per symbol in two packed words (a slice has at most
    // 256 frames < 2^16); only larger symbols go to the shared histogram.
    static_assert(kernels::tuning::kAnsCountFramesPerSlice < (1u << 16), "packed 16-bit counters");
    std::uint64_t small_low = 0;   // symbols 0..3
    std::uint64_t small_high = 0;  // symbols 4..7
    for (std::uint32_t f = first; f < last; ++f) {
      const std::uint32_t symbol = value_symbol(frame_value(frames, g, group, f, pixel), shift);
      const std::uint64_t one = std::uint64_t{1} << (16 * (symbol & 3u));
      small_low += symbol < 4 ? one : 0;
      small_high += (symbol >= 4 && symbol < 8) ? one : 0;
      if (symbol >= 8) atomicAdd(&counts[cls * kAnsAlphabetSize + symbol], 1u);
    }
#pragma unroll
    for (std::uint32_t k = 0; k < 4; ++k) {
      const std::uint32_t low_count = static_cast<std::uint32_t>((small_low >> (16 * k)) & 0xffffu);
      const std::uint32_t high_count = static_cast<std::uint32_t>((small_high >> (16 * k)) & 0xffffu);
      if (low_count != 0) atomicAdd(&counts[cls * kAnsAlphabetSize + k], low_count);
      if (high_count != 0) atomicAdd(&counts[cls * kAnsAlphabetSize + 4 + k], high_count);
    }
  }
  __syncthreads();
  std::uint32_t* out = s.counts + std::uint64_t{group} * kAnsClassCount * kAnsAlphabetSize;
  for (std::uint32_t i = threadIdx.x; i < kAnsClassCount * kAnsAlphabetSize; i += blockDim.x)
    if (counts[i] != 0) atomicAdd(out + i, counts[i]);
}

// grid: groups; kAnsClassCount threads, one per class.
__global__ void normalize_kernel(EncodeGeometry g, EncodeScratch s) {
  const std::uint32_t group = blockIdx.x;
  const std::uint32_t cls = threadIdx.x;
  if (cls >= kAnsClassCount) return;
  const std::uint64_t base = (std::uint64_t{group} * kAnsClassCount + cls) * kAnsAlphabetSize;
  std::uint64_t counts[kAnsAlphabetSize];
  std::uint16_t frequencies[kAnsAlphabetSize];
  for (std::uint32_t i = 0; i < kAnsAlphabetSize; ++i) counts[i] = s.counts[base + i];
  normalize_frequencies(counts, frequencies);
  std::uint32_t cumulative = 0;
  for (std::uint32_t i = 0; i < kAnsAlphabetSize; ++i) {
    s.tables[base + i] = frequencies[i] | (cumulative << 16);
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

// One thread per stream; encodes the quad backwards with one state per quad
// position. kWrite = false (measure) counts the words and keeps the first
// g.kept_words of them, in emission order, in the scratch. kWrite = true copies
// a stream's kept words in read order (last emitted first) when they are all
// there, and otherwise encodes the stream again, storing 4 words per 8 bytes.
// grid: (stream blocks, groups)
template <class T, bool kWrite>
__global__ void __launch_bounds__(kernels::tuning::kAnsEncodeThreads)
    encode_streams_kernel(const T* __restrict__ frames, EncodeGeometry g, EncodeScratch s, std::uint8_t* output,
                          const std::uint64_t* group_offsets) {
  __shared__ std::uint32_t tables[kAnsClassCount * kAnsAlphabetSize];  // frequency | cdf << 16
  __shared__ std::uint64_t reciprocals[kAnsProbabilityScale + 1];     // frequency_reciprocal(f), by frequency
  const std::uint32_t group = blockIdx.y;
  const std::uint64_t table_base = std::uint64_t{group} * kAnsClassCount * kAnsAlphabetSize;
  for (std::uint32_t i = threadIdx.x; i < kAnsClassCount * kAnsAlphabetSize; i += blockDim.x)
    tables[i] = s.tables[table_base + i];
  for (std::uint32_t f = threadIdx.x; f <= kAnsProbabilityScale; f += blockDim.x) reciprocals[f] = frequency_reciprocal(f);
  __syncthreads();
  const std::uint32_t stream = blockIdx.x * blockDim.x + threadIdx.x;
  if (stream >= g.layout.stream_count) return;
  const std::uint64_t stream_index = std::uint64_t{group} * g.layout.stream_count + stream;
  std::uint64_t* kept = s.kept_words + stream_index * (g.kept_words / 4);

  StreamOutput out(nullptr, 0);
  if constexpr (kWrite) {
    out = StreamOutput(output + group_offsets[group] + g.layout.stream_data_offset + s.stream_offsets[stream_index],
                       s.stream_words[stream_index]);
    if (out.word_count <= g.kept_words) {  // copy the kept words, reversed
      const auto* kept_halves = reinterpret_cast<const std::uint16_t*>(kept);
      for (std::uint32_t u = 0; u < out.unit_count; ++u) {
        std::uint64_t unit = 0;
#pragma unroll
        for (std::uint32_t t = 0; t < 4; ++t) {
          const std::uint32_t index = 4 * u + t;  // read position
          if (index < out.word_count) unit |= std::uint64_t{kept_halves[out.word_count - 1 - index]} << (16 * t);
        }
        out.units[u] = unit;
      }
      *out.states = s.final_states[stream_index];
      return;
    }
  }

  const std::uint32_t frame_count = frames_in_group(g, group);
  const std::uint32_t class_scale = s.class_params[2 * group];
  std::uint32_t pixels[4];
  const std::uint32_t present = kernels::ans_device::quad_pixels(stream, g.layout.quad_cols, g.rows, g.cols, pixels);
  const std::uint8_t* classes = s.classes + std::uint64_t{group} * g.pixels_padded;
  std::uint32_t table_offset[4];
  std::uint32_t shift[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const bool here = ((present >> k) & 1u) != 0;
    const std::uint32_t cls = here ? classes[pixels[k]] : 0u;
    table_offset[k] = cls * kAnsAlphabetSize;
    shift[k] = class_shift(cls, class_scale);
    if (!here) pixels[k] = pixels[0];  // a valid address; the value is never encoded
  }

  std::uint32_t emitted = 0;
  std::uint64_t pending = 0;  // the 4-word unit being filled
  auto emit = [&](std::uint32_t word) {
    if (word == kAnsNoWord) return;
    if constexpr (kWrite) {
      const std::uint32_t index = out.word_count - 1 - emitted;  // read position of this word
      pending |= std::uint64_t{word} << (16 * (index % 4));
      if (index % 4 == 0) {
        out.units[index / 4] = pending;
        pending = 0;
      }
    } else if (emitted < g.kept_words) {
      pending |= std::uint64_t{word} << (16 * (emitted % 4));
      if (emitted % 4 == 3) {
        kept[emitted / 4] = pending;
        pending = 0;
      }
    }
    ++emitted;
  };
  const T* group_frames = frames + std::uint64_t{group} * g.frames_per_group * g.pixels;
  std::uint32_t state[4] = {kAnsStateLower, kAnsStateLower, kAnsStateLower, kAnsStateLower};
  std::uint32_t next[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) next[k] = __ldg(group_frames + std::uint64_t{frame_count - 1} * g.pixels + pixels[k]);
  for (std::uint32_t f = frame_count; f-- > 0;) {
    std::uint32_t value[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) value[k] = next[k];
    if (f > 0) {  // the previous frame's values load while this frame encodes
#pragma unroll
      for (int k = 0; k < 4; ++k) next[k] = __ldg(group_frames + std::uint64_t{f - 1} * g.pixels + pixels[k]);
    }
#pragma unroll
    for (int k = 3; k >= 0; --k) {
      if (!((present >> k) & 1u)) continue;
      encode_value(
          state[k], value[k], shift[k],
          [&](std::uint32_t& x, std::uint32_t symbol) {
            const std::uint32_t entry = tables[table_offset[k] + symbol];
            const std::uint32_t frequency = entry & 0xffffu;
            return encode_symbol_reciprocal(x, frequency, entry >> 16, reciprocals[frequency]);
          },
          emit);
    }
  }
  if constexpr (kWrite) {
    *out.states = uint4{state[0], state[1], state[2], state[3]};
    // The unit holding word 0 is stored; a partial last-emitted unit was stored
    // with zeros above its words. Zero the padding units after them.
    for (std::uint32_t u = (out.word_count + 3) / 4; u < out.unit_count; ++u) out.units[u] = 0;
  } else {
    if (emitted % 4 != 0 && emitted < g.kept_words) kept[emitted / 4] = pending;  // the partial last unit
    s.stream_words[stream_index] = emitted;
    s.final_states[stream_index] = uint4{state[0], state[1], state[2], state[3]};
  }
}

// grid: groups; one CTA scans the stream sizes (4 + 2 * words bytes) into offsets.
__global__ void __launch_bounds__(kernels::tuning::kAnsScanThreads) stream_offsets_kernel(EncodeGeometry g, EncodeScratch s) {
  __shared__ std::uint64_t partial[kernels::tuning::kAnsScanThreads];
  const std::uint32_t group = blockIdx.x;
  const std::uint32_t streams = g.layout.stream_count;
  const std::uint32_t per_thread = (streams + blockDim.x - 1) / blockDim.x;
  const std::uint32_t begin = min(threadIdx.x * per_thread, streams);
  const std::uint32_t end = min(begin + per_thread, streams);
  const std::uint32_t* words = s.stream_words + std::uint64_t{group} * streams;
  std::uint64_t local = 0;
  auto stream_bytes = [](std::uint32_t word_count) {
    return (kAnsStreamHeaderBytes + 2 * std::uint64_t{word_count} + kAnsStreamAlignment - 1) / kAnsStreamAlignment *
           kAnsStreamAlignment;
  };
  for (std::uint32_t i = begin; i < end; ++i) local += stream_bytes(words[i]);
  partial[threadIdx.x] = local;
  __syncthreads();
  for (std::uint32_t stride = 1; stride < blockDim.x; stride *= 2) {  // Hillis-Steele inclusive scan
    const std::uint64_t add = threadIdx.x >= stride ? partial[threadIdx.x - stride] : 0;
    __syncthreads();
    partial[threadIdx.x] += add;
    __syncthreads();
  }
  std::uint64_t running = partial[threadIdx.x] - local;
  std::uint32_t* offsets = s.stream_offsets + std::uint64_t{group} * streams;
  for (std::uint32_t i = begin; i < end; ++i) {
    offsets[i] = static_cast<std::uint32_t>(running);
    running += stream_bytes(words[i]);
  }
  if (threadIdx.x == blockDim.x - 1) {
    s.data_bytes[group] = partial[threadIdx.x];
    s.blob_bytes[group] = g.layout.stream_data_offset + partial[threadIdx.x];
  }
}

// grid: (blocks, groups); header, class map (zero padding), frequencies, offsets.
__global__ void group_tables_kernel(EncodeGeometry g, EncodeScratch s, std::uint8_t* output,
                                    const std::uint64_t* group_offsets) {
  const std::uint32_t group = blockIdx.y;
  std::uint8_t* blob = output + group_offsets[group];
  const std::uint32_t thread = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint32_t threads = gridDim.x * blockDim.x;
  if (thread == 0) {
    AnsGroupHeader header{};
    header.magic = kAnsMagic;
    header.header_bytes = kAnsHeaderBytes;
    header.frame_count = frames_in_group(g, group);
    header.detector_rows = g.rows;
    header.detector_cols = g.cols;
    header.raw_words = s.class_params[2 * group + 1];
    header.class_scale = s.class_params[2 * group];
    header.stream_count = g.layout.stream_count;
    header.class_map_offset = g.layout.class_map_offset;
    header.freq_table_offset = g.layout.freq_table_offset;
    header.stream_offsets_offset = g.layout.stream_offsets_offset;
    header.stream_data_offset = g.layout.stream_data_offset;
    header.stream_data_bytes = s.data_bytes[group];
    header.total_bytes = s.blob_bytes[group];
    *reinterpret_cast<AnsGroupHeader*>(blob) = header;
  }
  const std::uint32_t class_map_bytes = g.layout.freq_table_offset - g.layout.class_map_offset;
  const std::uint8_t* classes = s.classes + std::uint64_t{group} * g.pixels_padded;
  for (std::uint32_t i = thread; i < class_map_bytes; i += threads)
    blob[g.layout.class_map_offset + i] = i < g.pixels ? classes[i] : 0;
  auto* frequencies = reinterpret_cast<std::uint16_t*>(blob + g.layout.freq_table_offset);
  const std::uint32_t* tables = s.tables + std::uint64_t{group} * kAnsClassCount * kAnsAlphabetSize;
  for (std::uint32_t i = thread; i < kAnsClassCount * kAnsAlphabetSize; i += threads)
    frequencies[i] = static_cast<std::uint16_t>(tables[i] & 0xffffu);
  auto* offsets = reinterpret_cast<std::uint32_t*>(blob + g.layout.stream_offsets_offset);
  const std::uint32_t* scratch_offsets = s.stream_offsets + std::uint64_t{group} * g.layout.stream_count;
  const std::uint32_t offset_slots = (g.layout.stream_data_offset - g.layout.stream_offsets_offset) / 4;
  for (std::uint32_t i = thread; i < offset_slots; i += threads)
    offsets[i] = i < g.layout.stream_count ? scratch_offsets[i] : 0u;
}

template <class T>
void launch_measure(const T* frames, const EncodeGeometry& g, const EncodeScratch& s, cudaStream_t stream) {
  using namespace kernels::tuning;
  const dim3 sum_grid((g.pixels + kAnsSumThreads - 1) / kAnsSumThreads,
                      (g.frames_per_group + kAnsSumFramesPerSlice - 1) / kAnsSumFramesPerSlice, g.group_count);
  pixel_sums_kernel<T><<<sum_grid, kAnsSumThreads, 0, stream>>>(frames, g, s);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "pixel_sums_kernel");
  class_map_kernel<<<g.group_count, kAnsClassMapThreads, 0, stream>>>(g, s);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "class_map_kernel");
  const dim3 count_grid((g.pixels + kAnsCountThreads - 1) / kAnsCountThreads,
                        (g.frames_per_group + kAnsCountFramesPerSlice - 1) / kAnsCountFramesPerSlice, g.group_count);
  symbol_counts_kernel<T><<<count_grid, kAnsCountThreads, 0, stream>>>(frames, g, s);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "symbol_counts_kernel");
  normalize_kernel<<<g.group_count, kAnsClassCount, 0, stream>>>(g, s);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "normalize_kernel");
  const dim3 encode_grid((g.layout.stream_count + kAnsEncodeThreads - 1) / kAnsEncodeThreads, g.group_count);
  encode_streams_kernel<T, false><<<encode_grid, kAnsEncodeThreads, 0, stream>>>(frames, g, s, nullptr, nullptr);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "encode_streams_kernel<measure>");
  stream_offsets_kernel<<<g.group_count, kAnsScanThreads, 0, stream>>>(g, s);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "stream_offsets_kernel");
}

template <class T>
void launch_write(const T* frames, const EncodeGeometry& g, const EncodeScratch& s, std::uint8_t* output,
                  const std::uint64_t* group_offsets, cudaStream_t stream) {
  using namespace kernels::tuning;
  group_tables_kernel<<<dim3(16, g.group_count), 256, 0, stream>>>(g, s, output, group_offsets);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "group_tables_kernel");
  const dim3 encode_grid((g.layout.stream_count + kAnsEncodeThreads - 1) / kAnsEncodeThreads, g.group_count);
  encode_streams_kernel<T, true><<<encode_grid, kAnsEncodeThreads, 0, stream>>>(frames, g, s, output, group_offsets);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "encode_streams_kernel<write>");
}

}  // namespace

std::size_t ans_group_count(std::uint64_t total_frames, std::uint32_t frames_per_group) noexcept {
  if (frames_per_group == 0) return 0;
  return static_cast<std::size_t>((total_frames + frames_per_group - 1) / frames_per_group);
}

std::size_t ans_encode_scratch_bytes(const AnsEncodeBatch& batch) { return plan_scratch(make_geometry(batch)).total; }

std::vector<std::uint64_t> ans_encode_measure(const AnsEncodeBatch& batch, void* d_scratch, std::size_t scratch_bytes,
                                              StreamHandle stream) {
  const EncodeGeometry g = make_geometry(batch);
  const ScratchPlan plan = plan_scratch(g);
  if (d_scratch == nullptr || scratch_bytes < plan.total) throw bad_request("ANS encode: scratch too small");
  const EncodeScratch s = scratch_pointers(d_scratch, plan);
  // Zero the accumulators (sums, maxima, counts).
  QUANTEM_CUDA_TRY(cudaMemsetAsync(s.pixel_sums, 0, std::size_t{g.group_count} * g.pixels * sizeof(std::uint64_t), stream));
  QUANTEM_CUDA_TRY(cudaMemsetAsync(s.max_values, 0, std::size_t{g.group_count} * sizeof(std::uint32_t), stream));
  QUANTEM_CUDA_TRY(cudaMemsetAsync(s.counts, 0,
                                   std::size_t{g.group_count} * kAnsClassCount * kAnsAlphabetSize * sizeof(std::uint32_t),
                                   stream));
  switch (batch.dtype) {
    case DType::uint8: launch_measure(static_cast<const std::uint8_t*>(batch.d_frames), g, s, stream); break;
    case DType::uint16: launch_measure(static_cast<const std::uint16_t*>(batch.d_frames), g, s, stream); break;
    case DType::uint32: launch_measure(static_cast<const std::uint32_t*>(batch.d_frames), g, s, stream); break;
  }
  std::vector<std::uint64_t> blob_bytes(g.group_count);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(blob_bytes.data(), s.blob_bytes, blob_bytes.size() * sizeof(std::uint64_t),
                                   cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  for (std::uint64_t bytes : blob_bytes)
    if (bytes > 0xffffffffull) throw bad_request("ANS encode: a group exceeds 4 GiB; use fewer frames per group");
  return blob_bytes;
}

void ans_encode_write(const AnsEncodeBatch& batch, const void* d_scratch, std::size_t scratch_bytes,
                      std::uint8_t* d_output, const std::uint64_t* d_group_offsets, StreamHandle stream) {
  const EncodeGeometry g = make_geometry(batch);
  const ScratchPlan plan = plan_scratch(g);
  if (d_scratch == nullptr || scratch_bytes < plan.total) throw bad_request("ANS encode: scratch too small");
  if (d_output == nullptr || d_group_offsets == nullptr) throw bad_request("ANS encode: null output");
  const EncodeScratch s = scratch_pointers(const_cast<void*>(d_scratch), plan);
  switch (batch.dtype) {
    case DType::uint8:
      launch_write(static_cast<const std::uint8_t*>(batch.d_frames), g, s, d_output, d_group_offsets, stream);
      break;
    case DType::uint16:
      launch_write(static_cast<const std::uint16_t*>(batch.d_frames), g, s, d_output, d_group_offsets, stream);
      break;
    case DType::uint32:
      launch_write(static_cast<const std::uint32_t*>(batch.d_frames), g, s, d_output, d_group_offsets, stream);
      break;
  }
}

}  // namespace quantem::cuda
