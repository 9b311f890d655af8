#pragma once
// QUANTEM_HOST_DEVICE marks building blocks that compile for both the host
// compiler (CPU unit tests of the same logic) and nvcc.
#if defined(__CUDACC__)
#define QUANTEM_HOST_DEVICE __host__ __device__
#define QUANTEM_FORCE_INLINE __forceinline__
#else
#define QUANTEM_HOST_DEVICE
#define QUANTEM_FORCE_INLINE inline
#endif
