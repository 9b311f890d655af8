#include "cuda_load_plan.hpp"

#include <algorithm>
#include <string>

#include "quantem/ans/ans_format.hpp"
#include "quantem/backend/ring_partition.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/ans.hpp"
#include "quantem/kernels/bitshuffle_lz4.hpp"
#include "quantem/kernels/resident_products.hpp"
#include "cuda_support.hpp"

namespace quantem::backend::cuda {
namespace {

// 2048 frames per group. 1024 makes the load a little faster (the encoder
// runs twice the streams per 1 GiB batch) but every masked sum slower: its
// CTAs hold a group's 128 KiB decode tables (one CTA per SM) and never span
// groups, so twice the groups round up to more CTAs, and a BF disk's masked
// sum takes markedly longer (docs/benchmarks.md has both figures). A load
// happens once, a masked sum on every request: 2048.
constexpr std::uint32_t kDefaultFramesPerGroup = 2048;
// Frames between a stream's seek points: a group of 2048 frames decodes as
// chains of at most 512 (3 points per stream, 20 bytes each).
constexpr std::uint32_t kDefaultFramesPerSeekPoint = 512;
constexpr std::uint64_t kDefaultBatchDenseBytes = std::uint64_t{1} << 30;
constexpr std::uint32_t kMaxGroupsPerBatch = 64;
constexpr std::uint64_t kDefaultStagingBytes = std::uint64_t{64} << 20;
constexpr std::uint64_t kDefaultRecentFramesMaxBytes = std::uint64_t{64} << 20;
constexpr std::uint32_t kDefaultSubBatchFrames = 4096;

std::uint64_t align16(std::uint64_t value) { return (value + 15) / 16 * 16; }

// Encoded bytes a value may take, in quarter bytes. uint32: the format's own
// bound (at most three 16-bit words per value: a symbol and two raw halves).
// uint8/uint16: an admission cap (2 and 2.5 bytes per value) far above what
// counting data encodes to (sparse counts take a fraction of a byte) but below
// the format's worst case of 4 bytes; the load fails cleanly rather than exceed it.
std::uint64_t cap_quarter_bytes(DType dtype) {
  switch (dtype) {
    case DType::uint8: return 8;
    case DType::uint16: return 10;
    case DType::uint32: return 24;
  }
  return 24;
}

// The steps of plan_cuda_load, in order; each fills its part of `plan`.
// The frames, their shape and dtype, and the limits of the resident.
void plan_frames(const catalog::Acquisition& acquisition, CudaLoadPlan& plan) {
  plan.source_dtype = acquisition.dtype.value_or(DType::uint32);
  plan.frames = acquisition.frame_count();
  plan.frame_pixels = acquisition.frame_pixels();
  plan.frame_bytes = plan.frame_pixels * dtype_size(plan.source_dtype);
  if (plan.frames == 0 || plan.frame_pixels == 0) throw unprocessable(acquisition.name + " has no frames to load");
  if (acquisition.detector_rows > 65535 || acquisition.detector_cols > 65535 ||
      plan.frame_pixels >= (std::uint64_t{1} << 31)) {
    throw unprocessable(acquisition.name + ": a " + std::to_string(acquisition.detector_rows) + " x " +
                        std::to_string(acquisition.detector_cols) +
                        " detector is larger than the CUDA resident holds (65535 pixels per axis, 2^31 per frame)");
  }
}

// ANS groups, and the batches of groups decoded before each encode.
void plan_groups(const catalog::Acquisition& acquisition, const CudaLoadTuning& tuning, CudaLoadPlan& plan) {
  std::uint64_t frames_per_group = tuning.frames_per_group != 0 ? tuning.frames_per_group : kDefaultFramesPerGroup;
  frames_per_group = std::min<std::uint64_t>(frames_per_group, kernels::kMomentsMaxFramesPerGroup);
  frames_per_group = std::min<std::uint64_t>(frames_per_group, ((std::uint64_t{1} << 32) - 1) / plan.frame_pixels);
  frames_per_group = std::max<std::uint64_t>(frames_per_group, 1);
  plan.frames_per_group = static_cast<std::uint32_t>(frames_per_group);
  plan.groups = (plan.frames + frames_per_group - 1) / frames_per_group;
  if (plan.groups > 65535 * std::uint64_t{kMaxGroupsPerBatch}) {
    throw unprocessable(acquisition.name + " has too many frames for one CUDA resident");
  }
  std::uint64_t groups_per_batch =
      tuning.groups_per_batch != 0 ? tuning.groups_per_batch
                                   : std::max<std::uint64_t>(1, kDefaultBatchDenseBytes / (frames_per_group * plan.frame_bytes));
  groups_per_batch = std::min<std::uint64_t>({groups_per_batch, kMaxGroupsPerBatch, plan.groups});
  plan.groups_per_batch = static_cast<std::uint32_t>(groups_per_batch);
  plan.batch_frames = std::min(plan.frames, groups_per_batch * frames_per_group);
  plan.batches = (plan.groups + groups_per_batch - 1) / groups_per_batch;
}

// The staging slots the reads fill, the GPU decoder's sub-batches and scratch.
void plan_staging(const catalog::Acquisition& acquisition, const CudaLoadTuning& tuning, CudaLoadPlan& plan) {
  plan.max_stored_chunk_bytes = 3 * plan.frame_bytes + 4096;
  plan.staging_bytes = align16(std::max(tuning.staging_bytes != 0 ? tuning.staging_bytes : kDefaultStagingBytes,
                                        plan.max_stored_chunk_bytes));
  plan.sub_batch_frames = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(tuning.sub_batch_frames != 0 ? tuning.sub_batch_frames : kDefaultSubBatchFrames,
                              plan.batch_frames));
  const std::size_t element = dtype_size(plan.source_dtype);
  plan.gpu_decoder = acquisition.chunk_format.filter == codec::ChunkFilter::bitshuffle_lz4 &&
                     (element == 1 || element == 2 || element == 4);

