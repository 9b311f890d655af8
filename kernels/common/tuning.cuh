#pragma once
// Launch shapes of every kernel, in one place: the codec's (bitshuffle/LZ4,
// ANS encode and decode), then the products' over the ANS resident.
#include <cstdint>

namespace quantem::kernels::device::tuning {

// bitshuffle/LZ4: each warp takes kBslz4BlocksPerWarp bitshuffle blocks at a
// time (their lanes parse them side by side, then the warp writes each into
// its 8 KiB shared buffer); 4 warps per CTA -> 32 KiB of shared memory per CTA.
inline constexpr int kBslz4WarpsPerCta = 4;
inline constexpr std::uint32_t kBslz4BlocksPerWarp = 8;
// Chunk-index kernel: one thread per chunk, at most kBslz4IndexMaxCtas CTAs
// (a grid-stride loop covers the rest).
inline constexpr int kBslz4IndexThreads = 128;
inline constexpr unsigned kBslz4IndexMaxCtas = 65535;
// bitshuffle/LZ4 encode: a warp per block, its 8 KiB shuffled block and 2 KiB
// of run marks in shared memory (40 KiB per CTA of 4 warps); at most this many
// CTAs per SM in the grid-stride loop. A thread per chunk sums its block
// sizes; a warp per chunk gathers the blocks into place.
inline constexpr int kBslz4EncodeWarpsPerCta = 4;
inline constexpr unsigned kBslz4EncodeCtasPerSm = 8;
inline constexpr int kBslz4ChunkSizeThreads = 256;
inline constexpr int kBslz4GatherWarpsPerCta = 8;

}  // namespace quantem::kernels::device::tuning

namespace quantem::kernels::device::tuning {

// ANS encoder.
inline constexpr int kAnsSumThreads = 256;
inline constexpr std::uint32_t kAnsSumFramesPerSlice = 64;
inline constexpr int kAnsClassMapThreads = 1024;
inline constexpr int kAnsCountThreads = 256;
// At most 255: the symbol counts keep 8-bit counters per pixel and slice.
inline constexpr std::uint32_t kAnsCountFramesPerSlice = 255;
inline constexpr int kAnsEncodeThreads = 128;
// encode_streams_kernel: at least 8 CTAs (1,024 threads) per SM, so at most 64
// registers a thread (without the bound the compiler takes up to 74 and fewer
// CTAs fit).
inline constexpr int kAnsEncodeMinBlocksPerSm = 8;
inline constexpr int kAnsScanThreads = 1024;
// The batch's pattern sum (add_pattern_sum_kernel): one thread per pixel.
inline constexpr int kAnsPatternSumThreads = 256;
// Seek points' word indices (seek_word_index_kernel): one thread per stream.
inline constexpr int kAnsSeekWordIndexThreads = 256;
// Group tables (group_tables_kernel): kAnsGroupTablesCtas CTAs per group
// stride over its header, class map, frequencies and offsets.
inline constexpr unsigned kAnsGroupTablesCtas = 16;
inline constexpr int kAnsGroupTablesThreads = 256;

// ANS decoders: 128 KiB of decode tables per CTA -> one CTA per SM, so CTAs are wide.
inline constexpr int kAnsDecodeThreads = 512;
inline constexpr int kAnsMaskedSumThreads = 1024;
// The seek-point recorder decodes every stream of a batch once, at load: one
// CTA per SM (the 128 KiB decode tables), so as many threads as a CTA holds.
inline constexpr int kAnsSeekPointThreads = 1024;
// Decode tables built once per group at load (to global memory): one CTA per
// group, one warp per class (32 classes).
inline constexpr int kAnsBuildTablesThreads = 1024;

}  // namespace quantem::kernels::device::tuning

namespace quantem::kernels::device::tuning {

// Products. Decoders over the resident build 128 KiB of decode tables per CTA (one CTA
// per SM), so their CTAs are wide.
inline constexpr int kAccumulateThreads = 512;
// The frame decoder's two CTA widths (ans_accumulate_frames): the wide one
// when it still gives every SM a CTA, else the narrow one.
inline constexpr int kAccumulateFramesNarrowThreads = 512;
inline constexpr int kAccumulateFramesWideThreads = 1024;
inline constexpr int kMomentsThreads = 512;
// Element-wise kernels over dense frames and slot sums.
inline constexpr int kPrepareThreads = 256;
inline constexpr int kBinnedMaxThreads = 256;
// Whole binned plan frames of an export batch: a thread per output value.
inline constexpr int kPlanFramesThreads = 256;
// Their grid-stride loops run at most this many CTAs per SM: enough resident
// warps to keep the memory system busy, and CTAs that each walk a long
// stretch rather than a grid that only adds scheduling.
inline constexpr unsigned kElementwiseCtasPerSm = 16;
// CTAs of an element-wise kernel over `items` items: one item per thread, at
// least one CTA, at most kElementwiseCtasPerSm per SM of the device
// (sm_count: cudaDevAttrMultiProcessorCount, current_sm_count()).
inline unsigned elementwise_ctas(std::uint64_t items, int threads, int sm_count) {
  const std::uint64_t needed = (items + static_cast<std::uint64_t>(threads) - 1) / static_cast<std::uint64_t>(threads);
  const std::uint64_t most = std::uint64_t{kElementwiseCtasPerSm} * static_cast<std::uint64_t>(sm_count > 0 ? sm_count : 1);
  return static_cast<unsigned>(needed < most ? (needed == 0 ? 1 : needed) : most);
}
// Ring sums of dense frames: one CTA per frame. A staged u16 frame (72 KiB of
// shared memory) leaves room for 3 CTAs per SM: at 512 threads 48 warps hide
// the index loads' latency, which 256 threads leave exposed; 1024 add no
// warps the latency needs.
inline constexpr int kRingSumThreads = 512;
// The row-order ring pass (row_ring_sums_kernel): 8 pixels per thread and
// step, bins only in shared memory.
inline constexpr int kRowRingSumThreads = 256;
// Moments of dense frames (dense_frame_moments_kernel): one CTA per frame, at
// most 32 warps (frame_moments_of's partial sums).
inline constexpr int kDenseFrameMomentsThreads = 256;
static_assert(kDenseFrameMomentsThreads <= 32 * 32, "frame_moments_of keeps one partial sum per warp, 32 at most");
// Ring sums added into the slots' sums (add_ring_sums_kernel): element-wise.
inline constexpr int kAddRingSumsThreads = 256;
// Plan sums narrowed to uint32 (narrow_plan_sums_kernel): a grid-stride loop
// over the plan's positions on at most kNarrowPlanSumsMaxCtas CTAs.
inline constexpr unsigned kNarrowPlanSumsThreads = 256;
inline constexpr unsigned kNarrowPlanSumsMaxCtas = 4096;

}  // namespace quantem::kernels::device::tuning
