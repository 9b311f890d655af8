#pragma once
// QUANTEM_HOST_DEVICE marks functions that compile for both the host compiler
// (the CPU reference and unit tests of the same logic) and nvcc: the ANS
// format (quantem/ans/), the kernels' building blocks (kernels/) and the ANS
// stream reader they share with a host test. The one host/device macro of the
// project; CUDA-free. Where a body needs a device intrinsic it chooses it with
// `#if defined(__CUDA_ARCH__)` and keeps a plain C++ path for the host.
//
// QUANTEM_FORCE_INLINE asks for a function to be inlined always: nvcc's
// __forceinline__, GCC's and Clang's always_inline on the host (the host
// bitshuffle kernels only pay off fully inlined: GCC -O2 otherwise calls the
// 8x8 transpose once per lane).
#if defined(__CUDACC__)
#define QUANTEM_HOST_DEVICE __host__ __device__
#define QUANTEM_FORCE_INLINE __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#define QUANTEM_HOST_DEVICE
#define QUANTEM_FORCE_INLINE inline __attribute__((always_inline))
#else
#define QUANTEM_HOST_DEVICE
#define QUANTEM_FORCE_INLINE inline
#endif
