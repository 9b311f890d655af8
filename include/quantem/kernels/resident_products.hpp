#pragma once
// Product kernels computed straight from an ANS resident (AnsResidentView,
// include/quantem/kernels/ans.hpp), and the load-time preparation of dense
// frames. CUDA-free header; implemented in kernels/products/resident_products.cu.
//
// A stream (one 2x2 quad across a group's frames) is sequential: a product
// that needs frame f of a group decodes that group's streams up to f and no
// further. Every sum is an integer sum accumulated in uint64 with integer
// atomics: exact, and the same for any launch shape. A malformed stream never
// faults; it sets *d_error non-zero (d_error may be null). All d_* pointers are
// device pointers; every call is asynchronous on `stream`.
#include <cstddef>
#include <cstdint>

#include "quantem/core/dtype.hpp"
#include "quantem/kernels/ans.hpp"
#include "quantem/kernels/device.hpp"

namespace quantem::kernels {

// Zeroes the masked pixels (d_masked_pixels: masked_count detector pixel
// indices) of every frame of a dense batch (frame_count frames of frame_pixels
// values of `dtype`, frame-major) and, when d_max is non-null, raises *d_max to
// the largest value left (after masking).
void prepare_frames(void* d_frames, DType dtype, std::uint64_t frame_count, std::uint32_t frame_pixels,
                    const std::uint32_t* d_masked_pixels, std::uint32_t masked_count, std::uint32_t* d_max,
                    StreamHandle stream);

// One group of the resident that a product reads: its frames
// [frame_begin, frame_end) are decoded (frame_end <= the group's frame count).
// frame_begin is 0 or the frame of one of the resident's seek points (a
// multiple of AnsResidentView::frames_per_seek_point; see ans_seek_job_begin).
struct FrameJob {
  std::uint32_t group = 0;
  std::uint32_t frame_end = 0;
  std::uint32_t frame_begin = 0;
};

// The first frame a job that needs frame `frame_in_group` of a group may
// start at: its seek point, or 0 when the resident has none.
inline std::uint32_t ans_seek_job_begin(std::uint32_t frame_in_group, std::uint32_t frames_per_group,
                                        std::uint32_t frames_per_seek_point) {
  const std::uint32_t points = ans_seek_points_per_group(frames_per_group, frames_per_seek_point);
  if (points == 0) return 0;
  const std::uint32_t segment = frame_in_group / frames_per_seek_point;
  return (segment < points ? segment : points) * frames_per_seek_point;
}

// Largest job list one call takes (grid.y).
inline constexpr std::size_t kMaxFrameJobs = 65535;

// Per native detector pixel p: d_sums[p] += Σ value(f, p) over the frames f of
// the jobs whose bit is set in d_frame_bitmap (bit f % 32 of word f / 32, f the
// resident's global frame index); when d_max is non-null, d_max[p] is raised
// to the largest such value. d_sums (and d_max) hold detector_rows *
// detector_cols values and are not cleared.
//
// One thread per stream; the CTA width is chosen per call (each CTA first
// fills 128 KiB of shared decode tables, so one CTA runs per SM): 1024 threads
// when that grid still gives every SM a CTA (a crop's hundreds of jobs: more
// threads per SM hide more of the decode's latency), else 512 (a frame: a
// wider CTA would leave SMs without one, docs/kernels.md). cta_threads 0 (the
// default) applies that rule; 512 or 1024 force a width (benchmarks); any
// other value is a quantem::Error(bad_request) (check_ans_accumulate_frames_cta_threads).
void ans_accumulate_frames(const AnsResidentView& resident, const FrameJob* d_jobs, std::size_t job_count,
                           const std::uint32_t* d_frame_bitmap, std::uint64_t* d_sums, std::uint32_t* d_max,
                           std::uint32_t* d_error, StreamHandle stream, int cta_threads = 0);
void check_ans_accumulate_frames_cta_threads(int cta_threads);
// The width the rule picks for job_count jobs of stream_count streams on sm_count SMs.
int ans_accumulate_frames_threads_for(std::size_t job_count, std::uint32_t stream_count, int sm_count);

// Decodes the frames [job.frame_begin, job.frame_end) of job.group and
// writes those from keep_from on (frame_begin <= keep_from < frame_end, frame
// indices within the group) whole: d_frames[(f - keep_from) * pixels + p],
// pixels = detector_rows * detector_cols, as element_bytes-byte values (1, 2
// or 4: the resident's held dtype holds every value). One launch of
// ceil(streams / 512) CTAs; a malformed stream sets *d_error.
void ans_decode_frames(const AnsResidentView& resident, const FrameJob& job, std::uint32_t keep_from, void* d_frames,
                       std::uint32_t element_bytes, std::uint32_t* d_error, StreamHandle stream);

// One run of consecutive frames of a group, decoded into an output batch:
// job.group's frames [job.frame_begin, job.frame_end) are decoded and those
// from keep_from on are written whole at output frame out_frame + (f - keep_from).
struct FrameRun {
  FrameJob job;
  std::uint32_t keep_from = 0;
  std::uint64_t out_frame = 0;
};

// ans_decode_frames for many runs in one launch (grid: stream blocks x runs,
// at most kMaxFrameJobs runs): d_frames[(out_frame + f - keep_from) * pixels + p]
// as element_bytes-byte values (1, 2 or 4; at least the resident's held
// dtype's). Runs must not write the same output frame. A malformed stream or
// run sets *d_error.
void ans_decode_frame_runs(const AnsResidentView& resident, const FrameRun* d_runs, std::size_t run_count,
                           void* d_frames, std::uint32_t element_bytes, std::uint32_t* d_error, StreamHandle stream);

// Per slot: d_slot_sums[slot * pixels + p] += value(f, p) for every frame f of
// the jobs with d_frame_slots[f] = slot >= 0 (global frame index; -1: none).
// Used to build whole scan-binned frames several at a time. Not cleared.
void ans_accumulate_slots(const AnsResidentView& resident, const FrameJob* d_jobs, std::size_t job_count,
                          const std::int32_t* d_frame_slots, std::uint64_t* d_slot_sums, std::uint32_t* d_error,
                          StreamHandle stream);

// d_result[b] = max(d_result[b], Σ of slot s's native pixels that fall in
// detector bin b) over the slot_count slots of d_slot_sums (slot-major, native
// pixels). d_result has ceil(rows / bin) * ceil(cols / bin) values.
void binned_slot_max(const std::uint64_t* d_slot_sums, std::uint32_t slot_count, std::uint32_t detector_rows,
                     std::uint32_t detector_cols, std::uint32_t detector_bin, std::uint64_t* d_result,
                     StreamHandle stream);

// Largest frames_per_group ans_frame_moments takes (three uint64 per frame in shared memory).
inline constexpr std::uint32_t kMomentsMaxFramesPerGroup = 2048;

// For every frame f of the view: d_total[f] = Σ_p I, d_row_moment[f] =
// Σ_p row_weight[r(p)] · I, d_col_moment[f] = Σ_p col_weight[c(p)] · I
// (weights: device arrays of detector_rows / detector_cols uint32). The outputs
// hold total_frames values each and are overwritten. Decodes every stream.
void ans_frame_moments(const AnsResidentView& resident, const std::uint32_t* d_row_weights,
                       const std::uint32_t* d_col_weights, std::uint32_t max_weight, std::uint64_t* d_total,
                       std::uint64_t* d_row_moment, std::uint64_t* d_col_moment, std::uint32_t* d_error,
                       StreamHandle stream);

// --- Ring sums (include/quantem/backend/ring_partition.hpp) ------------------

// Exact per-frame ring sums of a dense batch: for frame f of the batch and
// ring r, d_ring_sums[r * ring_stride + first_frame + f] = Σ of the frame's
// pixels in ring r. The partition comes as its pixels sorted by ring
// (d_pixels_by_ring) and each sorted pixel's ring (d_ring_of_sorted), and
// optionally (may be null) as every pixel's ring in row-major order
// (d_ring_of_pixel, 16-byte aligned): with it, frames of 8k pixels (and, with
// moments, 8k columns) are read once in row order instead of gathered by ring.
// sum_bytes: 4 (uint32 sums; callers guarantee no ring sum reaches 2^32) or 8.
// With `moments` set, the same pass over the frames also writes their moments
// as dense_frame_moments does (detector_cols must divide frame_pixels).
struct FrameMomentsTarget {
  std::uint64_t* d_moments = nullptr;  // [3][table_stride]: Σ I, Σ row·I, Σ col·I
  std::uint32_t detector_cols = 0;
  std::uint64_t table_stride = 0;
};
void dense_ring_sums(const void* d_frames, DType dtype, std::uint64_t frame_count, std::uint32_t frame_pixels,
                     const std::uint32_t* d_pixels_by_ring, const std::uint16_t* d_ring_of_sorted,
                     const std::uint16_t* d_ring_of_pixel, std::uint32_t ring_count, void* d_ring_sums, std::uint32_t sum_bytes, std::uint64_t ring_stride,
                     std::uint64_t first_frame, StreamHandle stream, const FrameMomentsTarget& moments = {});

// A plan's region of the source scan and its scan bin, in the plain integers
// a kernel takes (plan::PlanGeometry stays host-side).
struct PlanRegionView {
  std::uint64_t row_start = 0, row_stop = 0, col_start = 0, col_stop = 0;  // source scan region, half-open
  std::uint64_t source_cols = 0;
  std::uint64_t scan_bin = 1;
  std::uint64_t plan_rows = 0, plan_cols = 0;  // ceil(region / scan_bin)
};

// Gathers per-frame sums (d_frame_sums[f - base_frame] for source frame f) into
// the plan's positions: d_out[p] = Σ over position p's frames (up to
// scan_bin², partial bins at the region's edges), as uint32. A position whose
// exact sum exceeds 2^32 - 1 gets 0 and sets *d_overflow non-zero (the caller
// zeroes it first and then reports the overflow; never a wrapped value).
void narrow_plan_sums(const std::uint64_t* d_frame_sums, std::uint64_t base_frame, const PlanRegionView& region,
                      std::uint32_t* d_out, std::uint32_t* d_overflow, StreamHandle stream);

// A window of decoded source frames and the binned plan frames made from it
// (an export batch of whole plan rows).
struct PlanFramesShape {
  std::uint64_t window_rows = 0, window_cols = 0;     // source frames, row-major: (r, c) is frame r * window_cols + c
  std::uint32_t window_element_bytes = 2;             // 1, 2 or 4
  std::uint32_t detector_rows = 0, detector_cols = 0;  // source detector
  std::uint32_t scan_bin = 1, detector_bin = 1;
  std::uint64_t plan_rows = 0, plan_cols = 0;          // ceil(window_rows / scan_bin), ceil(window_cols / scan_bin)
};

// Plan frame (pr, pc) of the window, binned pixel (br, bc): the exact sum of
// the source values of the window frames (pr * scan_bin + i, pc * scan_bin + j)
// and detector pixels (br * detector_bin + u, bc * detector_bin + v) that
// exist (partial edge bins kept), written as uint32 at
// d_out[(pr * plan_cols + pc) * binned_pixels + br * binned_cols + bc]. A sum
// above 2^32 - 1 sets *d_overflow non-zero (its value is unspecified: the
// caller fails, never wraps).
void bin_plan_frames(const void* d_window, const PlanFramesShape& shape, std::uint32_t* d_out,
                     std::uint32_t* d_overflow, StreamHandle stream);

// Exact per-frame moments of a dense batch at native detector coordinates:
// for frame f of the batch, d_moments[k * table_stride + first_frame + f] =
// Σ I (k = 0), Σ row·I (k = 1), Σ col·I (k = 2) over the frame's pixels. The
// centre of mass of any plan at detector bin 1 is read from this table.
void dense_frame_moments(const void* d_frames, DType dtype, std::uint64_t frame_count, std::uint32_t detector_rows,
                         std::uint32_t detector_cols, std::uint64_t* d_moments, std::uint64_t table_stride,
                         std::uint64_t first_frame, StreamHandle stream);

// d_sums[f] += Σ_{r in d_rings} ring_sums[r * ring_stride + first_frame + f] for f < frame_count.
void add_ring_sums(const void* d_ring_sums, std::uint32_t sum_bytes, std::uint64_t ring_stride,
                   const std::uint32_t* d_rings, std::uint32_t ring_list_count, std::uint64_t first_frame,
                   std::uint64_t frame_count, std::uint64_t* d_sums, StreamHandle stream);

}  // namespace quantem::kernels
