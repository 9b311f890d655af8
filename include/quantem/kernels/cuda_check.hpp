#pragma once
// Check macros for every CUDA call and launch (host code only), and the one
// way CUDA failures become typed errors (quantem/kernels/cuda_error.hpp).
//
//   QUANTEM_CUDA_TRY(cudaMalloc(...));             // throws CudaError / OutOfDeviceMemory
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   QUANTEM_CUDA_CHECK_LAUNCH(stream, "my_kernel");  // launch error; with
//                                                    // QUANTEM_DEBUG_SYNC also syncs + checks
//   QUANTEM_CUDA_TRY_NOTHROW(cudaFree(p));          // destructors: report, never throw
//
// CUDA-free: a status is passed on as the int value of its cudaError_t
// (cudaSuccess is 0), so the header needs no CUDA runtime header and every
// component that calls the runtime shares it (kernels/, src/backend/cuda/).
// Implemented in kernels/common/device.cu.
#include "quantem/kernels/cuda_error.hpp"
#include "quantem/kernels/device.hpp"

namespace quantem::kernels::detail {

// `status` is a cudaError_t other than cudaSuccess.
[[noreturn]] void throw_cuda_error(int status, const char* expression, const char* file, int line);
void report_cuda_error_nothrow(int status, const char* expression, const char* file, int line) noexcept;
void check_launch(StreamHandle stream, const char* kernel_name, const char* file, int line);

}  // namespace quantem::kernels::detail

#define QUANTEM_CUDA_TRY(call)                                                                    \
  do {                                                                                            \
    const int quantem_cuda_status_ = static_cast<int>(call);                                      \
    if (quantem_cuda_status_ != 0)                                                                \
      ::quantem::kernels::detail::throw_cuda_error(quantem_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define QUANTEM_CUDA_TRY_NOTHROW(call)                                                                     \
  do {                                                                                                     \
    const int quantem_cuda_status_ = static_cast<int>(call);                                               \
    if (quantem_cuda_status_ != 0)                                                                         \
      ::quantem::kernels::detail::report_cuda_error_nothrow(quantem_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define QUANTEM_CUDA_CHECK_LAUNCH(stream, kernel_name) \
  ::quantem::kernels::detail::check_launch((stream), (kernel_name), __FILE__, __LINE__)
