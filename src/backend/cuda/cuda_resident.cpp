#include "cuda_resident.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "quantem/ans/ans_format.hpp"
#include "quantem/backend/stage_clock.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/resident_products.hpp"
#include "quantem/kernels/scratch_layout.hpp"
#include "quantem/plan/plan.hpp"

namespace quantem::backend::cuda {
namespace {

// Largest slot buffer of a binned region max (whole native frames in uint64).
constexpr std::uint64_t kSlotBufferBytes = std::uint64_t{64} << 20;

// Jobs for ascending frames: each touched segment of a group (the frames
// from one seek point to the next; the whole group without seek points),
// decoded from its start up to its last needed frame.
std::vector<kernels::FrameJob> jobs_for(const std::vector<std::uint64_t>& sorted_frames, std::uint32_t frames_per_group,
                                     std::uint32_t frames_per_seek_point) {
  // Divisions only when a frame leaves the current job's segment (a region's
  // frames number tens of thousands on every request).
  std::vector<kernels::FrameJob> jobs;
  std::uint64_t segment_first = 1;  // the current job's frames [segment_first, segment_end): none yet
  std::uint64_t segment_end = 0;
  std::uint64_t group_first = 0;
  const std::uint32_t last_begin = kernels::ans_seek_job_begin(frames_per_group - 1, frames_per_group, frames_per_seek_point);
  for (const std::uint64_t frame : sorted_frames) {
    if (frame < segment_first || frame >= segment_end) {
      const auto group = static_cast<std::uint32_t>(frame / frames_per_group);
      group_first = std::uint64_t{group} * frames_per_group;
      const auto in_group = static_cast<std::uint32_t>(frame - group_first);
      const std::uint32_t begin = kernels::ans_seek_job_begin(in_group, frames_per_group, frames_per_seek_point);
      const std::uint32_t next = begin == last_begin ? frames_per_group : begin + frames_per_seek_point;
      segment_first = group_first + begin;
      segment_end = group_first + next;
      jobs.push_back({group, in_group + 1, begin});
    } else {
      jobs.back().frame_end = std::max(jobs.back().frame_end, static_cast<std::uint32_t>(frame - group_first + 1));
    }
  }
  return jobs;
}

}  // namespace

std::uint32_t ring_sum_bytes_for(const RingPartition& partition, DType dtype) {
  std::uint64_t widest = 0;
  for (std::uint32_t ring = 0; ring < partition.ring_count(); ++ring) {
    widest = std::max<std::uint64_t>(widest, partition.ring_pixels(ring));
  }
  const std::uint64_t largest_value = dtype == DType::uint8 ? 0xffu : dtype == DType::uint16 ? 0xffffu : 0xffffffffu;
  return widest * largest_value < (std::uint64_t{1} << 32) ? 4 : 8;
}

CudaResident::CudaResident(catalog::Acquisition source, DType resident_dtype, std::string encoding, int device_index,
                           std::uint32_t frames_per_group, std::vector<TrackedBuffer> pieces,
                           TrackedBuffer group_offsets, const std::uint8_t* base, CudaRingTable rings,
                           TrackedBuffer frame_moments, CudaSeekTable seek, TrackedBuffer decode_tables,
                           CudaRecentFrames recent, std::vector<std::uint64_t> full_pattern,
                           int accumulate_frames_cta_threads)
    : source_(std::move(source)),
      resident_dtype_(resident_dtype),
      encoding_(std::move(encoding)),
      device_index_(device_index),
      frames_per_group_(frames_per_group),
      group_count_(kernels::ans_group_count(source_.frame_count(), frames_per_group)),
      pieces_(std::move(pieces)),
      group_offsets_(std::move(group_offsets)),
      base_(base),
      rings_(std::move(rings)),
      frame_moments_(std::move(frame_moments)),
      seek_(std::move(seek)),
      decode_tables_(std::move(decode_tables)),
      recent_(std::move(recent)),
      accumulate_frames_cta_threads_(accumulate_frames_cta_threads),
      resident_bytes_(group_offsets_.size() + rings_.d_ring_sums.size() + frame_moments_.size() +
                      seek_.d_points.size() + decode_tables_.size() + recent_.d_frames.size()),
      full_pattern_(std::move(full_pattern)) {
  for (const TrackedBuffer& piece : pieces_) resident_bytes_ += piece.size();
}

CudaResident::~CudaResident() { QUANTEM_CUDA_TRY_NOTHROW(cudaSetDevice(device_index_)); }

CudaResident::RegionSpan CudaResident::region_span(const plan::PlanGeometry& g) const {
  RegionSpan span;
  span.first_frame = g.region.row_start * g.source_scan_cols + g.region.col_start;
  span.last_frame = (g.region.row_stop - 1) * g.source_scan_cols + g.region.col_stop - 1;
  span.first_group = span.first_frame / frames_per_group_;
  span.end_group = span.last_frame / frames_per_group_ + 1;
  return span;
}

kernels::AnsResidentView CudaResident::view() const { return view_of_groups(0, group_count_); }

kernels::AnsResidentView CudaResident::view_of_groups(std::uint64_t first_group, std::uint64_t end_group) const {
  kernels::AnsResidentView view;
  view.d_blobs = base_;
  view.d_group_offsets = group_offsets_.as<const std::uint64_t>() + first_group;
  view.group_count = static_cast<std::size_t>(end_group - first_group);
  view.frames_per_group = frames_per_group_;
  view.total_frames = std::min(source_.frame_count(), end_group * frames_per_group_) - first_group * frames_per_group_;
  view.detector_rows = static_cast<std::uint32_t>(source_.detector_rows);
  view.detector_cols = static_cast<std::uint32_t>(source_.detector_cols);
  if (decode_tables_.size() != 0) {
    view.d_decode_tables = decode_tables_.as<const std::uint32_t>() + first_group * kernels::ans_decode_table_words();
  }
  if (seek_.frames_per_point != 0 && seek_.d_points.size() != 0) {
    const quantem::ans::AnsGroupLayout layout = quantem::ans::ans_group_layout(view.detector_rows, view.detector_cols);
    view.frames_per_seek_point = seek_.frames_per_point;
    view.d_seek_points = seek_.d_points.as<const std::uint32_t>() +
                         kernels::ans_seek_table_words(first_group, frames_per_group_, seek_.frames_per_point,
                                                    layout.stream_count);
  }
  return view;
}

void CudaResident::bind_device() const { kernels::set_device(device_index_); }

std::size_t CudaResident::host_staging_bytes(std::size_t bytes) {
  std::size_t grown = std::size_t{1} << 20;
  while (grown < bytes) grown *= 2;
  return grown;
}

std::size_t CudaResident::first_product_staging_bytes(const catalog::Acquisition& source) {
  // A masked sum's result (uint64 per frame, or uint32 and its flags), its
  // mask entries and whole rings (at most a few words per detector pixel).
  return host_staging_bytes(source.frame_count() * 8 + source.frame_pixels() * 8 + 4096);
}

void CudaResident::adopt_host_staging(kernels::PinnedBuffer staging) {
  std::lock_guard<std::mutex> lock(staging_mutex_);
  if (staging.size() > staging_.size()) staging_ = std::move(staging);
}

CudaResident::HostStaging::HostStaging(CudaResident& resident, std::size_t bytes) : lock_(resident.staging_mutex_) {
  if (resident.staging_.size() < bytes) {
    resident.staging_ = kernels::PinnedBuffer();  // the old one first: never both at once
    resident.staging_ = kernels::PinnedBuffer(host_staging_bytes(bytes));
  }
  base_ = resident.staging_.data();
}

std::vector<std::uint64_t> CudaResident::native_sum(const std::vector<std::uint64_t>& frames,
                                                    std::vector<std::uint32_t>* maxima) {
  return accumulate_native(frames, maxima, nullptr, nullptr);
}

std::optional<std::vector<std::uint32_t>> CudaResident::native_sum_u32(const std::vector<std::uint64_t>& frames) {
  std::vector<std::uint32_t> narrow;
  bool overflow = false;
  (void)accumulate_native(frames, nullptr, &narrow, &overflow);
  if (overflow) return std::nullopt;
  return narrow;
}

namespace {

// The frames' bitmap and their decode jobs, through pinned host memory, onto the device.
void upload_frame_selection(const std::vector<std::uint64_t>& frames, const std::vector<kernels::FrameJob>& jobs,
                            std::uint64_t bitmap_words, std::uint32_t* host_bitmap, kernels::FrameJob* host_jobs,
                            std::uint32_t* d_bitmap, kernels::FrameJob* d_jobs, cudaStream_t stream) {
  std::fill(host_bitmap, host_bitmap + bitmap_words, 0u);
  for (const std::uint64_t frame : frames) host_bitmap[frame / 32] |= 1u << (frame % 32);
  std::copy(jobs.begin(), jobs.end(), host_jobs);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_bitmap, host_bitmap, bitmap_words * 4, cudaMemcpyHostToDevice, stream));
  QUANTEM_CUDA_TRY(
      cudaMemcpyAsync(d_jobs, host_jobs, jobs.size() * sizeof(kernels::FrameJob), cudaMemcpyHostToDevice, stream));
}

