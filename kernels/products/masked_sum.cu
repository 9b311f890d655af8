// The masked sum of the ANS resident: for every frame, the exact sum of the
// values at a detector mask's pixels, decoding only the streams the mask
// touches (the bright-field and annular images are built from it).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "quantem/ans/ans_format.hpp"
#include "quantem/ans/ans_model.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/ans.hpp"
#include "quantem/kernels/cuda_check.hpp"
#include "../codec/ans_device.cuh"
#include "../codec/ans_resident.cuh"
#include "../common/tuning.cuh"
#include "../common/warp_collectives.cuh"

namespace quantem::kernels {
namespace {

using namespace quantem::ans;
namespace dev = quantem::kernels::device::ans_device;
using namespace quantem::kernels::device::ans_resident;

// One work item of a masked-sum launch: an active stream within one seek
// segment of the CTA's group. padded_streams is a multiple of 32, so a warp's
// lanes share one segment (and its frames).
struct SegmentItem {
  std::uint32_t segment;
  std::uint32_t index;  // into the entries
  std::uint32_t begin;  // the segment's frames within the group
  std::uint32_t end;
  bool active;
};

__device__ inline SegmentItem segment_item(const ResidentParams& p, std::uint32_t active_streams,
                                           std::uint32_t padded_streams, std::uint32_t segments,
                                           std::uint32_t frame_count) {
  SegmentItem item;
  const std::uint32_t flat = blockIdx.x * blockDim.x + threadIdx.x;
  item.segment = flat / padded_streams;
  item.index = flat % padded_streams;
  item.begin = item.segment * p.seek_frames;  // 0 without seek points (one segment)
  item.end = item.segment < p.seek_points ? min(frame_count, item.begin + p.seek_frames) : frame_count;
  item.active = item.segment < segments && item.begin < frame_count && item.index < active_streams;
  if (item.begin >= frame_count) item.end = item.begin;
  return item;
}

// A stream's entry: its id and, per mask k, the quad positions it counts (4
// bits at 4k): the two arrays of ans_mask_set_entries, or (quads null, one
// mask) the packed entries of ans_mask_entries.
template <int Masks>
__device__ inline void load_entry(const std::uint32_t* streams, const std::uint32_t* quads, std::uint32_t index,
                                  std::uint32_t& stream, std::uint32_t& stream_quads) {
  if (Masks == 1 && quads == nullptr) {
    const std::uint32_t entry = streams[index];
    stream = entry & 0x0fffffffu;
    stream_quads = entry >> 28;
  } else {
    stream = streams[index];
    stream_quads = quads[index];
  }
}

// What a stream counts of each frame's four values for each mask.
// Several masks: bits 4m..4m+3 of `quads`, tested per use (a thread has 64
// registers at 1024 threads a CTA: keep words per mask would spill).
template <int Masks>
struct QuadKeeps {
  std::uint32_t quads;
  __device__ explicit QuadKeeps(std::uint32_t stream_quads) : quads(stream_quads) {}
  __device__ std::uint32_t sum(int m, const std::uint32_t values[4]) const {
    const std::uint32_t bits = quads >> (4 * m);
    return ((bits & 1u) ? values[0] : 0u) + ((bits & 2u) ? values[1] : 0u) + ((bits & 4u) ? values[2] : 0u) +
           ((bits & 8u) ? values[3] : 0u);
  }
  __device__ unsigned long long sum_wide(int m, const std::uint32_t values[4]) const {
    const std::uint32_t bits = quads >> (4 * m);
    return ((bits & 1u) ? 0ull + values[0] : 0ull) + ((bits & 2u) ? 0ull + values[1] : 0ull) +
           ((bits & 4u) ? 0ull + values[2] : 0ull) + ((bits & 8u) ? 0ull + values[3] : 0ull);
  }
};

// One mask (every single product): keep words, value & keep[i] counts quad
// position i; in a plain frame the table entry & keep_symbol[i] is summed in
// place and shifted down once.
template <>
struct QuadKeeps<1> {
  std::uint32_t keep[4];
  std::uint32_t keep_symbol[4];
  __device__ explicit QuadKeeps(std::uint32_t stream_quads) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      keep[k] = ((stream_quads >> k) & 1u) ? 0xffffffffu : 0u;
      keep_symbol[k] = keep[k] & dev::kEntrySymbolMask;
    }
  }
  __device__ std::uint32_t sum(int, const std::uint32_t values[4]) const {
    return (values[0] & keep[0]) + (values[1] & keep[1]) + (values[2] & keep[2]) + (values[3] & keep[3]);
  }
  __device__ unsigned long long sum_wide(int, const std::uint32_t values[4]) const {
    unsigned long long total = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) total += values[k] & keep[k];
    return total;
  }
  __device__ std::uint32_t sum_symbols(const std::uint32_t entries[4]) const {
    return ((entries[0] & keep_symbol[0]) + (entries[1] & keep_symbol[1]) + (entries[2] & keep_symbol[2]) +
            (entries[3] & keep_symbol[3])) >>
           dev::kEntrySymbolShift;
  }
};

