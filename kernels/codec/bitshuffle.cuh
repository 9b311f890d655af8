#pragma once
// Warp bit-unshuffle of one bitshuffle block held in shared memory
// (reference/arina-format-and-codecs.md §2.5).
//
// A block of n elements (n a multiple of 8) of B = 8 * element bytes bits is
// stored as B bit-planes of n/8 bytes; bit k of little-endian word w of plane p
// is bit p of element 32w + k. When n is a multiple of 32, lane (q, p) of the
// warp (p = lane % B, q = lane / B) loads word w0 + q of plane p; then 32
// ballots on "bit k of my word" return, in bit q*B + p, bit p of element
// 32(w0 + q) + k: lane k keeps ballot k and writes 32/B elements. So the warp
// rebuilds 32 bits of output per ballot and its stores are coalesced.
// Partial blocks whose n is not a multiple of 32 take a per-element gather.
#include <cstdint>

namespace quantem::kernels {

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

template <int kElementBytes>
__device__ void bitunshuffle_block_warp(const std::uint8_t* block, std::uint32_t element_count,
                                        typename ElementType<kElementBytes>::type* out, std::uint32_t lane) {
  using Element = typename ElementType<kElementBytes>::type;
  constexpr std::uint32_t kBits = 8 * kElementBytes;
  constexpr std::uint32_t kWordsPerBallot = 32 / kBits;
  constexpr std::uint32_t kValueMask = kBits == 32 ? 0xffffffffu : ((1u << kBits) - 1u);
  const std::uint32_t plane_bytes = element_count / 8;

  if (element_count % 32 == 0) {
    const std::uint32_t words_per_plane = element_count / 32;
    const std::uint32_t plane = lane % kBits;
    const std::uint32_t sub_word = lane / kBits;
    const std::uint32_t* planes = reinterpret_cast<const std::uint32_t*>(block);
    for (std::uint32_t first_word = 0; first_word < words_per_plane; first_word += kWordsPerBallot) {
      const std::uint32_t word_index = first_word + sub_word;
      const std::uint32_t word = word_index < words_per_plane ? planes[plane * words_per_plane + word_index] : 0u;
      std::uint32_t mine = 0;
#pragma unroll
      for (std::uint32_t bit = 0; bit < 32; ++bit) {
        const std::uint32_t ballot = __ballot_sync(0xffffffffu, (word >> bit) & 1u);
        if (lane == bit) mine = ballot;
      }
#pragma unroll
      for (std::uint32_t q = 0; q < kWordsPerBallot; ++q) {
        if (first_word + q < words_per_plane) {
          out[32 * (first_word + q) + lane] = static_cast<Element>((mine >> (q * kBits)) & kValueMask);
        }
      }
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

}  // namespace quantem::kernels
