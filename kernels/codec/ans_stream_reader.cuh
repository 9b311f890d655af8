#pragma once
// The per-thread reader of one ANS stream (format: quantem/ans/ans_format.hpp),
// device code under nvcc, plain inline C++ under the host compiler, so a CPU
// test runs the exact logic the kernels run.
//
// A stream holds one quad's 4 interleaved rANS states. decode_frame() first
// issues the 4 table lookups of a frame (independent: each depends only on its
// own state), then applies them in coding order, each renormalisation taking
// the next word of the shared buffer. The long latency of the shared-memory
// lookups thus overlaps 4 ways within a thread.
//
// Streams are 16-byte aligned. The reader buffers up to 8 16-bit words in two
// 64-bit registers and keeps the next 16-byte chunk in flight. A warp holds 32
// independent streams, so anything a lane does alone (a refill) costs the
// whole warp: renormalisation is therefore branch-free (select on "state <
// lower bound"), and the buffer is topped up once per frame (top_up(): at
// least 5 words when the stream has them, enough for the 4 symbols of a quad).
// Only escapes and raw low bits can drain it mid-frame; they take the rare
// refill branch. Every read is bounded by the stream end: a malformed stream
// sets `corrupt` and continues on zeros (never faults).
#include <cstdint>

#if defined(__CUDACC__)
#include <vector_types.h>
#define QUANTEM_ANS_READER_HD __device__ __forceinline__
#define QUANTEM_ANS_READER_LOAD(pointer) __ldg(pointer)
#define QUANTEM_ANS_READER_UNROLL _Pragma("unroll")
#else
#include <vector_types.h>
#define QUANTEM_ANS_READER_HD inline
#define QUANTEM_ANS_READER_LOAD(pointer) (*(pointer))
#define QUANTEM_ANS_READER_UNROLL
#endif

#include "quantem/ans/ans_format.hpp"

namespace quantem::kernels::ans_device {

struct StreamReader {
  const uint4* next_chunk;
  const uint4* end_chunk;
  uint4 upcoming;              // the next chunk, loaded ahead
  std::uint64_t low;           // buffered words, first word in the low 16 bits
  std::uint64_t high;
  std::uint32_t words_left;    // buffered words, 0..8
  std::uint32_t halves_left;   // unread 64-bit halves of `upcoming`, 0..2
  std::uint32_t state[ans::kAnsStatesPerStream];  // one per quad position
  bool corrupt;

  // data: the group's stream data; offsets: its stream offsets.
  QUANTEM_ANS_READER_HD void open(const std::uint8_t* data, const std::uint32_t* offsets, std::uint32_t stream,
                                  std::uint32_t stream_count, std::uint64_t data_bytes) {
    const std::uint64_t begin = QUANTEM_ANS_READER_LOAD(offsets + stream);
    const std::uint64_t finish = stream + 1 < stream_count ? QUANTEM_ANS_READER_LOAD(offsets + stream + 1) : data_bytes;
    corrupt = begin >= finish || finish > data_bytes || begin % ans::kAnsStreamAlignment != 0 ||
              finish % ans::kAnsStreamAlignment != 0;
    low = high = 0;
    words_left = 0;
    halves_left = 0;
    upcoming = uint4{0, 0, 0, 0};
    next_chunk = end_chunk = reinterpret_cast<const uint4*>(data);
    for (std::uint32_t k = 0; k < ans::kAnsStatesPerStream; ++k) state[k] = ans::kAnsStateLower;
    if (corrupt) return;
    const uint4* chunk = reinterpret_cast<const uint4*>(data + begin);  // the 16-byte chunk of the 4 states
    end_chunk = reinterpret_cast<const uint4*>(data + finish);
    const uint4 states = QUANTEM_ANS_READER_LOAD(chunk);
    state[0] = states.x;
    state[1] = states.y;
    state[2] = states.z;
    state[3] = states.w;
    next_chunk = chunk + 1;
    prefetch();
  }

  QUANTEM_ANS_READER_HD void prefetch() {
    if (next_chunk < end_chunk) {
      upcoming = QUANTEM_ANS_READER_LOAD(next_chunk);
      ++next_chunk;
      halves_left = 2;
    }
  }

