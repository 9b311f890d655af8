// The CUDA resident's export encoder (Resident::encode_export_chunks,
// decision 0023): a batch of whole plan rows is decoded from the ANS groups
// into a window of source frames (kernels::ans_decode_frame_runs), binned into
// the plan's frames when the plan bins (kernels::bin_plan_frames; unbinned plans
// decode straight into the plan's frames at the export dtype), bitshuffle/LZ4
// encoded (kernels::encode_bitshuffle_lz4), and only the encoded chunks cross to
// the host.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_resident.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/bitshuffle_lz4.hpp"
#include "quantem/kernels/scratch_layout.hpp"

namespace quantem::backend::cuda {
namespace {

// Device memory one export batch may take (window, plan frames, encoder
// scratch, encoded chunks) and batches in flight at once: a batch is decoded
// and encoded while the one before it crosses to the host and is written.
constexpr std::uint64_t kExportBatchDeviceBytes = std::uint64_t{512} << 20;
constexpr unsigned kExportWorkers = 2;

bool binned(const plan::PlanGeometry& geometry) { return geometry.scan_bin > 1 || geometry.detector_bin > 1; }

kernels::BitshuffleLz4EncodeBatch encode_batch(const plan::PlanGeometry& geometry, std::size_t element_size,
                                            const void* d_frames, std::uint64_t count) {
  kernels::BitshuffleLz4EncodeBatch batch;
  batch.d_frames = d_frames;
  batch.chunk_count = count;
  batch.element_size = element_size;
  batch.elements_per_chunk = geometry.detector_pixels();
  return batch;
}

// The window's source frames per plan row: scan_bin source rows (fewer at the
// region's last row) of the region's width.
std::uint64_t window_frames_per_plan_row(const plan::PlanGeometry& geometry) {
  return geometry.scan_bin * (geometry.region.col_stop - geometry.region.col_start);
}

}  // namespace

std::vector<kernels::FrameRun> CudaResident::export_window_runs(const plan::PlanGeometry& geometry,
                                                             std::uint64_t first_plan_row,
                                                             std::uint64_t end_plan_row) const {
  const std::uint64_t source_cols = geometry.source_scan_cols;
  const std::uint64_t width = geometry.region.col_stop - geometry.region.col_start;
  const std::uint64_t row_first = geometry.region.row_start + first_plan_row * geometry.scan_bin;
  const std::uint64_t row_end =
      std::min(geometry.region.row_start + end_plan_row * geometry.scan_bin, geometry.region.row_stop);
  const std::uint32_t seek_frames = seek_.frames_per_point;
  const std::uint32_t seek_points = kernels::ans_seek_points_per_group(frames_per_group_, seek_frames);
  const std::uint64_t total_frames = source_.frame_count();
  std::vector<kernels::FrameRun> runs;
  // Frames [first, end) of the resident to output frames from out_frame on,
  // cut at groups and seek segments.
  const auto add = [&](std::uint64_t first, std::uint64_t end, std::uint64_t out_frame) {
    while (first < end) {
      const std::uint64_t group = first / frames_per_group_;
      const std::uint64_t group_first = group * frames_per_group_;
      const auto group_frames =
          static_cast<std::uint32_t>(std::min<std::uint64_t>(frames_per_group_, total_frames - group_first));
      const auto in_group = static_cast<std::uint32_t>(first - group_first);
      const std::uint32_t begin = kernels::ans_seek_job_begin(in_group, frames_per_group_, seek_frames);
      const std::uint32_t segment_end =
          seek_points != 0 && begin / seek_frames < seek_points ? begin + seek_frames : group_frames;
      const auto job_end = static_cast<std::uint32_t>(std::min<std::uint64_t>(segment_end, end - group_first));
      runs.push_back(kernels::FrameRun{kernels::FrameJob{static_cast<std::uint32_t>(group), job_end, begin}, in_group,
                                    out_frame});
      out_frame += job_end - in_group;
      first = group_first + job_end;
    }
  };
  if (width == source_cols) {
    add(row_first * source_cols, row_end * source_cols, 0);
  } else {
    for (std::uint64_t row = row_first; row < row_end; ++row) {
      add(row * source_cols + geometry.region.col_start, row * source_cols + geometry.region.col_stop,
          (row - row_first) * width);
    }
  }
  return runs;
}

Resident::ExportBatchShape CudaResident::export_batch_shape(const plan::PlanGeometry& geometry,
                                                            std::size_t element_size) const {
  const std::uint64_t plan_bytes = geometry.detector_pixels() * element_size;
  const auto one = encode_batch(geometry, element_size, nullptr, 1);
  const std::uint64_t window_bytes =
      binned(geometry) ? window_frames_per_plan_row(geometry) * source_.frame_pixels() * dtype_size(resident_dtype_)
                       : 0;
  const std::uint64_t row_bytes =
      geometry.scan_cols * (plan_bytes + kernels::bitshuffle_lz4_encode_scratch_bytes(one) +
                            kernels::bitshuffle_lz4_chunk_bound(one)) +
      window_bytes;
  const std::uint64_t rows = std::clamp<std::uint64_t>(kExportBatchDeviceBytes / std::max<std::uint64_t>(row_bytes, 1),
                                                       1, std::max<std::uint64_t>(geometry.scan_rows, 1));
  return {rows * geometry.scan_cols, kExportWorkers};
}

bool CudaResident::compute_export_chunks(const plan::PlanGeometry& geometry, std::uint64_t first_position,
                                         std::uint64_t count, std::size_t element_size, EncodedChunks& out) {
  out.offsets.assign(count + 1, 0);
  out.bytes.clear();
  if (count == 0) return true;
  // The whole plan rows holding the positions.
  const std::uint64_t first_row = first_position / geometry.scan_cols;
  const std::uint64_t end_row = (first_position + count + geometry.scan_cols - 1) / geometry.scan_cols;
  const std::uint64_t rows_positions = (end_row - first_row) * geometry.scan_cols;
  const std::uint64_t skipped = first_position - first_row * geometry.scan_cols;
  const std::uint64_t width = geometry.region.col_stop - geometry.region.col_start;
  const std::uint64_t window_rows =
      std::min(geometry.region.row_start + end_row * geometry.scan_bin, geometry.region.row_stop) -
      (geometry.region.row_start + first_row * geometry.scan_bin);
  const bool bins = binned(geometry);
  const std::size_t window_element = bins ? dtype_size(resident_dtype_) : element_size;
  const std::vector<kernels::FrameRun> runs = export_window_runs(geometry, first_row, end_row);

  bind_device();
  const cudaStream_t stream = cudaStreamPerThread;
  const std::size_t plan_frame_bytes = geometry.detector_pixels() * element_size;
  kernels::ScratchLayout layout;
  const std::size_t flags_at = layout.add(8);  // decode error, bin overflow
  const std::size_t runs_at = layout.add(runs.size() * sizeof(kernels::FrameRun));
  const std::size_t window_at = layout.add(bins ? window_rows * width * source_.frame_pixels() * window_element : 0);
  const std::size_t plan_at = layout.add(rows_positions * plan_frame_bytes);
  const auto batch = encode_batch(geometry, element_size, nullptr, count);
  const std::size_t encode_bytes = kernels::bitshuffle_lz4_encode_scratch_bytes(batch);
  const std::size_t encode_at = layout.add(encode_bytes);
  const std::size_t chunks_at = layout.add(count * kernels::bitshuffle_lz4_chunk_bound(batch));
  const std::size_t offsets_at = layout.add((count + 1) * sizeof(std::uint64_t));
  ScratchBuffer scratch(layout.total(), stream);
  const auto part = [&](std::size_t at) { return kernels::scratch_part<std::uint8_t>(scratch.data(), at); };
  auto* d_flags = reinterpret_cast<std::uint32_t*>(part(flags_at));
  auto* d_runs = reinterpret_cast<kernels::FrameRun*>(part(runs_at));
  std::uint8_t* d_plan = part(plan_at);

  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_flags, 0, 8, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_runs, runs.data(), runs.size() * sizeof(kernels::FrameRun), cudaMemcpyHostToDevice,
                                   stream));
  std::uint8_t* d_window = bins ? part(window_at) : d_plan;
  const kernels::AnsResidentView all = view();
  for (std::size_t first = 0; first < runs.size(); first += kernels::kMaxFrameJobs) {
    kernels::ans_decode_frame_runs(all, d_runs + first, std::min(kernels::kMaxFrameJobs, runs.size() - first), d_window,
                                static_cast<std::uint32_t>(window_element), d_flags, stream);
  }
  if (bins) {
    kernels::PlanFramesShape shape;
    shape.window_rows = window_rows;
    shape.window_cols = width;
    shape.window_element_bytes = static_cast<std::uint32_t>(window_element);
    shape.detector_rows = static_cast<std::uint32_t>(geometry.source_detector_rows);
    shape.detector_cols = static_cast<std::uint32_t>(geometry.source_detector_cols);
    shape.scan_bin = static_cast<std::uint32_t>(geometry.scan_bin);
    shape.detector_bin = static_cast<std::uint32_t>(geometry.detector_bin);
    shape.plan_rows = end_row - first_row;
    shape.plan_cols = geometry.scan_cols;
    kernels::bin_plan_frames(d_window, shape, reinterpret_cast<std::uint32_t*>(d_plan), d_flags + 1, stream);
  }
  const auto frames = encode_batch(geometry, element_size, d_plan + skipped * plan_frame_bytes, count);
  auto* d_offsets = reinterpret_cast<std::uint64_t*>(part(offsets_at));
  kernels::encode_bitshuffle_lz4(frames, part(encode_at), encode_bytes, part(chunks_at), d_offsets, stream);

  std::uint32_t flags[2] = {0, 0};
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(flags, d_flags, 8, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(out.offsets.data(), d_offsets, (count + 1) * sizeof(std::uint64_t),
                                   cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  throw_if_malformed(flags[0], source_.name, "decode_frame_runs_kernel");
  if (flags[1] != 0) throw binned_value_overflow(first_position, count);
  out.bytes.resize(out.offsets[count]);
  QUANTEM_CUDA_TRY(
      cudaMemcpyAsync(out.bytes.data(), part(chunks_at), out.bytes.size(), cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  return true;
}

}  // namespace quantem::backend::cuda
