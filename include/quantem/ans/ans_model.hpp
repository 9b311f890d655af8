#pragma once
// The integer model of the ANS resident (ans_format.hpp), written once for the
// CPU reference and the CUDA encoder so both produce byte-identical groups:
// integer square root, class selection, frequency normalisation, one rANS
// encode step. CUDA-free: QUANTEM_HOST_DEVICE (ans_format.hpp) expands to
// __host__ __device__ only under nvcc.
#include <cstdint>

#include "quantem/ans/ans_format.hpp"  // QUANTEM_HOST_DEVICE

namespace quantem::ans {

// floor(sqrt(n)) for n < 2^62, exact.
QUANTEM_HOST_DEVICE inline std::uint64_t isqrt_u64(std::uint64_t n) {
  std::uint64_t root = 0;
  std::uint64_t bit = std::uint64_t{1} << 62;
  while (bit > n) bit >>= 2;
  while (bit != 0) {
    if (n >= root + bit) {
      n -= root + bit;
      root = (root >> 1) + bit;
    } else {
      root >>= 1;
    }
    bit >>= 2;
  }
  return root;
}

// h of the class-scale histogram: min(4095, isqrt(64 S / F)).
QUANTEM_HOST_DEVICE inline std::uint32_t class_histogram_bin(std::uint64_t pixel_sum, std::uint32_t frame_count) {
  const std::uint64_t h = isqrt_u64((pixel_sum * 64u) / frame_count);
  return h < kAnsClassHistogramBins - 1 ? static_cast<std::uint32_t>(h) : kAnsClassHistogramBins - 1;
}

// K (in 1/16 units) from the smallest histogram bin H reaching 99.5 % of the pixels.
QUANTEM_HOST_DEVICE inline std::uint32_t class_scale_from_bin(std::uint32_t high_bin) {
  const std::uint64_t square = (std::uint64_t{high_bin} + 1) * (std::uint64_t{high_bin} + 1);
  const std::uint64_t scale = (61504u * 16u) / square;
  return scale < 1 ? 1u : (scale > 4096 ? 4096u : static_cast<std::uint32_t>(scale));
}

// Pixels the 99.5 % quantile must reach.
QUANTEM_HOST_DEVICE inline std::uint64_t class_quantile_pixels(std::uint64_t pixel_count) {
  return (pixel_count * 995u + 999u) / 1000u;
}

QUANTEM_HOST_DEVICE inline std::uint32_t pixel_class(std::uint64_t pixel_sum, std::uint32_t frame_count,
                                                std::uint32_t class_scale) {
  const std::uint64_t c = isqrt_u64((pixel_sum * class_scale) / (std::uint64_t{frame_count} * 16u));
  return c < kAnsClassCount - 1 ? static_cast<std::uint32_t>(c) : kAnsClassCount - 1;
}

// Normalises symbol counts to frequencies summing to kAnsProbabilityScale; a
// symbol that occurs keeps a frequency >= 1. All zero counts give all zero
// frequencies (an unused class).
//  1. f = max(1, floor(count * scale / total)) for every occurring symbol;
//  2. a shortfall goes to the most frequent symbol (lowest index on ties);
//  3. an excess is taken from the largest frequency (lowest index on ties),
//     never below 1, until the sum is exact.
QUANTEM_HOST_DEVICE inline void normalize_frequencies(const std::uint64_t* counts, std::uint16_t* frequencies) {
  std::uint64_t total = 0;
  std::uint32_t most_frequent = 0;
  for (std::uint32_t s = 0; s < kAnsAlphabetSize; ++s) {
    total += counts[s];
    if (counts[s] > counts[most_frequent]) most_frequent = s;
  }
  if (total == 0) {
    for (std::uint32_t s = 0; s < kAnsAlphabetSize; ++s) frequencies[s] = 0;
    return;
  }
  std::uint32_t sum = 0;
  for (std::uint32_t s = 0; s < kAnsAlphabetSize; ++s) {
    std::uint64_t f = counts[s] == 0 ? 0 : (counts[s] * kAnsProbabilityScale) / total;
    if (counts[s] != 0 && f == 0) f = 1;
    frequencies[s] = static_cast<std::uint16_t>(f);
    sum += static_cast<std::uint32_t>(f);
  }
  if (sum < kAnsProbabilityScale) {
    frequencies[most_frequent] = static_cast<std::uint16_t>(frequencies[most_frequent] + (kAnsProbabilityScale - sum));
    return;
  }
  while (sum > kAnsProbabilityScale) {
    std::uint32_t largest = 0;
    for (std::uint32_t s = 1; s < kAnsAlphabetSize; ++s)
      if (frequencies[s] > frequencies[largest]) largest = s;
    const std::uint32_t excess = sum - kAnsProbabilityScale;
    const std::uint32_t room = frequencies[largest] - 1u;
    const std::uint32_t take = excess < room ? excess : room;
    frequencies[largest] = static_cast<std::uint16_t>(frequencies[largest] - take);
    sum -= take;
  }
}

inline constexpr std::uint32_t kAnsNoWord = 0xffffffffu;

// floor(log2(n)) for n > 0.
QUANTEM_HOST_DEVICE inline std::uint32_t ilog2_u64(std::uint64_t n) {
  std::uint32_t log = 0;
  while (n >>= 1) ++log;
  return log;
}

// Raw low bits of the values of a class (see ans_format.hpp): the fewest that
// bring the class's likely values (upper-edge mean m + 6 sqrt(m) + 16) below
// the escape symbols, so moderate counts are modelled exactly and only very
// bright classes send low bits raw.
QUANTEM_HOST_DEVICE inline std::uint32_t class_shift(std::uint32_t cls, std::uint32_t class_scale) {
  const std::uint64_t mean_ceiling = (std::uint64_t{cls + 1} * (cls + 1) * 16u) / class_scale;
  const std::uint64_t reach = mean_ceiling + 6 * isqrt_u64(mean_ceiling) + 16;
  std::uint32_t shift = 0;
  while (shift < kAnsMaxClassShift && (reach >> shift) >= kAnsEscape16) ++shift;
  return shift;
}

// The symbol of a value in a class of shift `shift`. kMayExceed16Bits =
// false promises value <= 0xffff (8- and 16-bit data), which drops the
// escape32 test from the GPU encoder's inner loops; the symbol is the same.
template <bool kMayExceed16Bits = true>
QUANTEM_HOST_DEVICE inline std::uint32_t value_symbol(std::uint32_t value, std::uint32_t shift) {
  const std::uint32_t high = value >> shift;
  if (high < kAnsEscape16) return high;
  if constexpr (!kMayExceed16Bits) return kAnsEscape16;
  return value <= 0xffffu ? kAnsEscape16 : kAnsEscape32;
}

// One rANS encode step for a symbol of frequency `frequency` and cumulative
// frequency `cdf`. Returns the 16-bit word emitted by renormalisation, or
// kAnsNoWord. At most one word is emitted per step (the state stays in [2^16, 2^32)).
QUANTEM_HOST_DEVICE inline std::uint32_t encode_symbol(std::uint32_t& state, std::uint32_t frequency, std::uint32_t cdf) {
  std::uint32_t word = kAnsNoWord;
  const std::uint64_t limit = (std::uint64_t{kAnsStateLower >> kAnsProbabilityBits} << 16) * frequency;
  if (state >= limit) {
    word = state & 0xffffu;
    state >>= 16;
  }
  state = ((state / frequency) << kAnsProbabilityBits) + (state % frequency) + cdf;
  return word;
}

// The multiplier of frequency_quotient: ceil(2^64 / f) for 2 <= f <= 2^16; 0 for f <= 1.
QUANTEM_HOST_DEVICE inline std::uint64_t frequency_reciprocal(std::uint32_t frequency) {
  return frequency <= 1 ? 0 : ~std::uint64_t{0} / frequency + 1;
}

// floor(x / f) for x < 2^32, 1 <= f <= 2^16, without a division: the high
// 64 bits of x * ceil(2^64 / f). Exact: x * ceil(2^64/f) / 2^64 = x/f + e with
// 0 <= e < x / 2^64 < 2^-32, while x/f is at least 1/f >= 2^-16 below the next integer.
QUANTEM_HOST_DEVICE inline std::uint32_t frequency_quotient(std::uint32_t x, std::uint32_t frequency,
                                                       std::uint64_t reciprocal) {
#if defined(__CUDA_ARCH__)
  const std::uint64_t high = __umul64hi(x, reciprocal);
#else
  // (x * r) >> 64 from 32-bit halves: x * r_high + ((x * r_low) >> 32) < 2^64 cannot overflow.
  const std::uint64_t high = (std::uint64_t{x} * (reciprocal >> 32) + ((std::uint64_t{x} * (reciprocal & 0xffffffffu)) >> 32)) >> 32;
#endif
  return frequency == 1 ? x : static_cast<std::uint32_t>(high);
}

// encode_symbol with the division replaced by frequency_quotient (the GPU
// encoder's form; tests check it equals encode_symbol for every frequency).
QUANTEM_HOST_DEVICE inline std::uint32_t encode_symbol_reciprocal(std::uint32_t& state, std::uint32_t frequency,
                                                             std::uint32_t cdf, std::uint64_t reciprocal) {
  // state >= 2^22 * frequency  <=>  (state >> 22) >= frequency (the renormalisation limit of encode_symbol)
  const bool emit = (state >> (32 - kAnsProbabilityBits)) >= frequency;
  const std::uint32_t word = emit ? (state & 0xffffu) : kAnsNoWord;
  const std::uint32_t x = emit ? (state >> 16) : state;
  const std::uint32_t quotient = frequency_quotient(x, frequency, reciprocal);
  state = (quotient << kAnsProbabilityBits) + (x - quotient * frequency) + cdf;
  return word;
}

// Encodes `count` (1..16) raw bits: a symbol of frequency 1 at scale 2^count.
// Returns the renormalisation word emitted, or kAnsNoWord.
QUANTEM_HOST_DEVICE inline std::uint32_t encode_bits(std::uint32_t& state, std::uint32_t bits, std::uint32_t count) {
  std::uint32_t word = kAnsNoWord;
  if (state >= (std::uint64_t{kAnsStateLower >> count} << 16)) {
    word = state & 0xffffu;
    state >>= 16;
  }
  state = (state << count) | bits;
  return word;
}

// Encodes one value of a pixel of class shift `shift`, calling emit(word) for
// every renormalisation word (in encode order; the decoder reads them in
// reverse). encode_symbol_step(state, symbol) encodes the value's symbol with
// the pixel's class table and returns the word it emits (or kAnsNoWord).
// Values are encoded last to first, so each value's parts go in reverse of
// their decode order: raw bits (or escaped bits) first, then the symbol.
// kMayExceed16Bits as for value_symbol.
template <bool kMayExceed16Bits = true, class EncodeSymbolStep, class Emit>
QUANTEM_HOST_DEVICE inline void encode_value(std::uint32_t& state, std::uint32_t value, std::uint32_t shift,
                                        EncodeSymbolStep&& encode_symbol_step, Emit&& emit) {
  const std::uint32_t symbol = value_symbol<kMayExceed16Bits>(value, shift);
  if (kMayExceed16Bits && symbol == kAnsEscape32) {
    emit(encode_bits(state, value >> 16, 16));
    emit(encode_bits(state, value & 0xffffu, 16));
  } else if (symbol == kAnsEscape16) {
    emit(encode_bits(state, value, 16));
  } else if (shift != 0) {
    emit(encode_bits(state, value & ((1u << shift) - 1u), shift));
  }
  emit(encode_symbol_step(state, symbol));
}

}  // namespace quantem::ans