  plan.masked_list_bytes = 0;
  for (const std::uint8_t m : acquisition.pixel_mask) plan.masked_list_bytes += m != 0 ? 4 : 0;
  plan.table_offset = plan.staging_bytes;
  plan.device_slot_bytes = plan.staging_bytes + align16(std::uint64_t{plan.sub_batch_frames} * 8) +
                           std::uint64_t{plan.sub_batch_frames} * 4;
  if (plan.gpu_decoder) {
    kernels::BitshuffleLz4Batch shape;
    shape.element_size = element;
    shape.elements_per_chunk = plan.frame_pixels;
    shape.chunk_count = plan.sub_batch_frames;
    shape.stored_bytes = plan.staging_bytes;  // a slot's bytes: the decoder's sequence tables scale with them
    plan.bslz4_scratch_bytes = kernels::bitshuffle_lz4_scratch_bytes(shape);
  }
}

// The dense batches, the encoder's scratch and the launch tuning the load and the resident use.
void plan_encoder(const catalog::Acquisition& acquisition, const CudaLoadTuning& tuning, CudaLoadPlan& plan) {
  plan.dense_batch_bytes = plan.batch_frames * plan.frame_bytes;
  plan.batch_statuses_bytes = align16(plan.batch_frames * 4);
  plan.batch_misc_bytes = 16 + std::uint64_t{plan.groups_per_batch} * 8;
  kernels::AnsEncodeBatch encode;
  encode.d_frames = reinterpret_cast<const void*>(std::uintptr_t{256});  // sizing only, never read
  encode.dtype = plan.source_dtype;
  encode.total_frames = plan.batch_frames;
  encode.frames_per_group = plan.frames_per_group;
  encode.detector_rows = static_cast<std::uint32_t>(acquisition.detector_rows);
  encode.detector_cols = static_cast<std::uint32_t>(acquisition.detector_cols);
  plan.kept_words_per_frame = tuning.kept_words_per_frame == 0 ? encode.kept_words_per_frame
                              : tuning.kept_words_per_frame == CudaLoadTuning::kNoKeptWords ? 0
                                                                                            : tuning.kept_words_per_frame;
  encode.kept_words_per_frame = plan.kept_words_per_frame;
  plan.prioritise_encoder = tuning.prioritise_encoder;
  plan.bslz4_tuning.blocks_per_warp = tuning.bslz4_blocks_per_warp;
  plan.bslz4_tuning.grid_percent = tuning.bslz4_grid_percent;
  plan.bslz4_tuning.batched_literals = tuning.bslz4_batched_literals;
  kernels::check_bitshuffle_lz4_tuning(plan.bslz4_tuning);
  plan.accumulate_frames_cta_threads = tuning.accumulate_frames_cta_threads;
  kernels::check_ans_accumulate_frames_cta_threads(plan.accumulate_frames_cta_threads);
  plan.encode_scratch_bytes = kernels::ans_encode_scratch_bytes(encode);
  plan.group_offsets_bytes = plan.groups * 8;
}

// Upper bounds of what the resident keeps: encoded groups, ring table,
// moments, seek points, decode tables, recent frames.
void plan_resident_bounds(const catalog::Acquisition& acquisition, const CudaLoadTuning& tuning, CudaLoadPlan& plan) {
  const auto rows = static_cast<std::uint32_t>(acquisition.detector_rows);
  const auto cols = static_cast<std::uint32_t>(acquisition.detector_cols);
  const std::uint64_t frames_per_group = plan.frames_per_group;
  const ans::AnsGroupLayout layout = ans::ans_group_layout(rows, cols);
  const auto group_bound = [&](std::uint64_t frames) {
    const std::uint64_t data = (frames * plan.frame_pixels * cap_quarter_bytes(plan.source_dtype) + 3) / 4;
    // Each stream: 16 bytes of states, its words, and up to 14 bytes of padding (< 32).
    return align16(layout.stream_data_offset + std::uint64_t{layout.stream_count} * 32 + data);
  };
  const std::uint64_t full_groups = plan.frames / frames_per_group;
  const std::uint64_t last_frames = plan.frames % frames_per_group;
  plan.resident_bound_bytes = full_groups * group_bound(frames_per_group) + group_bound(last_frames) * (last_frames != 0);
  // ring_sum_bytes_for, at most: no ring holds more than every pixel.
  const std::uint64_t largest_value = plan.source_dtype == DType::uint8 ? 0xffu : 0xffffu;
  const std::uint64_t widest_sum =
      plan.source_dtype == DType::uint32 || plan.frame_pixels * largest_value >= (std::uint64_t{1} << 32) ? 8 : 4;
  plan.ring_table_bound_bytes = std::uint64_t{max_ring_count(rows, cols)} * plan.frames * widest_sum;
  // The pattern sum (uint64), the pixels sorted by ring (uint32), their
  // rings and every pixel's ring (uint16 each): four allocations.
  plan.ring_setup_bytes = plan.frame_pixels * (8 + 4 + 2 + 2);
  plan.frame_moments_bytes = plan.frames * 3 * 8;
  const std::uint32_t seek_frames =
      tuning.frames_per_seek_point == CudaLoadTuning::kNoSeekPoints ? 0
      : tuning.frames_per_seek_point != 0                          ? tuning.frames_per_seek_point
                                                                   : kDefaultFramesPerSeekPoint;
  plan.frames_per_seek_point = kernels::ans_seek_points_per_group(plan.frames_per_group, seek_frames) != 0 ? seek_frames : 0;
  plan.seek_points_from_encoder = tuning.seek_points_from_encoder;
  plan.seek_table_bytes =
      kernels::ans_seek_table_words(plan.groups, plan.frames_per_group, plan.frames_per_seek_point, layout.stream_count) * 4;
  plan.decode_table_bytes = tuning.decode_tables_at_load ? plan.groups * std::uint64_t{kernels::ans_decode_table_words()} * 4 : 0;
  // One seek segment (a group when there are no seek points), at most the byte cap.
  const std::uint64_t segment_frames =
      std::min<std::uint64_t>(plan.frames, plan.frames_per_seek_point != 0 ? plan.frames_per_seek_point : plan.frames_per_group);
  const std::uint64_t recent_cap =
      tuning.recent_frames_max_bytes == CudaLoadTuning::kNoRecentFrames ? 0
      : tuning.recent_frames_max_bytes != 0                            ? tuning.recent_frames_max_bytes
                                                                       : kDefaultRecentFramesMaxBytes;
  plan.recent_frames = plan.frame_bytes == 0 ? 0 : std::min(segment_frames, recent_cap / plan.frame_bytes);
  plan.recent_frames_bytes = plan.recent_frames * plan.frame_bytes;
}

}  // namespace

