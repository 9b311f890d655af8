#pragma once
// SIMD shuffle/unshuffle kernels shared by bitshuffle.cpp (SSE2) and
// bitshuffle_avx2.cpp (AVX2, compiled with -mavx2). Internal to src/codec.
//
// Everything is in an anonymous namespace on purpose: each translation unit
// gets its own copy compiled for its own instruction set, so the linker can
// never merge an AVX2-compiled instantiation into the SSE2 path.
//
// One kernel call (un)shuffles Ops::kGroups consecutive groups of 8 elements.
// For each element byte j it loads the 8 bit planes 8j..8j+7 across those
// groups, transposes bytes (planes x groups -> groups x planes, three unpack
// stages) so each 64-bit lane holds one group's 8 plane bytes, transposes each
// lane's 8x8 bit matrix, and finally interleaves the element bytes j = 0..S-1.
// AVX2 unpacks work within 128-bit halves, so the 256-bit kernel is the 128-bit
// kernel on two independent runs of 16 groups (low half: groups 0-15, high
// half: groups 16-31). A byte j whose 8 planes are all zero over the groups
// (the high planes of sparse counting data) skips the transposes.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include <emmintrin.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

// The kernels only pay off fully inlined (QUANTEM_FORCE_INLINE).
#include "quantem/core/host_device.hpp"

namespace quantem::codec {
namespace {

struct Sse2Ops {
  using Vector = __m128i;
  static constexpr std::size_t kGroups = 16;
  static Vector load(const std::uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  // Loads / stores the 16 bytes of each 128-bit half: SSE2 has only the low half.
  static Vector load_halves(const std::uint8_t* low, const std::uint8_t*) { return load(low); }
  static void store(std::uint8_t* p, Vector v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
  static void store_halves(std::uint8_t* low, std::uint8_t*, Vector v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(low), v);
  }
  static Vector zero() { return _mm_setzero_si128(); }
  static bool all_zero(Vector v) { return _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128())) == 0xFFFF; }
  static Vector bit_or(Vector a, Vector b) { return _mm_or_si128(a, b); }
  static Vector bit_xor(Vector a, Vector b) { return _mm_xor_si128(a, b); }
  static Vector bit_and(Vector a, Vector b) { return _mm_and_si128(a, b); }
  static Vector broadcast64(long long value) { return _mm_set1_epi64x(value); }
  template <int Shift>
  static Vector shift_right64(Vector v) { return _mm_srli_epi64(v, Shift); }
  template <int Shift>
  static Vector shift_left64(Vector v) { return _mm_slli_epi64(v, Shift); }
  static Vector unpack_low8(Vector a, Vector b) { return _mm_unpacklo_epi8(a, b); }
  static Vector unpack_high8(Vector a, Vector b) { return _mm_unpackhi_epi8(a, b); }
  static Vector unpack_low16(Vector a, Vector b) { return _mm_unpacklo_epi16(a, b); }
  static Vector unpack_high16(Vector a, Vector b) { return _mm_unpackhi_epi16(a, b); }
  static Vector unpack_low32(Vector a, Vector b) { return _mm_unpacklo_epi32(a, b); }
  static Vector unpack_high32(Vector a, Vector b) { return _mm_unpackhi_epi32(a, b); }
  static Vector broadcast16(short value) { return _mm_set1_epi16(value); }
  template <int Shift>
  static Vector shift_right16(Vector v) { return _mm_srli_epi16(v, Shift); }
  template <int Shift>
  static Vector shift_left32(Vector v) { return _mm_slli_epi32(v, Shift); }
  template <int Shift>
  static Vector shift_right_arithmetic32(Vector v) { return _mm_srai_epi32(v, Shift); }
  static Vector pack_unsigned16(Vector a, Vector b) { return _mm_packus_epi16(a, b); }
  static Vector pack_signed32(Vector a, Vector b) { return _mm_packs_epi32(a, b); }
};

#ifdef __AVX2__
struct Avx2Ops {
  using Vector = __m256i;
  static constexpr std::size_t kGroups = 32;
  static Vector load(const std::uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static Vector load_halves(const std::uint8_t* low, const std::uint8_t* high) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(low))),
                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(high)), 1);
  }
  static void store(std::uint8_t* p, Vector v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static void store_halves(std::uint8_t* low, std::uint8_t* high, Vector v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(low), _mm256_castsi256_si128(v));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(high), _mm256_extracti128_si256(v, 1));
  }
  static Vector zero() { return _mm256_setzero_si256(); }
  static bool all_zero(Vector v) { return _mm256_testz_si256(v, v) != 0; }
  static Vector bit_or(Vector a, Vector b) { return _mm256_or_si256(a, b); }
  static Vector bit_xor(Vector a, Vector b) { return _mm256_xor_si256(a, b); }
  static Vector bit_and(Vector a, Vector b) { return _mm256_and_si256(a, b); }
  static Vector broadcast64(long long value) { return _mm256_set1_epi64x(value); }
  template <int Shift>
  static Vector shift_right64(Vector v) { return _mm256_srli_epi64(v, Shift); }
  template <int Shift>
  static Vector shift_left64(Vector v) { return _mm256_slli_epi64(v, Shift); }
  static Vector unpack_low8(Vector a, Vector b) { return _mm256_unpacklo_epi8(a, b); }
  static Vector unpack_high8(Vector a, Vector b) { return _mm256_unpackhi_epi8(a, b); }
  static Vector unpack_low16(Vector a, Vector b) { return _mm256_unpacklo_epi16(a, b); }
  static Vector unpack_high16(Vector a, Vector b) { return _mm256_unpackhi_epi16(a, b); }
  static Vector unpack_low32(Vector a, Vector b) { return _mm256_unpacklo_epi32(a, b); }
  static Vector unpack_high32(Vector a, Vector b) { return _mm256_unpackhi_epi32(a, b); }
  static Vector broadcast16(short value) { return _mm256_set1_epi16(value); }
  template <int Shift>
  static Vector shift_right16(Vector v) { return _mm256_srli_epi16(v, Shift); }
  template <int Shift>
  static Vector shift_left32(Vector v) { return _mm256_slli_epi32(v, Shift); }
  template <int Shift>
  static Vector shift_right_arithmetic32(Vector v) { return _mm256_srai_epi32(v, Shift); }
  static Vector pack_unsigned16(Vector a, Vector b) { return _mm256_packus_epi16(a, b); }
  static Vector pack_signed32(Vector a, Vector b) { return _mm256_packs_epi32(a, b); }
};
#endif

