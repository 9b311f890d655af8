#pragma once
// QUANTEM_HOST_DEVICE marks functions that compile for both the host compiler
// (the CPU reference and unit tests of the same logic) and nvcc: the ANS
// format (quantem/ans/) and the kernels' building blocks (kernels/). The one
// host/device macro of the project; CUDA-free.
#if defined(__CUDACC__)
#define QUANTEM_HOST_DEVICE __host__ __device__
#define QUANTEM_FORCE_INLINE __forceinline__
#else
#define QUANTEM_HOST_DEVICE
#define QUANTEM_FORCE_INLINE inline
#endif
