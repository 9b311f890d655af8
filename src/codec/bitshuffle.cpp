// Bit transposes of one bitshuffle block (kiyo-masui/bitshuffle's bitshuffle_core.c).
//
// Layout: a block of n elements (n a multiple of 8) of element_size bytes is
// stored as 8*element_size bit planes of n/8 bytes each; bit m of byte g of
// plane p is bit p of element 8g+m (p = 8*j + b for bit b of byte j).
//
// Both directions work on "groups" of 8 consecutive elements. For one group g
// and one element byte j, the 8 plane bytes {plane 8j+k, byte g : k = 0..7}
// and the 8 element bytes {element 8g+m, byte j : m = 0..7} are the rows of two
// 8x8 bit matrices that are transposes of each other. Each 8x8 bit matrix lives
// in one 64-bit word (byte = row, bit = column) and is transposed with three
// masked swap steps. Gathering the plane bytes of 8 or 16 consecutive groups
// is itself an 8x8 / 8x16 byte transpose: shift-and-mask on 64-bit words here
// (any element size, and the groups left over by the SIMD kernels), SSE2/AVX2
// unpacks in bitshuffle_simd.hpp (element sizes 1, 2 and 4).
#include <cstdint>
#include <cstring>
#include <string>

#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/error.hpp"

// The 64-bit word tricks below read byte r of a word as its bits 8r..8r+7.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "quantem codec assumes a little-endian host"
#endif

#if defined(__SSE2__) || defined(_M_X64)
#define QUANTEM_CODEC_SSE2 1
#include "bitshuffle_simd.hpp"
#endif