CudaLoadPlan plan_cuda_load(const catalog::Acquisition& acquisition, const CudaLoadTuning& tuning) {
  CudaLoadPlan plan;
  plan_frames(acquisition, plan);
  plan_groups(acquisition, tuning, plan);
  plan_staging(acquisition, tuning, plan);
  plan_encoder(acquisition, tuning, plan);
  plan_resident_bounds(acquisition, tuning, plan);
  plan.provisional_resident_bytes = std::min(plan.resident_bytes_bound(), acquisition.size_bytes / 2);
  return plan;
}

std::uint64_t CudaLoadPlan::working_bytes(bool with_staging) const {
  // One line per allocation of ResidentEncoder and the loader besides the
  // resident's own (pieces, ring table, group table).
  const std::uint64_t dense_slot_bytes =
      round_to_granularity(dense_batch_bytes) + round_to_granularity(batch_statuses_bytes);
  std::uint64_t working = kRuntimeReserveBytes + round_to_granularity(masked_list_bytes) +
                          static_cast<std::uint64_t>(dense_slots(with_staging)) * dense_slot_bytes +
                          round_to_granularity(batch_misc_bytes) + round_to_granularity(encode_scratch_bytes) +
                          4 * round_to_granularity(ring_setup_bytes);
  if (with_staging && gpu_decoder) {
    working += kDeviceSlots * round_to_granularity(device_slot_bytes) + round_to_granularity(bslz4_scratch_bytes);
  }
  return working;
}

