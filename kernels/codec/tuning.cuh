#pragma once
// Launch shapes of the codec kernels, in one place.
#include <cstdint>

namespace quantem::kernels::tuning {

// bitshuffle/LZ4: each warp takes kBslz4BlocksPerWarp bitshuffle blocks at a
// time (their lanes parse them side by side, then the warp writes each into
// its 8 KiB shared buffer); 4 warps per CTA -> 32 KiB of shared memory per CTA.
inline constexpr int kBslz4WarpsPerCta = 4;
inline constexpr std::uint32_t kBslz4BlocksPerWarp = 8;
// Chunk-index kernel: one thread per chunk.
inline constexpr int kBslz4IndexThreads = 128;

}  // namespace quantem::kernels::tuning

namespace quantem::kernels::tuning {

// ANS encoder.
inline constexpr int kAnsSumThreads = 256;
inline constexpr std::uint32_t kAnsSumFramesPerSlice = 64;
inline constexpr int kAnsClassMapThreads = 1024;
inline constexpr int kAnsCountThreads = 256;
// At most 255: the symbol counts keep 8-bit counters per pixel and slice.
inline constexpr std::uint32_t kAnsCountFramesPerSlice = 255;
inline constexpr int kAnsEncodeThreads = 128;
inline constexpr int kAnsScanThreads = 1024;

// ANS decoders: 128 KiB of decode tables per CTA -> one CTA per SM, so CTAs are wide.
inline constexpr int kAnsDecodeThreads = 512;
inline constexpr int kAnsMaskedSumThreads = 1024;
// The seek-point recorder decodes every stream of a batch once, at load: one
// CTA per SM (the 128 KiB decode tables), so as many threads as a CTA holds.
inline constexpr int kAnsSeekPointThreads = 1024;
// Decode tables built once per group at load (to global memory): one CTA per
// group, one warp per class (32 classes).
inline constexpr int kAnsBuildTablesThreads = 1024;

}  // namespace quantem::kernels::tuning