namespace quantem::codec {

#ifdef QUANTEM_CODEC_AVX2_KERNEL
namespace detail {
// bitshuffle_avx2.cpp (compiled with -mavx2): (un)shuffle whole runs of 32
// groups from first_group on, for element sizes 1, 2, 4; return the first
// group not done.
std::size_t unshuffle_group_runs_avx2(const std::uint8_t* in, std::uint8_t* out, std::size_t groups,
                                      std::size_t element_size, std::size_t first_group);
std::size_t shuffle_group_runs_avx2(const std::uint8_t* in, std::uint8_t* out, std::size_t groups,
                                    std::size_t element_size, std::size_t first_group);
}  // namespace detail
#endif

namespace {

bool cpu_has_avx2() {
#ifdef QUANTEM_CODEC_AVX2_KERNEL
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  return has_avx2;
#else
  return false;  // the AVX2 kernel is not built
#endif
}

std::uint64_t load_u64(const std::uint8_t* p) {
  std::uint64_t value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

void store_u64(std::uint8_t* p, std::uint64_t value) { std::memcpy(p, &value, sizeof value); }

// Transposes the 8x8 bit matrix held in `x` (byte r = row r, bit c = column c).
std::uint64_t transpose_bits_8x8(std::uint64_t x) {
  std::uint64_t t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAull;
  x ^= t ^ (t << 7);
  t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCull;
  x ^= t ^ (t << 14);
  t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ull;
  x ^= t ^ (t << 28);
  return x;
}

// Transposes the 8x8 byte matrix rows[0..7] (byte i of rows[k] = element (k, i)) in place.
void transpose_bytes_8x8(std::uint64_t rows[8]) {
  auto swap_step = [](std::uint64_t& a, std::uint64_t& b, unsigned shift, std::uint64_t mask) {
    const std::uint64_t t = ((a >> shift) ^ b) & mask;
    b ^= t;
    a ^= t << shift;
  };
  for (int k = 0; k < 8; k += 2) swap_step(rows[k], rows[k + 1], 8, 0x00FF00FF00FF00FFull);
  for (int k : {0, 1, 4, 5}) swap_step(rows[k], rows[k + 2], 16, 0x0000FFFF0000FFFFull);
  for (int k = 0; k < 4; ++k) swap_step(rows[k], rows[k + 4], 32, 0x00000000FFFFFFFFull);
}

// ---- unshuffle (planes -> elements) -------------------------------------

// One group, any element size.
void unshuffle_group(const std::uint8_t* in, std::uint8_t* out, std::size_t plane_bytes,
                     std::size_t element_size, std::size_t group) {
  for (std::size_t j = 0; j < element_size; ++j) {
    std::uint64_t rows = 0;
    for (std::size_t k = 0; k < 8; ++k) rows |= std::uint64_t{in[(8 * j + k) * plane_bytes + group]} << (8 * k);
    const std::uint64_t element_bytes = transpose_bits_8x8(rows);
    std::uint8_t* first = out + 8 * group * element_size + j;
    for (std::size_t m = 0; m < 8; ++m) first[m * element_size] = static_cast<std::uint8_t>(element_bytes >> (8 * m));
  }
}

// Eight consecutive groups, any element size (portable 64-bit path).
void unshuffle_eight_groups(const std::uint8_t* in, std::uint8_t* out, std::size_t plane_bytes,
                            std::size_t element_size, std::size_t first_group) {
  for (std::size_t j = 0; j < element_size; ++j) {
    std::uint64_t words[8];
    for (std::size_t k = 0; k < 8; ++k) words[k] = load_u64(in + (8 * j + k) * plane_bytes + first_group);
    transpose_bytes_8x8(words);  // words[i] byte k = plane 8j+k, byte first_group+i
    for (std::size_t i = 0; i < 8; ++i) {
      const std::uint64_t element_bytes = transpose_bits_8x8(words[i]);
      const std::size_t group = first_group + i;
      if (element_size == 1) {
        store_u64(out + 8 * group, element_bytes);
      } else {
        std::uint8_t* first = out + 8 * group * element_size + j;
        for (std::size_t m = 0; m < 8; ++m) first[m * element_size] = static_cast<std::uint8_t>(element_bytes >> (8 * m));
      }
    }
  }
}


// ---- shuffle (elements -> planes) ---------------------------------------

// Byte j of the 8 elements of one group, packed into one word (byte m = element 8g+m).
std::uint64_t gather_element_bytes(const std::uint8_t* in, std::size_t element_size, std::size_t group,
                                   std::size_t j) {
  const std::uint8_t* first = in + 8 * group * element_size + j;
  if (element_size == 1) return load_u64(first);
  std::uint64_t word = 0;
  for (std::size_t m = 0; m < 8; ++m) word |= std::uint64_t{first[m * element_size]} << (8 * m);
  return word;
}

void shuffle_group(const std::uint8_t* in, std::uint8_t* out, std::size_t plane_bytes, std::size_t element_size,
                   std::size_t group) {
  for (std::size_t j = 0; j < element_size; ++j) {
    const std::uint64_t plane_bytes_of_group = transpose_bits_8x8(gather_element_bytes(in, element_size, group, j));
    for (std::size_t k = 0; k < 8; ++k)
      out[(8 * j + k) * plane_bytes + group] = static_cast<std::uint8_t>(plane_bytes_of_group >> (8 * k));
  }
}

void shuffle_eight_groups(const std::uint8_t* in, std::uint8_t* out, std::size_t plane_bytes,
                          std::size_t element_size, std::size_t first_group) {
  for (std::size_t j = 0; j < element_size; ++j) {
    std::uint64_t words[8];
    for (std::size_t i = 0; i < 8; ++i)
      words[i] = transpose_bits_8x8(gather_element_bytes(in, element_size, first_group + i, j));
    transpose_bytes_8x8(words);  // words[k] byte i = plane 8j+k, byte first_group+i
    for (std::size_t k = 0; k < 8; ++k) store_u64(out + (8 * j + k) * plane_bytes + first_group, words[k]);
  }
}

void check_block_arguments(const char* function, std::size_t element_count, std::size_t element_size) {
  if (element_size == 0 || element_count % 8 != 0)
    throw internal_error(std::string(function) + ": element_count " + std::to_string(element_count) +
                         " must be a multiple of 8 and element_size " + std::to_string(element_size) +
                         " must be positive");
}

// (Un)shuffles whole runs of groups from first_group on with one SIMD kernel;
// returns the first group not done.
using GroupRuns = std::size_t (*)(const std::uint8_t* in, std::uint8_t* out, std::size_t groups,
                                  std::size_t element_size, std::size_t first_group);
// (Un)shuffles the group, or the eight groups, from `group` on.
using Groups = void (*)(const std::uint8_t* in, std::uint8_t* out, std::size_t plane_bytes,
                        std::size_t element_size, std::size_t group);

// Where a SIMD kernel is not built: no group done.
[[maybe_unused]] std::size_t no_group_runs(const std::uint8_t*, std::uint8_t*, std::size_t, std::size_t,
                                          std::size_t first_group) {
  return first_group;
}

#ifdef QUANTEM_CODEC_AVX2_KERNEL
constexpr GroupRuns kAvx2ShuffleRuns = detail::shuffle_group_runs_avx2;
constexpr GroupRuns kAvx2UnshuffleRuns = detail::unshuffle_group_runs_avx2;
#else
constexpr GroupRuns kAvx2ShuffleRuns = no_group_runs;
constexpr GroupRuns kAvx2UnshuffleRuns = no_group_runs;
#endif
#ifdef QUANTEM_CODEC_SSE2
constexpr GroupRuns kSse2ShuffleRuns = shuffle_group_runs<Sse2Ops>;
constexpr GroupRuns kSse2UnshuffleRuns = unshuffle_group_runs<Sse2Ops>;
#else
constexpr GroupRuns kSse2ShuffleRuns = no_group_runs;
constexpr GroupRuns kSse2UnshuffleRuns = no_group_runs;
#endif

// One direction over a whole block: the widest kernel the CPU has first, then
// the portable ones for the groups it leaves.
template <GroupRuns Avx2Runs, GroupRuns Sse2Runs, Groups EightGroups, Groups OneGroup>
void transpose_block(const char* function, const std::uint8_t* in, std::uint8_t* out, std::size_t element_count,
                     std::size_t element_size) {
  check_block_arguments(function, element_count, element_size);
  const std::size_t groups = element_count / 8;  // = bytes per bit plane
  std::size_t group = 0;
  if (cpu_has_avx2()) group = Avx2Runs(in, out, groups, element_size, group);
  group = Sse2Runs(in, out, groups, element_size, group);
  for (; group + 8 <= groups; group += 8) EightGroups(in, out, groups, element_size, group);
  for (; group < groups; ++group) OneGroup(in, out, groups, element_size, group);
}

}  // namespace

void bitshuffle_block(const std::uint8_t* in, std::uint8_t* out, std::size_t element_count,
                      std::size_t element_size) {
  transpose_block<kAvx2ShuffleRuns, kSse2ShuffleRuns, shuffle_eight_groups, shuffle_group>(
      "bitshuffle_block", in, out, element_count, element_size);
}

void bitunshuffle_block(const std::uint8_t* in, std::uint8_t* out, std::size_t element_count,
                        std::size_t element_size) {
  transpose_block<kAvx2UnshuffleRuns, kSse2UnshuffleRuns, unshuffle_eight_groups, unshuffle_group>(
      "bitunshuffle_block", in, out, element_count, element_size);
}

}  // namespace quantem::codec