// Transposes the 8x8 bit matrix in each 64-bit lane (byte r = row r, bit c = column c).
template <typename Ops>
QUANTEM_FORCE_INLINE typename Ops::Vector transpose_bits_8x8_lanes(typename Ops::Vector x) {
  using V = typename Ops::Vector;
  V t = Ops::bit_and(Ops::bit_xor(x, Ops::template shift_right64<7>(x)), Ops::broadcast64(0x00AA00AA00AA00AALL));
  x = Ops::bit_xor(x, Ops::bit_xor(t, Ops::template shift_left64<7>(t)));
  t = Ops::bit_and(Ops::bit_xor(x, Ops::template shift_right64<14>(x)), Ops::broadcast64(0x0000CCCC0000CCCCLL));
  x = Ops::bit_xor(x, Ops::bit_xor(t, Ops::template shift_left64<14>(t)));
  t = Ops::bit_and(Ops::bit_xor(x, Ops::template shift_right64<28>(x)), Ops::broadcast64(0x00000000F0F0F0F0LL));
  x = Ops::bit_xor(x, Ops::bit_xor(t, Ops::template shift_left64<28>(t)));
  return x;
}

// Are all 8 vectors zero (an element byte whose 8 bit planes are empty)?
template <typename Ops>
QUANTEM_FORCE_INLINE bool all_zero8(const typename Ops::Vector v[8]) {
  return Ops::all_zero(Ops::bit_or(Ops::bit_or(Ops::bit_or(v[0], v[1]), Ops::bit_or(v[2], v[3])),
                                   Ops::bit_or(Ops::bit_or(v[4], v[5]), Ops::bit_or(v[6], v[7]))));
}

