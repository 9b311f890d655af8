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
// Ring sums of dense frames: one CTA per frame.
inline constexpr int kRingSumThreads = 256;

}  // namespace quantem::kernels::tuning
