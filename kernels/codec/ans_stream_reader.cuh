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

// Decode-table entries, built per CTA by build_decode_tables (not part of the
// stored format). The fields are placed so that the hot path needs the fewest
// integer-pipe instructions (the decoders are bound by them, docs/kernels.md):
//   bits  0..9   bias = slot - cdf(symbol)       (entry & 0x3ff: one AND)
//   bits 10..17  symbol                          (a masked sum ANDs the entry with kEntrySymbolMask)
//   bit  18      escape flag (symbol 254 or 255) (one OR over a frame's entries finds any)
//   bits 21..31  frequency, 1..1024              (entry >> 21: one shift)
// so a symbol decodes as x' = (entry >> 21) * (x >> 10) + (entry & 0x3ff).
inline constexpr std::uint32_t kEntryBiasMask = (1u << ans::kAnsProbabilityBits) - 1u;
inline constexpr std::uint32_t kEntrySymbolShift = 10;
inline constexpr std::uint32_t kEntrySymbolMask = 0xffu << kEntrySymbolShift;
inline constexpr std::uint32_t kEntryEscapeFlag = 1u << 18;
inline constexpr std::uint32_t kEntryFrequencyShift = 21;

QUANTEM_ANS_READER_HD constexpr std::uint32_t make_decode_entry(std::uint32_t symbol, std::uint32_t frequency,
                                                                std::uint32_t bias) {
  return bias | (symbol << kEntrySymbolShift) | (symbol >= ans::kAnsEscape16 ? kEntryEscapeFlag : 0u) |
         (frequency << kEntryFrequencyShift);
}

QUANTEM_ANS_READER_HD constexpr std::uint32_t entry_symbol(std::uint32_t entry) {
  return (entry >> kEntrySymbolShift) & 0xffu;
}

// The one-entry table of an absent quad position (outside the detector, or a
// lane without a stream): frequency = scale and bias = slot leave the state
// unchanged, the symbol is 0 and no word is read. Such a state stays at its
// initial 2^16, so slot 0 is the only one ever looked up.
inline constexpr std::uint32_t kNeutralEntry = make_decode_entry(0, ans::kAnsProbabilityScale, 0);
// Where the neutral entry sits: after the class tables (entry index).
inline constexpr std::uint32_t kNeutralTableOffset = ans::kAnsClassCount * ans::kAnsProbabilityScale;

// PTX prmt (byte i of the result = byte selector[4i..4i+3] of b:a; every
// selector nibble here is below 8) and the
// 32-bit funnel shift ((hi:lo) >> (shift mod 32)), with host twins.
QUANTEM_ANS_READER_HD std::uint32_t byte_perm(std::uint32_t a, std::uint32_t b, std::uint32_t selector) {
#if defined(__CUDA_ARCH__)
  std::uint32_t result;  // prmt itself: __byte_perm would first mask the selector (one more instruction)
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(result) : "r"(a), "r"(b), "r"(selector));
  return result;
