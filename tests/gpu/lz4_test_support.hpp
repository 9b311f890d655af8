#pragma once
// Scans LZ4 raw blocks (and bitshuffle/LZ4 chunks) for a match offset of 0:
// liblz4 1.9.x accepts such blocks in some positions, copying undefined bytes,
// while the GPU decoder always rejects them (kernels/codec/lz4_block.cuh).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace quantem::lz4_test {

inline bool has_zero_offset(const std::uint8_t* c, std::size_t size) {
  std::size_t ip = 0;
  while (ip < size) {
    const unsigned token = c[ip++];
    std::size_t literals = token >> 4;
    if (literals == 15) {
      unsigned b = 255;
      while (b == 255 && ip < size) literals += (b = c[ip++]);
    }
    ip += literals;
    if (ip + 2 > size) return false;
    if (c[ip] == 0 && c[ip + 1] == 0) return true;
    ip += 2;
    if ((token & 15) == 15) {
      unsigned b = 255;
      while (b == 255 && ip < size) b = c[ip++];
    }
  }
  return false;
}

inline bool has_zero_offset(const std::vector<std::uint8_t>& block) { return has_zero_offset(block.data(), block.size()); }

// Any block of a bitshuffle/LZ4 chunk (12-byte header, u32 BE lengths).
inline bool chunk_has_zero_offset(const std::vector<std::uint8_t>& chunk) {
  std::size_t position = 12;
  while (position + 4 <= chunk.size()) {
    const std::size_t length = (std::size_t{chunk[position]} << 24) | (std::size_t{chunk[position + 1]} << 16) |
                               (std::size_t{chunk[position + 2]} << 8) | chunk[position + 3];
    position += 4;
    if (length > chunk.size() - position) return false;
    if (has_zero_offset(chunk.data() + position, length)) return true;
    position += length;
  }
  return false;
}

}  // namespace quantem::lz4_test