// The masks (bit m) that some lane of the warp counts.
template <int Masks>
__device__ inline std::uint32_t warp_masks_present(std::uint32_t stream_quads) {
  std::uint32_t mine = 0;
#pragma unroll
  for (int m = 0; m < Masks; ++m) mine |= ((stream_quads >> (4 * m)) & 0xfu) != 0 ? 1u << m : 0u;
  return __reduce_or_sync(0xffffffffu, mine);
}

// The frames [begin, end) of one stream, 16-bit groups: per frame and mask a
// warp sums its lanes' masked values (redux); lane j keeps the warp sums of
// frames 32i + j in a register and adds them to the CTA's per-frame sums in
// shared memory every 32 frames (a CTA's per-frame sum is < 1024 streams * 4 *
// 65535 < 2^32: 32-bit shared atomics, native and cheap).
template <int Masks>
__device__ inline void sum_frames_narrow(dev::StreamReader& reader, const std::uint32_t* table,
                                         const std::uint32_t class_offset[4], const std::uint32_t shift[4],
                                         bool raw_bits, const QuadKeeps<Masks>& keeps, std::uint32_t present,
                                         std::uint32_t begin, std::uint32_t end, std::uint32_t frame_count,
                                         std::uint32_t* frame_sums) {
  const std::uint32_t lane = threadIdx.x % 32;
  for (std::uint32_t first = begin; first < end; first += 32) {
    const std::uint32_t frames_here = min(32u, end - first);
    std::uint32_t mine[Masks] = {};  // the warp sums of frame first + lane
    for (std::uint32_t j = 0; j < frames_here; ++j) {
      reader.top_up();
      std::uint32_t entries[4];
      reader.lookup(table, class_offset, entries);
      std::uint32_t lane_sums[Masks];
      std::uint32_t values[4];
      if (!raw_bits && dev::StreamReader::plain(entries)) {
        reader.decode_plain(entries);
        if constexpr (Masks == 1) {
          lane_sums[0] = keeps.sum_symbols(entries);
        } else {  // in a plain frame the symbol is the value
#pragma unroll
          for (int k = 0; k < 4; ++k) values[k] = (entries[k] & dev::kEntrySymbolMask) >> dev::kEntrySymbolShift;
        }
      } else {
        reader.decode_checked(entries, shift, values);
        if constexpr (Masks == 1) lane_sums[0] = keeps.sum(0, values);
      }
      if constexpr (Masks > 1) {
#pragma unroll
        for (int m = 0; m < Masks; ++m) lane_sums[m] = (present >> m & 1u) != 0 ? keeps.sum(m, values) : 0u;
      }
#pragma unroll
      for (int m = 0; m < Masks; ++m) {
        if ((present >> m & 1u) == 0) continue;  // warp-uniform
        const std::uint32_t warp_sum = __reduce_add_sync(0xffffffffu, lane_sums[m]);
        if (lane == j) mine[m] = warp_sum;
      }
    }
#pragma unroll
    for (int m = 0; m < Masks; ++m) {
      if (lane < frames_here && mine[m] != 0) atomicAdd(frame_sums + m * frame_count + first + lane, mine[m]);
    }
  }
}

// The same for 32-bit groups: 64-bit sums.
template <int Masks>
__device__ inline void sum_frames_wide(dev::StreamReader& reader, const std::uint32_t* table,
                                       const std::uint32_t class_offset[4], const std::uint32_t shift[4], bool raw_bits,
                                       const QuadKeeps<Masks>& keeps, std::uint32_t present, std::uint32_t begin,
                                       std::uint32_t end, std::uint32_t frame_count, unsigned long long* frame_sums) {
  const std::uint32_t lane = threadIdx.x % 32;
  for (std::uint32_t first = begin; first < end; first += 32) {
    const std::uint32_t frames_here = min(32u, end - first);
    unsigned long long mine[Masks] = {};
    for (std::uint32_t j = 0; j < frames_here; ++j) {
      reader.top_up();
      std::uint32_t values[4];
      reader.decode_frame(table, class_offset, shift, raw_bits, values);
#pragma unroll
      for (int m = 0; m < Masks; ++m) {
        if ((present >> m & 1u) == 0) continue;  // warp-uniform
        const unsigned long long lane_sum = device::warp_sum_u64(keeps.sum_wide(m, values));
        if (lane == j) mine[m] = lane_sum;
      }
    }
#pragma unroll
    for (int m = 0; m < Masks; ++m) {
      if (lane < frames_here && mine[m] != 0) atomicAdd(frame_sums + m * frame_count + first + lane, mine[m]);
    }
  }
}

