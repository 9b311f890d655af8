// Per-frame sums of a region gathered into plan positions (scan-binned) and
// narrowed to the wire's uint32 on the device, and whole binned plan frames
// from a window of decoded frames (an export's batch); declared in
// include/quantem/kernels/resident_products.hpp.
#include <cuda_runtime.h>

#include <cstdint>

#include "quantem/core/error.hpp"
#include "quantem/kernels/resident_products.hpp"
#include "quantem/kernels/cuda_check.hpp"
#include "../common/tuning.cuh"

namespace quantem::kernels {
namespace {

// One thread per plan position: Σ of its (up to scan_bin²) frames, written as
// uint32; a sum above 2^32 - 1 writes 0 and raises *d_overflow.
__global__ void narrow_plan_sums_kernel(const unsigned long long* __restrict__ frame_sums, std::uint64_t base_frame,
                                        PlanRegionView region, std::uint32_t* __restrict__ out,
                                        std::uint32_t* d_overflow) {
  const std::uint64_t positions = region.plan_rows * region.plan_cols;
  for (std::uint64_t p = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; p < positions;
       p += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t row_begin = region.row_start + p / region.plan_cols * region.scan_bin;
    const std::uint64_t col_begin = region.col_start + p % region.plan_cols * region.scan_bin;
    const std::uint64_t row_end = min(region.row_stop, row_begin + region.scan_bin);
    const std::uint64_t col_end = min(region.col_stop, col_begin + region.scan_bin);
    unsigned long long sum = 0;
    for (std::uint64_t row = row_begin; row < row_end; ++row) {
      const unsigned long long* in = frame_sums + (row * region.source_cols - base_frame);
      for (std::uint64_t col = col_begin; col < col_end; ++col) sum += in[col];
    }
    if (sum > 0xffffffffull) {
      atomicOr(d_overflow, 1u);
      sum = 0;
    }
    out[p] = static_cast<std::uint32_t>(sum);
  }
}

// One thread per (plan frame, binned pixel): the exact sum over its scan bin's
// window frames and its detector bin's pixels.
template <class Element>
__global__ void bin_plan_frames_kernel(const Element* __restrict__ window, PlanFramesShape shape,
                                       std::uint32_t binned_cols, std::uint64_t binned_pixels,
                                       std::uint32_t* __restrict__ out, std::uint32_t* d_overflow) {
  const std::uint64_t source_pixels = std::uint64_t{shape.detector_rows} * shape.detector_cols;
  const std::uint64_t total = shape.plan_rows * shape.plan_cols * binned_pixels;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t position = i / binned_pixels;
    const std::uint64_t pixel = i % binned_pixels;
    const std::uint64_t row_begin = position / shape.plan_cols * shape.scan_bin;
    const std::uint64_t col_begin = position % shape.plan_cols * shape.scan_bin;
    const std::uint64_t row_end = min(shape.window_rows, row_begin + shape.scan_bin);
    const std::uint64_t col_end = min(shape.window_cols, col_begin + shape.scan_bin);
    const std::uint32_t det_row_begin = static_cast<std::uint32_t>(pixel / binned_cols) * shape.detector_bin;
    const std::uint32_t det_col_begin = static_cast<std::uint32_t>(pixel % binned_cols) * shape.detector_bin;
    const std::uint32_t det_row_end = min(shape.detector_rows, det_row_begin + shape.detector_bin);
    const std::uint32_t det_col_end = min(shape.detector_cols, det_col_begin + shape.detector_bin);
    unsigned long long sum = 0;
    for (std::uint64_t row = row_begin; row < row_end; ++row) {
      for (std::uint64_t col = col_begin; col < col_end; ++col) {
        const Element* frame = window + (row * shape.window_cols + col) * source_pixels;
        for (std::uint32_t r = det_row_begin; r < det_row_end; ++r) {
          const Element* line = frame + std::uint64_t{r} * shape.detector_cols;
          for (std::uint32_t c = det_col_begin; c < det_col_end; ++c) sum += line[c];
        }
      }
    }
    if (sum > 0xffffffffull) atomicOr(d_overflow, 1u);
    out[i] = static_cast<std::uint32_t>(sum);
  }
}

template <class Element>
void launch_bin_plan_frames(const void* d_window, const PlanFramesShape& shape, std::uint32_t* d_out,
                            std::uint32_t* d_overflow, cudaStream_t stream) {
  const std::uint32_t binned_rows = (shape.detector_rows + shape.detector_bin - 1) / shape.detector_bin;
  const std::uint32_t binned_cols = (shape.detector_cols + shape.detector_bin - 1) / shape.detector_bin;
  const std::uint64_t binned_pixels = std::uint64_t{binned_rows} * binned_cols;
  const std::uint64_t total = shape.plan_rows * shape.plan_cols * binned_pixels;
  const int threads = device::tuning::kPlanFramesThreads;
  bin_plan_frames_kernel<Element><<<device::tuning::elementwise_ctas(total, threads, current_sm_count()), threads, 0,
                                    stream>>>(static_cast<const Element*>(d_window), shape, binned_cols, binned_pixels,
                                              d_out, d_overflow);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "bin_plan_frames_kernel");
}

}  // namespace

