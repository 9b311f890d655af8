// The masked sum of the ANS resident: for every frame, the exact sum of the
// values at a detector mask's pixels, decoding only the streams the mask
// touches (the bright-field and annular images are built from it).
#include <cuda_runtime.h>

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

using device::ans_resident::group_decode_tables;
using device::ans_resident::make_resident_params;
using device::ans_resident::open_group_or_flag;
using device::ans_resident::OpenedGroup;
using device::ans_resident::ResidentParams;
using device::ans_resident::table_shared_bytes;

// grid: (blocks of active streams, groups). Each thread decodes one active
// stream; per frame a warp sums its lanes' masked values (redux) and adds the
// result to the CTA's per-frame sums in shared memory (16-bit groups: through
// one lane's register every 32 frames); at the end the CTA adds its sums to
// the global ones. Integer atomics: the result is exact and
// independent of the launch shape.
__global__ void __launch_bounds__(device::tuning::kAnsMaskedSumThreads)
    masked_sum_kernel(ResidentParams p, const std::uint32_t* __restrict__ entries, std::uint32_t active_streams,
                      std::uint32_t padded_streams, std::uint32_t segments, unsigned long long* sums,
                      std::uint32_t* error) {
  extern __shared__ __align__(16) std::uint8_t shared[];
  auto* table = reinterpret_cast<std::uint32_t*>(shared);
  auto* cdf_scratch = reinterpret_cast<std::uint16_t*>(table + dev::kDecodeTableEntries);
  auto* frame_sums = reinterpret_cast<unsigned long long*>(
      shared + table_shared_bytes(blockDim.x));
  const OpenedGroup opened = open_group_or_flag(p, blockIdx.y, error);
  if (!opened.valid) return;
  const auto& [blob, header, first_frame, frame_count, valid] = opened;
  // 16-bit groups: a CTA's per-frame sum is < 1024 streams * 4 * 65535 < 2^32,
  // so 32-bit shared atomics (native, cheap) hold it; 32-bit groups use 64 bits.
  auto* frame_sums32 = reinterpret_cast<std::uint32_t*>(frame_sums);
  for (std::uint32_t f = threadIdx.x; f < frame_count; f += blockDim.x) frame_sums[f] = 0;
  group_decode_tables(p, opened, blockIdx.y, table, cdf_scratch);  // ends with __syncthreads()

  // Work item = (segment, active stream); padded_streams is a multiple of 32,
  // so a warp's lanes share one segment (and its frames).
  const std::uint32_t item = blockIdx.x * blockDim.x + threadIdx.x;
  const std::uint32_t segment = item / padded_streams;
  const std::uint32_t index = item % padded_streams;
  const std::uint32_t segment_begin = segment * p.seek_frames;  // 0 without seek points (one segment)
  const std::uint32_t segment_end =
      segment < p.seek_points ? min(frame_count, segment_begin + p.seek_frames) : frame_count;
  const bool active = segment < segments && segment_begin < frame_count && index < active_streams;
  const bool warp_active = __any_sync(0xffffffffu, active);
  if (warp_active) {
    const std::uint32_t entry = active ? entries[index] : 0u;
    const std::uint32_t stream = entry & 0x0fffffffu;
    const std::uint32_t mask = entry >> 28;
    std::uint32_t class_offset[4];
    std::uint32_t shift[4];
    dev::StreamReader reader;
    if (active) {
      std::uint32_t pixels[4];
      const std::uint32_t present = dev::quad_pixels(stream, p.quad_cols, p.rows, p.cols, pixels);
      dev::quad_class_tables(blob, header, pixels, present, class_offset, shift);
      reader.open(blob + header.stream_data_offset,
                  reinterpret_cast<const std::uint32_t*>(blob + header.stream_offsets_offset), stream,
                  header.stream_count, header.stream_data_bytes);
      if (segment > 0) device::ans_resident::seek_to_segment(p, blockIdx.y, segment, stream, reader);
    } else {
      dev::no_quad(class_offset, shift, reader);
    }
    const std::uint32_t lane = threadIdx.x % 32;
    const bool raw_bits = __any_sync(0xffffffffu, (shift[0] | shift[1] | shift[2] | shift[3]) != 0);
    // The masked positions: value & keep[k] (all ones or zero); in a plain
    // frame the symbol is the value, summed in place inside the table entries
    // (entry & keep_symbol[k]) and shifted down once per frame.
    std::uint32_t keep[4];
    std::uint32_t keep_symbol[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      keep[k] = ((mask >> k) & 1u) ? 0xffffffffu : 0u;
      keep_symbol[k] = keep[k] & dev::kEntrySymbolMask;
    }
    if (header.raw_words == 1) {
      // Lane j collects the warp sums of frames 32i + j in a register and adds
      // them to the CTA's sums every 32 frames: one predicated add per frame
      // instead of a shared atomic, which the compiler turns into a
      // warp-aggregated sequence of a dozen instructions.
      const std::uint32_t segment_frames = segment_begin < frame_count ? segment_end - segment_begin : 0u;
      for (std::uint32_t first = 0; first < segment_frames; first += 32) {
        const std::uint32_t frames_here = min(32u, segment_frames - first);
        std::uint32_t mine = 0;  // the warp sum of frame segment_begin + first + lane
        for (std::uint32_t j = 0; j < frames_here; ++j) {
          reader.top_up();
          std::uint32_t frame_entries[4];
          reader.lookup(table, class_offset, frame_entries);
          std::uint32_t lane_sum;
          if (!raw_bits && dev::StreamReader::plain(frame_entries)) {
            reader.decode_plain(frame_entries);
            lane_sum = ((frame_entries[0] & keep_symbol[0]) + (frame_entries[1] & keep_symbol[1]) +
                        (frame_entries[2] & keep_symbol[2]) + (frame_entries[3] & keep_symbol[3])) >>
                       dev::kEntrySymbolShift;
          } else {
            std::uint32_t values[4];
            reader.decode_checked(frame_entries, shift, values);
            lane_sum = (values[0] & keep[0]) + (values[1] & keep[1]) + (values[2] & keep[2]) + (values[3] & keep[3]);
          }
          const std::uint32_t warp_sum = __reduce_add_sync(0xffffffffu, lane_sum);
          if (lane == j) mine = warp_sum;
        }
        if (lane < frames_here && mine != 0) atomicAdd(frame_sums32 + segment_begin + first + lane, mine);
      }
    } else {  // 32-bit groups: 64-bit sums, the same register-held per-frame sums
      const std::uint32_t segment_frames = segment_begin < frame_count ? segment_end - segment_begin : 0u;
      for (std::uint32_t first = 0; first < segment_frames; first += 32) {
        const std::uint32_t frames_here = min(32u, segment_frames - first);
        unsigned long long mine = 0;
        for (std::uint32_t j = 0; j < frames_here; ++j) {
          reader.top_up();
          std::uint32_t values[4];
          reader.decode_frame(table, class_offset, shift, raw_bits, values);
          unsigned long long lane_sum = 0;
#pragma unroll
          for (int k = 0; k < 4; ++k) lane_sum += values[k] & keep[k];
          lane_sum = device::warp_sum_u64(lane_sum);
          if (lane == j) mine = lane_sum;
        }
        if (lane < frames_here && mine != 0) atomicAdd(frame_sums + segment_begin + first + lane, mine);
      }
    }
    // The last segment ends the stream cleanly; any other ends exactly at the next seek point.
    if (active && error != nullptr) {
      const bool bad = segment_end == frame_count ? !reader.finished_cleanly()
                                                  : reader.corrupt || !device::ans_resident::at_seek_point(
                                                                          p, blockIdx.y, segment + 1, stream, reader);
      if (bad) atomicOr(error, 1u);
    }
  }
  __syncthreads();
  for (std::uint32_t f = threadIdx.x; f < frame_count; f += blockDim.x) {
    const unsigned long long frame_sum = header.raw_words == 1 ? frame_sums32[f] : frame_sums[f];
    if (frame_sum != 0) atomicAdd(sums + first_frame + f, frame_sum);
  }
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
  const int threads = device::tuning::kAnsMaskedSumThreads;
  const std::size_t shared_bytes =
      table_shared_bytes(threads) + std::size_t{resident.frames_per_group} * sizeof(std::uint64_t);
  QUANTEM_CUDA_TRY(cudaFuncSetAttribute(masked_sum_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
  // One work item per (segment, stream): the chains a group's streams decode
  // are seek_frames long instead of frames_per_group (more, shorter chains).
  const std::uint32_t padded = (entry_count + 31) / 32 * 32;
  const std::uint32_t segments = p.seek_points + 1;
  const std::uint64_t items = std::uint64_t{padded} * segments;
  const dim3 grid(static_cast<unsigned>((items + threads - 1) / threads), static_cast<unsigned>(resident.group_count));
  masked_sum_kernel<<<grid, threads, shared_bytes, stream>>>(
      p, d_entries, entry_count, padded, segments, reinterpret_cast<unsigned long long*>(d_sums), d_error);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "masked_sum_kernel");
}

}  // namespace quantem::kernels
