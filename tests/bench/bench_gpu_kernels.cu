#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>

#include "bench_gpu_kernels.hpp"
#include "quantem/kernels/cuda_check.hpp"

namespace quantem::bench {
namespace {

constexpr int kDenseThreads = 256;
constexpr int kDenseWarps = kDenseThreads / 32;
constexpr std::uint32_t kMaxEntries = 8192;

__global__ void __launch_bounds__(kDenseThreads)
    dense_masked_sum_kernel(const std::uint32_t* __restrict__ words, std::uint64_t frame_count,
                            std::uint32_t frame_words, const std::uint32_t* __restrict__ word_entries,
                            std::uint32_t entry_count, unsigned long long* sums) {
  __shared__ std::uint32_t entries[kMaxEntries];
  for (std::uint32_t i = threadIdx.x; i < entry_count; i += blockDim.x) entries[i] = word_entries[i];
  __syncthreads();
  const std::uint32_t lane = threadIdx.x % 32;
  for (std::uint64_t frame = std::uint64_t{blockIdx.x} * kDenseWarps + threadIdx.x / 32; frame < frame_count;
       frame += std::uint64_t{gridDim.x} * kDenseWarps) {
    const std::uint32_t* base = words + frame * frame_words;
    std::uint32_t sum = 0;
#pragma unroll 4
    for (std::uint32_t i = lane; i < entry_count; i += 32) {
      const std::uint32_t entry = entries[i];
      const std::uint32_t word = __ldg(base + (entry & 0x3fffffffu));
      sum += ((entry >> 30) & 1u ? (word & 0xffffu) : 0u) + ((entry >> 31) ? (word >> 16) : 0u);
    }
    sum = __reduce_add_sync(0xffffffffu, sum);
    if (lane == 0) sums[frame] = sum;
  }
}

__global__ void count_differences_kernel(const uint4* a, const uint4* b, std::size_t words,
                                         unsigned long long* differences) {
  std::uint32_t local = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < words; i += std::size_t{gridDim.x} * blockDim.x) {
    const uint4 x = a[i];
    const uint4 y = b[i];
    local += (x.x != y.x) + (x.y != y.y) + (x.z != y.z) + (x.w != y.w);
  }
  local = __reduce_add_sync(0xffffffffu, local);
  if (threadIdx.x % 32 == 0 && local != 0) atomicAdd(differences, static_cast<unsigned long long>(local));
}

}  // namespace

void dense_masked_sum_u16(const std::uint16_t* d_frames, std::uint64_t frame_count, std::uint32_t frame_pixels,
                          const std::uint32_t* d_word_entries, std::uint32_t entry_count, std::uint64_t* d_sums,
                          kernels::StreamHandle stream) {
  if (entry_count > kMaxEntries || frame_pixels % 2 != 0)
    throw std::runtime_error("dense_masked_sum_u16: too many entries or an odd frame size");
  const std::uint64_t ctas = std::min<std::uint64_t>((frame_count + kDenseWarps - 1) / kDenseWarps, 132 * 64);
  dense_masked_sum_kernel<<<static_cast<unsigned>(ctas), kDenseThreads, 0, stream>>>(
      reinterpret_cast<const std::uint32_t*>(d_frames), frame_count, frame_pixels / 2, d_word_entries, entry_count,
      reinterpret_cast<unsigned long long*>(d_sums));
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "dense_masked_sum_kernel");
}

std::uint64_t count_differences(const std::uint8_t* d_a, const std::uint8_t* d_b, std::size_t bytes) {
  // Buffers from cudaMalloc are 256-byte aligned; compare 16-byte words, then the tail on the host.
  unsigned long long* d_count = nullptr;
  QUANTEM_CUDA_TRY(cudaMalloc(&d_count, sizeof(unsigned long long)));
  QUANTEM_CUDA_TRY(cudaMemset(d_count, 0, sizeof(unsigned long long)));
  const std::size_t words = bytes / 16;
  count_differences_kernel<<<1024, 256>>>(reinterpret_cast<const uint4*>(d_a), reinterpret_cast<const uint4*>(d_b),
                                          words, d_count);
  QUANTEM_CUDA_CHECK_LAUNCH(nullptr, "count_differences_kernel");
  unsigned long long count = 0;
  QUANTEM_CUDA_TRY(cudaMemcpy(&count, d_count, sizeof count, cudaMemcpyDeviceToHost));
  QUANTEM_CUDA_TRY(cudaFree(d_count));
  for (std::size_t i = words * 16; i < bytes; ++i) {
    std::uint8_t x = 0, y = 0;
    QUANTEM_CUDA_TRY(cudaMemcpy(&x, d_a + i, 1, cudaMemcpyDeviceToHost));
    QUANTEM_CUDA_TRY(cudaMemcpy(&y, d_b + i, 1, cudaMemcpyDeviceToHost));
    count += x != y;
  }
  return count;
}

EventTimer::EventTimer() {
  QUANTEM_CUDA_TRY(cudaEventCreate(reinterpret_cast<cudaEvent_t*>(&start_)));
  QUANTEM_CUDA_TRY(cudaEventCreate(reinterpret_cast<cudaEvent_t*>(&stop_)));
}

EventTimer::~EventTimer() {
  QUANTEM_CUDA_TRY_NOTHROW(cudaEventDestroy(static_cast<cudaEvent_t>(start_)));
  QUANTEM_CUDA_TRY_NOTHROW(cudaEventDestroy(static_cast<cudaEvent_t>(stop_)));
}

void EventTimer::start(kernels::StreamHandle stream) {
  QUANTEM_CUDA_TRY(cudaEventRecord(static_cast<cudaEvent_t>(start_), stream));
}

double EventTimer::stop_ms(kernels::StreamHandle stream) {
  QUANTEM_CUDA_TRY(cudaEventRecord(static_cast<cudaEvent_t>(stop_), stream));
  QUANTEM_CUDA_TRY(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)));
  float ms = 0;
  QUANTEM_CUDA_TRY(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)));
  return ms;
}

}  // namespace quantem::bench