void narrow_plan_sums(const std::uint64_t* d_frame_sums, std::uint64_t base_frame, const PlanRegionView& region,
                      std::uint32_t* d_out, std::uint32_t* d_overflow, StreamHandle stream) {
  const std::uint64_t positions = region.plan_rows * region.plan_cols;
  if (positions == 0) return;
  if (d_frame_sums == nullptr || d_out == nullptr || d_overflow == nullptr)
    throw bad_request("narrow_plan_sums: null pointer");
  if (region.scan_bin == 0 || region.row_start * region.source_cols + region.col_start < base_frame)
    throw bad_request("narrow_plan_sums: the region starts before the sums");
  const unsigned threads = device::tuning::kNarrowPlanSumsThreads;
  const std::uint64_t wanted = (positions + threads - 1) / threads;
  const unsigned ctas = static_cast<unsigned>(wanted < device::tuning::kNarrowPlanSumsMaxCtas
                                                  ? wanted
                                                  : device::tuning::kNarrowPlanSumsMaxCtas);
  narrow_plan_sums_kernel<<<ctas, threads, 0, stream>>>(reinterpret_cast<const unsigned long long*>(d_frame_sums),
                                                        base_frame, region, d_out, d_overflow);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "narrow_plan_sums_kernel");
}

void bin_plan_frames(const void* d_window, const PlanFramesShape& shape, std::uint32_t* d_out,
                     std::uint32_t* d_overflow, StreamHandle stream) {
  if (shape.plan_rows == 0 || shape.plan_cols == 0) return;
  if (d_window == nullptr || d_out == nullptr || d_overflow == nullptr) throw bad_request("bin_plan_frames: null pointer");
  if (shape.scan_bin == 0 || shape.detector_bin == 0 || shape.detector_rows == 0 || shape.detector_cols == 0)
    throw bad_request("bin_plan_frames: empty shape or bin");
  if (shape.plan_rows != (shape.window_rows + shape.scan_bin - 1) / shape.scan_bin ||
      shape.plan_cols != (shape.window_cols + shape.scan_bin - 1) / shape.scan_bin)
    throw bad_request("bin_plan_frames: plan shape does not match the window");
  switch (shape.window_element_bytes) {
    case 1: launch_bin_plan_frames<std::uint8_t>(d_window, shape, d_out, d_overflow, stream); break;
    case 2: launch_bin_plan_frames<std::uint16_t>(d_window, shape, d_out, d_overflow, stream); break;
    case 4: launch_bin_plan_frames<std::uint32_t>(d_window, shape, d_out, d_overflow, stream); break;
    default: throw bad_request("bin_plan_frames: element size must be 1, 2 or 4 bytes");
  }
}

}  // namespace quantem::kernels
