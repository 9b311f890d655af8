#pragma once
// Launch shapes of the product kernels over the ANS resident, in one place.
namespace quantem::kernels::tuning {

// Decoders over the resident build 128 KiB of decode tables per CTA (one CTA
// per SM), so their CTAs are wide.
inline constexpr int kAccumulateThreads = 512;
inline constexpr int kMomentsThreads = 512;
// Element-wise kernels over dense frames and slot sums.
inline constexpr int kPrepareThreads = 256;
inline constexpr int kBinnedMaxThreads = 256;
inline constexpr unsigned kElementwiseMaxCtas = 132 * 16;
// Ring sums of dense frames: one CTA per frame. A staged u16 frame (72 KiB of
// shared memory) leaves room for 3 CTAs per SM: at 512 threads 48 warps hide
// the index loads' latency (256 threads leave it exposed and the load slower;
// 1024 gain nothing over 512).
inline constexpr int kRingSumThreads = 512;
// The row-order ring pass (row_ring_sums_kernel): 8 pixels per thread and
// step, bins only in shared memory.
inline constexpr int kRowRingSumThreads = 256;

}  // namespace quantem::kernels::tuning