// One active stream's segment: opened (and sought), summed for every mask, and
// checked to end cleanly (the last segment) or exactly at the next seek point.
template <int Masks>
__device__ inline void sum_stream_segment(const ResidentParams& p, const OpenedGroup& opened,
                                          const std::uint32_t* table, const SegmentItem& item, std::uint32_t stream,
                                          std::uint32_t stream_quads, void* frame_sums, std::uint32_t* error) {
  const auto& [blob, header, first_frame, frame_count, valid] = opened;
  std::uint32_t class_offset[4];
  std::uint32_t shift[4];
  dev::StreamReader reader;
  if (item.active) {
    std::uint32_t pixels[4];
    const std::uint32_t present_pixels = dev::quad_pixels(stream, p.quad_cols, p.rows, p.cols, pixels);
    dev::quad_class_tables(blob, header, pixels, present_pixels, class_offset, shift);
    reader.open(blob + header.stream_data_offset,
                reinterpret_cast<const std::uint32_t*>(blob + header.stream_offsets_offset), stream,
                header.stream_count, header.stream_data_bytes);
    if (item.segment > 0) seek_to_segment(p, blockIdx.y, item.segment, stream, reader);
  } else {
    dev::no_quad(class_offset, shift, reader);
  }
  const bool raw_bits = __any_sync(0xffffffffu, (shift[0] | shift[1] | shift[2] | shift[3]) != 0);
  const QuadKeeps<Masks> keeps(stream_quads);
  const std::uint32_t present = warp_masks_present<Masks>(stream_quads);
  if (header.raw_words == 1) {
    sum_frames_narrow<Masks>(reader, table, class_offset, shift, raw_bits, keeps, present, item.begin, item.end,
                             frame_count, static_cast<std::uint32_t*>(frame_sums));
  } else {
    sum_frames_wide<Masks>(reader, table, class_offset, shift, raw_bits, keeps, present, item.begin, item.end,
                           frame_count, static_cast<unsigned long long*>(frame_sums));
  }
  if (item.active && error != nullptr) {
    const bool bad = item.end == frame_count
                         ? !reader.finished_cleanly()
                         : reader.corrupt || !at_seek_point(p, blockIdx.y, item.segment + 1, stream, reader);
    if (bad) atomicOr(error, 1u);
  }
}

// The CTA's per-frame sums of every mask added to the global ones.
__device__ inline void add_group_sums(const OpenedGroup& opened, std::uint32_t mask_count, const void* frame_sums,
                                      unsigned long long* sums, std::uint64_t sums_stride) {
  const std::uint32_t count = opened.frame_count;
  for (std::uint32_t i = threadIdx.x; i < mask_count * count; i += blockDim.x) {
    const unsigned long long frame_sum = opened.header.raw_words == 1
                                             ? static_cast<const std::uint32_t*>(frame_sums)[i]
                                             : static_cast<const unsigned long long*>(frame_sums)[i];
    if (frame_sum != 0) atomicAdd(sums + (i / count) * sums_stride + opened.first_frame + i % count, frame_sum);
  }
}

