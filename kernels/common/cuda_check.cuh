#pragma once
// Check macros for every CUDA call and launch (host code only).
//
//   QUANTEM_CUDA_TRY(cudaMalloc(...));             // throws CudaError / OutOfDeviceMemory
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   QUANTEM_CUDA_CHECK_LAUNCH(stream, "my_kernel");  // launch error; with
//                                                    // QUANTEM_DEBUG_SYNC also syncs + checks
//   QUANTEM_CUDA_TRY_NOTHROW(cudaFree(p));          // destructors: report, never throw
#include <cuda_runtime_api.h>

#include "quantem/cuda/cuda_error.hpp"

namespace quantem::cuda::detail {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expression, const char* file,
                                   int line);
void report_cuda_error_nothrow(cudaError_t status, const char* expression, const char* file,
                               int line) noexcept;
void check_launch(cudaStream_t stream, const char* kernel_name, const char* file, int line);

}  // namespace quantem::cuda::detail

#define QUANTEM_CUDA_TRY(call)                                                          \
  do {                                                                                  \
    const cudaError_t quantem_cuda_status_ = (call);                                    \
    if (quantem_cuda_status_ != cudaSuccess)                                            \
      ::quantem::cuda::detail::throw_cuda_error(quantem_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define QUANTEM_CUDA_TRY_NOTHROW(call)                                                  \
  do {                                                                                  \
    const cudaError_t quantem_cuda_status_ = (call);                                    \
    if (quantem_cuda_status_ != cudaSuccess)                                            \
      ::quantem::cuda::detail::report_cuda_error_nothrow(quantem_cuda_status_, #call, __FILE__, \
                                                        __LINE__);                      \
  } while (0)

#define QUANTEM_CUDA_CHECK_LAUNCH(stream, kernel_name) \
  ::quantem::cuda::detail::check_launch((stream), (kernel_name), __FILE__, __LINE__)