// For element byte j: lanes[i] holds (per 128-bit half) groups 2i and 2i+1 of
// that half's 16 groups; byte m of a 64-bit lane is byte j of element 8g+m.
template <typename Ops>
QUANTEM_FORCE_INLINE void unshuffle_element_byte(const std::uint8_t* in, std::size_t plane_bytes, std::size_t j, std::size_t first_group,
                            typename Ops::Vector lanes[8]) {
  using V = typename Ops::Vector;
  V p[8];
  for (std::size_t k = 0; k < 8; ++k) p[k] = Ops::load(in + (8 * j + k) * plane_bytes + first_group);
  if (all_zero8<Ops>(p)) {
    for (std::size_t i = 0; i < 8; ++i) lanes[i] = Ops::zero();
    return;
  }
  // planes x groups -> groups x planes
  const V a0 = Ops::unpack_low8(p[0], p[1]), a1 = Ops::unpack_high8(p[0], p[1]);
  const V a2 = Ops::unpack_low8(p[2], p[3]), a3 = Ops::unpack_high8(p[2], p[3]);
  const V a4 = Ops::unpack_low8(p[4], p[5]), a5 = Ops::unpack_high8(p[4], p[5]);
  const V a6 = Ops::unpack_low8(p[6], p[7]), a7 = Ops::unpack_high8(p[6], p[7]);
  const V b0 = Ops::unpack_low16(a0, a2), b1 = Ops::unpack_high16(a0, a2);  // groups 0-3, 4-7; planes 0-3
  const V b2 = Ops::unpack_low16(a1, a3), b3 = Ops::unpack_high16(a1, a3);  // groups 8-11, 12-15
  const V b4 = Ops::unpack_low16(a4, a6), b5 = Ops::unpack_high16(a4, a6);  // planes 4-7
  const V b6 = Ops::unpack_low16(a5, a7), b7 = Ops::unpack_high16(a5, a7);
  lanes[0] = transpose_bits_8x8_lanes<Ops>(Ops::unpack_low32(b0, b4));
  lanes[1] = transpose_bits_8x8_lanes<Ops>(Ops::unpack_high32(b0, b4));
  lanes[2] = transpose_bits_8x8_lanes<Ops>(Ops::unpack_low32(b1, b5));
  lanes[3] = transpose_bits_8x8_lanes<Ops>(Ops::unpack_high32(b1, b5));
  lanes[4] = transpose_bits_8x8_lanes<Ops>(Ops::unpack_low32(b2, b6));
  lanes[5] = transpose_bits_8x8_lanes<Ops>(Ops::unpack_high32(b2, b6));
  lanes[6] = transpose_bits_8x8_lanes<Ops>(Ops::unpack_low32(b3, b7));
  lanes[7] = transpose_bits_8x8_lanes<Ops>(Ops::unpack_high32(b3, b7));
}

// Unshuffles Ops::kGroups groups starting at first_group, for element sizes 1, 2, 4.
template <typename Ops, std::size_t ElementSize>
void unshuffle_groups(const std::uint8_t* in, std::uint8_t* out, std::size_t plane_bytes, std::size_t first_group) {
  using V = typename Ops::Vector;
  V lanes[ElementSize][8];
  for (std::size_t j = 0; j < ElementSize; ++j) unshuffle_element_byte<Ops>(in, plane_bytes, j, first_group, lanes[j]);
  constexpr std::size_t kPairBytes = 16 * ElementSize;          // output bytes of 2 groups
  constexpr std::size_t kHalfBytes = 16 * 8 * ElementSize;      // output bytes of 16 groups
  std::uint8_t* low = out + 8 * first_group * ElementSize;      // groups of the low 128-bit half
  for (std::size_t i = 0; i < 8; ++i) {
    std::uint8_t* pair_low = low + kPairBytes * i;  // groups 2i and 2i+1 of the low half
    std::uint8_t* pair_high = pair_low + kHalfBytes;  // the same groups of the high half (AVX2)
    if constexpr (ElementSize == 1) {
      Ops::store_halves(pair_low, pair_high, lanes[0][i]);
    } else if constexpr (ElementSize == 2) {
      Ops::store_halves(pair_low, pair_high, Ops::unpack_low8(lanes[0][i], lanes[1][i]));
      Ops::store_halves(pair_low + 16, pair_high + 16, Ops::unpack_high8(lanes[0][i], lanes[1][i]));
    } else {
      static_assert(ElementSize == 4, "SIMD unshuffle handles element sizes 1, 2 and 4");
      const V low01 = Ops::unpack_low8(lanes[0][i], lanes[1][i]);
      const V high01 = Ops::unpack_high8(lanes[0][i], lanes[1][i]);
      const V low23 = Ops::unpack_low8(lanes[2][i], lanes[3][i]);
      const V high23 = Ops::unpack_high8(lanes[2][i], lanes[3][i]);
      Ops::store_halves(pair_low, pair_high, Ops::unpack_low16(low01, low23));
      Ops::store_halves(pair_low + 16, pair_high + 16, Ops::unpack_high16(low01, low23));
      Ops::store_halves(pair_low + 32, pair_high + 32, Ops::unpack_low16(high01, high23));
      Ops::store_halves(pair_low + 48, pair_high + 48, Ops::unpack_high16(high01, high23));
    }
  }
}

