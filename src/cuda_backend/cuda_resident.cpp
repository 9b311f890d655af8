#include "cuda_resident.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "quantem/core/error.hpp"
#include "quantem/cuda/resident_products.hpp"

namespace quantem::backend::cuda_detail {
namespace {

// Largest slot buffer of a binned region max (whole native frames in uint64).
constexpr std::uint64_t kSlotBufferBytes = std::uint64_t{64} << 20;

std::uint64_t align256(std::uint64_t value) { return (value + 255) / 256 * 256; }

// out[r / bin][c / bin] = Σ native[r][c]; out has ceil(rows/bin) x ceil(cols/bin) values.
std::vector<std::uint64_t> bin_detector(const std::vector<std::uint64_t>& native, std::uint64_t rows,
                                        std::uint64_t cols, std::uint64_t bin) {
  if (bin == 1) return native;
  const std::uint64_t out_cols = (cols + bin - 1) / bin;
  const std::uint64_t out_rows = (rows + bin - 1) / bin;
  std::vector<std::uint64_t> out(out_rows * out_cols, 0);
  for (std::uint64_t r = 0; r < rows; ++r) {
    for (std::uint64_t c = 0; c < cols; ++c) out[(r / bin) * out_cols + c / bin] += native[r * cols + c];
  }
  return out;
}

// Sums per-frame values of the region (row-major over the region) into plan positions.
std::vector<std::uint64_t> bin_scan(const plan::PlanGeometry& g, std::vector<std::uint64_t> per_frame) {
  if (g.scan_bin == 1) return per_frame;
  const std::uint64_t region_cols = g.region.col_stop - g.region.col_start;
  const std::uint64_t region_rows = g.region.row_stop - g.region.row_start;
  std::vector<std::uint64_t> out(g.positions(), 0);
  for (std::uint64_t r = 0; r < region_rows; ++r) {
    for (std::uint64_t c = 0; c < region_cols; ++c) {
      out[(r / g.scan_bin) * g.scan_cols + c / g.scan_bin] += per_frame[r * region_cols + c];
    }
  }
  return out;
}

// Global frame indices (ascending) of the region.
std::vector<std::uint64_t> region_frames(const plan::PlanGeometry& g) {
  std::vector<std::uint64_t> frames;
  frames.reserve((g.region.row_stop - g.region.row_start) * (g.region.col_stop - g.region.col_start));
  for (std::uint64_t row = g.region.row_start; row < g.region.row_stop; ++row)
    for (std::uint64_t col = g.region.col_start; col < g.region.col_stop; ++col)
      frames.push_back(row * g.source_scan_cols + col);
  return frames;
}

// The source frames (ascending) of one plan position: its scan_bin x scan_bin block, cut at the region's edge.
std::vector<std::uint64_t> position_frames(const plan::PlanGeometry& g, std::uint64_t position) {
  const std::uint64_t row_begin = g.region.row_start + position / g.scan_cols * g.scan_bin;
  const std::uint64_t row_end = std::min(g.region.row_stop, row_begin + g.scan_bin);
  const std::uint64_t col_begin = g.region.col_start + position % g.scan_cols * g.scan_bin;
  const std::uint64_t col_end = std::min(g.region.col_stop, col_begin + g.scan_bin);
  std::vector<std::uint64_t> frames;
  for (std::uint64_t row = row_begin; row < row_end; ++row)
    for (std::uint64_t col = col_begin; col < col_end; ++col) frames.push_back(row * g.source_scan_cols + col);
  return frames;
}

// Jobs for ascending frames: each touched group, decoded up to its last needed frame.
std::vector<cuda::FrameJob> jobs_for(const std::vector<std::uint64_t>& sorted_frames, std::uint32_t frames_per_group) {
  std::vector<cuda::FrameJob> jobs;
  for (const std::uint64_t frame : sorted_frames) {
    const auto group = static_cast<std::uint32_t>(frame / frames_per_group);
    const auto end = static_cast<std::uint32_t>(frame % frames_per_group + 1);
    if (jobs.empty() || jobs.back().group != group) {
      jobs.push_back({group, end});
    } else {
      jobs.back().frame_end = std::max(jobs.back().frame_end, end);
    }
  }
  return jobs;
}

}  // namespace

CudaResident::CudaResident(catalog::Acquisition source, DType resident_dtype, std::string encoding, int device_index,
                           std::uint32_t frames_per_group, std::vector<TrackedBuffer> pieces,
                           TrackedBuffer group_offsets, const std::uint8_t* base)
    : source_(std::move(source)),
      resident_dtype_(resident_dtype),
      encoding_(std::move(encoding)),
      device_index_(device_index),
      frames_per_group_(frames_per_group),
      group_count_(cuda::ans_group_count(source_.frame_count(), frames_per_group)),
      pieces_(std::move(pieces)),
      group_offsets_(std::move(group_offsets)),
      base_(base),
      resident_bytes_(group_offsets_.size()) {
  for (const TrackedBuffer& piece : pieces_) resident_bytes_ += piece.size();
}

CudaResident::~CudaResident() { QUANTEM_CUDA_TRY_NOTHROW(cudaSetDevice(device_index_)); }

cuda::AnsResidentView CudaResident::view() const { return view_of_groups(0, group_count_); }

cuda::AnsResidentView CudaResident::view_of_groups(std::uint64_t first_group, std::uint64_t end_group) const {
  cuda::AnsResidentView view;
  view.d_blobs = base_;
  view.d_group_offsets = group_offsets_.as<const std::uint64_t>() + first_group;
  view.group_count = static_cast<std::size_t>(end_group - first_group);
  view.frames_per_group = frames_per_group_;
  view.total_frames = std::min(source_.frame_count(), end_group * frames_per_group_) - first_group * frames_per_group_;
  view.detector_rows = static_cast<std::uint32_t>(source_.detector_rows);
  view.detector_cols = static_cast<std::uint32_t>(source_.detector_cols);
  return view;
}

void CudaResident::bind_device() const { cuda::set_device(device_index_); }

void CudaResident::check_geometry(const plan::PlanGeometry& geometry) const {
  plan::require_resolved_for(geometry, source_.scan_rows, source_.scan_cols, source_.detector_rows,
                             source_.detector_cols, source_.name);
}

namespace {
void throw_if_malformed(std::uint32_t error_flag, const std::string& name, const char* what) {
  if (error_flag != 0) {
    throw internal_error("the CUDA resident of " + name + " holds a malformed ANS group (found by " + what + ")");
  }
}
}  // namespace

std::vector<std::uint64_t> CudaResident::native_sum(const std::vector<std::uint64_t>& frames,
                                                    std::vector<std::uint32_t>* maxima) {
  const std::uint64_t pixels = source_.frame_pixels();
  std::vector<std::uint64_t> sums(pixels, 0);
  if (maxima != nullptr) maxima->assign(pixels, 0);
  if (frames.empty()) return sums;
  const std::uint64_t total_frames = source_.frame_count();
  std::vector<std::uint32_t> bitmap((total_frames + 31) / 32, 0);
  for (const std::uint64_t frame : frames) bitmap[frame / 32] |= 1u << (frame % 32);
  const std::vector<cuda::FrameJob> jobs = jobs_for(frames, frames_per_group_);

  bind_device();
  const cudaStream_t stream = cudaStreamPerThread;
  const std::uint64_t bitmap_bytes = align256(bitmap.size() * 4);
  const std::uint64_t jobs_bytes = align256(jobs.size() * sizeof(cuda::FrameJob));
  const std::uint64_t sums_bytes = align256(pixels * 8);
  const std::uint64_t maxima_bytes = align256(pixels * 4);
  ScratchBuffer scratch(bitmap_bytes + jobs_bytes + sums_bytes + maxima_bytes + 256, stream);
  auto* bytes = scratch.as<std::uint8_t>();
  auto* d_bitmap = reinterpret_cast<std::uint32_t*>(bytes);
  auto* d_jobs = reinterpret_cast<cuda::FrameJob*>(bytes + bitmap_bytes);
  auto* d_sums = reinterpret_cast<std::uint64_t*>(bytes + bitmap_bytes + jobs_bytes);
  auto* d_maxima = reinterpret_cast<std::uint32_t*>(bytes + bitmap_bytes + jobs_bytes + sums_bytes);
  auto* d_error = reinterpret_cast<std::uint32_t*>(bytes + bitmap_bytes + jobs_bytes + sums_bytes + maxima_bytes);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_bitmap, bitmap.data(), bitmap.size() * 4, cudaMemcpyHostToDevice, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_jobs, jobs.data(), jobs.size() * sizeof(cuda::FrameJob), cudaMemcpyHostToDevice,
                                   stream));
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_sums, 0, sums_bytes + maxima_bytes + 256, stream));
  const cuda::AnsResidentView all = view();
  for (std::size_t first = 0; first < jobs.size(); first += cuda::kMaxFrameJobs) {
    const std::size_t count = std::min(cuda::kMaxFrameJobs, jobs.size() - first);
    cuda::ans_accumulate_frames(all, d_jobs + first, count, d_bitmap, d_sums, maxima != nullptr ? d_maxima : nullptr,
                                d_error, stream);
  }
  std::uint32_t error_flag = 0;
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(sums.data(), d_sums, pixels * 8, cudaMemcpyDeviceToHost, stream));
  if (maxima != nullptr) {
    QUANTEM_CUDA_TRY(cudaMemcpyAsync(maxima->data(), d_maxima, pixels * 4, cudaMemcpyDeviceToHost, stream));
  }
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(&error_flag, d_error, 4, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  throw_if_malformed(error_flag, source_.name, "accumulate_frames_kernel");
  return sums;
}