#else
  const std::uint64_t bytes = a | (std::uint64_t{b} << 32);
  std::uint32_t result = 0;
  for (int i = 0; i < 4; ++i)
    result |= static_cast<std::uint32_t>((bytes >> (8 * ((selector >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return result;
#endif
}

QUANTEM_ANS_READER_HD std::uint32_t funnel_right(std::uint32_t lo, std::uint32_t hi, std::uint32_t shift) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, shift);
#else
  return static_cast<std::uint32_t>(((std::uint64_t{hi} << 32) | lo) >> (shift & 31u));
#endif
}

// x >> kAnsProbabilityBits as the high half of a product, so that it issues
// on the multiply pipe instead of the busier integer pipe.
QUANTEM_ANS_READER_HD std::uint32_t state_quotient(std::uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __umulhi(x, 1u << (32 - ans::kAnsProbabilityBits));
#else
  return x >> ans::kAnsProbabilityBits;
#endif
}

struct StreamReader {
  const uint4* next_chunk;
  const uint4* end_chunk;
  std::uint64_t ahead0;        // the next 4 words of the stream after the window (loaded ahead; 0 past the end)
  std::uint64_t ahead1;        // the 4 after those
  std::uint64_t low;           // window words 0..3 (word 0 in the low 16 bits)
  std::uint64_t high;          // window words 4..7
  std::uint32_t pos;           // bit position of the next unread word in low:high, 0..128
  std::uint32_t ahead_halves;  // how many of ahead0, ahead1 hold stream words, 0..2
  std::uint32_t phantom_bits;  // zero bits at the end of the window that lie past the stream: 0, 64 or 128
  std::uint32_t state[ans::kAnsStatesPerStream];  // one per quad position
  bool corrupt;

  // A reader with no stream (a lane without work): every state rests at 2^16
  // and, with neutral tables, never reads a word.
  QUANTEM_ANS_READER_HD void open_empty() {
    next_chunk = end_chunk = nullptr;
    ahead0 = ahead1 = low = high = 0;
    pos = 0;
    ahead_halves = 0;
    phantom_bits = 128;
    for (std::uint32_t k = 0; k < ans::kAnsStatesPerStream; ++k) state[k] = ans::kAnsStateLower;
    corrupt = false;
  }

  // data: the group's stream data; offsets: its stream offsets.
  QUANTEM_ANS_READER_HD void open(const std::uint8_t* data, const std::uint32_t* offsets, std::uint32_t stream,
                                  std::uint32_t stream_count, std::uint64_t data_bytes) {
    const std::uint64_t begin = QUANTEM_ANS_READER_LOAD(offsets + stream);
    const std::uint64_t finish = stream + 1 < stream_count ? QUANTEM_ANS_READER_LOAD(offsets + stream + 1) : data_bytes;
    open_empty();
    corrupt = begin >= finish || finish > data_bytes || begin % ans::kAnsStreamAlignment != 0 ||
              finish % ans::kAnsStreamAlignment != 0;
    pos = 128;
    phantom_bits = 0;
    next_chunk = end_chunk = reinterpret_cast<const uint4*>(data);
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

  // Loads the next 16-byte chunk into ahead0:ahead1 (both used up).
  QUANTEM_ANS_READER_HD void prefetch() {
    if (next_chunk < end_chunk) {
      const uint4 chunk = QUANTEM_ANS_READER_LOAD(next_chunk);
      ++next_chunk;
      ahead0 = chunk.x | (std::uint64_t{chunk.y} << 32);
      ahead1 = chunk.z | (std::uint64_t{chunk.w} << 32);
      ahead_halves = 2;
    }
  }

  // Slides the window by 4 words: low = high, high = the next 4 words of the
  // stream (zeros past its end).
  QUANTEM_ANS_READER_HD void slide() {
    low = high;
    high = ahead0;  // 0 when nothing is ahead
    ahead0 = ahead1;
    ahead1 = 0;
    phantom_bits = ahead_halves != 0 ? phantom_bits : (phantom_bits >= 64 ? 128u : phantom_bits + 64);
    ahead_halves = ahead_halves != 0 ? ahead_halves - 1 : 0u;
    pos -= 64;
    if (ahead_halves == 0) prefetch();
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

  // The frame's 4 table entries: independent lookups, issued together.
  // table: the decode tables (build_decode_tables); class_offset[k]: where
  // position k's class table starts in it, a multiple of the scale (the
  // neutral entry for an absent position), so the index is one OR.
  QUANTEM_ANS_READER_HD void lookup(const std::uint32_t* table, const std::uint32_t class_offset[4],
                                    std::uint32_t entry[4]) const {
    QUANTEM_ANS_READER_UNROLL
    for (int k = 0; k < 4; ++k) entry[k] = table[(state[k] & (ans::kAnsProbabilityScale - 1)) | class_offset[k]];
  }

  // True when the frame is plain: no escape among its entries (raw bits are
  // the caller's warp-uniform promise, see decode_frame).
  QUANTEM_ANS_READER_HD static bool plain(const std::uint32_t entry[4]) {
    return ((entry[0] | entry[1] | entry[2] | entry[3]) & kEntryEscapeFlag) == 0;
  }

  // Decodes one frame of the quad: values[k] for every position k (0 for
  // absent ones, whose table is the neutral one; see lookup). shift[k] is position k's
  // class shift (0 for absent ones). `raw_bits` false promises every shift is
  // 0; pass the same value on every lane of a warp so the choice never
  // diverges. Call top_up() before each frame.
  QUANTEM_ANS_READER_HD void decode_frame(const std::uint32_t* table, const std::uint32_t class_offset[4],
                                          const std::uint32_t shift[4], bool raw_bits, std::uint32_t values[4]) {
    std::uint32_t entry[4];
    lookup(table, class_offset, entry);
    if (!raw_bits && plain(entry)) {
      decode_plain(entry);
      QUANTEM_ANS_READER_UNROLL
      for (int k = 0; k < 4; ++k) values[k] = entry_symbol(entry[k]);
      return;
    }
    decode_checked(entry, shift, values);
  }

  // Any frame: raw bits and escapes, each word read checked.
  QUANTEM_ANS_READER_HD void decode_checked(const std::uint32_t entry[4], const std::uint32_t shift[4],
                                            std::uint32_t values[4]) {
    QUANTEM_ANS_READER_UNROLL
    for (int k = 0; k < 4; ++k) {
      std::uint32_t& x = state[k];
      x = (entry[k] >> kEntryFrequencyShift) * (x >> ans::kAnsProbabilityBits) + (entry[k] & kEntryBiasMask);
      renormalize(x);
      const std::uint32_t symbol = entry_symbol(entry[k]);  // an unused class's zero entries end in a wrong final state
      if (symbol >= ans::kAnsEscape16) {
        values[k] = read_escaped(x, symbol);
      } else {  // shift 0: masks no bits, leaves x >= 2^16 (no word read)
        values[k] = (symbol << shift[k]) | read_bits(x, shift[k]);
      }
    }
  }

  // The common case, plain symbols (no raw bits, no escapes): at most one word
  // per symbol, so the 4 words after `pos` (top_up() keeps at least 5 unread,
  // pos < 64) serve the whole frame. Branch-free: v0:v1 are those 4 words, the
  // renormalisation of position k takes word `taken` (the count of earlier
  // ones that renormalised) with one byte permutation, and `pos` advances by
  // the words taken.
  QUANTEM_ANS_READER_HD void decode_plain(const std::uint32_t entry[4]) {
    const bool upper = pos >= 32;
    const std::uint32_t w0 = static_cast<std::uint32_t>(low);
    const std::uint32_t w1 = static_cast<std::uint32_t>(low >> 32);
    const std::uint32_t w2 = static_cast<std::uint32_t>(high);
    const std::uint32_t w3 = static_cast<std::uint32_t>(high >> 32);
    const std::uint32_t a = upper ? w1 : w0;
    const std::uint32_t b = upper ? w2 : w1;
    const std::uint32_t c = upper ? w3 : w2;
    const std::uint32_t v0 = funnel_right(a, b, pos);  // words 0, 1 after pos (pos is 0, 16, 32 or 48)
    const std::uint32_t v1 = funnel_right(b, c, pos);  // words 2, 3
    std::uint32_t taken = 0;
    QUANTEM_ANS_READER_UNROLL
    for (int k = 0; k < 4; ++k) {
      const std::uint32_t decoded =
          (entry[k] >> kEntryFrequencyShift) * state_quotient(state[k]) + (entry[k] & kEntryBiasMask);
      // (decoded << 16) | word `taken`: positions 0 and 1 find it in v0, 2 and 3 anywhere in v0:v1.
      const std::uint32_t renormalized =
          k < 2 ? byte_perm(v0, decoded, 0x5410u + 0x22u * taken)
                : byte_perm(byte_perm(v0, v1, 0x10u + 0x22u * taken), decoded, 0x5410u);
      const bool need = decoded < ans::kAnsStateLower;
      state[k] = need ? renormalized : decoded;
      taken += need ? 1u : 0u;
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
    // The last chunk's second half may still sit unread in ahead0: then it is padding.
    const bool rest_is_padding = ahead_halves == 0 || (ahead_halves == 1 && ahead0 == 0);
    return rest_is_padding && next_chunk == end_chunk;
  }
};

}  // namespace quantem::kernels::ans_device
