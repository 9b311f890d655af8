#pragma once
// Launch shapes of the codec kernels, in one place.
#include <cstdint>

namespace quantem::kernels::tuning {

// bitshuffle/LZ4: one warp per bitshuffle block, each with an 8 KiB shared
// buffer; 4 warps per CTA -> 32 KiB of shared memory per CTA.
inline constexpr int kBslz4WarpsPerCta = 4;
// Chunk-index kernel: one thread per chunk.
inline constexpr int kBslz4IndexThreads = 128;

}  // namespace quantem::kernels::tuning