std::vector<std::uint64_t> CudaResident::pattern_sum(const plan::PlanGeometry& geometry) {
  check_geometry(geometry);
  std::vector<std::uint64_t> native;
  if (geometry.cropped) {
    native = native_sum(region_frames(geometry), nullptr);
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
  return bin_detector(native, source_.detector_rows, source_.detector_cols, geometry.detector_bin);
}

std::vector<std::uint64_t> CudaResident::masked_sum(const plan::PlanGeometry& g,
                                                    const std::vector<std::uint8_t>& binned_mask) {
  check_geometry(g);
  if (binned_mask.size() != g.detector_pixels()) {
    throw bad_request("detector mask has " + std::to_string(binned_mask.size()) + " values; the plan's " +
                      std::to_string(g.detector_rows) + " x " + std::to_string(g.detector_cols) +
                      " detector needs " + std::to_string(g.detector_pixels()));
  }
  const std::uint64_t rows = source_.detector_rows;
  const std::uint64_t cols = source_.detector_cols;
  std::vector<std::uint8_t> native(rows * cols);
  for (std::uint64_t r = 0; r < rows; ++r)
    for (std::uint64_t c = 0; c < cols; ++c)
      native[r * cols + c] = binned_mask[(r / g.detector_bin) * g.detector_cols + c / g.detector_bin] != 0 ? 1 : 0;

  const std::uint64_t first_frame = g.region.row_start * g.source_scan_cols + g.region.col_start;
  const std::uint64_t last_frame = (g.region.row_stop - 1) * g.source_scan_cols + g.region.col_stop - 1;
  const std::uint64_t first_group = first_frame / frames_per_group_;
  const std::uint64_t end_group = last_frame / frames_per_group_ + 1;
  const cuda::AnsResidentView groups = view_of_groups(first_group, end_group);

  bind_device();
  const cudaStream_t stream = cudaStreamPerThread;
  // The mask's entries go into this request's stream-ordered scratch: no
  // cudaMalloc/cudaFree (which would synchronise the device) per request.
  const std::vector<std::uint32_t> entries =
      cuda::ans_mask_entries(native, static_cast<std::uint32_t>(rows), static_cast<std::uint32_t>(cols));
  const std::uint64_t sums_bytes = align256(groups.total_frames * 8);
  const std::uint64_t entries_bytes = align256(entries.size() * 4);
  ScratchBuffer scratch(sums_bytes + entries_bytes + 256, stream);
  auto* d_sums = scratch.as<std::uint64_t>();
  auto* d_entries = reinterpret_cast<std::uint32_t*>(scratch.as<std::uint8_t>() + sums_bytes);
  auto* d_error = reinterpret_cast<std::uint32_t*>(scratch.as<std::uint8_t>() + sums_bytes + entries_bytes);
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_error, 0, 4, stream));
  if (!entries.empty())  // from pageable memory: staged before the call returns
    QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_entries, entries.data(), entries.size() * 4, cudaMemcpyHostToDevice, stream));
  cuda::ans_masked_sum(groups, d_entries, static_cast<std::uint32_t>(entries.size()), d_sums, d_error, stream);
  // Only the frames from the region's first to its last come back; a region of
  // whole scan rows is exactly that span, in order.
  const std::uint64_t base_frame = first_group * frames_per_group_;
  std::vector<std::uint64_t> span(last_frame - first_frame + 1);
  std::uint32_t error_flag = 0;
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(span.data(), d_sums + (first_frame - base_frame), span.size() * 8,
                                   cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(&error_flag, d_error, 4, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  throw_if_malformed(error_flag, source_.name, "masked_sum_kernel");

  if (g.region.col_start == 0 && g.region.col_stop == g.source_scan_cols) return bin_scan(g, std::move(span));
  std::vector<std::uint64_t> per_frame;
  per_frame.reserve((g.region.row_stop - g.region.row_start) * (g.region.col_stop - g.region.col_start));
  for (const std::uint64_t frame : region_frames(g)) per_frame.push_back(span[frame - first_frame]);
  return bin_scan(g, std::move(per_frame));
}

CenterOfMassSums CudaResident::center_of_mass_sums(const plan::PlanGeometry& g) {
  check_geometry(g);
  const std::uint64_t rows = source_.detector_rows;
  const std::uint64_t cols = source_.detector_cols;
  std::vector<std::uint32_t> row_weights(rows);
  std::vector<std::uint32_t> col_weights(cols);
  for (std::uint64_t r = 0; r < rows; ++r) row_weights[r] = static_cast<std::uint32_t>(r / g.detector_bin);
  for (std::uint64_t c = 0; c < cols; ++c) col_weights[c] = static_cast<std::uint32_t>(c / g.detector_bin);
  const std::uint32_t max_weight = static_cast<std::uint32_t>(std::max(rows, cols) - 1) / static_cast<std::uint32_t>(g.detector_bin);

  const std::uint64_t first_frame = g.region.row_start * g.source_scan_cols + g.region.col_start;
  const std::uint64_t last_frame = (g.region.row_stop - 1) * g.source_scan_cols + g.region.col_stop - 1;
  const std::uint64_t first_group = first_frame / frames_per_group_;
  const std::uint64_t end_group = last_frame / frames_per_group_ + 1;
  const cuda::AnsResidentView groups = view_of_groups(first_group, end_group);

  bind_device();
  const cudaStream_t stream = cudaStreamPerThread;
  const std::uint64_t weights_bytes = align256(rows * 4) + align256(cols * 4);
  const std::uint64_t sums_bytes = align256(groups.total_frames * 8);
  ScratchBuffer scratch(weights_bytes + 3 * sums_bytes + 256, stream);
  auto* bytes = scratch.as<std::uint8_t>();
  auto* d_row_weights = reinterpret_cast<std::uint32_t*>(bytes);
  auto* d_col_weights = reinterpret_cast<std::uint32_t*>(bytes + align256(rows * 4));
  auto* d_total = reinterpret_cast<std::uint64_t*>(bytes + weights_bytes);
  auto* d_row = reinterpret_cast<std::uint64_t*>(bytes + weights_bytes + sums_bytes);
  auto* d_col = reinterpret_cast<std::uint64_t*>(bytes + weights_bytes + 2 * sums_bytes);
  auto* d_error = reinterpret_cast<std::uint32_t*>(bytes + weights_bytes + 3 * sums_bytes);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_row_weights, row_weights.data(), rows * 4, cudaMemcpyHostToDevice, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_col_weights, col_weights.data(), cols * 4, cudaMemcpyHostToDevice, stream));
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_error, 0, 4, stream));
  cuda::ans_frame_moments(groups, d_row_weights, d_col_weights, max_weight, d_total, d_row, d_col, d_error, stream);
  std::vector<std::uint64_t> total(groups.total_frames);
  std::vector<std::uint64_t> row_moment(groups.total_frames);
  std::vector<std::uint64_t> col_moment(groups.total_frames);
  std::uint32_t error_flag = 0;
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(total.data(), d_total, total.size() * 8, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(row_moment.data(), d_row, row_moment.size() * 8, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(col_moment.data(), d_col, col_moment.size() * 8, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(&error_flag, d_error, 4, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  throw_if_malformed(error_flag, source_.name, "frame_moments_kernel");

  const std::uint64_t base_frame = first_group * frames_per_group_;
  CenterOfMassSums sums;
  for (const std::uint64_t frame : region_frames(g)) {
    sums.total.push_back(total[frame - base_frame]);
    sums.row_moment.push_back(row_moment[frame - base_frame]);
    sums.col_moment.push_back(col_moment[frame - base_frame]);
  }
  sums.total = bin_scan(g, std::move(sums.total));
  sums.row_moment = bin_scan(g, std::move(sums.row_moment));
  sums.col_moment = bin_scan(g, std::move(sums.col_moment));
  return sums;
}

std::vector<std::uint64_t> CudaResident::frame(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                               std::uint64_t scan_col) {
  check_geometry(geometry);
  if (scan_row >= geometry.scan_rows || scan_col >= geometry.scan_cols) {
    throw bad_request("scan position (" + std::to_string(scan_row) + ", " + std::to_string(scan_col) +
                      ") is outside the plan's " + std::to_string(geometry.scan_rows) + " x " +
                      std::to_string(geometry.scan_cols) + " scan");
  }
  const std::vector<std::uint64_t> native =
      native_sum(position_frames(geometry, scan_row * geometry.scan_cols + scan_col), nullptr);
  return bin_detector(native, source_.detector_rows, source_.detector_cols, geometry.detector_bin);
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
  const std::uint64_t result_bytes = align256(binned_pixels * 8);
  const std::uint64_t slots_bytes = align256(slots_per_pass * pixels * 8);
  const std::uint64_t frame_slots_bytes = align256(total_frames * 4);
  const std::uint64_t jobs_bytes = align256(group_count_ * sizeof(cuda::FrameJob));
  ScratchBuffer scratch(result_bytes + slots_bytes + frame_slots_bytes + jobs_bytes + 256, stream);
  auto* bytes = scratch.as<std::uint8_t>();
  auto* d_result = reinterpret_cast<std::uint64_t*>(bytes);
  auto* d_slots = reinterpret_cast<std::uint64_t*>(bytes + result_bytes);
  auto* d_frame_slots = reinterpret_cast<std::int32_t*>(bytes + result_bytes + slots_bytes);
  auto* d_jobs = reinterpret_cast<cuda::FrameJob*>(bytes + result_bytes + slots_bytes + frame_slots_bytes);
  auto* d_error = reinterpret_cast<std::uint32_t*>(bytes + result_bytes + slots_bytes + frame_slots_bytes + jobs_bytes);
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_result, 0, result_bytes, stream));
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_error, 0, 4, stream));
  const cuda::AnsResidentView all = view();
  std::vector<std::int32_t> frame_slots;
  for (std::size_t first = 0; first < positions.size(); first += slots_per_pass) {
    const std::size_t count = std::min<std::size_t>(slots_per_pass, positions.size() - first);
    frame_slots.assign(total_frames, -1);
    std::vector<std::uint64_t> frames;
    for (std::size_t k = 0; k < count; ++k) {
      for (const std::uint64_t frame : position_frames(g, positions[first + k])) {
        frame_slots[frame] = static_cast<std::int32_t>(k);
        frames.push_back(frame);
      }
    }
    std::sort(frames.begin(), frames.end());
    const std::vector<cuda::FrameJob> jobs = jobs_for(frames, frames_per_group_);
    QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_frame_slots, frame_slots.data(), total_frames * 4, cudaMemcpyHostToDevice, stream));
    QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_jobs, jobs.data(), jobs.size() * sizeof(cuda::FrameJob), cudaMemcpyHostToDevice,
                                     stream));
    QUANTEM_CUDA_TRY(cudaMemsetAsync(d_slots, 0, count * pixels * 8, stream));
    cuda::ans_accumulate_slots(all, d_jobs, jobs.size(), d_frame_slots, d_slots, d_error, stream);
    cuda::binned_slot_max(d_slots, static_cast<std::uint32_t>(count), static_cast<std::uint32_t>(source_.detector_rows),
                          static_cast<std::uint32_t>(source_.detector_cols), static_cast<std::uint32_t>(g.detector_bin),
                          d_result, stream);
    QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));  // the host arrays are rebuilt for the next pass
  }
  std::vector<std::uint64_t> result(binned_pixels);
  std::uint32_t error_flag = 0;
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(result.data(), d_result, binned_pixels * 8, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(&error_flag, d_error, 4, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  throw_if_malformed(error_flag, source_.name, "accumulate_slots_kernel");
  return result;
}

std::vector<std::uint64_t> CudaResident::region_reduce(const plan::PlanGeometry& geometry,
                                                       const std::vector<std::uint64_t>& positions,
                                                       RegionReduce reduce) {
  check_geometry(geometry);
  const std::vector<std::uint64_t> sorted = plan::sorted_distinct_positions(geometry, positions);
  if (reduce == RegionReduce::max && (geometry.scan_bin != 1 || geometry.detector_bin != 1)) {
    return binned_position_max(geometry, sorted);
  }
  // Distinct positions have disjoint frame blocks: their union, ascending.
  std::vector<std::uint64_t> frames;
  for (const std::uint64_t position : sorted) {
    for (const std::uint64_t frame : position_frames(geometry, position)) frames.push_back(frame);
  }
  std::sort(frames.begin(), frames.end());
  if (reduce == RegionReduce::max) {  // one frame per position, native detector: a per-pixel max
    std::vector<std::uint32_t> maxima;
    native_sum(frames, &maxima);
    return std::vector<std::uint64_t>(maxima.begin(), maxima.end());
  }
  return bin_detector(native_sum(frames, nullptr), source_.detector_rows, source_.detector_cols,
                      geometry.detector_bin);
}

}  // namespace quantem::backend::cuda_detail
