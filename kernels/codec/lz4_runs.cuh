#pragma once
// Warp building blocks of the bitshuffle/LZ4 encoder
// (kernels/codec/bitshuffle_lz4_encode.cu): the forward bit-shuffle of one
// block into shared memory, the marks of where runs of one byte start, and an
// LZ4 block writer that codes those runs as matches of offset 1.
//
// Every function is called by all 32 lanes of a warp with the same arguments
// (warp-uniform control flow); lane = threadIdx.x % 32.
#include <cstdint>

#include "bitshuffle.cuh"

namespace quantem::kernels::device::lz4_runs {

// LZ4 block format limits (lz4_Block_format.md): a match is at least 4 bytes,
// the last 5 bytes of a block are literals, and the last match starts at
// least 12 bytes before the end of the block.
inline constexpr std::uint32_t kMinMatch = 4;
inline constexpr std::uint32_t kLastLiterals = 5;
inline constexpr std::uint32_t kMatchStartLimit = 12;
// A run worth a sequence: one literal, then a match of kMinMatch copies of it.
inline constexpr std::uint32_t kMinRun = 1 + kMinMatch;

// LZ4's worst case for `bytes` input bytes (LZ4_COMPRESSBOUND).
__host__ __device__ constexpr std::uint32_t lz4_bound(std::uint32_t bytes) { return bytes + bytes / 255 + 16; }

// Bit-shuffles `count` elements (a multiple of 8) of `in` (global memory)
// into `out` (shared memory, 4-byte aligned): plane p is bytes
// [p * count / 8, (p + 1) * count / 8), and bit k of its little-endian word w
// is bit p of element 32w + k (kiyo-masui/bitshuffle's layout, the inverse of
// bitunshuffle_block_warp). When count is a multiple of 32 a ballot per plane
// builds each word; otherwise each lane builds whole plane bytes.
template <int kElementBytes>
__device__ void bitshuffle_block_warp(const typename ElementType<kElementBytes>::type* in, std::uint32_t count,
                                      std::uint8_t* out, std::uint32_t lane) {
  constexpr std::uint32_t kBits = 8 * kElementBytes;
  if (count % 32 == 0) {
    const std::uint32_t words = count / 32;
    auto* planes = reinterpret_cast<std::uint32_t*>(out);
    for (std::uint32_t w = 0; w < words; ++w) {
      const std::uint32_t value = in[32 * w + lane];
      std::uint32_t mine = 0;
#pragma unroll
      for (std::uint32_t plane = 0; plane < kBits; ++plane) {
        const std::uint32_t word = __ballot_sync(0xffffffffu, ((value >> plane) & 1u) != 0);
        if (lane == plane) mine = word;
      }
      if (lane < kBits) planes[lane * words + w] = mine;
    }
    return;
  }
  const std::uint32_t plane_bytes = count / 8;
  for (std::uint32_t j = lane; j < kBits * plane_bytes; j += 32) {
    const std::uint32_t plane = j / plane_bytes;
    const std::uint32_t first = 8 * (j % plane_bytes);
    std::uint32_t byte = 0;
#pragma unroll
    for (std::uint32_t i = 0; i < 8; ++i) byte |= ((static_cast<std::uint32_t>(in[first + i]) >> plane) & 1u) << i;
    out[j] = static_cast<std::uint8_t>(byte);
  }
}

// Marks, one bit per byte of in[0, bytes) (bit i % 32 of word i / 32):
// boundaries: i starts a run of one byte value (i == 0 or in[i] != in[i - 1]);
// run_starts: a boundary whose run is at least kMinRun bytes long.
__device__ inline void mark_byte_runs(const std::uint8_t* in, std::uint32_t bytes, std::uint32_t* boundaries,
                                      std::uint32_t* run_starts, std::uint32_t lane) {
  const std::uint32_t words = (bytes + 31) / 32;
  for (std::uint32_t w = 0; w < words; ++w) {
    const std::uint32_t i = 32 * w + lane;
    bool boundary = false;
    bool long_run = false;
    if (i < bytes) {
      const std::uint8_t value = in[i];
      boundary = i == 0 || in[i - 1] != value;
      if (boundary && i + kMinRun <= bytes) {
        long_run = in[i + 1] == value && in[i + 2] == value && in[i + 3] == value && in[i + 4] == value;
      }
    }
    const std::uint32_t boundary_word = __ballot_sync(0xffffffffu, boundary);
    const std::uint32_t run_word = __ballot_sync(0xffffffffu, long_run);
    if (lane == 0) {
      boundaries[w] = boundary_word;
      run_starts[w] = run_word;
    }
  }
}

// The first marked position at or after `from` (words: word_count mark words), or `none`.
__device__ inline std::uint32_t next_marked(const std::uint32_t* words, std::uint32_t word_count, std::uint32_t from,
                                            std::uint32_t none) {
  std::uint32_t w = from / 32;
  if (w >= word_count) return none;
  std::uint32_t bits = words[w] & (0xffffffffu << (from % 32));
  while (bits == 0) {
    if (++w >= word_count) return none;
    bits = words[w];
  }
  return 32 * w + static_cast<std::uint32_t>(__ffs(bits)) - 1;
}

// Writes the bytes that extend a length field of `extra` (length - 15): as
// many 255s as fit, then the remainder. Returns the next output position.
__device__ inline std::uint32_t write_length_bytes(std::uint8_t* out, std::uint32_t at, std::uint32_t extra,
                                                   std::uint32_t lane) {
  const std::uint32_t count = extra / 255 + 1;
  for (std::uint32_t j = lane; j < count; j += 32) {
    out[at + j] = static_cast<std::uint8_t>(j + 1 < count ? 255u : extra % 255u);
  }
  return at + count;
}

// One sequence: the literals in[literal_start, match_start), then (when
// match_bytes != 0) a match of offset 1 and match_bytes bytes. Returns the
// next output position.
__device__ inline std::uint32_t write_sequence(const std::uint8_t* in, std::uint32_t literal_start,
                                               std::uint32_t match_start, std::uint32_t match_bytes,
                                               std::uint8_t* out, std::uint32_t at, std::uint32_t lane) {
  const std::uint32_t literals = match_start - literal_start;
  const std::uint32_t match_code = match_bytes == 0 ? 0u : match_bytes - kMinMatch;
  if (lane == 0) out[at] = static_cast<std::uint8_t>((min(literals, 15u) << 4) | min(match_code, 15u));
  ++at;
  if (literals >= 15) at = write_length_bytes(out, at, literals - 15, lane);
  for (std::uint32_t j = lane; j < literals; j += 32) out[at + j] = in[literal_start + j];
  at += literals;
  if (match_bytes == 0) return at;
  if (lane == 0) {
    out[at] = 1;  // offset 1, little-endian
    out[at + 1] = 0;
  }
  at += 2;
  if (match_code >= 15) at = write_length_bytes(out, at, match_code - 15, lane);
  return at;
}

// The LZ4 block of in[0, bytes) (the marks of mark_byte_runs) at `out`: each
// run of at least kMinRun equal bytes that may start a match becomes its
// first byte as a literal and a match of offset 1 for the rest (cut so that
// the last kLastLiterals bytes stay literals), everything else literals.
// Returns the block's length (at most lz4_bound(bytes)).
__device__ inline std::uint32_t write_lz4_runs(const std::uint8_t* in, std::uint32_t bytes,
                                               const std::uint32_t* boundaries, const std::uint32_t* run_starts,
                                               std::uint8_t* out, std::uint32_t lane) {
  const std::uint32_t words = (bytes + 31) / 32;
  std::uint32_t at = 0;
  std::uint32_t literal_start = 0;
  std::uint32_t from = 0;
  while (bytes > kMatchStartLimit) {
    const std::uint32_t run = next_marked(run_starts, words, from, bytes);
    const std::uint32_t match_start = run + 1;
    if (run >= bytes || match_start + kMatchStartLimit > bytes) break;
    const std::uint32_t run_end = next_marked(boundaries, words, match_start, bytes);
    const std::uint32_t match_end = min(run_end, bytes - kLastLiterals);
    // A run cut by the last literals may be too short now; every later one is too.
    if (match_end < match_start + kMinMatch) break;
    at = write_sequence(in, literal_start, match_start, match_end - match_start, out, at, lane);
    literal_start = match_end;
    from = match_end;
  }
  return write_sequence(in, literal_start, bytes, 0, out, at, lane);
}

}  // namespace quantem::kernels::device::lz4_runs
