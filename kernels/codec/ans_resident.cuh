#pragma once
// The ANS resident as kernels see it, written once for the codec's decoders
// (ans_decode.cu) and the product kernels (kernels/products): the launch
// parameters checked on the host, the shared-memory size of the decode
// tables, and the prologue that opens one group (blob, header, frames) and
// checks its header against the resident's shape.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "quantem/ans/ans_format.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/host_device.hpp"
#include "quantem/kernels/ans.hpp"
#include "ans_device.cuh"

namespace quantem::kernels::device::ans_resident {

namespace dev = quantem::kernels::device::ans_device;

// What every kernel over the resident needs, passed by value.
struct ResidentParams {
  const std::uint8_t* d_blobs;
  const std::uint64_t* d_group_offsets;
  std::uint64_t total_frames;
  std::uint32_t frames_per_group;
  std::uint32_t rows;
  std::uint32_t cols;
  std::uint32_t quad_cols;
  std::uint32_t stream_count;
  const std::uint32_t* d_seek_points;  // null: no seek points (kernels::AnsResidentView)
  std::uint32_t seek_frames;           // frames between seek points (0 without)
  std::uint32_t seek_points;           // per group (ans_seek_points_per_group)
  const std::uint32_t* d_decode_tables;  // null: each CTA builds its group's (kernels::AnsResidentView)
};

// Checks a resident view (Error(bad_request) prefixed with `who`) and returns its parameters.
inline ResidentParams make_resident_params(const kernels::AnsResidentView& resident, const char* who) {
  using namespace quantem::ans;
  if (resident.d_blobs == nullptr || resident.d_group_offsets == nullptr)
    throw bad_request(std::string(who) + ": null resident pointers");
  if (resident.frames_per_group == 0 || resident.frames_per_group > kernels::kAnsMaxFramesPerGroup)
    throw bad_request(std::string(who) + ": frames_per_group must be 1.." + std::to_string(kernels::kAnsMaxFramesPerGroup));
  if (resident.detector_rows == 0 || resident.detector_cols == 0) throw bad_request(std::string(who) + ": empty detector");
  if (resident.group_count != kernels::ans_group_count(resident.total_frames, resident.frames_per_group))
    throw bad_request(std::string(who) + ": group_count does not match total_frames / frames_per_group");
  const AnsGroupLayout layout = ans_group_layout(resident.detector_rows, resident.detector_cols);
  const bool seekable = resident.d_seek_points != nullptr && resident.frames_per_seek_point != 0;
  const std::uint32_t seek_frames = seekable ? resident.frames_per_seek_point : 0;
  return {resident.d_blobs,
          resident.d_group_offsets,
          resident.total_frames,
          resident.frames_per_group,
          resident.detector_rows,
          resident.detector_cols,
          layout.quad_cols,
          layout.stream_count,
          seekable ? resident.d_seek_points : nullptr,
          seek_frames,
          kernels::ans_seek_points_per_group(resident.frames_per_group, seek_frames),
          resident.d_decode_tables};
}

// Where seek point `point` (1-based) of stream `stream` of group `group` lies:
// value j (0..3 the states, 4 the word index) at [j * stream_count].
__device__ inline const std::uint32_t* seek_point(const ResidentParams& p, std::uint32_t group, std::uint32_t point,
                                                  std::uint32_t stream) {
  return p.d_seek_points + (std::uint64_t{group} * p.seek_points + (point - 1)) * 5 * p.stream_count + stream;
}

// Moves an opened reader to the start of segment `segment` (> 0) of its group.
__device__ inline void seek_to_segment(const ResidentParams& p, std::uint32_t group, std::uint32_t segment,
                                       std::uint32_t stream, dev::StreamReader& reader) {
  const std::uint32_t* at = seek_point(p, group, segment, stream);
  std::uint32_t states[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) states[k] = __ldg(at + k * p.stream_count);
  reader.seek(states, __ldg(at + 4 * p.stream_count));
}

// True when a reader that decoded up to the start of segment `segment` (> 0)
// is where the seek table says (a check of the table, and of the stream).
__device__ inline bool at_seek_point(const ResidentParams& p, std::uint32_t group, std::uint32_t segment,
                                     std::uint32_t stream, const dev::StreamReader& reader) {
  const std::uint32_t* at = seek_point(p, group, segment, stream);
  bool same = __ldg(at + 4 * p.stream_count) == reader.word_index();
#pragma unroll
  for (int k = 0; k < 4; ++k) same = same && __ldg(at + k * p.stream_count) == reader.state[k];
  return same;
}

// Decode tables + per-warp cdf scratch, rounded up to 16 bytes.
QUANTEM_HOST_DEVICE constexpr std::size_t table_shared_bytes(unsigned threads) {
  return (dev::kDecodeTableEntries * sizeof(std::uint32_t) +
          std::size_t{threads / 32} * dev::kCdfScratchEntries * sizeof(std::uint16_t) + 15) / 16 * 16;
}

// One group as a CTA works on it: its blob, header and frames.
struct OpenedGroup {
  const std::uint8_t* blob;
  quantem::ans::AnsGroupHeader header;
  std::uint64_t first_frame;
  std::uint32_t frame_count;
  bool valid;  // the header matches the resident (magic, shape, frame count, stream count, ranges)
};

__device__ inline OpenedGroup open_group(const ResidentParams& p, std::uint32_t group) {
  using namespace quantem::ans;
  OpenedGroup opened;
  opened.blob = p.d_blobs + p.d_group_offsets[group];
  opened.header = dev::load_header(opened.blob);
  opened.first_frame = std::uint64_t{group} * p.frames_per_group;
  const std::uint64_t left = p.total_frames - opened.first_frame;
  opened.frame_count = left < p.frames_per_group ? static_cast<std::uint32_t>(left) : p.frames_per_group;
  const AnsGroupHeader& h = opened.header;
  opened.valid = h.magic == kAnsMagic && h.detector_rows == p.rows && h.detector_cols == p.cols &&
                 h.frame_count == opened.frame_count && (h.raw_words == 1 || h.raw_words == 2) &&
                 h.class_scale >= 1 && h.class_scale <= 4096 && h.stream_count == p.stream_count;
  return opened;
}

// The decode tables of an opened group in shared memory: copied from the
// tables built at load when the resident has them (16-byte loads by every
// thread), else built from the group's frequency tables. Ends with
// __syncthreads(); call from every thread of the CTA.
__device__ inline void group_decode_tables(const ResidentParams& p, const OpenedGroup& opened, std::uint32_t group,
                                           std::uint32_t* table, std::uint16_t* cdf_scratch) {
  static_assert(dev::kDecodeTableEntries % 4 == 0, "decode tables are copied 16 bytes at a time");
  if (p.d_decode_tables != nullptr) {
    const uint4* from = reinterpret_cast<const uint4*>(p.d_decode_tables + std::uint64_t{group} * dev::kDecodeTableEntries);
    uint4* to = reinterpret_cast<uint4*>(table);
    for (std::uint32_t i = threadIdx.x; i < dev::kDecodeTableEntries / 4; i += blockDim.x) to[i] = __ldg(from + i);
    __syncthreads();
    return;
  }
  dev::build_decode_tables(opened.blob, opened.header, table, cdf_scratch);
}

// open_group, and when the group does not match the resident, the error flag
// set once per CTA (thread 0); the caller returns when !valid.
__device__ inline OpenedGroup open_group_or_flag(const ResidentParams& p, std::uint32_t group, std::uint32_t* error) {
  const OpenedGroup opened = open_group(p, group);
  if (!opened.valid && threadIdx.x == 0 && error != nullptr) atomicOr(error, 1u);
  return opened;
}

// A CTA's dynamic shared memory when it sums per frame of one group: the
// decode tables, the CDF scratch they are built in (table_shared_bytes), then
// the per-frame sums.
struct GroupSumsShared {
  std::uint32_t* table;
  std::uint16_t* cdf_scratch;
  unsigned long long* frame_sums;
};

__device__ inline GroupSumsShared group_sums_shared(std::uint8_t* shared) {
  auto* table = reinterpret_cast<std::uint32_t*>(shared);
  return {table, reinterpret_cast<std::uint16_t*>(table + dev::kDecodeTableEntries),
          reinterpret_cast<unsigned long long*>(shared + table_shared_bytes(blockDim.x))};
}

// The prologue of a kernel that sums per frame of the CTA's group
// (blockIdx.y): the group opened (a malformed one flagged: the CTA returns on
// !valid), `sums_per_frame` x frame_count per-frame sums zeroed and the decode
// tables in place. Ends with __syncthreads() when valid; call from every thread.
__device__ inline OpenedGroup open_group_for_sums(const ResidentParams& p, std::uint32_t* error,
                                                  const GroupSumsShared& shared, std::uint32_t sums_per_frame) {
  const OpenedGroup opened = open_group_or_flag(p, blockIdx.y, error);
  if (!opened.valid) return opened;
  for (std::uint32_t i = threadIdx.x; i < sums_per_frame * opened.frame_count; i += blockDim.x) shared.frame_sums[i] = 0;
  group_decode_tables(p, opened, blockIdx.y, shared.table, shared.cdf_scratch);
  return opened;
}

}  // namespace quantem::kernels::device::ans_resident
