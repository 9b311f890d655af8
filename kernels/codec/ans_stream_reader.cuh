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
// stream in two 64-bit registers (low, high) and a bit position `pos` of the
// next unread word in it, plus the 4 words after the window (`ahead`), loaded
// one slide early so that no read waits for memory. A warp holds 32
// independent streams, so anything a lane does alone costs the whole warp:
// consuming a word only advances `pos`, and top_up() slides the window by
// 4 words (low = high, high = ahead, ahead = the next 4) once per frame,
// branch-free (predicated), whenever pos >= 64: then at least 4 unread words
// are in view, enough for the 4 symbols of a plain frame. Plain frames (no raw
// bits, no escapes) decode branch-free from that 4-word view; raw bits and
// escapes take a checked path that may slide the window mid-frame. Reads never
// leave the stream: past its end the window holds copies of its last words,
// which a valid stream never consumes; a stream that consumed more words than
// it has, left non-zero words unread, or did not end in its initial states is
// reported (never faults).
#include <vector_types.h>

#include <cstdint>

#include "quantem/ans/ans_format.hpp"
#include "quantem/core/host_device.hpp"

// On the device: loads through the read-only data cache, unrolled loops. On
// the host (the host compiler, or nvcc's host pass): plain loads and loops.
#if defined(__CUDA_ARCH__)
#define QUANTEM_ANS_READER_LOAD(pointer) __ldg(pointer)
#define QUANTEM_ANS_READER_UNROLL _Pragma("unroll")
#else
#define QUANTEM_ANS_READER_LOAD(pointer) (*(pointer))
#define QUANTEM_ANS_READER_UNROLL
#endif

namespace quantem::kernels::device::ans_device {

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

QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE constexpr std::uint32_t make_decode_entry(std::uint32_t symbol, std::uint32_t frequency,
                                                                std::uint32_t bias) {
  return bias | (symbol << kEntrySymbolShift) | (symbol >= ans::kAnsEscape16 ? kEntryEscapeFlag : 0u) |
         (frequency << kEntryFrequencyShift);
}

QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE constexpr std::uint32_t entry_symbol(std::uint32_t entry) {
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
QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE std::uint32_t byte_perm(std::uint32_t a, std::uint32_t b, std::uint32_t selector) {
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

QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE std::uint32_t funnel_right(std::uint32_t lo, std::uint32_t hi, std::uint32_t shift) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, shift);
#else
  return static_cast<std::uint32_t>(((std::uint64_t{hi} << 32) | lo) >> (shift & 31u));
#endif
}

// x >> kAnsProbabilityBits as the high half of a product, so that it issues
// on the multiply pipe instead of the busier integer pipe.
QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE std::uint32_t state_quotient(std::uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __umulhi(x, 1u << (32 - ans::kAnsProbabilityBits));
#else
  return x >> ans::kAnsProbabilityBits;
#endif
}

struct StreamReader {
  const std::uint64_t* words;  // the stream's words after its 16-byte state header, 4 per uint64
  std::uint32_t quads;         // how many uint64 of words the stream has (a multiple of 2)
  std::uint32_t last_quad;     // the last one that may be loaded (the state header when quads == 0)
  std::uint32_t window;        // the uint64 index of `low` in the stream
  std::uint64_t low;           // window words 0..3 (word 0 in the low 16 bits)
  std::uint64_t high;          // window words 4..7
  std::uint64_t ahead;         // the 4 words after the window
  std::uint32_t pos;           // bit position of the next unread word in low:high, 0..128
  std::uint32_t state[ans::kAnsStatesPerStream];  // one per quad position
  bool corrupt;

  // A reader with no stream (a lane without work): every state rests at 2^16
  // and, with neutral tables, never reads a word (it must never slide: `words`
  // is null).
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE void open_empty() {
    words = nullptr;
    quads = last_quad = window = 0;
    low = high = ahead = 0;
    pos = 0;
    for (std::uint32_t k = 0; k < ans::kAnsStatesPerStream; ++k) state[k] = ans::kAnsStateLower;
    corrupt = false;
  }

  // data: the group's stream data; offsets: its stream offsets.
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE void open(const std::uint8_t* data, const std::uint32_t* offsets, std::uint32_t stream,
                                  std::uint32_t stream_count, std::uint64_t data_bytes) {
    const std::uint64_t begin = QUANTEM_ANS_READER_LOAD(offsets + stream);
    const std::uint64_t finish = stream + 1 < stream_count ? QUANTEM_ANS_READER_LOAD(offsets + stream + 1) : data_bytes;
    open_empty();
    corrupt = begin >= finish || finish > data_bytes || begin % ans::kAnsStreamAlignment != 0 ||
              finish % ans::kAnsStreamAlignment != 0;
    if (corrupt) {
      // Decoding goes on (garbage, reported at the end) and slides the window:
      // its loads read the first 8 bytes of the offsets (16-byte aligned, at
      // least 16 bytes), never a stray address.
      words = reinterpret_cast<const std::uint64_t*>(offsets);
      return;
    }
    const uint4 states = QUANTEM_ANS_READER_LOAD(reinterpret_cast<const uint4*>(data + begin));
    state[0] = states.x;
    state[1] = states.y;
    state[2] = states.z;
    state[3] = states.w;
    quads = static_cast<std::uint32_t>((finish - begin - ans::kAnsStreamHeaderBytes) / 8);
    // With no words, loads read the state header: valid memory, never consumed.
    words = reinterpret_cast<const std::uint64_t*>(data + begin + (quads != 0 ? ans::kAnsStreamHeaderBytes : 0));
    last_quad = quads != 0 ? quads - 1 : 0;
    low = load_quad(0);
    high = load_quad(1);
    ahead = load_quad(2);
  }