// Per-pixel sums narrowed to uint32 on the device: the pixels as one row of
// "frames", narrow_plan_sums over a one-row region.
void narrow_pixel_sums(const std::uint64_t* d_sums, std::uint64_t pixels, std::uint32_t* d_narrow,
                       std::uint32_t* d_overflow, cudaStream_t stream) {
  kernels::PlanRegionView row;
  row.row_stop = 1;
  row.col_stop = row.source_cols = row.plan_cols = pixels;
  row.plan_rows = 1;
  kernels::narrow_plan_sums(d_sums, 0, row, d_narrow, d_overflow, stream);
}

}  // namespace

std::vector<std::uint64_t> CudaResident::accumulate_native(const std::vector<std::uint64_t>& frames,
                                                           std::vector<std::uint32_t>* maxima,
                                                           std::vector<std::uint32_t>* narrow, bool* overflow) {
  const std::uint64_t pixels = source_.frame_pixels();
  std::vector<std::uint64_t> sums(narrow != nullptr ? 0 : pixels, 0);
  if (maxima != nullptr) maxima->assign(pixels, 0);
  if (narrow != nullptr) narrow->assign(pixels, 0);
  if (overflow != nullptr) *overflow = false;
  if (frames.empty()) return sums;
  const std::uint64_t total_frames = source_.frame_count();
  const std::uint64_t bitmap_words = (total_frames + 31) / 32;
  const std::vector<kernels::FrameJob> jobs = jobs_for(frames, frames_per_group_, seek_.frames_per_point);
  stage_lap("jobs");

  bind_device();
  const cudaStream_t stream = cudaStreamPerThread;
  kernels::ScratchLayout layout;
  const std::size_t bitmap_at = layout.add(bitmap_words * 4);
  const std::size_t jobs_at = layout.add(jobs.size() * sizeof(kernels::FrameJob));
  // Sums, maxima, the narrowed sums, the overflow and error flags: zeroed
  // together; what comes back starts at the narrowed sums when they are asked for.
  const std::size_t sums_at = layout.add(pixels * 8);
  const std::size_t maxima_at = layout.add(maxima != nullptr ? pixels * 4 : 0);  // copied back only when asked
  const std::size_t narrow_at = layout.add(narrow != nullptr ? pixels * 4 : 0);
  const std::size_t overflow_at = layout.add(4);
  const std::size_t error_at = layout.add(4);
  ScratchBuffer scratch(layout.total(), stream);
  auto* d_bitmap = kernels::scratch_part<std::uint32_t>(scratch.data(), bitmap_at);
  auto* d_jobs = kernels::scratch_part<kernels::FrameJob>(scratch.data(), jobs_at);
  auto* d_sums = kernels::scratch_part<std::uint64_t>(scratch.data(), sums_at);
  auto* d_maxima = kernels::scratch_part<std::uint32_t>(scratch.data(), maxima_at);
  auto* d_narrow = kernels::scratch_part<std::uint32_t>(scratch.data(), narrow_at);
  auto* d_overflow = kernels::scratch_part<std::uint32_t>(scratch.data(), overflow_at);
  auto* d_error = kernels::scratch_part<std::uint32_t>(scratch.data(), error_at);
  // The frame bitmap and the jobs go up through the resident's pinned staging
  // (asynchronous copies), placed after where the result comes back.
  const std::size_t zeroed_bytes = layout.total() - sums_at;
  const std::size_t result_from = narrow != nullptr ? narrow_at : sums_at;
  const std::size_t result_bytes = layout.total() - result_from;
  kernels::ScratchLayout host_layout;
  const std::size_t host_result_at = host_layout.add(result_bytes);
  const std::size_t host_bitmap_at = host_layout.add(bitmap_words * 4);
  const std::size_t host_jobs_at = host_layout.add(jobs.size() * sizeof(kernels::FrameJob));
  const HostStaging host(*this, host_layout.total());
  upload_frame_selection(frames, jobs, bitmap_words, host.part<std::uint32_t>(host_bitmap_at),
                         host.part<kernels::FrameJob>(host_jobs_at), d_bitmap, d_jobs, stream);
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_sums, 0, zeroed_bytes, stream));
  const kernels::AnsResidentView all = view();
  for (std::size_t first = 0; first < jobs.size(); first += kernels::kMaxFrameJobs) {
    const std::size_t count = std::min(kernels::kMaxFrameJobs, jobs.size() - first);
    kernels::ans_accumulate_frames(all, d_jobs + first, count, d_bitmap, d_sums, maxima != nullptr ? d_maxima : nullptr,
                                d_error, stream, accumulate_frames_cta_threads_);
  }
  if (narrow != nullptr) narrow_pixel_sums(d_sums, pixels, d_narrow, d_overflow, stream);
  // What comes back lies together in the scratch: one copy.
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(host.part<void>(host_result_at), scratch.as<std::uint8_t>() + result_from,
                                   result_bytes, cudaMemcpyDeviceToHost, stream));
  stage_lap("enqueue");  // bitmap, scratch, uploads, kernels, the copy back
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  stage_lap("wait");
  const auto host_at = [&](std::size_t device_at) { return host_result_at + (device_at - result_from); };
  throw_if_malformed(*host.part<std::uint32_t>(host_at(error_at)), source_.name, "accumulate_frames_kernel");
  if (narrow != nullptr) {
    *overflow = *host.part<std::uint32_t>(host_at(overflow_at)) != 0;
    const auto* h_narrow = host.part<std::uint32_t>(host_at(narrow_at));
    std::copy(h_narrow, h_narrow + pixels, narrow->begin());
  } else {
    const auto* h_sums = host.part<std::uint64_t>(host_at(sums_at));
    std::copy(h_sums, h_sums + pixels, sums.begin());
  }
  if (maxima != nullptr) {
    const auto* h_maxima = host.part<std::uint32_t>(host_at(maxima_at));
    std::copy(h_maxima, h_maxima + pixels, maxima->begin());
  }
  stage_lap("result");
  return sums;
}

