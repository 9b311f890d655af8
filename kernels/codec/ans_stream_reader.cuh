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
// Streams are 16-byte aligned. The reader holds an 8-word window of the
// stream in two 64-bit registers and a bit position `pos` of the next unread
// word in it, and keeps the next 16-byte chunk in flight. A warp holds 32
// independent streams, so anything a lane does alone costs the whole warp:
// consuming a word only advances `pos`, and the window slides by 4 words
// (low = high, high = the next 4 words) once per frame at most (top_up():
// then at least 5 unread words, enough for the 4 symbols of a quad). Plain
// frames (no raw bits, no escapes) decode branch-free from a 4-word view of
// the window; raw bits and escapes take a checked path that may slide the
// window mid-frame. Reads are bounded by the stream end: past it the window
// fills with zeros (counted in `phantom_bits`), and a stream that consumed
// them, or did not end exactly, is reported (never faults).
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
  std::uint64_t low;           // window words 0..3 (word 0 in the low 16 bits)
  std::uint64_t high;          // window words 4..7
  std::uint32_t pos;           // bit position of the next unread word in low:high, 0..128
  std::uint32_t halves_left;   // unread 64-bit halves of `upcoming`, 0..2
  std::uint32_t phantom_bits;  // zero bits at the end of the window that lie past the stream: 0, 64 or 128
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
    pos = 128;
    halves_left = 0;
    phantom_bits = 0;
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
    slide();
    slide();
  }

  QUANTEM_ANS_READER_HD void prefetch() {
    if (next_chunk < end_chunk) {
      upcoming = QUANTEM_ANS_READER_LOAD(next_chunk);
      ++next_chunk;
      halves_left = 2;
    }
  }

  // Slides the window by 4 words: low = high, high = the next 4 words of the
  // stream (zeros past its end).
  QUANTEM_ANS_READER_HD void slide() {
    const bool have = halves_left != 0;
    const std::uint64_t half = halves_left == 2 ? (upcoming.x | (std::uint64_t{upcoming.y} << 32))
                                                : (upcoming.z | (std::uint64_t{upcoming.w} << 32));
    low = high;
    high = have ? half : 0;
    phantom_bits = have ? phantom_bits : (phantom_bits >= 64 ? 128u : phantom_bits + 64);
    pos -= 64;
    if (have && --halves_left == 0) prefetch();
  }

  // Once per frame: at least 5 unread words in the window (pos < 64). Only a
  // frame of many raw bits or escapes leaves pos at 128 and needs two slides.
  QUANTEM_ANS_READER_HD void top_up() {
    if (pos >= 128) slide();
    if (pos >= 64) slide();
  }

  // The next unread word; slides the window when it is used up (checked path).
  QUANTEM_ANS_READER_HD std::uint32_t peek_word() {
    if (pos >= 128) slide();
    return static_cast<std::uint32_t>((pos < 64 ? (low >> pos) : (high >> (pos - 64))) & 0xffffu);
  }

  // x < 2^16 -> x = (x << 16) | next word (checked path).
  QUANTEM_ANS_READER_HD void renormalize(std::uint32_t& x) {
    if (x < ans::kAnsStateLower) {
      x = (x << 16) | peek_word();
      pos += 16;
    }
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
  // per symbol, so the 4 words after `pos` (top_up() keeps at least 5 unread)
  // serve the whole frame. Branch-free: each renormalisation takes the next
  // word from a two-register view, and `pos` advances by the words taken.
  QUANTEM_ANS_READER_HD void decode_plain_symbols(const std::uint32_t entry[4], std::uint32_t present,
                                                  std::uint32_t values[4]) {
    const std::uint64_t view = pos == 0 ? low : ((low >> pos) | (high << (64 - pos)));  // pos < 64 here
    std::uint32_t front = static_cast<std::uint32_t>(view);       // words 0, 1 after pos
    std::uint32_t back = static_cast<std::uint32_t>(view >> 32);  // words 2, 3
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
    pos += 16 * taken;
  }

  // True when the stream decoded exactly: every final state is the encoder's
  // initial state, no word past the stream end was consumed, and only zero
  // padding is left unread.
  QUANTEM_ANS_READER_HD bool finished_cleanly() const {
    bool states_final = true;
    for (std::uint32_t k = 0; k < ans::kAnsStatesPerStream; ++k) states_final = states_final && state[k] == ans::kAnsStateLower;
    const std::uint32_t real_end = 128 - phantom_bits;  // window bits that came from the stream
    if (corrupt || !states_final || pos > real_end) return false;
    for (std::uint32_t bit = pos; bit < real_end; bit += 16) {
      const std::uint64_t word = (bit < 64 ? (low >> bit) : (high >> (bit - 64))) & 0xffffu;
      if (word != 0) return false;
    }
    // The last chunk's second half may still sit unread in `upcoming`: then it is padding.
    const bool rest_is_padding = halves_left == 0 || (halves_left == 1 && upcoming.z == 0 && upcoming.w == 0);
    return rest_is_padding && next_chunk == end_chunk;
  }
};

}  // namespace quantem::kernels::ans_device
