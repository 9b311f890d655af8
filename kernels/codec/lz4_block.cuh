#pragma once
// LZ4 raw block decoding (lz4_Block_format.md), written once for the host and
// the device: the control flow lives here, the byte movement in an Io policy.
//
// The policy provides
//   std::uint32_t read(std::uint32_t input_position)             // one input byte
//   void copy_literals(std::uint32_t input_position, std::uint32_t output_position, std::uint32_t count)
//   void copy_match(std::uint32_t output_position, std::uint32_t offset, std::uint32_t count)
// and is only ever called with positions inside [0, input_bytes) and
// [0, output_bytes): every bound is checked here, before the call.
//
// Acceptance follows liblz4's LZ4_decompress_safe (1.9.x) for full blocks:
//  - a literal run that ends within the last 12 output bytes (MFLIMIT) or
//    within the last 8 input bytes must be the last sequence, consuming the
//    input exactly;
//  - a match must end at least 5 bytes (LASTLITERALS) before the block end;
//  - a match offset must be 1..output position. liblz4 accepts offset 0 in
//    some positions (it then copies undefined bytes); we always reject it.
//  - the block must decode to exactly output_bytes (bitshuffle's own check).
#include <cstdint>

#include "quantem/core/host_device.hpp"

namespace quantem::kernels::device {

enum class Lz4Result : std::uint32_t { ok = 0, corrupt = 1, wrong_size = 2 };

inline constexpr std::uint32_t kLz4MinMatch = 4;
inline constexpr std::uint32_t kLz4LastLiterals = 5;
inline constexpr std::uint32_t kLz4MatchFindLimit = 12;

// Positions and counts stay far below 2^32 (input and output of at most
// kMaxLz4BlockBytes, checked first; a length extension stops at
// output_bytes + 255), so the control flow is in 32-bit arithmetic: half the
// instructions of 64-bit on the GPU.
inline constexpr std::uint32_t kMaxLz4BlockBytes = std::uint32_t{1} << 24;

template <class Io>
QUANTEM_HOST_DEVICE Lz4Result lz4_decode_block(Io& io, std::uint32_t input_bytes,
                                               std::uint32_t output_bytes) {
  if (input_bytes > kMaxLz4BlockBytes || output_bytes > kMaxLz4BlockBytes) return Lz4Result::corrupt;
  const std::uint32_t input_end = input_bytes;
  const std::uint32_t output_end = output_bytes;
  std::uint32_t input_position = 0;
  std::uint32_t output_position = 0;
  for (;;) {
    if (input_position >= input_end) return Lz4Result::corrupt;
    const std::uint32_t token = io.read(input_position++);
    std::uint32_t literal_count = token >> 4;
    if (literal_count == 15) {
      std::uint32_t extension = 255;
      while (extension == 255) {
        if (input_position >= input_end) return Lz4Result::corrupt;
        extension = io.read(input_position++);
        literal_count += extension;
        if (literal_count > output_bytes) return Lz4Result::corrupt;
      }
    }
    const std::uint32_t literals_end_output = output_position + literal_count;
    const std::uint32_t literals_end_input = input_position + literal_count;
    if (literals_end_output + kLz4MatchFindLimit > output_end ||
        literals_end_input + 2 + 1 + kLz4LastLiterals > input_end) {
      // Only the last sequence may get this close to either end.
      if (literals_end_input != input_end || literals_end_output > output_end) return Lz4Result::corrupt;
      io.copy_literals(input_position, output_position, literal_count);
      output_position += literal_count;
      break;
    }
    io.copy_literals(input_position, output_position, literal_count);
    input_position += literal_count;
    output_position += literal_count;

    // At least 8 input bytes remain (checked above): the offset is in bounds.
    const std::uint32_t offset = io.read(input_position) | (io.read(input_position + 1) << 8);
    input_position += 2;
    std::uint32_t match_count = token & 15u;
    if (match_count == 15) {
      std::uint32_t extension = 255;
      while (extension == 255) {
        if (input_position + kLz4LastLiterals >= input_end) return Lz4Result::corrupt;
        extension = io.read(input_position++);
        match_count += extension;
        if (match_count > output_bytes) return Lz4Result::corrupt;
      }
    }
    match_count += kLz4MinMatch;
    if (offset == 0 || offset > output_position) return Lz4Result::corrupt;
    if (output_position + match_count + kLz4LastLiterals > output_end) return Lz4Result::corrupt;
    io.copy_match(output_position, offset, match_count);
    output_position += match_count;
  }
  return output_position == output_bytes ? Lz4Result::ok : Lz4Result::wrong_size;
}

// Host policy: plain byte loops (used by the CPU test of the shared control flow).
struct HostLz4Io {
  const std::uint8_t* input;
  std::uint8_t* output;
  std::uint32_t read(std::uint32_t position) const { return input[position]; }
  void copy_literals(std::uint32_t input_position, std::uint32_t output_position, std::uint32_t count) {
    for (std::uint32_t i = 0; i < count; ++i) output[output_position + i] = input[input_position + i];
  }
  void copy_match(std::uint32_t output_position, std::uint32_t offset, std::uint32_t count) {
    for (std::uint32_t i = 0; i < count; ++i) output[output_position + i] = output[output_position - offset + i];
  }
};

#if defined(__CUDACC__)
// Copies a match inside the shared-memory output (16-byte aligned) with the 32 lanes of a warp.
__device__ inline void warp_copy_match(std::uint8_t* output, std::uint32_t lane, std::uint32_t output_position,
                                       std::uint32_t offset, std::uint32_t count) {
  const std::uint32_t source = output_position - offset;
  if (offset >= count) {
    for (std::uint32_t i = lane; i < count; i += 32) output[output_position + i] = output[source + i];
  } else if ((offset & (offset - 1)) == 0 && offset <= 4) {
    // A period of 1, 2 or 4 bytes (the runs of zero bit-planes: mostly 2)
    // divides 16: every aligned 16-byte piece is the same repeated word. Bytes
    // up to the first aligned piece, the pieces, the bytes after the last.
    const std::uint32_t period_mask = offset - 1;
    const std::uint32_t head = min(count, (16u - output_position % 16u) % 16u);
    const std::uint32_t pieces = (count - head) / 16u;
    const std::uint32_t tail = head + 16u * pieces;
    std::uint32_t word = 0;
#pragma unroll
    for (std::uint32_t b = 0; b < 4; ++b) word |= std::uint32_t{output[source + ((head + b) & period_mask)]} << (8 * b);
    if (lane < head) output[output_position + lane] = output[source + (lane & period_mask)];
    uint4* aligned = reinterpret_cast<uint4*>(output + output_position + head);
    for (std::uint32_t piece = lane; piece < pieces; piece += 32) aligned[piece] = make_uint4(word, word, word, word);
    for (std::uint32_t i = tail + lane; i < count; i += 32) output[output_position + i] = output[source + (i & period_mask)];
  } else {
    std::uint32_t phase = lane % offset;       // i % offset, advanced incrementally
    const std::uint32_t step = 32u % offset;
    for (std::uint32_t i = lane; i < count; i += 32) {
      output[output_position + i] = output[source + phase];
      phase += step;
      if (phase >= offset) phase -= offset;
    }
  }
  __syncwarp();
}

// Device policy: one warp decodes one block into shared memory. Every lane runs
// the same control flow on the same (broadcast) input bytes; the copies are
// split across the 32 lanes. An overlapping match (offset < count) repeats the
// `offset` bytes before the output position: out[p + i] = out[p - offset + i % offset],
// which reads only bytes written before this call, so all lanes copy at once.
struct WarpLz4Io {
  const std::uint8_t* input;  // global memory
  std::uint8_t* output;       // shared memory
  std::uint32_t lane;

