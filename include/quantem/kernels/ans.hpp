#pragma once
// GPU encoder, decoder and masked sum of the lossless ANS resident (format:
// include/quantem/ans/ans_format.hpp; CPU reference: include/quantem/ans/ans_codec.hpp;
// design: docs/kernels.md). CUDA-free header; implemented in kernels/codec/ans_*.cu.
//
// The GPU encoder writes byte-identical groups to the CPU reference, so either
// side decodes what the other wrote. All pointers named d_* are device pointers.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quantem/ans/ans_format.hpp"
#include "quantem/core/dtype.hpp"
#include "quantem/kernels/device.hpp"

namespace quantem::kernels {

// Largest group the kernels accept (the masked sum keeps one uint64 per frame
// of a group in shared memory).
inline constexpr std::uint32_t kAnsMaxFramesPerGroup = 8192;

// Dense frames on the device, cut into groups of frames_per_group frames (the
// last group takes the remainder).
struct AnsEncodeBatch {
  const void* d_frames = nullptr;        // device: total_frames frames, frame-major, row-major
  DType dtype = DType::uint16;
  std::uint64_t total_frames = 0;
  std::uint32_t frames_per_group = 2048;  // 1 .. kAnsMaxFramesPerGroup
  std::uint32_t detector_rows = 0;
  std::uint32_t detector_cols = 0;
  // The measuring pass keeps up to this many 16-bit words per frame of each
  // stream (a stream codes 4 values per frame) in the scratch, and the write
  // pass copies them instead of encoding again; a stream that needs more is
  // encoded again. 0: always encode again (smallest scratch). 2 words per frame
  // = 8 bits per value, far above what counting data needs.
  std::uint32_t kept_words_per_frame = 2;
  // Optional: ans_encode_measure also writes the seek table of this batch's
  // groups (the layout of ans_record_seek_points, ans_seek_table_words values)
  // at d_seek_points, from the encoder's own states: a rANS decoder before
  // frame f holds exactly the states the encoder had after encoding frame f
  // (frames are encoded last to first), and its next word is the first one the
  // encoder emitted before them. No decode pass. Points at frames a short last
  // group does not hold are zeroed (as ans_record_seek_points leaves them).
  std::uint32_t* d_seek_points = nullptr;
  std::uint32_t frames_per_seek_point = 0;  // 0: no seek table
  // Optional: ans_encode_measure adds each pixel's sum over the batch's frames
  // to d_pattern_sum[pixel] (uint64, exact), from the sums its model is built
  // from (no extra pass over the frames).
  std::uint64_t* d_pattern_sum = nullptr;
};

std::size_t ans_group_count(std::uint64_t total_frames, std::uint32_t frames_per_group) noexcept;

// Device scratch for ans_encode_measure + ans_encode_write of this batch.
// Throws quantem::Error(bad_request) for an invalid batch.
std::size_t ans_encode_scratch_bytes(const AnsEncodeBatch& batch);

// Builds every group's model (classes, frequency tables) and sizes every
// stream, then waits for `stream` and returns each group's blob size in bytes.
std::vector<std::uint64_t> ans_encode_measure(const AnsEncodeBatch& batch, void* d_scratch, std::size_t scratch_bytes,
                                              StreamHandle stream);
// ans_encode_measure without the wait: enqueues the measuring pass and the
// copy of each group's blob size to h_blob_bytes (pinned host memory, one
// uint64 per group), which hold them once `stream` has passed this point
// (wait on an event recorded after the call). The caller checks that no group
// exceeds 4 GiB (ans_encode_check_sizes), as ans_encode_measure does.
void ans_encode_measure_async(const AnsEncodeBatch& batch, void* d_scratch, std::size_t scratch_bytes,
                              std::uint64_t* h_blob_bytes, StreamHandle stream);
// Throws Error(bad_request) when a group's blob exceeds 4 GiB.
void ans_encode_check_sizes(const std::vector<std::uint64_t>& blob_bytes);

// Writes group g's blob at d_output + d_group_offsets[g] (offsets device-side,
// each a multiple of 16, with the sizes from ans_encode_measure). Needs the scratch
// filled by ans_encode_measure for the same batch. Asynchronous.
void ans_encode_write(const AnsEncodeBatch& batch, const void* d_scratch, std::size_t scratch_bytes,
                      std::uint8_t* d_output, const std::uint64_t* d_group_offsets, StreamHandle stream);

// An encoded resident on the device: group blobs in one buffer.
struct AnsResidentView {
  const std::uint8_t* d_blobs = nullptr;           // device
  const std::uint64_t* d_group_offsets = nullptr;  // device: group g at d_blobs + offset[g] (multiples of 16)
  std::size_t group_count = 0;
  std::uint32_t frames_per_group = 0;              // every group but the last
  std::uint64_t total_frames = 0;
  std::uint32_t detector_rows = 0;
  std::uint32_t detector_cols = 0;
  // Optional seek points (ans_record_seek_points) of these groups: a stream's
  // decoding may start at any multiple of frames_per_seek_point instead of at
  // the group's first frame. Null: every decode starts at frame 0.
  const std::uint32_t* d_seek_points = nullptr;
  std::uint32_t frames_per_seek_point = 0;
  // Optional decode tables of these groups (ans_build_decode_tables),
  // ans_decode_table_words() per group: a decoding CTA copies its group's
  // instead of building them. Null: every CTA builds them.
  const std::uint32_t* d_decode_tables = nullptr;
};

// The decode tables of one group as a CTA holds them in shared memory (32
// classes x 1024 slots, then the neutral entry padded to 16 bytes; built from
// the group's frequency tables, not part of the stored format), in 32-bit words.
inline constexpr std::uint32_t ans_decode_table_words() noexcept {
  return quantem::ans::kAnsClassCount * quantem::ans::kAnsProbabilityScale + 4;
}

// Writes the decode tables of every group of `resident` at d_tables (group g
// at g * ans_decode_table_words()). d_error (may be null) is set non-zero for
// a group whose header does not match the resident. Asynchronous.
void ans_build_decode_tables(const AnsResidentView& resident, std::uint32_t* d_tables, std::uint32_t* d_error,
                             StreamHandle stream);

// Seek points: a stream of a group is a chain of frames_per_group frames, each
// decoded after the previous one, so reaching frame f costs f frames and a
// kernel's latency is one whole chain. For every group, every stream and every
// point s = 1 .. ans_seek_points_per_group() - the group's frame s·K (K =
// frames_per_seek_point) - the table holds what a reader has before decoding
// that frame: its 4 rANS states and the index of its next unread 16-bit word.
// Layout, uint32: [group][point s - 1][5][stream] (states 0..3, then the word
// index), so one warp's loads are coalesced. Not part of the stored format: it
// is derived from the groups once (at load) and kept beside them.
inline std::uint32_t ans_seek_points_per_group(std::uint32_t frames_per_group,
                                               std::uint32_t frames_per_seek_point) noexcept {
  return frames_per_seek_point == 0 || frames_per_group == 0 ? 0 : (frames_per_group - 1) / frames_per_seek_point;
}
// uint32 values of the seek table of group_count groups of stream_count streams.
inline std::uint64_t ans_seek_table_words(std::uint64_t group_count, std::uint32_t frames_per_group,
                                          std::uint32_t frames_per_seek_point, std::uint32_t stream_count) noexcept {
  return group_count * ans_seek_points_per_group(frames_per_group, frames_per_seek_point) * 5 *
         std::uint64_t{stream_count};
}

// Decodes every stream of every group of `resident` (its own seek points are
// ignored) and writes the seek table of these groups at d_points
// (ans_seek_table_words values). d_error (may be null) is set non-zero when a
// stream is malformed. Asynchronous.
void ans_record_seek_points(const AnsResidentView& resident, std::uint32_t frames_per_seek_point,
                            std::uint32_t* d_points, std::uint32_t* d_error, StreamHandle stream);

// Decodes groups [first_group, first_group + group_count) into dense frames of
// out_dtype (uint16 or uint32; a value that does not fit uint16 is truncated
// to its low 16 bits and reported through d_error) at d_out, frame-major from
// the first group's first frame. d_error (device, one uint32, may be null) is
// set non-zero when a stream is malformed. Asynchronous.
void ans_decode_frames(const AnsResidentView& resident, std::size_t first_group, std::size_t group_count,
                       DType out_dtype, void* d_out, std::uint32_t* d_error, StreamHandle stream);

// A detector mask prepared for masked sums, on the host: one entry per stream
// that holds at least one masked pixel, `stream id | (pixel mask << 28)`
// (bit k of the pixel mask: quad position k counts).
std::vector<std::uint32_t> ans_mask_entries(const std::vector<std::uint8_t>& detector_mask, std::uint32_t detector_rows,
                                            std::uint32_t detector_cols);

// Several detector masks prepared for one masked-sum pass (the products of one
// plan): one entry per stream that any mask touches, ascending; quads[i] holds
// mask m's quad positions in bits 4m..4m+3. At most kAnsMasksPerPass masks.
inline constexpr std::uint32_t kAnsMasksPerPass = 4;
struct AnsMaskSetEntries {
  std::vector<std::uint32_t> streams;
  std::vector<std::uint32_t> quads;
};
AnsMaskSetEntries ans_mask_set_entries(const std::vector<std::vector<std::uint8_t>>& detector_masks,
                                       std::uint32_t detector_rows, std::uint32_t detector_cols);

// The same entries in device memory (synchronous allocation and copy): build
// once per mask and reuse. Request paths that must not synchronise the device
// place ans_mask_entries() in their own stream-ordered scratch instead.
class AnsMaskedStreams {
 public:
  AnsMaskedStreams(const std::vector<std::uint8_t>& detector_mask, std::uint32_t detector_rows,
                   std::uint32_t detector_cols);
  std::uint32_t active_streams() const noexcept { return active_streams_; }
  const std::uint32_t* d_entries() const noexcept { return entries_.as<std::uint32_t>(); }

