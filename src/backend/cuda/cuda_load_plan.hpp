#pragma once
// Internal: the sizes of a CUDA load, computed from the acquisition alone
// before anything is allocated (the admission estimate), and its read
// schedule, computed from the frame index.
#include <cstdint>
#include <string>
#include <vector>

#include "quantem/backend/cuda_load.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/dtype.hpp"
#include "quantem/kernels/bitshuffle_lz4.hpp"

namespace quantem::backend::cuda {

// Largest coalesced read (a larger chunk gets a read of its own) and the
// largest hole between two chunks read through. 1 MiB reads spread a
// sub-batch (~40 MB of chunks) over every thread of the read pool; larger ones
// left threads idle (docs/benchmarks.md, "Code decisions and their
// measurements").
inline constexpr std::uint64_t kReadBatchBytes = std::uint64_t{1} << 20;
inline constexpr std::uint64_t kReadGapBytes = std::uint64_t{64} << 10;
// Pinned host staging slots: reads of one sub-batch overlap the copies and
// decodes of the two before it.
inline constexpr int kHostSlots = 3;
// Threads that fault in the pages of a set of pinned slots before they are registered.
inline constexpr unsigned kFaultThreads = 8;
inline constexpr int kDeviceSlots = 2;
// Dense batches of a load from files: batch b is decoded into slot b % 2
// while the encode worker encodes batch b - 1 from the other slot
// (docs/decisions/0007-overlapped-load-pipeline.md). A load from dense host
// counts (make_cuda_resident) encodes synchronously from one slot.
inline constexpr int kDenseSlots = 2;
// Device memory the CUDA runtime may take during a load besides our
// allocations (kernels loaded lazily on first launch).
inline constexpr std::uint64_t kRuntimeReserveBytes = std::uint64_t{64} << 20;

struct CudaLoadPlan {
  DType source_dtype = DType::uint16;
  std::uint64_t frames = 0;
  std::uint64_t frame_pixels = 0;
  std::uint64_t frame_bytes = 0;  // source dtype
  std::uint32_t frames_per_group = 0;
  std::uint64_t groups = 0;
  std::uint32_t groups_per_batch = 0;
  std::uint64_t batch_frames = 0;
  std::uint64_t batches = 0;
  std::uint64_t max_stored_chunk_bytes = 0;  // a larger chunk is corrupt
  std::uint64_t staging_bytes = 0;           // stored bytes of one slot
  std::uint32_t sub_batch_frames = 0;
  bool gpu_decoder = false;                  // bitshuffle/LZ4 source: device staging slots exist

  // Device allocations (bytes as requested).
  std::uint64_t masked_list_bytes = 0;
  std::uint64_t device_slot_bytes = 0;       // stored bytes + chunk table of one device slot
  std::uint64_t table_offset = 0;            // chunk table offset inside a slot
  std::uint64_t bslz4_scratch_bytes = 0;
  std::uint64_t dense_batch_bytes = 0;       // one dense slot: batch_frames frames
  std::uint64_t batch_statuses_bytes = 0;    // one dense slot's per-frame decode statuses
  std::uint64_t batch_misc_bytes = 0;        // the max value, the batch's group offsets (one, for the encoder)
  std::uint64_t encode_scratch_bytes = 0;
  std::uint64_t group_offsets_bytes = 0;     // the finished resident's group table
  std::uint64_t resident_bound_bytes = 0;    // encoded groups, at most (enforced by the load)
  std::uint64_t ring_table_bound_bytes = 0;  // per-frame ring sums, at most (any centre: ring_partition.hpp)
  std::uint64_t ring_setup_bytes = 0;        // the first batch's pattern sum and the partition's device tables
  std::uint64_t frame_moments_bytes = 0;     // per-frame Σ I, Σ row·I, Σ col·I (uint64 each), kept by the resident
  std::uint32_t frames_per_seek_point = 0;   // 0: no seek points
  bool seek_points_from_encoder = true;      // CudaLoadTuning::seek_points_from_encoder
  std::uint32_t kept_words_per_frame = 0;    // CudaLoadTuning::kept_words_per_frame, resolved
  bool prioritise_encoder = false;           // CudaLoadTuning::prioritise_encoder
  kernels::BitshuffleLz4Tuning bslz4_tuning;    // CudaLoadTuning::bslz4_*, checked
  int accumulate_frames_cta_threads = 0;     // CudaLoadTuning::accumulate_frames_cta_threads, checked
  std::uint64_t seek_table_bytes = 0;        // the streams' seek points (kernels::ans_seek_table_words), kept by the resident
  std::uint64_t decode_table_bytes = 0;      // every group's decode tables (kernels::ans_build_decode_tables), kept by the resident
  std::uint64_t recent_frames = 0;           // frames the resident keeps decoded (CudaLoadTuning::recent_frames_max_bytes)
  std::uint64_t recent_frames_bytes = 0;     // their bytes at the source dtype (the held dtype is never wider)
  // What admission reserves for the resident before the load starts: half the
  // acquisition's bytes on disk (the ANS resident of detector counts is
  // smaller than their bitshuffle/LZ4 shards), at most the bound. The load
  // grows the reservation past it, allocation by allocation, when needed.
  std::uint64_t provisional_resident_bytes = 0;