// grid: (blocks of (segment, active stream) items, groups). Each thread
// decodes one active stream's segment and adds its masked values to every
// mask's per-frame sums (Masks masks, up to kAnsMasksPerPass; sums of mask m
// at sums + m * sums_stride). Integer atomics: the result is exact and
// independent of the launch shape.
template <int Masks>
__global__ void __launch_bounds__(device::tuning::kAnsMaskedSumThreads)
    masked_sum_kernel(ResidentParams p, const std::uint32_t* __restrict__ streams,
                      const std::uint32_t* __restrict__ quads, std::uint32_t active_streams,
                      std::uint32_t padded_streams, std::uint32_t segments, std::uint32_t mask_count,
                      unsigned long long* sums, std::uint64_t sums_stride, std::uint32_t* error) {
  extern __shared__ __align__(16) std::uint8_t shared_bytes[];
  const GroupSumsShared shared = group_sums_shared(shared_bytes);
  const OpenedGroup opened = open_group_for_sums(p, error, shared, mask_count);
  if (!opened.valid) return;
  const std::uint32_t* table = shared.table;
  unsigned long long* frame_sums = shared.frame_sums;
  const SegmentItem item = segment_item(p, active_streams, padded_streams, segments, opened.frame_count);
  if (__any_sync(0xffffffffu, item.active)) {
    std::uint32_t stream = 0, stream_quads = 0;
    if (item.active) load_entry<Masks>(streams, quads, item.index, stream, stream_quads);
    sum_stream_segment<Masks>(p, opened, table, item, stream, stream_quads, frame_sums, error);
  }
  __syncthreads();
  add_group_sums(opened, mask_count, frame_sums, sums, sums_stride);
}

template <int Masks>
void launch_masked_sum(const ResidentParams& p, const AnsResidentView& resident, const std::uint32_t* d_streams,
                       const std::uint32_t* d_quads, std::uint32_t entry_count, std::uint32_t mask_count,
                       std::uint64_t* d_sums, std::uint32_t* d_error, StreamHandle stream) {
  const int threads = device::tuning::kAnsMaskedSumThreads;
  const std::size_t shared_bytes =
      table_shared_bytes(threads) + std::size_t{mask_count} * resident.frames_per_group * sizeof(std::uint64_t);
  QUANTEM_CUDA_TRY(cudaFuncSetAttribute(masked_sum_kernel<Masks>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
  // One work item per (segment, stream): the chains a group's streams decode
  // are seek_frames long instead of frames_per_group (more, shorter chains).
  const std::uint32_t padded = (entry_count + 31) / 32 * 32;
  const std::uint32_t segments = p.seek_points + 1;
  const std::uint64_t items = std::uint64_t{padded} * segments;
  const dim3 grid(static_cast<unsigned>((items + threads - 1) / threads), static_cast<unsigned>(resident.group_count));
  masked_sum_kernel<Masks><<<grid, threads, shared_bytes, stream>>>(
      p, d_streams, d_quads, entry_count, padded, segments, mask_count, reinterpret_cast<unsigned long long*>(d_sums),
      resident.total_frames, d_error);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "masked_sum_kernel");
}

}  // namespace

std::vector<std::uint32_t> ans_mask_entries(const std::vector<std::uint8_t>& detector_mask, std::uint32_t detector_rows,
                                            std::uint32_t detector_cols) {
  if (detector_mask.size() != std::size_t{detector_rows} * detector_cols)
    throw bad_request("masked sum: the mask must hold detector_rows * detector_cols bytes");
  const AnsGroupLayout layout = ans_group_layout(detector_rows, detector_cols);
  if (layout.stream_count >= (1u << 28)) throw bad_request("masked sum: detector too large");
  // Quad rows then quad columns (no division per stream: this runs on every
  // masked-sum request); a quad past an odd edge has no pixel there.
  std::vector<std::uint32_t> entries;
  std::uint32_t stream = 0;
  for (std::uint32_t row = 0; row < detector_rows; row += 2) {
    const std::uint8_t* top = detector_mask.data() + std::size_t{row} * detector_cols;
    const std::uint8_t* bottom = row + 1 < detector_rows ? top + detector_cols : nullptr;
    for (std::uint32_t col = 0; col < detector_cols; col += 2, ++stream) {
      // Four quads at once when none of their 16 pixels is selected (a
      // residual band or a disk leaves most of the detector empty).
      while (col + 8 <= detector_cols) {
        std::uint64_t top_word = 0, bottom_word = 0;
        std::memcpy(&top_word, top + col, 8);
        if (bottom != nullptr) std::memcpy(&bottom_word, bottom + col, 8);
        if ((top_word | bottom_word) != 0) break;
        col += 8;
        stream += 4;
      }
      if (col >= detector_cols) break;
      const bool right = col + 1 < detector_cols;
      const std::uint32_t mask = (top[col] != 0 ? 1u : 0u) | (right && top[col + 1] != 0 ? 2u : 0u) |
                                 (bottom != nullptr && bottom[col] != 0 ? 4u : 0u) |
                                 (bottom != nullptr && right && bottom[col + 1] != 0 ? 8u : 0u);
      if (mask != 0) entries.push_back(stream | (mask << 28));
    }
  }
  return entries;
}