// Runs kernel(std::integral_constant<std::size_t, element_size>, group) on as
// many whole runs of Ops::kGroups groups as fit in [first_group, groups);
// returns the first group not done. Element sizes other than 1, 2, 4 are left
// alone.
template <typename Ops, typename Kernel>
std::size_t for_group_runs(std::size_t groups, std::size_t element_size, std::size_t first_group,
                           const Kernel& kernel) {
  std::size_t group = first_group;
  const auto run = [&](auto size) {
    for (; group + Ops::kGroups <= groups; group += Ops::kGroups) kernel(size, group);
  };
  switch (element_size) {
    case 1: run(std::integral_constant<std::size_t, 1>{}); break;
    case 2: run(std::integral_constant<std::size_t, 2>{}); break;
    case 4: run(std::integral_constant<std::size_t, 4>{}); break;
    default: break;
  }
  return group;
}

// Unshuffles as many whole runs of Ops::kGroups groups as fit (for_group_runs).
template <typename Ops>
std::size_t unshuffle_group_runs(const std::uint8_t* in, std::uint8_t* out, std::size_t groups,
                                 std::size_t element_size, std::size_t first_group) {
  return for_group_runs<Ops>(groups, element_size, first_group, [&](auto size, std::size_t group) {
    unshuffle_groups<Ops, decltype(size)::value>(in, out, groups, group);
  });
}


// ---- shuffle (elements -> planes): the same steps in reverse -------------
//
// Element bytes are split per byte j with saturating packs (exact after
// masking or sign-extending), giving lanes of 8 element bytes per group; each
// lane's 8x8 bit matrix is transposed; then a 4-stage byte transpose turns
// 16 groups x 8 planes into 8 planes x 16 groups.

// Splits the 16-bit units of a and b: low bytes -> out_low, high bytes -> out_high.
template <typename Ops>
QUANTEM_FORCE_INLINE void split_bytes16(typename Ops::Vector a, typename Ops::Vector b, typename Ops::Vector& out_low,
                                        typename Ops::Vector& out_high) {
  const typename Ops::Vector low_byte = Ops::broadcast16(0x00FF);
  out_low = Ops::pack_unsigned16(Ops::bit_and(a, low_byte), Ops::bit_and(b, low_byte));
  out_high = Ops::pack_unsigned16(Ops::template shift_right16<8>(a), Ops::template shift_right16<8>(b));
}

// Splits the 32-bit units of a and b: low 16 bits -> out_low, high 16 bits -> out_high.
template <typename Ops>
QUANTEM_FORCE_INLINE void split_halves32(typename Ops::Vector a, typename Ops::Vector b, typename Ops::Vector& out_low,
                                         typename Ops::Vector& out_high) {
  auto sign_extended_low = [](typename Ops::Vector v) {
    return Ops::template shift_right_arithmetic32<16>(Ops::template shift_left32<16>(v));
  };
  out_low = Ops::pack_signed32(sign_extended_low(a), sign_extended_low(b));
  out_high = Ops::pack_signed32(Ops::template shift_right_arithmetic32<16>(a),
                                Ops::template shift_right_arithmetic32<16>(b));
}

