#pragma once
// Launch shapes of the product kernels over the ANS resident, in one place.
#include <cstdint>
namespace quantem::kernels::tuning {

// Decoders over the resident build 128 KiB of decode tables per CTA (one CTA
// per SM), so their CTAs are wide.
inline constexpr int kAccumulateThreads = 512;
inline constexpr int kMomentsThreads = 512;
// Element-wise kernels over dense frames and slot sums.
inline constexpr int kPrepareThreads = 256;
inline constexpr int kBinnedMaxThreads = 256;
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

}  // namespace quantem::kernels::tuning