AnsMaskSetEntries ans_mask_set_entries(const std::vector<std::vector<std::uint8_t>>& detector_masks,
                                       std::uint32_t detector_rows, std::uint32_t detector_cols) {
  if (detector_masks.empty() || detector_masks.size() > kAnsMasksPerPass)
    throw bad_request("masked sums: 1 to " + std::to_string(kAnsMasksPerPass) + " masks per pass");
  // Each mask's entries are ascending by stream: merged, a stream once with
  // every mask's quad positions beside it.
  std::vector<std::vector<std::uint32_t>> per_mask;
  for (const auto& mask : detector_masks) per_mask.push_back(ans_mask_entries(mask, detector_rows, detector_cols));
  std::vector<std::size_t> next(per_mask.size(), 0);
  AnsMaskSetEntries set;
  for (;;) {
    std::uint32_t stream = 0xffffffffu;
    for (std::size_t m = 0; m < per_mask.size(); ++m) {
      if (next[m] < per_mask[m].size()) stream = std::min(stream, per_mask[m][next[m]] & 0x0fffffffu);
    }
    if (stream == 0xffffffffu) break;
    std::uint32_t quads = 0;
    for (std::size_t m = 0; m < per_mask.size(); ++m) {
      if (next[m] < per_mask[m].size() && (per_mask[m][next[m]] & 0x0fffffffu) == stream) {
        quads |= (per_mask[m][next[m]] >> 28) << (4 * m);
        ++next[m];
      }
    }
    set.streams.push_back(stream);
    set.quads.push_back(quads);
  }
  return set;
}

AnsMaskedStreams::AnsMaskedStreams(const std::vector<std::uint8_t>& detector_mask, std::uint32_t detector_rows,
                                   std::uint32_t detector_cols) {
  const std::vector<std::uint32_t> entries = ans_mask_entries(detector_mask, detector_rows, detector_cols);
  active_streams_ = static_cast<std::uint32_t>(entries.size());
  if (!entries.empty()) {
    entries_ = DeviceBuffer(entries.size() * sizeof(std::uint32_t));
    copy_to_device(entries_.data(), entries.data(), entries.size() * sizeof(std::uint32_t));
  }
}

void ans_masked_sum(const AnsResidentView& resident, const std::uint32_t* d_entries, std::uint32_t entry_count,
                    std::uint64_t* d_sums, std::uint32_t* d_error, StreamHandle stream) {
  const ResidentParams p = make_resident_params(resident, "ANS decode");
  if (d_sums == nullptr) throw bad_request("masked sum: null output");
  if (entry_count != 0 && d_entries == nullptr) throw bad_request("masked sum: null mask entries");
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_sums, 0, resident.total_frames * sizeof(std::uint64_t), stream));
  if (entry_count == 0 || resident.group_count == 0) return;
  if (resident.group_count > 65535) throw bad_request("masked sum: more than 65535 groups");
  launch_masked_sum<1>(p, resident, d_entries, nullptr, entry_count, 1, d_sums, d_error, stream);
}

void ans_masked_sums(const AnsResidentView& resident, const std::uint32_t* d_streams, const std::uint32_t* d_quads,
                     std::uint32_t entry_count, std::uint32_t mask_count, std::uint64_t* d_sums,
                     std::uint32_t* d_error, StreamHandle stream) {
  const ResidentParams p = make_resident_params(resident, "ANS decode");
  if (d_sums == nullptr) throw bad_request("masked sums: null output");
  if (mask_count == 0 || mask_count > kAnsMasksPerPass)
    throw bad_request("masked sums: 1 to " + std::to_string(kAnsMasksPerPass) + " masks per pass");
  if (entry_count != 0 && (d_streams == nullptr || d_quads == nullptr))
    throw bad_request("masked sums: null mask entries");
  QUANTEM_CUDA_TRY(
      cudaMemsetAsync(d_sums, 0, std::uint64_t{mask_count} * resident.total_frames * sizeof(std::uint64_t), stream));
  if (entry_count == 0 || resident.group_count == 0) return;
  if (resident.group_count > 65535) throw bad_request("masked sums: more than 65535 groups");
  // Two instantiations: one mask (every single product) and the widest pass.
  if (mask_count == 1) {
    launch_masked_sum<1>(p, resident, d_streams, d_quads, entry_count, 1, d_sums, d_error, stream);
  } else {
    launch_masked_sum<kAnsMasksPerPass>(p, resident, d_streams, d_quads, entry_count, mask_count, d_sums, d_error,
                                        stream);
  }
}

}  // namespace quantem::kernels