  // The index of the next unread 16-bit word (after the state header).
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE std::uint32_t word_index() const { return 4 * window + pos / 16; }

  // After open(): continues as if the stream had been decoded up to the point
  // where its states were `states` and its next unread word `word`
  // (ans_record_seek_points). A word past the stream's end marks it corrupt.
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE void seek(const std::uint32_t states[ans::kAnsStatesPerStream], std::uint32_t word) {
    if (words == nullptr) return;  // an empty reader stays empty
    if (word > 4 * quads) corrupt = true;
    for (std::uint32_t k = 0; k < ans::kAnsStatesPerStream; ++k) state[k] = states[k];
    window = word / 4;
    pos = 16 * (word % 4);
    low = load_quad(window);
    high = load_quad(window + 1);
    ahead = load_quad(window + 2);
  }

  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE std::uint64_t load_quad(std::uint32_t index) const {
    return QUANTEM_ANS_READER_LOAD(words + (index < last_quad ? index : last_quad));
  }

  // Slides the window by 4 words: low = high, high = ahead, ahead = the next 4.
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE void slide() {
    low = high;
    high = ahead;
    ahead = load_quad(window + 3);
    ++window;
    pos -= 64;
  }

  // Before each frame: pos < 64, so at least 4 unread words are in view. The
  // slide is predicated, not branched on: lanes slide in different frames.
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE void top_up() {
    const bool move = pos >= 64;
    low = move ? high : low;
    high = move ? ahead : high;
    if (move) ahead = load_quad(window + 3);
    window += move ? 1u : 0u;
    pos -= move ? 64u : 0u;
  }

  // The next unread word; slides the window when it is used up (checked path).
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE std::uint32_t peek_word() {
    if (pos >= 128) slide();
    return static_cast<std::uint32_t>((pos < 64 ? (low >> pos) : (high >> (pos - 64))) & 0xffffu);
  }

  // x < 2^16 -> x = (x << 16) | next word (checked path).
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE void renormalize(std::uint32_t& x) {
    if (x < ans::kAnsStateLower) {
      x = (x << 16) | peek_word();
      pos += 16;
    }
  }

  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE std::uint32_t read_bits(std::uint32_t& x, std::uint32_t count) {
    const std::uint32_t bits = x & ((1u << count) - 1u);
    x >>= count;
    renormalize(x);
    return bits;
  }

  // The value behind an escape symbol (254: 16 raw bits, 255: 32 raw bits).
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE std::uint32_t read_escaped(std::uint32_t& x, std::uint32_t symbol) {
    const std::uint32_t low_half = read_bits(x, 16);
    if (symbol == ans::kAnsEscape16) return low_half;
    return low_half | (read_bits(x, 16) << 16);
  }

  // The frame's 4 table entries: independent lookups, issued together.
  // table: the decode tables (build_decode_tables); class_offset[k]: where
  // position k's class table starts in it, a multiple of the scale (the
  // neutral entry for an absent position), so the index is one OR.
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE void lookup(const std::uint32_t* table, const std::uint32_t class_offset[4],
                                    std::uint32_t entry[4]) const {
    QUANTEM_ANS_READER_UNROLL
    for (int k = 0; k < 4; ++k) entry[k] = table[(state[k] & (ans::kAnsProbabilityScale - 1)) | class_offset[k]];
  }

  // True when the frame is plain: no escape among its entries (raw bits are
  // the caller's warp-uniform promise, see decode_frame).
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE static bool plain(const std::uint32_t entry[4]) {
    return ((entry[0] | entry[1] | entry[2] | entry[3]) & kEntryEscapeFlag) == 0;
  }

  // Decodes one frame of the quad: values[k] for every position k (0 for
  // absent ones, whose table is the neutral one; see lookup). shift[k] is position k's
  // class shift (0 for absent ones). `raw_bits` false promises every shift is
  // 0; pass the same value on every lane of a warp so the choice never
  // diverges. Call top_up() before each frame.
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE void decode_frame(const std::uint32_t* table, const std::uint32_t class_offset[4],
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
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE void decode_checked(const std::uint32_t entry[4], const std::uint32_t shift[4],
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
    if (pos >= 128) slide();  // so that one slide in top_up() brings pos below 64
  }

  // The common case, plain symbols (no raw bits, no escapes): at most one word
  // per symbol, so the 4 words after `pos` (top_up() keeps at least 5 unread,
  // pos < 64) serve the whole frame. Branch-free: v0:v1 are those 4 words, the
  // renormalisation of position k takes word `taken` (the count of earlier
  // ones that renormalised) with one byte permutation, and `pos` advances by
  // the words taken.
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE void decode_plain(const std::uint32_t entry[4]) {
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
  // initial state, no word past the stream end was consumed, and what is left
  // unread is the zero padding to 16 bytes (fewer than 8 words).
  QUANTEM_HOST_DEVICE QUANTEM_FORCE_INLINE bool finished_cleanly() const {
    bool states_final = true;
    for (std::uint32_t k = 0; k < ans::kAnsStatesPerStream; ++k) states_final = states_final && state[k] == ans::kAnsStateLower;
    const std::uint32_t consumed = 4 * window + pos / 16;
    const std::uint32_t total = 4 * quads;
    if (corrupt || !states_final || consumed > total || total - consumed >= 8) return false;
    const std::uint16_t* stream_words = reinterpret_cast<const std::uint16_t*>(words);
    for (std::uint32_t w = consumed; w < total; ++w)
      if (QUANTEM_ANS_READER_LOAD(stream_words + w) != 0) return false;
    return true;
  }
};

}  // namespace quantem::kernels::device::ans_device