std::uint64_t CudaLoadPlan::transition_peak_bytes(bool with_staging) const {
  // The resident at its bound: every piece (one per batch, each may waste up
  // to one granule), the ring table, the frame moments and the group table.
  return working_bytes(with_staging) + resident_bound_bytes + batches * kAllocationGranularity +
         round_to_granularity(group_offsets_bytes) + round_to_granularity(ring_table_bound_bytes) +
         round_to_granularity(frame_moments_bytes) + round_to_granularity(seek_table_bytes) +
         round_to_granularity(decode_table_bytes) + round_to_granularity(recent_frames_bytes);
}

std::uint64_t default_device_slot_bytes(const CudaLoadTuning& tuning) {
  const std::uint64_t staging = align16(tuning.staging_bytes != 0 ? tuning.staging_bytes : kDefaultStagingBytes);
  const std::uint64_t frames = tuning.sub_batch_frames != 0 ? tuning.sub_batch_frames : kDefaultSubBatchFrames;
  return staging + align16(frames * 8) + frames * 4;
}

bool gpu_decodes(const catalog::Acquisition& acquisition, const catalog::FrameLocation& location) {
  const std::size_t element = acquisition.chunk_format.element_size;
  return acquisition.chunk_format.filter == codec::ChunkFilter::bitshuffle_lz4 && (location.filter_mask & 1u) == 0 &&
         (element == 1 || element == 2 || element == 4);
}

