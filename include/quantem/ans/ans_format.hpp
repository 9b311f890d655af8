#pragma once
// The lossless ANS format of the resident (docs/kernels.md, "ANS resident").
// Plain constants and POD structs shared by the CPU reference (src/ans) and
// the CUDA kernels (kernels/codec/ans_*.cu): CUDA-free, host/device-neutral.
//
// A resident is a sequence of independent *groups*; a group holds
// frame_count consecutive frames (whole scan rows, ~2048 frames) and is one
// self-contained little-endian blob:
//
//   AnsGroupHeader (64 bytes)
//   class map      detector pixels bytes, padded to 16   (class of each pixel, 0..31)
//   freq tables    kAnsClassCount * 256 uint16           (per class; each used class sums to kAnsProbabilityScale)
//   stream offsets stream_count uint32, padded to 16     (byte offset of each stream in the stream data)
//   stream data    stream_count rANS streams, each 16-byte aligned (zero padded)
//
// Stream s codes the 2x2 pixel quad (2*qr + dr, 2*qc + dc), s = qr * quad_cols + qc,
// across the group's frames: for each frame, for each present pixel of the quad
// in the order k = 2 dr + dc = 0 (0,0), 1 (0,1), 2 (1,0), 3 (1,1), one value.
// Each quad position k has its own rANS state (4 interleaved states sharing
// one word stream), so a decoder runs 4 independent dependency chains: the
// 4 table lookups of a frame are issued together. With the pixel's class shift
// b (class_shift below) a value v is
//   symbol h = v >> b when h < 254, then b raw low bits (v & (2^b - 1));
//   symbol 254 then 16 raw bits = v            (h >= 254, v < 2^16);
//   symbol 255 then 16 raw bits = v & 0xffff, then 16 raw bits = v >> 16.
// A stream is [4 x uint32 initial decoder states x_0..x_3 (16 bytes)]
// [16-bit words in read order][zeros to 16]. Every part of a value of position
// k uses x_k: decoding a symbol: slot = x_k & (scale-1); (symbol, freq, cdf)
// from the class table; x_k = freq * (x_k >> kAnsProbabilityBits) + slot - cdf.
// Decoding c raw bits: bits = x_k & (2^c - 1); x_k >>= c. After either, if
// x_k < kAnsStateLower, x_k = (x_k << 16) | next word of the shared stream.
// The parts are decoded in the order above (frame, k, symbol then raw bits), so
// the encoder, running backwards, emits the words in exactly reverse order.
// After the last value every x_k == kAnsStateLower (absent positions never move).
//
// Class of a pixel (integer arithmetic, identical on CPU and GPU):
//   S = sum of the pixel's values over the group, F = frame_count
//   h = min(4095, isqrt(64 S / F)); H = smallest h reaching 99.5 % of pixels
//   K = clamp(16 * 61504 / (H + 1)^2, 1, 4096)      (class_scale, in 1/16 units, in the header)
//   class = min(31, isqrt(K S / (16 F)))            (classes evenly spaced in sqrt(mean))
//   class_shift = the smallest b <= 12 with (m + 6 isqrt(m) + 16) >> b < 254,
//   m = 16 (class + 1)^2 / K: moderate counts are symbols as they are; only
//   classes whose counts would overflow the alphabet send b low bits raw
//   (nearly uniform bits, since then the spread sqrt(m) >> 2^b).
#include <cstdint>

// Functions of the format used by both the CPU reference and the CUDA kernels
// are QUANTEM_HOST_DEVICE: __host__ __device__ under nvcc, plain functions elsewhere.
#include "quantem/core/host_device.hpp"

