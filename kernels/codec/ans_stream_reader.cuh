#pragma once
// The per-thread reader of one ANS stream (format: quantem/ans/ans_format.hpp),
// device code under nvcc, plain inline C++ under the host compiler, so a CPU
// test runs the exact logic the kernels run.
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
#else
#include <vector_types.h>
#define QUANTEM_ANS_READER_HD inline
#define QUANTEM_ANS_READER_LOAD(pointer) (*(pointer))
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
  std::uint32_t state;
  bool corrupt;

  // blob: the group; offsets: its stream offsets; data: its stream data.
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
    state = ans::kAnsStateLower;
    if (corrupt) return;
    const uint4* chunk = reinterpret_cast<const uint4*>(data + begin);
    end_chunk = reinterpret_cast<const uint4*>(data + finish);
    const uint4 first = QUANTEM_ANS_READER_LOAD(chunk);
    state = first.x;
    low = first.y | (std::uint64_t{first.z} << 32);
    high = first.w;
    words_left = 6;
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

  // Once per frame: keep at least 5 words buffered while the stream has them.
  QUANTEM_ANS_READER_HD void top_up() {
    if (words_left <= 4 && halves_left != 0) append_half();
  }

  QUANTEM_ANS_READER_HD void renormalize() {
    const bool need = state < ans::kAnsStateLower;
    if (need && words_left == 0) {  // rare: escapes or raw bits drained the buffer
      if (halves_left == 0) {
        corrupt = true;
      } else {
        append_half();
      }
    }
    const std::uint32_t word = static_cast<std::uint32_t>(low) & 0xffffu;
    const std::uint64_t next_low = (low >> 16) | (high << 48);
    state = need ? ((state << 16) | word) : state;
    low = need ? next_low : low;
    high = need ? (high >> 16) : high;
    words_left -= (need && words_left != 0) ? 1u : 0u;
  }

  // entry = symbol | frequency << 8 | (slot - cdf) << 19 (see build_decode_tables).
  QUANTEM_ANS_READER_HD std::uint32_t decode_symbol(const std::uint32_t* class_table) {
    const std::uint32_t slot = state & (ans::kAnsProbabilityScale - 1);
    const std::uint32_t entry = class_table[slot];
    state = ((entry >> 8) & 0x7ffu) * (state >> ans::kAnsProbabilityBits) + (entry >> 19);
    renormalize();
    return entry & 0xffu;  // an unused class's zero entries end in a wrong final state
  }

  QUANTEM_ANS_READER_HD std::uint32_t read_bits(std::uint32_t count) {
    const std::uint32_t bits = state & ((1u << count) - 1u);
    state >>= count;
    renormalize();
    return bits;
  }

  // One value of a pixel whose class has decode table `class_table` and shift `shift`.
  QUANTEM_ANS_READER_HD std::uint32_t decode_value(const std::uint32_t* class_table, std::uint32_t shift) {
    const std::uint32_t symbol = decode_symbol(class_table);
    if (symbol < ans::kAnsEscape16) return shift == 0 ? symbol : (symbol << shift) | read_bits(shift);
    const std::uint32_t low_half = read_bits(16);
    if (symbol == ans::kAnsEscape16) return low_half;
    return low_half | (read_bits(16) << 16);
  }

  // True when the stream decoded exactly: the final state is the encoder's
  // initial state and only zero padding is left unread.
  QUANTEM_ANS_READER_HD bool finished_cleanly() const {
    // The last chunk's second half may still sit unread in `upcoming`: then it is padding.
    const bool rest_is_padding = halves_left == 0 || (halves_left == 1 && upcoming.z == 0 && upcoming.w == 0);
    return !corrupt && state == ans::kAnsStateLower && rest_is_padding && next_chunk == end_chunk && low == 0 &&
           high == 0;
  }
};

}  // namespace quantem::kernels::ans_device