 private:
  DeviceBuffer entries_;  // ans_mask_entries()
  std::uint32_t active_streams_ = 0;
};

// For every frame of the resident, the exact sum of the values at the masked
// pixels, decoding only the streams the mask touches: d_sums[frame] (uint64,
// total_frames values) is overwritten. d_entries: entry_count entries of
// ans_mask_entries() in device memory. Asynchronous. The sum is an integer sum
// and does not depend on the launch shape.
void ans_masked_sum(const AnsResidentView& resident, const std::uint32_t* d_entries, std::uint32_t entry_count,
                    std::uint64_t* d_sums, std::uint32_t* d_error, StreamHandle stream);
// The masked sums of mask_count masks (1..kAnsMasksPerPass) in one pass: each
// touched stream is decoded once for all of them. d_streams, d_quads:
// entry_count values of ans_mask_set_entries() in device memory; the sums of
// mask m are d_sums[m * total_frames + frame] (overwritten). Asynchronous.
void ans_masked_sums(const AnsResidentView& resident, const std::uint32_t* d_streams, const std::uint32_t* d_quads,
                     std::uint32_t entry_count, std::uint32_t mask_count, std::uint64_t* d_sums,
                     std::uint32_t* d_error, StreamHandle stream);
inline void ans_masked_sum(const AnsResidentView& resident, const AnsMaskedStreams& mask, std::uint64_t* d_sums,
                           std::uint32_t* d_error, StreamHandle stream) {
  ans_masked_sum(resident, mask.d_entries(), mask.active_streams(), d_sums, d_error, stream);
}

}  // namespace quantem::kernels
