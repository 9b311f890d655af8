#pragma once
// Warp bit-unshuffle of one bitshuffle block held in shared memory
// (the bit planes of kiyo-masui/bitshuffle's bitshuffle_core.c).
//
// A block of n elements (n a multiple of 8) of B = 8 * element bytes bits is
// stored as B bit-planes of n/8 bytes; bit k of little-endian word w of plane p
// is bit p of element 32w + k. When n is a multiple of 32, lane (q, p) of the
// warp (p = lane % B, q = lane / B) loads word w0 + q of plane p; a 32 x 32
// bit transpose across the warp (warp_transpose_bits: five shuffles, where 32
// ballots took 32) gives lane k, in bit q*B + p, bit p of element
// 32(w0 + q) + k, and lane k writes 32/B elements. Its stores are coalesced. B is the
// number of planes up to the highest non-zero one, rounded up to a power of two.
// Partial blocks whose n is not a multiple of 32 take a per-element gather.
#include <cstdint>

namespace quantem::kernels::device {

template <int kElementBytes>
struct ElementType;
template <>
struct ElementType<1> {
  using type = std::uint8_t;
};
template <>
struct ElementType<2> {
  using type = std::uint16_t;
};
template <>
struct ElementType<4> {
  using type = std::uint32_t;
};

// A 32 x 32 bit matrix held one row per lane (bit k of lane L's word is
// entry (L, k)) transposed across the warp: lane k returns column k (bit L is
// entry (L, k)), what 32 ballots on "bit k of my word" would give lane k. Five
// exchange steps: at step j, entry (r, c) trades places with (r ^ j, c ^ j)
// when bit j of r and c differ (Hacker's Delight 7-3, one row per lane).
__device__ inline std::uint32_t warp_transpose_bits(std::uint32_t x, std::uint32_t lane) {
  std::uint32_t low = 0x0000ffffu;  // the columns c with bit j of c clear
#pragma unroll
  for (int j = 16; j != 0; j >>= 1, low ^= low << j) {
    const std::uint32_t y = __shfl_xor_sync(0xffffffffu, x, j);
    x = (lane & j) != 0 ? (x & ~low) | ((y >> j) & low) : (x & low) | ((y << j) & ~low);
  }
  return x;
}

// The planes 0 .. 2^kPlaneBits - 1 of a block (the rest are zero) transposed
// and stored: 32 >> kPlaneBits words of each plane per transpose, so lane k
// holds that many elements' values side by side in its result. The plane
// count is a template parameter so that the unpacking of a transpose is
// unrolled with constant shifts (it was a loop with variable ones).
template <std::uint32_t kPlaneBits, class Element>
__device__ __forceinline__ void unshuffle_planes(const std::uint32_t* planes, std::uint32_t words_per_plane, Element* out,
                                                 std::uint32_t lane) {
  constexpr std::uint32_t kPlanes = 1u << kPlaneBits;
  constexpr std::uint32_t kWordsPerTranspose = 32u >> kPlaneBits;
  constexpr std::uint32_t kValueMask = kPlanes == 32 ? 0xffffffffu : (1u << kPlanes) - 1u;
  const std::uint32_t plane = lane & (kPlanes - 1u);
  const std::uint32_t sub_word = lane >> kPlaneBits;
  const std::uint32_t whole = words_per_plane - words_per_plane % kWordsPerTranspose;
  std::uint32_t first_word = 0;
  for (; first_word < whole; first_word += kWordsPerTranspose) {
    const std::uint32_t mine = warp_transpose_bits(planes[plane * words_per_plane + first_word + sub_word], lane);
#pragma unroll
    for (std::uint32_t q = 0; q < kWordsPerTranspose; ++q)
      out[32 * (first_word + q) + lane] = static_cast<Element>((mine >> (q * kPlanes)) & kValueMask);
  }
  if (first_word < words_per_plane) {  // a last, partial transpose
    const std::uint32_t word_index = first_word + sub_word;
    const std::uint32_t word = word_index < words_per_plane ? planes[plane * words_per_plane + word_index] : 0u;
    const std::uint32_t mine = warp_transpose_bits(word, lane);
#pragma unroll
    for (std::uint32_t q = 0; q < kWordsPerTranspose; ++q)
      if (first_word + q < words_per_plane)
        out[32 * (first_word + q) + lane] = static_cast<Element>((mine >> (q * kPlanes)) & kValueMask);
  }
}

template <int kElementBytes>
__device__ void bitunshuffle_block_warp(const std::uint8_t* block, std::uint32_t element_count,
                                        typename ElementType<kElementBytes>::type* out, std::uint32_t lane) {
  using Element = typename ElementType<kElementBytes>::type;
  constexpr std::uint32_t kBits = 8 * kElementBytes;
  const std::uint32_t plane_bytes = element_count / 8;

  if (element_count % 32 == 0) {
    const std::uint32_t words_per_plane = element_count / 32;
    const std::uint32_t* planes = reinterpret_cast<const std::uint32_t*>(block);
    // Counts are small: find the highest bit-plane holding a one, and gather
    // only the planes up to the next power of two. With B effective planes a
    // transpose carries 32 / B elements' worth of words, so 4-bit data takes a
    // quarter of the transposes of 16-bit data.
    int top_plane = -1;
    for (int plane = static_cast<int>(kBits) - 1; plane >= 0; --plane) {
      bool nonzero = false;
      for (std::uint32_t w = lane; w < words_per_plane; w += 32) nonzero |= planes[plane * words_per_plane + w] != 0u;
      if (__any_sync(0xffffffffu, nonzero)) {
        top_plane = plane;
        break;
      }
    }
    if (top_plane < 0) {
      for (std::uint32_t element = lane; element < element_count; element += 32) out[element] = 0;
      return;
    }
    std::uint32_t plane_bits = 0;  // log2 of the effective plane count
    while ((1u << plane_bits) < static_cast<std::uint32_t>(top_plane) + 1u) ++plane_bits;
    switch (plane_bits) {
      case 0: unshuffle_planes<0>(planes, words_per_plane, out, lane); break;
      case 1: unshuffle_planes<1>(planes, words_per_plane, out, lane); break;
      case 2: unshuffle_planes<2>(planes, words_per_plane, out, lane); break;
      case 3: unshuffle_planes<3>(planes, words_per_plane, out, lane); break;
      case 4: unshuffle_planes<4>(planes, words_per_plane, out, lane); break;
      default: unshuffle_planes<5>(planes, words_per_plane, out, lane); break;
    }
  } else {
    for (std::uint32_t element = lane; element < element_count; element += 32) {
      const std::uint32_t byte_in_plane = element / 8;
      const std::uint32_t bit_in_byte = element % 8;
      std::uint32_t value = 0;
#pragma unroll
      for (std::uint32_t plane = 0; plane < kBits; ++plane) {
        value |= ((block[plane * plane_bytes + byte_in_plane] >> bit_in_byte) & 1u) << plane;
      }
      out[element] = static_cast<Element>(value);
    }
  }
}

}  // namespace quantem::kernels::device