  __device__ std::uint32_t read(std::uint32_t position) const { return __ldg(input + position); }

  __device__ void copy_literals(std::uint32_t input_position, std::uint32_t output_position,
                                std::uint32_t count) {
    for (std::uint32_t i = lane; i < count; i += 32) output[output_position + i] = __ldg(input + input_position + i);
    __syncwarp();
  }

  __device__ void copy_match(std::uint32_t output_position, std::uint32_t offset, std::uint32_t count) {
    warp_copy_match(output, lane, output_position, offset, count);
  }
};

// One LZ4 sequence as lz4_decode_block asks for it: copy literal_count
// literals from literal_input, then match_count bytes from match_offset back
// (match_count 0: the block's last literals). Every field fits 16 bits in a
// block of at most 8 KiB (kMaxBitshuffleBlockBytes).
struct Lz4Sequence {
  std::uint16_t literal_input;
  std::uint16_t literal_count;
  std::uint16_t match_offset;
  std::uint16_t match_count;
};

// Device policy for one lane alone: parses a block from global memory with
// lz4_decode_block's checks and records its sequences instead of copying;
// a warp then replays them (replay_lz4_sequences). A block of n input bytes
// has at most n / 3 + 1 sequences (each but the last reads a token and a
// two-byte offset).
struct RecordingLz4Io {
  const std::uint8_t* input;  // global memory
  Lz4Sequence* sequences;     // global memory, room for n / 3 + 1
  std::uint32_t count = 0;
  Lz4Sequence pending{};