// Shuffles Ops::kGroups groups starting at first_group, for element sizes 1, 2, 4.
template <typename Ops, std::size_t ElementSize>
void shuffle_groups(const std::uint8_t* in, std::uint8_t* out, std::size_t plane_bytes, std::size_t first_group) {
  using V = typename Ops::Vector;
  constexpr std::size_t kPairBytes = 16 * ElementSize;      // input bytes of 2 groups
  constexpr std::size_t kHalfBytes = 16 * 8 * ElementSize;  // input bytes of 16 groups
  // lanes[j][i]: per 128-bit half, groups 2i and 2i+1; byte m of a 64-bit lane
  // is byte j of element 8g+m.
  V lanes[ElementSize][8];
  const std::uint8_t* low = in + 8 * first_group * ElementSize;
  for (std::size_t i = 0; i < 8; ++i) {
    const std::uint8_t* pair_low = low + kPairBytes * i;
    const std::uint8_t* pair_high = pair_low + kHalfBytes;
    if constexpr (ElementSize == 1) {
      lanes[0][i] = Ops::load_halves(pair_low, pair_high);
    } else if constexpr (ElementSize == 2) {
      split_bytes16<Ops>(Ops::load_halves(pair_low, pair_high), Ops::load_halves(pair_low + 16, pair_high + 16),
                         lanes[0][i], lanes[1][i]);
    } else {
      static_assert(ElementSize == 4, "SIMD shuffle handles element sizes 1, 2 and 4");
      V low_words_a, high_words_a, low_words_b, high_words_b;  // a: group 2i, b: group 2i+1
      split_halves32<Ops>(Ops::load_halves(pair_low, pair_high), Ops::load_halves(pair_low + 16, pair_high + 16),
                          low_words_a, high_words_a);
      split_halves32<Ops>(Ops::load_halves(pair_low + 32, pair_high + 32),
                          Ops::load_halves(pair_low + 48, pair_high + 48), low_words_b, high_words_b);
      split_bytes16<Ops>(low_words_a, low_words_b, lanes[0][i], lanes[1][i]);
      split_bytes16<Ops>(high_words_a, high_words_b, lanes[2][i], lanes[3][i]);
    }
  }
  for (std::size_t j = 0; j < ElementSize; ++j) {
    V* c = lanes[j];
    std::uint8_t* planes = out + 8 * j * plane_bytes + first_group;
    if (all_zero8<Ops>(c)) {
      for (std::size_t k = 0; k < 8; ++k) Ops::store(planes + k * plane_bytes, Ops::zero());
      continue;
    }
    for (std::size_t i = 0; i < 8; ++i) c[i] = transpose_bits_8x8_lanes<Ops>(c[i]);
    // groups x planes -> planes x groups. Vector index bits start as the pair
    // index (i2 i1 i0) with byte index (h k2 k1 k0), g = 2i + h; each stage
    // interleaves the two vectors that differ in one index bit.
    V d[8];
    for (std::size_t i = 0; i < 4; ++i) {  // pairs differing in i2
      d[i] = Ops::unpack_low8(c[i], c[i + 4]);
      d[i + 4] = Ops::unpack_high8(c[i], c[i + 4]);
    }
    for (std::size_t i : {0, 1, 4, 5}) {  // in i1
      c[i] = Ops::unpack_low8(d[i], d[i + 2]);
      c[i + 2] = Ops::unpack_high8(d[i], d[i + 2]);
    }
    for (std::size_t i : {0, 2, 4, 6}) {  // in i0
      d[i] = Ops::unpack_low8(c[i], c[i + 1]);
      d[i + 1] = Ops::unpack_high8(c[i], c[i + 1]);
    }
    for (std::size_t i = 0; i < 4; ++i) {  // in h; byte index is now g
      c[i] = Ops::unpack_low8(d[i], d[i + 4]);
      c[i + 4] = Ops::unpack_high8(d[i], d[i + 4]);
    }
    // Vector index bits are now (k0 k2 k1).
    for (std::size_t k = 0; k < 8; ++k)
      Ops::store(planes + k * plane_bytes, c[4 * (k & 1) + 2 * ((k >> 2) & 1) + ((k >> 1) & 1)]);
  }
}

// Shuffles as many whole runs of Ops::kGroups groups as fit (for_group_runs).
template <typename Ops>
std::size_t shuffle_group_runs(const std::uint8_t* in, std::uint8_t* out, std::size_t groups,
                               std::size_t element_size, std::size_t first_group) {
  return for_group_runs<Ops>(groups, element_size, first_group, [&](auto size, std::size_t group) {
    shuffle_groups<Ops, decltype(size)::value>(in, out, groups, group);
  });
}

}  // namespace
}  // namespace quantem::codec