std::vector<std::uint64_t> CudaResident::compute_pattern_sum(const plan::PlanGeometry& geometry) {
  std::vector<std::uint64_t> native;
  if (geometry.cropped) {
    native = native_sum(plan::region_frame_indices(geometry), nullptr);
  } else {
    // Every frame belongs to exactly one plan position: one sum serves every uncropped plan.
    std::lock_guard<std::mutex> lock(full_pattern_mutex_);
    if (!full_pattern_) {
      std::vector<std::uint64_t> all(source_.frame_count());
      for (std::uint64_t f = 0; f < all.size(); ++f) all[f] = f;
      full_pattern_ = native_sum(all, nullptr);
    }
    native = *full_pattern_;
  }
  return plan::bin_detector_sums(std::move(native), source_.detector_rows, source_.detector_cols, geometry.detector_bin);
}

CenterOfMassSums CudaResident::compute_center_of_mass_sums(const plan::PlanGeometry& g) {
  if (g.detector_bin == 1 && frame_moments_.size() != 0) return center_of_mass_from_table(g);
  const std::uint64_t rows = source_.detector_rows;
  const std::uint64_t cols = source_.detector_cols;
  std::vector<std::uint32_t> row_weights(rows);
  std::vector<std::uint32_t> col_weights(cols);
  for (std::uint64_t r = 0; r < rows; ++r) row_weights[r] = static_cast<std::uint32_t>(r / g.detector_bin);
  for (std::uint64_t c = 0; c < cols; ++c) col_weights[c] = static_cast<std::uint32_t>(c / g.detector_bin);
  const std::uint32_t max_weight = static_cast<std::uint32_t>(std::max(rows, cols) - 1) / static_cast<std::uint32_t>(g.detector_bin);

  const RegionSpan span_of_region = region_span(g);
  const std::uint64_t first_group = span_of_region.first_group;
  const kernels::AnsResidentView groups = view_of_groups(first_group, span_of_region.end_group);

  bind_device();
  const cudaStream_t stream = cudaStreamPerThread;
  kernels::ScratchLayout layout;
  const std::size_t row_weights_at = layout.add(rows * 4);
  const std::size_t col_weights_at = layout.add(cols * 4);
  const std::size_t total_at = layout.add(groups.total_frames * 8);
  const std::size_t row_at = layout.add(groups.total_frames * 8);
  const std::size_t col_at = layout.add(groups.total_frames * 8);
  const std::size_t error_at = layout.add(4);
  ScratchBuffer scratch(layout.total(), stream);
  auto* d_row_weights = kernels::scratch_part<std::uint32_t>(scratch.data(), row_weights_at);
  auto* d_col_weights = kernels::scratch_part<std::uint32_t>(scratch.data(), col_weights_at);
  auto* d_total = kernels::scratch_part<std::uint64_t>(scratch.data(), total_at);
  auto* d_row = kernels::scratch_part<std::uint64_t>(scratch.data(), row_at);
  auto* d_col = kernels::scratch_part<std::uint64_t>(scratch.data(), col_at);
  auto* d_error = kernels::scratch_part<std::uint32_t>(scratch.data(), error_at);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_row_weights, row_weights.data(), rows * 4, cudaMemcpyHostToDevice, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_col_weights, col_weights.data(), cols * 4, cudaMemcpyHostToDevice, stream));
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_error, 0, 4, stream));
  kernels::ans_frame_moments(groups, d_row_weights, d_col_weights, max_weight, d_total, d_row, d_col, d_error, stream);
  // The three sums and the error flag lie together in the scratch: one copy back.
  const HostStaging host(*this, layout.total() - total_at);
  QUANTEM_CUDA_TRY(
      cudaMemcpyAsync(host.part<void>(0), d_total, layout.total() - total_at, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  throw_if_malformed(*host.part<std::uint32_t>(error_at - total_at), source_.name, "frame_moments_kernel");
  return region_moments(g, host.part<std::uint64_t>(0), host.part<std::uint64_t>(row_at - total_at),
                        host.part<std::uint64_t>(col_at - total_at), first_group * frames_per_group_);
}

CenterOfMassSums CudaResident::center_of_mass_from_table(const plan::PlanGeometry& g) {
  // The span of frames from the region's first to its last, of each of the three tables.
  const RegionSpan span_of_region = region_span(g);
  const std::uint64_t span_frames = span_of_region.last_frame - span_of_region.first_frame + 1;
  const std::uint64_t frames = source_.frame_count();
  bind_device();
  const cudaStream_t stream = cudaStreamPerThread;
  const HostStaging host(*this, 3 * span_frames * 8);
  const auto* d_table = frame_moments_.as<const std::uint64_t>();
  QUANTEM_CUDA_TRY(cudaMemcpy2DAsync(host.part<void>(0), span_frames * 8, d_table + span_of_region.first_frame,
                                     frames * 8, span_frames * 8, 3, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  const auto* h_table = host.part<std::uint64_t>(0);
  return region_moments(g, h_table, h_table + span_frames, h_table + 2 * span_frames, span_of_region.first_frame);
}

CenterOfMassSums CudaResident::region_moments(const plan::PlanGeometry& g, const std::uint64_t* total,
                                              const std::uint64_t* row_moment, const std::uint64_t* col_moment,
                                              std::uint64_t base_frame) const {
  CenterOfMassSums sums;
  const std::uint64_t frames = plan::region_frame_count(g);
  sums.total.reserve(frames);
  sums.row_moment.reserve(frames);
  sums.col_moment.reserve(frames);
  plan::for_each_region_row(g, [&](std::uint64_t first, std::uint64_t end) {
    sums.total.insert(sums.total.end(), total + (first - base_frame), total + (end - base_frame));
    sums.row_moment.insert(sums.row_moment.end(), row_moment + (first - base_frame), row_moment + (end - base_frame));
    sums.col_moment.insert(sums.col_moment.end(), col_moment + (first - base_frame), col_moment + (end - base_frame));
  });
  sums.total = plan::bin_scan_sums(g, std::move(sums.total));
  sums.row_moment = plan::bin_scan_sums(g, std::move(sums.row_moment));
  sums.col_moment = plan::bin_scan_sums(g, std::move(sums.col_moment));
  return sums;
}

std::optional<std::uint64_t> CudaResident::single_frame_at(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                                            std::uint64_t scan_col) const {
  if (geometry.scan_bin != 1) return std::nullopt;
  const std::vector<std::uint64_t> frames =
      plan::position_frame_indices(geometry, scan_row * geometry.scan_cols + scan_col);
  if (frames.size() != 1) return std::nullopt;
  return frames.front();
}

bool CudaResident::recent_frame(std::uint64_t frame, std::uint32_t* out) {
  if (recent_.capacity == 0) return false;
  std::unique_lock<std::mutex> lock(recent_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;  // another request fills or reads them: decode as usual
  const std::uint64_t pixels = source_.frame_pixels();
  const std::size_t element = dtype_size(resident_dtype_);
  const std::uint64_t frame_bytes = pixels * element;
  const bool held = frame >= recent_first_ && frame < recent_end_;
  bind_device();
  const cudaStream_t stream = cudaStreamPerThread;
  kernels::ScratchLayout host_layout;
  const std::size_t host_frame_at = host_layout.add(frame_bytes);
  const std::size_t host_error_at = host_layout.add(4);
  const HostStaging host(*this, host_layout.total());
  std::uint64_t first = recent_first_;
  std::uint64_t end = recent_end_;
  std::optional<ScratchBuffer> error;
  if (!held) {
    recent_first_ = recent_end_ = 0;  // empty until the new segment is in
    // The frame's seek segment, from its seek point up to the lookahead past
    // the frame, the last `capacity` of those frames kept.
    const auto group = static_cast<std::uint32_t>(frame / frames_per_group_);
    const std::uint64_t group_first = std::uint64_t{group} * frames_per_group_;
    const auto group_frames =
        static_cast<std::uint32_t>(std::min<std::uint64_t>(frames_per_group_, source_.frame_count() - group_first));
    const auto in_group = static_cast<std::uint32_t>(frame - group_first);
    const std::uint32_t begin = kernels::ans_seek_job_begin(in_group, frames_per_group_, seek_.frames_per_point);
    const std::uint32_t segment_end =
        kernels::ans_seek_points_per_group(frames_per_group_, seek_.frames_per_point) == 0
            ? group_frames
            : std::min(begin + seek_.frames_per_point, group_frames);
    const auto capacity = static_cast<std::uint32_t>(recent_.capacity);
    const std::uint32_t job_end = std::min(segment_end, in_group + 1 + std::min(kRecentFramesLookahead, capacity - 1));
    const std::uint32_t keep_from = std::max(begin, job_end > capacity ? job_end - capacity : 0u);
    error.emplace(4, stream);
    auto* d_error = error->as<std::uint32_t>();
    QUANTEM_CUDA_TRY(cudaMemsetAsync(d_error, 0, 4, stream));
    kernels::ans_decode_frames(view(), kernels::FrameJob{group, job_end, begin}, keep_from, recent_.d_frames.data(),
                            static_cast<std::uint32_t>(element), d_error, stream);
    QUANTEM_CUDA_TRY(
        cudaMemcpyAsync(host.part<void>(host_error_at), d_error, 4, cudaMemcpyDeviceToHost, stream));
    first = group_first + keep_from;
    end = group_first + job_end;
  }
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(host.part<void>(host_frame_at),
                                   recent_.d_frames.as<const std::uint8_t>() + (frame - first) * frame_bytes,
                                   frame_bytes, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  stage_lap(held ? "recent copy" : "recent decode");
  if (!held) {
    throw_if_malformed(*host.part<std::uint32_t>(host_error_at), source_.name, "decode_frames_kernel");
    recent_first_ = first;
    recent_end_ = end;
  }
  switch (element) {
    case 1: std::copy_n(host.part<const std::uint8_t>(host_frame_at), pixels, out); break;
    case 2: std::copy_n(host.part<const std::uint16_t>(host_frame_at), pixels, out); break;
    default: std::copy_n(host.part<const std::uint32_t>(host_frame_at), pixels, out); break;
  }
  stage_lap("result");
  return true;
}

std::vector<std::uint64_t> CudaResident::compute_frame(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                                       std::uint64_t scan_col) {
  if (const auto frame = single_frame_at(geometry, scan_row, scan_col)) {
    std::vector<std::uint32_t> native(source_.frame_pixels());
    if (recent_frame(*frame, native.data())) {
      return plan::bin_detector_sums(std::vector<std::uint64_t>(native.begin(), native.end()), source_.detector_rows,
                                     source_.detector_cols, geometry.detector_bin);
    }
  }
  return plan::bin_detector_sums(
      native_sum(plan::position_frame_indices(geometry, scan_row * geometry.scan_cols + scan_col), nullptr),
      source_.detector_rows, source_.detector_cols, geometry.detector_bin);
}

std::optional<std::vector<std::uint32_t>> CudaResident::compute_frame_u32(const plan::PlanGeometry& geometry,
                                                                          std::uint64_t scan_row,
                                                                          std::uint64_t scan_col) {
  if (geometry.detector_bin == 1) {
    if (const auto frame = single_frame_at(geometry, scan_row, scan_col)) {
      std::vector<std::uint32_t> native(source_.frame_pixels());
      if (recent_frame(*frame, native.data())) return native;  // native values fit uint32
    }
  }
  return Resident::compute_frame_u32(geometry, scan_row, scan_col);
}

std::vector<std::uint64_t> CudaResident::binned_position_max(const plan::PlanGeometry& g,
                                                             const std::vector<std::uint64_t>& positions) {
  const std::uint64_t pixels = source_.frame_pixels();
  const std::uint64_t binned_pixels = g.detector_pixels();
  const std::uint64_t total_frames = source_.frame_count();
  const std::uint64_t slots_per_pass =
      std::max<std::uint64_t>(1, std::min<std::uint64_t>(positions.size(), kSlotBufferBytes / (pixels * 8)));

  bind_device();
  const cudaStream_t stream = cudaStreamPerThread;
  kernels::ScratchLayout layout;
  const std::size_t result_at = layout.add(binned_pixels * 8);
  const std::size_t slots_at = layout.add(slots_per_pass * pixels * 8);
  const std::size_t frame_slots_at = layout.add(total_frames * 4);
  // At most one job per segment of every group (jobs_for).
  const std::uint64_t max_jobs =
      group_count_ * (kernels::ans_seek_points_per_group(frames_per_group_, seek_.frames_per_point) + 1);
  const std::size_t jobs_at = layout.add(max_jobs * sizeof(kernels::FrameJob));
  const std::size_t error_at = layout.add(4);
  ScratchBuffer scratch(layout.total(), stream);
  auto* d_result = kernels::scratch_part<std::uint64_t>(scratch.data(), result_at);
  auto* d_slots = kernels::scratch_part<std::uint64_t>(scratch.data(), slots_at);
  auto* d_frame_slots = kernels::scratch_part<std::int32_t>(scratch.data(), frame_slots_at);
  auto* d_jobs = kernels::scratch_part<kernels::FrameJob>(scratch.data(), jobs_at);
  auto* d_error = kernels::scratch_part<std::uint32_t>(scratch.data(), error_at);
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_result, 0, binned_pixels * 8, stream));
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_error, 0, 4, stream));
  const kernels::AnsResidentView all = view();
  std::vector<std::int32_t> frame_slots;
  for (std::size_t first = 0; first < positions.size(); first += slots_per_pass) {
    const std::size_t count = std::min<std::size_t>(slots_per_pass, positions.size() - first);
    frame_slots.assign(total_frames, -1);
    std::vector<std::uint64_t> frames;
    for (std::size_t k = 0; k < count; ++k) {
      for (const std::uint64_t frame : plan::position_frame_indices(g, positions[first + k])) {
        frame_slots[frame] = static_cast<std::int32_t>(k);
        frames.push_back(frame);
      }
    }
    std::sort(frames.begin(), frames.end());
    const std::vector<kernels::FrameJob> jobs = jobs_for(frames, frames_per_group_, seek_.frames_per_point);
    QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_frame_slots, frame_slots.data(), total_frames * 4, cudaMemcpyHostToDevice, stream));
    QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_jobs, jobs.data(), jobs.size() * sizeof(kernels::FrameJob), cudaMemcpyHostToDevice,
                                     stream));
    QUANTEM_CUDA_TRY(cudaMemsetAsync(d_slots, 0, count * pixels * 8, stream));
    kernels::ans_accumulate_slots(all, d_jobs, jobs.size(), d_frame_slots, d_slots, d_error, stream);
    kernels::binned_slot_max(d_slots, static_cast<std::uint32_t>(count), static_cast<std::uint32_t>(source_.detector_rows),
                          static_cast<std::uint32_t>(source_.detector_cols), static_cast<std::uint32_t>(g.detector_bin),
                          d_result, stream);
    QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));  // the host arrays are rebuilt for the next pass
  }
  kernels::ScratchLayout host_layout;
  const std::size_t host_result_at = host_layout.add(binned_pixels * 8);
  const std::size_t host_error_at = host_layout.add(4);
  const HostStaging host(*this, host_layout.total());
  QUANTEM_CUDA_TRY(
      cudaMemcpyAsync(host.part<void>(host_result_at), d_result, binned_pixels * 8, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(host.part<void>(host_error_at), d_error, 4, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  throw_if_malformed(*host.part<std::uint32_t>(host_error_at), source_.name, "accumulate_slots_kernel");
  const auto* h_result = host.part<std::uint64_t>(host_result_at);
  return std::vector<std::uint64_t>(h_result, h_result + binned_pixels);
}

namespace {
// Distinct positions have disjoint frame blocks: their union, ascending.
std::vector<std::uint64_t> region_frames(const plan::PlanGeometry& geometry, const std::vector<std::uint64_t>& sorted) {
  std::vector<std::uint64_t> frames;
  for (const std::uint64_t position : sorted) {
    for (const std::uint64_t frame : plan::position_frame_indices(geometry, position)) frames.push_back(frame);
  }
  std::sort(frames.begin(), frames.end());
  return frames;
}
}  // namespace

std::vector<std::uint64_t> CudaResident::compute_region_reduce(const plan::PlanGeometry& geometry,
                                                               const std::vector<std::uint64_t>& sorted,
                                                               RegionReduce reduce) {
  if (reduce == RegionReduce::max && (geometry.scan_bin != 1 || geometry.detector_bin != 1)) {
    return binned_position_max(geometry, sorted);
  }
  const std::vector<std::uint64_t> frames = region_frames(geometry, sorted);
  if (reduce == RegionReduce::max) {  // one frame per position, native detector: a per-pixel max
    std::vector<std::uint32_t> maxima;
    native_sum(frames, &maxima);
    return std::vector<std::uint64_t>(maxima.begin(), maxima.end());
  }
  return plan::bin_detector_sums(native_sum(frames, nullptr), source_.detector_rows, source_.detector_cols,
                      geometry.detector_bin);
}

std::optional<std::vector<std::uint32_t>> CudaResident::compute_region_reduce_u32(
    const plan::PlanGeometry& geometry, const std::vector<std::uint64_t>& sorted, RegionReduce reduce) {
  if (geometry.detector_bin != 1 || (reduce == RegionReduce::max && geometry.scan_bin != 1)) {
    return Resident::compute_region_reduce_u32(geometry, sorted, reduce);  // binned: narrowed on the host
  }
  const std::vector<std::uint64_t> frames = region_frames(geometry, sorted);
  if (reduce == RegionReduce::max) {  // native maxima are uint32 already
    std::vector<std::uint32_t> maxima;
    native_sum(frames, &maxima);
    return maxima;
  }
  return native_sum_u32(frames);
}

}  // namespace quantem::backend::cuda