ReadSchedule plan_reads(const catalog::Acquisition& acquisition, const catalog::FrameIndex& index,
                        const CudaLoadPlan& plan) {
  const std::uint64_t frames = plan.frames;
  if (index.frames.size() < frames) {
    throw conflict(acquisition.name + " stores " + std::to_string(index.frames.size()) + " frames; its " +
                   std::to_string(acquisition.scan_rows) + " x " + std::to_string(acquisition.scan_cols) +
                   " scan needs " + std::to_string(frames));
  }
  const std::uint64_t batch_span = std::uint64_t{plan.groups_per_batch} * plan.frames_per_group;
  ReadSchedule schedule;
  schedule.chunk_slot_offsets.assign(frames, 0);
  SubBatch* current = nullptr;
  std::uint64_t decoded_bytes = 0;  // host-decoded frames of the current sub-batch
  for (std::uint64_t frame = 0; frame < frames; ++frame) {
    const catalog::FrameLocation& location = index.frames[frame];
    if (location.shard >= index.shard_paths.size()) {
      throw CorruptChunk("frame " + std::to_string(frame) + " of " + acquisition.master_path + " points at shard " +
                         std::to_string(location.shard) + " of " + std::to_string(index.shard_paths.size()));
    }
    if (location.stored_bytes == 0 || location.stored_bytes > plan.max_stored_chunk_bytes) {
      throw CorruptChunk("frame " + std::to_string(frame) + " of " + index.shard_paths[location.shard] +
                         " has a stored chunk of " + std::to_string(location.stored_bytes) + " bytes at byte " +
                         std::to_string(location.file_offset) + "; a frame of " +
                         std::to_string(plan.frame_pixels) + " pixels is stored in at most " +
                         std::to_string(plan.max_stored_chunk_bytes));
    }
    const bool on_gpu = plan.gpu_decoder && gpu_decodes(acquisition, location);
    const std::uint64_t batch = frame / batch_span;
    bool fits = current != nullptr && current->batch == batch && current->gpu_decoded == on_gpu &&
                current->frame_count < plan.sub_batch_frames && (on_gpu || decoded_bytes + plan.frame_bytes <= plan.staging_bytes);
    // Extend the last read, or place a new one (16-byte aligned) in the slot.
    bool extend = false;
    if (fits && current->read_count > 0) {
      const PreadSpan& read = schedule.reads.back();
      const std::uint64_t read_end = read.file_offset + read.bytes;
      const std::uint64_t chunk_end = location.file_offset + location.stored_bytes;
      extend = location.shard == read.shard && location.file_offset >= read_end &&
               location.file_offset - read_end <= kReadGapBytes && chunk_end - read.file_offset <= kReadBatchBytes;
      const std::uint64_t slot_end = extend ? read.slot_offset + (chunk_end - read.file_offset)
                                            : align16(current->slot_bytes) + location.stored_bytes;
      if (slot_end > plan.staging_bytes) {
        fits = false;
        extend = false;
      }
    }
    if (!fits) {
      SubBatch next;
      next.batch = batch;
      next.first_frame = frame;
      next.gpu_decoded = on_gpu;
      next.first_read = schedule.reads.size();
      schedule.sub_batches.push_back(next);
      current = &schedule.sub_batches.back();
      decoded_bytes = 0;
    }
    if (extend) {
      PreadSpan& read = schedule.reads.back();
      read.bytes = location.file_offset + location.stored_bytes - read.file_offset;
      schedule.chunk_slot_offsets[frame] = read.slot_offset + (location.file_offset - read.file_offset);
      current->slot_bytes = read.slot_offset + read.bytes;
    } else {
      PreadSpan read;
      read.shard = location.shard;
      read.file_offset = location.file_offset;
      read.bytes = location.stored_bytes;
      read.slot_offset = align16(current->slot_bytes);
      read.first_frame = frame;
      schedule.reads.push_back(read);
      current->read_count += 1;
      schedule.chunk_slot_offsets[frame] = read.slot_offset;
      current->slot_bytes = read.slot_offset + read.bytes;
    }
    current->frame_count += 1;
    current->stored_bytes += location.stored_bytes;
    schedule.stored_bytes += location.stored_bytes;
    if (!on_gpu) decoded_bytes += plan.frame_bytes;
  }
  return schedule;
}

}  // namespace quantem::backend::cuda
