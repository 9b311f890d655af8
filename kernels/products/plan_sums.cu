// Per-frame sums of a region gathered into plan positions (scan-binned) and
// narrowed to the wire's uint32 on the device (declared in
// include/quantem/kernels/resident_products.hpp).
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

}  // namespace quantem::kernels