  // Appends the next 4 words (half a chunk) behind the buffered ones; needs words_left <= 4.
  QUANTEM_ANS_READER_HD void append_half() {
    const std::uint64_t half = halves_left == 2 ? (upcoming.x | (std::uint64_t{upcoming.y} << 32))
                                                : (upcoming.z | (std::uint64_t{upcoming.w} << 32));
    const std::uint32_t shift = 16 * words_left;  // 0..64; with words_left <= 4 every buffered word is in `low`
    if (shift == 0) {
      low = half;
      high = 0;
    } else if (shift < 64) {
      low |= half << shift;
      high = half >> (64 - shift);
    } else {
      high = half;
    }
    words_left += 4;
    if (--halves_left == 0) prefetch();
  }

  // Once per frame: keep at least 5 words buffered while the stream has them
  // (one per symbol of a quad, plus one; raw bits and escapes may need more
  // and take the rare refill branch of renormalize()). Branch-free except for
  // loading the next chunk.
  QUANTEM_ANS_READER_HD void top_up() {
    const bool take = words_left <= 4 && halves_left != 0;
    const std::uint64_t half = halves_left == 2 ? (upcoming.x | (std::uint64_t{upcoming.y} << 32))
                                                : (upcoming.z | (std::uint64_t{upcoming.w} << 32));
    const std::uint32_t shift = 16 * words_left;  // 0..64 when taking
    const std::uint64_t new_low = shift == 0 ? half : (shift >= 64 ? low : (low | (half << shift)));
    const std::uint64_t new_high = shift == 0 ? 0 : (shift >= 64 ? half : (half >> (64 - shift)));
    low = take ? new_low : low;
    high = take ? new_high : high;
    words_left += take ? 4u : 0u;
    halves_left -= take ? 1u : 0u;
    if (take && halves_left == 0) prefetch();
  }

  // x < 2^16 -> x = (x << 16) | next word; branch-free except when the buffer ran dry.
  QUANTEM_ANS_READER_HD void renormalize(std::uint32_t& x) {
    const bool need = x < ans::kAnsStateLower;
    if (need && words_left == 0) {  // rare: escapes or raw bits drained the buffer
      if (halves_left == 0) {
        corrupt = true;
      } else {
        append_half();
      }
    }
    const std::uint32_t word = static_cast<std::uint32_t>(low) & 0xffffu;
    const std::uint64_t next_low = (low >> 16) | (high << 48);
    x = need ? ((x << 16) | word) : x;
    low = need ? next_low : low;
    high = need ? (high >> 16) : high;
    words_left -= (need && words_left != 0) ? 1u : 0u;
  }

  QUANTEM_ANS_READER_HD std::uint32_t read_bits(std::uint32_t& x, std::uint32_t count) {
    const std::uint32_t bits = x & ((1u << count) - 1u);
    x >>= count;
    renormalize(x);
    return bits;
  }

  // The value behind an escape symbol (254: 16 raw bits, 255: 32 raw bits).
  QUANTEM_ANS_READER_HD std::uint32_t read_escaped(std::uint32_t& x, std::uint32_t symbol) {
    const std::uint32_t low_half = read_bits(x, 16);
    if (symbol == ans::kAnsEscape16) return low_half;
    return low_half | (read_bits(x, 16) << 16);
  }