  __device__ std::uint32_t read(std::uint32_t position) const { return __ldg(input + position); }
  __device__ void copy_literals(std::uint32_t input_position, std::uint32_t, std::uint32_t literals) {
    pending.literal_input = static_cast<std::uint16_t>(input_position);
    pending.literal_count = static_cast<std::uint16_t>(literals);
  }
  __device__ void copy_match(std::uint32_t, std::uint32_t offset, std::uint32_t match) {
    pending.match_offset = static_cast<std::uint16_t>(offset);
    pending.match_count = static_cast<std::uint16_t>(match);
    sequences[count++] = pending;
  }
  // After lz4_decode_block returned ok: the last literals.
  __device__ void finish() {
    pending.match_offset = 0;
    pending.match_count = 0;
    sequences[count++] = pending;
  }
};

// A warp writes a block recorded by RecordingLz4Io into the shared-memory
// output: 32 sequences per coalesced load, each broadcast by shuffles; the
// literals come from the block's input in global memory (just read by the
// recording lane: cached). The copies are lz4_decode_block's, in its order.
__device__ inline void replay_lz4_sequences(const Lz4Sequence* sequences, std::uint32_t count,
                                            const std::uint8_t* input, std::uint8_t* output, std::uint32_t lane) {
  std::uint32_t output_position = 0;
  for (std::uint32_t first = 0; first < count; first += 32) {
    uint2 mine = make_uint2(0, 0);
    if (first + lane < count) mine = *reinterpret_cast<const uint2*>(sequences + first + lane);
    const std::uint32_t in_this = min(32u, count - first);
    for (std::uint32_t k = 0; k < in_this; ++k) {
      const std::uint32_t literals = __shfl_sync(0xffffffffu, mine.x, k);  // input | count << 16
      const std::uint32_t match = __shfl_sync(0xffffffffu, mine.y, k);     // offset | count << 16
      const std::uint32_t literal_input = literals & 0xffffu, literal_count = literals >> 16;
      for (std::uint32_t i = lane; i < literal_count; i += 32)
        output[output_position + i] = __ldg(input + literal_input + i);
      __syncwarp();
      output_position += literal_count;
      const std::uint32_t match_count = match >> 16;
      if (match_count != 0) {
        warp_copy_match(output, lane, output_position, match & 0xffffu, match_count);
        output_position += match_count;
      }
    }
  }
}

// The same, with the literals of 32 sequences at a time copied at once: a
// warp scan of the sequences' output lengths places each; each lane copies its
// own sequence's literals (runs longer than 16 bytes by the whole warp, one
// after another); then the matches, in order — a match reads only output
// before it, which is then complete.
__device__ inline void replay_lz4_sequences_batched(const Lz4Sequence* sequences, std::uint32_t count,
                                                    const std::uint8_t* input, std::uint8_t* output,
                                                    std::uint32_t lane) {
  constexpr std::uint32_t kAll = 0xffffffffu;
  constexpr std::uint32_t kShortLiterals = 16;
  std::uint32_t base = 0;
  for (std::uint32_t first = 0; first < count; first += 32) {
    uint2 mine = make_uint2(0, 0);  // lanes past the end: no literals, no match
    if (first + lane < count) mine = *reinterpret_cast<const uint2*>(sequences + first + lane);
    const std::uint32_t literal_input = mine.x & 0xffffu, literal_count = mine.x >> 16;
    const std::uint32_t match_offset = mine.y & 0xffffu, match_count = mine.y >> 16;
    std::uint32_t end = literal_count + match_count;  // inclusive scan: where this sequence ends
#pragma unroll
    for (std::uint32_t d = 1; d < 32; d <<= 1) {
      const std::uint32_t before = __shfl_up_sync(kAll, end, d);
      if (lane >= d) end += before;
    }
    const std::uint32_t start = base + end - (literal_count + match_count);
    if (literal_count <= kShortLiterals) {
      for (std::uint32_t i = 0; i < literal_count; ++i) output[start + i] = __ldg(input + literal_input + i);
    }
    for (std::uint32_t runs = __ballot_sync(kAll, literal_count > kShortLiterals); runs != 0; runs &= runs - 1) {
      const int k = __ffs(static_cast<int>(runs)) - 1;
      const std::uint32_t at = __shfl_sync(kAll, start, k);
      const std::uint32_t from = __shfl_sync(kAll, literal_input, k);
      const std::uint32_t n = __shfl_sync(kAll, literal_count, k);
      for (std::uint32_t i = lane; i < n; i += 32) output[at + i] = __ldg(input + from + i);
    }
    __syncwarp();
    for (std::uint32_t matches = __ballot_sync(kAll, match_count != 0); matches != 0; matches &= matches - 1) {
      const int k = __ffs(static_cast<int>(matches)) - 1;
      warp_copy_match(output, lane, __shfl_sync(kAll, start + literal_count, k), __shfl_sync(kAll, match_offset, k),
                      __shfl_sync(kAll, match_count, k));
    }
    base += __shfl_sync(kAll, end, 31);
  }
}
#endif

}  // namespace quantem::kernels::device
