#pragma once
// Warp-wide reductions and scans used by the ANS kernels, written once. Every
// lane of the full warp (mask 0xffffffff) must call them. Block-wide scans use
// CUB (cub::BlockScan, part of the CUDA Toolkit).
#include <cuda_runtime.h>

#include <cstdint>

namespace quantem::kernels::device {

inline constexpr unsigned kFullWarp = 0xffffffffu;

// Σ over the warp of a 64-bit value (butterfly: every lane gets the sum).
__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long value) {
#pragma unroll
  for (int delta = 16; delta > 0; delta /= 2) value += __shfl_xor_sync(kFullWarp, value, delta);
  return value;
}

// Max over the warp (every lane gets it).
__device__ __forceinline__ std::uint32_t warp_max_u32(std::uint32_t value) {
#pragma unroll
  for (int delta = 16; delta > 0; delta /= 2) value = max(value, __shfl_xor_sync(kFullWarp, value, delta));
  return value;
}

// Inclusive prefix sum over the lanes (lane = threadIdx.x % 32).
__device__ __forceinline__ std::uint32_t warp_inclusive_scan_u32(std::uint32_t value, std::uint32_t lane) {
#pragma unroll
  for (int delta = 1; delta < 32; delta *= 2) {
    const std::uint32_t other = __shfl_up_sync(kFullWarp, value, delta);
    if (lane >= static_cast<std::uint32_t>(delta)) value += other;
  }
  return value;
}

}  // namespace quantem::kernels::device