  // Decodes one frame of the quad: values[k] for every present position k
  // (bit k of `present`), 0 for absent ones. class_table[k] is position k's
  // decode table (entry = symbol | frequency << 8 | (slot - cdf) << 19, see
  // build_decode_tables; any valid table for an absent position), shift[k]
  // its class shift. `raw_bits` false promises every shift is 0; pass the same
  // value on every lane of a warp so the choice never diverges. Call top_up()
  // before each frame.
  QUANTEM_ANS_READER_HD void decode_frame(const std::uint32_t* const class_table[4], const std::uint32_t shift[4],
                                          std::uint32_t present, bool raw_bits, std::uint32_t values[4]) {
    std::uint32_t entry[4];
    bool escaped = false;
    QUANTEM_ANS_READER_UNROLL
    for (int k = 0; k < 4; ++k) {
      entry[k] = class_table[k][state[k] & (ans::kAnsProbabilityScale - 1)];
      escaped = escaped || (((present >> k) & 1u) != 0 && (entry[k] & 0xffu) >= ans::kAnsEscape16);
    }
    if (!raw_bits && !escaped) {
      decode_plain_symbols(entry, present, values);
      return;
    }
    QUANTEM_ANS_READER_UNROLL
    for (int k = 0; k < 4; ++k) {
      values[k] = 0;
      if ((present >> k) & 1u) {
        std::uint32_t& x = state[k];
        x = ((entry[k] >> 8) & 0x7ffu) * (x >> ans::kAnsProbabilityBits) + (entry[k] >> 19);
        renormalize(x);
        const std::uint32_t symbol = entry[k] & 0xffu;  // an unused class's zero entries end in a wrong final state
        if (symbol >= ans::kAnsEscape16) {
          values[k] = read_escaped(x, symbol);
        } else {  // shift 0: masks no bits, leaves x >= 2^16 (no word read)
          values[k] = (symbol << shift[k]) | read_bits(x, shift[k]);
        }
      }
    }
  }

  // The common case, plain symbols (no raw bits, no escapes): at most one word
  // per symbol, so the 4 words at the front of the buffer (top_up() keeps at
  // least 5 while the stream has them) serve the whole frame. Branch-free:
  // each renormalisation takes the next word from two 32-bit registers, and
  // the buffer is shifted once per frame by the number of words taken.
  QUANTEM_ANS_READER_HD void decode_plain_symbols(const std::uint32_t entry[4], std::uint32_t present,
                                                  std::uint32_t values[4]) {
    std::uint32_t front = static_cast<std::uint32_t>(low);       // words 0, 1
    std::uint32_t back = static_cast<std::uint32_t>(low >> 32);  // words 2, 3
    std::uint32_t taken = 0;
    QUANTEM_ANS_READER_UNROLL
    for (int k = 0; k < 4; ++k) {
      const bool here = ((present >> k) & 1u) != 0;
      const std::uint32_t decoded =
          ((entry[k] >> 8) & 0x7ffu) * (state[k] >> ans::kAnsProbabilityBits) + (entry[k] >> 19);
      const bool need = here && decoded < ans::kAnsStateLower;
      const std::uint32_t renormalized = need ? ((decoded << 16) | (front & 0xffffu)) : decoded;
      state[k] = here ? renormalized : state[k];
      front = need ? ((front >> 16) | (back << 16)) : front;
      back = need ? (back >> 16) : back;
      taken += need ? 1u : 0u;
      values[k] = here ? (entry[k] & 0xffu) : 0u;
    }
    consume(taken);
  }

  // Drops `count` (0..4) words from the front of the buffer.
  QUANTEM_ANS_READER_HD void consume(std::uint32_t count) {
    corrupt = corrupt || count > words_left;  // a malformed stream ran past its end
    count = count > words_left ? words_left : count;
    const std::uint32_t bits = 16 * count;  // 0..64
    const std::uint64_t shifted = bits == 0 ? low : (bits >= 64 ? high : ((low >> bits) | (high << (64 - bits))));
    high = bits >= 64 ? 0 : (high >> bits);
    low = shifted;
    words_left -= count;
  }

  // True when the stream decoded exactly: every final state is the encoder's
  // initial state and only zero padding is left unread.
  QUANTEM_ANS_READER_HD bool finished_cleanly() const {
    // The last chunk's second half may still sit unread in `upcoming`: then it is padding.
    const bool rest_is_padding = halves_left == 0 || (halves_left == 1 && upcoming.z == 0 && upcoming.w == 0);
    bool states_final = true;
    for (std::uint32_t k = 0; k < ans::kAnsStatesPerStream; ++k) states_final = states_final && state[k] == ans::kAnsStateLower;
    return !corrupt && states_final && rest_is_padding && next_chunk == end_chunk && low == 0 && high == 0;
  }
};

}  // namespace quantem::kernels::ans_device