namespace quantem::ans {

inline constexpr std::uint32_t kAnsProbabilityBits = 10;
inline constexpr std::uint32_t kAnsProbabilityScale = 1u << kAnsProbabilityBits;
inline constexpr std::uint32_t kAnsStateLower = 1u << 16;  // states live in [2^16, 2^32)
inline constexpr std::uint32_t kAnsAlphabetSize = 256;
inline constexpr std::uint32_t kAnsEscape16 = 254;  // a raw 16-bit value follows
inline constexpr std::uint32_t kAnsEscape32 = 255;  // a raw 32-bit value follows (low word first)
inline constexpr std::uint32_t kAnsMaxClassShift = 12;
inline constexpr std::uint32_t kAnsStreamAlignment = 16;
inline constexpr std::uint32_t kAnsClassCount = 32;
inline constexpr std::uint32_t kAnsClassHistogramBins = 4096;
inline constexpr std::uint32_t kAnsMagic = 0x334e4151u;  // "QAN3"
inline constexpr std::uint32_t kAnsHeaderBytes = 64;
inline constexpr std::uint32_t kAnsPixelsPerStream = 4;   // 2x2 quads
inline constexpr std::uint32_t kAnsStatesPerStream = 4;   // one per quad position
inline constexpr std::uint32_t kAnsStreamHeaderBytes = 4 * kAnsStatesPerStream;

struct AnsGroupHeader {
  std::uint32_t magic;
  std::uint32_t header_bytes;
  std::uint32_t frame_count;
  std::uint32_t detector_rows;
  std::uint32_t detector_cols;
  std::uint32_t raw_words;         // 1: every value < 65536 (no symbol 255), 2: 32-bit values
  std::uint32_t class_scale;       // K above (1..4096)
  std::uint32_t stream_count;
  std::uint32_t class_map_offset;  // byte offsets from the start of the blob
  std::uint32_t freq_table_offset;
  std::uint32_t stream_offsets_offset;
  std::uint32_t stream_data_offset;
  std::uint64_t stream_data_bytes;
  std::uint64_t total_bytes;       // the whole blob
};
static_assert(sizeof(AnsGroupHeader) == kAnsHeaderBytes, "AnsGroupHeader must be 64 bytes");

// Layout of everything before the stream data: a function of the shape only.
struct AnsGroupLayout {
  std::uint32_t quad_rows;
  std::uint32_t quad_cols;
  std::uint32_t stream_count;
  std::uint32_t class_map_offset;
  std::uint32_t freq_table_offset;
  std::uint32_t stream_offsets_offset;
  std::uint32_t stream_data_offset;
};

QUANTEM_HOST_DEVICE constexpr AnsGroupLayout ans_group_layout(std::uint32_t detector_rows, std::uint32_t detector_cols) {
  AnsGroupLayout layout{};
  layout.quad_rows = (detector_rows + 1) / 2;
  layout.quad_cols = (detector_cols + 1) / 2;
  layout.stream_count = layout.quad_rows * layout.quad_cols;
  layout.class_map_offset = kAnsHeaderBytes;
  layout.freq_table_offset = layout.class_map_offset + ((detector_rows * detector_cols + 15u) & ~15u);
  layout.stream_offsets_offset = layout.freq_table_offset + kAnsClassCount * kAnsAlphabetSize * 2u;
  layout.stream_data_offset = layout.stream_offsets_offset + ((layout.stream_count * 4u + 15u) & ~15u);
  return layout;
}

// Bytes one stream takes in a group's stream data: its states, its 16-bit
// words, padded to kAnsStreamAlignment.
QUANTEM_HOST_DEVICE constexpr std::uint64_t ans_stream_bytes(std::uint64_t word_count) {
  return (kAnsStreamHeaderBytes + 2 * word_count + kAnsStreamAlignment - 1) / kAnsStreamAlignment *
         kAnsStreamAlignment;
}

// The header of a group with this layout, shape, encoder choices and stream
// data size.
QUANTEM_HOST_DEVICE inline AnsGroupHeader ans_group_header(const AnsGroupLayout& layout, std::uint32_t frame_count,
                                                      std::uint32_t detector_rows, std::uint32_t detector_cols,
                                                      std::uint32_t raw_words, std::uint32_t class_scale,
                                                      std::uint64_t stream_data_bytes) {
  AnsGroupHeader header{};
  header.magic = kAnsMagic;
  header.header_bytes = kAnsHeaderBytes;
  header.frame_count = frame_count;
  header.detector_rows = detector_rows;
  header.detector_cols = detector_cols;
  header.raw_words = raw_words;
  header.class_scale = class_scale;
  header.stream_count = layout.stream_count;
  header.class_map_offset = layout.class_map_offset;
  header.freq_table_offset = layout.freq_table_offset;
  header.stream_offsets_offset = layout.stream_offsets_offset;
  header.stream_data_offset = layout.stream_data_offset;
  header.stream_data_bytes = stream_data_bytes;
  header.total_bytes = layout.stream_data_offset + stream_data_bytes;
  return header;
}

}  // namespace quantem::ans