  std::uint64_t resident_bytes_bound() const {
    return resident_bound_bytes + group_offsets_bytes + ring_table_bound_bytes + frame_moments_bytes +
           seek_table_bytes + decode_table_bytes + recent_frames_bytes;
  }
  // Dense slots of a load from files (with_staging) or from dense host counts.
  static int dense_slots(bool with_staging) { return with_staging ? kDenseSlots : 1; }
  // Every device byte alive at the worst moment, allocations rounded up: a
  // load from files (with_staging: device staging slots and kDenseSlots dense
  // batches with their statuses) or from dense host counts (one dense batch).
  std::uint64_t transition_peak_bytes(bool with_staging) const;
  // Everything a load allocates besides the resident (slots, scratch, staging, the runtime reserve).
  std::uint64_t working_bytes(bool with_staging) const;
  // Reserved before the load: working_bytes + provisional_resident_bytes.
  std::uint64_t admitted_bytes(bool with_staging) const {
    return working_bytes(with_staging) + provisional_resident_bytes;
  }
};

// Sizes for a load from files (with_staging) or from dense host counts.
// Bytes of one pinned staging slot of a load with this tuning and at least
// the default sub-batch of frames (the slot size start-up prepares).
std::uint64_t default_device_slot_bytes(const CudaLoadTuning& tuning);

// Throws Error(unprocessable) for a shape the resident cannot hold.
CudaLoadPlan plan_cuda_load(const catalog::Acquisition& acquisition, const CudaLoadTuning& tuning);

struct PreadSpan {
  std::uint32_t shard = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t bytes = 0;
  std::uint64_t slot_offset = 0;  // where it lands in the slot (16-byte aligned)
  std::uint64_t first_frame = 0;  // for error messages
};

// Consecutive frames of one batch handled together: one H2D copy and one
// decode launch (GPU), or host decodes and one copy straight into the batch.
struct SubBatch {
  std::uint64_t batch = 0;
  std::uint64_t first_frame = 0;
  std::uint64_t frame_count = 0;
  bool gpu_decoded = true;
  std::uint64_t slot_bytes = 0;    // bytes of reads in the slot
  std::uint64_t stored_bytes = 0;  // Σ chunk sizes (progress)
  std::size_t first_read = 0;
  std::size_t read_count = 0;
};

struct ReadSchedule {
  std::vector<SubBatch> sub_batches;
  std::vector<PreadSpan> reads;
  std::vector<std::uint64_t> chunk_slot_offsets;  // per frame: its chunk's offset in its sub-batch's slot
  std::uint64_t stored_bytes = 0;
};

// True when frame `location` goes through the GPU decoder.
bool gpu_decodes(const catalog::Acquisition& acquisition, const catalog::FrameLocation& location);

// Throws CorruptChunk (naming frame and file) for a chunk larger than the plan
// allows, an empty chunk or a shard index out of range; Error(conflict) when
// the index holds fewer frames than the scan needs.
ReadSchedule plan_reads(const catalog::Acquisition& acquisition, const catalog::FrameIndex& index,
                        const CudaLoadPlan& plan);

}  // namespace quantem::backend::cuda
