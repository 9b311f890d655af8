#pragma once
// Launch shapes of the codec kernels, in one place.
#include <cstdint>

namespace quantem::kernels::tuning {

// bitshuffle/LZ4: one warp per bitshuffle block, each with an 8 KiB shared
// buffer; 4 warps per CTA -> 32 KiB of shared memory per CTA.
inline constexpr int kBslz4WarpsPerCta = 4;
// Compressed blocks up to this size are staged in shared memory before
// parsing (most blocks of counting data are 0.3-2 KiB); larger ones are
// parsed from global memory. 4 x (8 KiB + 3 KiB) stays under 48 KiB. Less
// staging (more warps per SM) did not help: the 512² u16 load took 0.207 s
// at 3072, 0.209 at 2048, 0.210 at 1024 and 0.211 without staging (session 8).
inline constexpr std::uint32_t kBslz4StageBytes = 3072;
// Chunk-index kernel: one thread per chunk.
inline constexpr int kBslz4IndexThreads = 128;

}  // namespace quantem::kernels::tuning

namespace quantem::kernels::tuning {

// ANS encoder.
inline constexpr int kAnsSumThreads = 256;
inline constexpr std::uint32_t kAnsSumFramesPerSlice = 64;
inline constexpr int kAnsClassMapThreads = 1024;
inline constexpr int kAnsCountThreads = 256;
inline constexpr std::uint32_t kAnsCountFramesPerSlice = 256;
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
