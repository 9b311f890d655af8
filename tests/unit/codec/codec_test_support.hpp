#pragma once
// Helpers shared by the codec tests: the manifest printed by
// tests/support/python/codec_reference.py, a naive bit-by-bit bitshuffle
// (bitshuffle's bit-plane definition, written independently of src/codec), and test data.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "quantem/codec/chunk_codec.hpp"
#include "test_support.hpp"

namespace quantem::codec::test_support {

constexpr int kBitshuffleFilterId = 32008;
constexpr int kLz4FilterId = 32004;

// One chunk exported by codec_reference.py: the stored bytes as written to the
// file and the decoded chunk as read through the official HDF5 filter.
struct ReferenceChunk {
  int filter_id = 0;
  std::string label;
  std::size_t index = 0;
  std::size_t element_size = 0;
  std::size_t element_count = 0;
  std::size_t block_elements = 0;  // the dataset's requested block (cd_values[3]), 0 = default
  std::string chunk_path;
  std::string frame_path;
};

inline std::vector<ReferenceChunk> parse_manifest(const std::string& output) {
  std::vector<ReferenceChunk> chunks;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind != "chunk") continue;
    ReferenceChunk chunk;
    fields >> chunk.filter_id >> chunk.label >> chunk.index >> chunk.element_size >> chunk.element_count >>
        chunk.block_elements >> chunk.chunk_path >> chunk.frame_path;
    EXPECT_FALSE(fields.fail()) << "malformed manifest line: " << line;
    chunks.push_back(chunk);
  }
  return chunks;
}

inline ChunkFormat format_of(const ReferenceChunk& chunk) {
  ChunkFormat format;
  format.element_size = chunk.element_size;
  format.filter = chunk.filter_id == kBitshuffleFilterId ? ChunkFilter::bitshuffle_lz4
                  : chunk.filter_id == kLz4FilterId      ? ChunkFilter::lz4
                                                         : ChunkFilter::none;
  return format;
}

// Index of the first differing byte, or -1 when equal (sizes must match).
inline long long first_difference(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  if (a.size() != b.size()) return static_cast<long long>(std::min(a.size(), b.size()));
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<long long>(i);
  return -1;
}

// out[p*(n/8) + g] bit m = bit p of element 8g+m (p counts bits from the
// least significant bit of the first byte of the little-endian element).
inline std::vector<std::uint8_t> naive_bitshuffle(const std::vector<std::uint8_t>& elements, std::size_t element_size) {
  const std::size_t count = elements.size() / element_size;
  std::vector<std::uint8_t> planes(elements.size(), 0);
  for (std::size_t e = 0; e < count; ++e)
    for (std::size_t p = 0; p < 8 * element_size; ++p)
      if ((elements[e * element_size + p / 8] >> (p % 8)) & 1u)
        planes[p * (count / 8) + e / 8] |= static_cast<std::uint8_t>(1u << (e % 8));
  return planes;
}

inline std::vector<std::uint8_t> random_bytes(std::mt19937_64& rng, std::size_t bytes) {
  std::vector<std::uint8_t> data(bytes);
  for (auto& b : data) b = static_cast<std::uint8_t>(rng());
  return data;
}

// Sparse counting data: mostly 0, some small counts, a few large values.
inline std::vector<std::uint8_t> sparse_elements(std::mt19937_64& rng, std::size_t count, std::size_t element_size) {
  std::vector<std::uint8_t> data(count * element_size, 0);
  for (std::size_t e = 0; e < count; ++e) {
    const std::uint64_t roll = rng() % 1000;
    std::uint64_t value = 0;
    if (roll < 150) value = 1 + rng() % 3;
    else if (roll < 155) value = rng();
    for (std::size_t j = 0; j < element_size; ++j) data[e * element_size + j] = static_cast<std::uint8_t>(value >> (8 * j));
  }
  return data;
}

inline std::vector<std::uint8_t> decode(const ChunkFormat& format, const std::vector<std::uint8_t>& stored,
                                        std::size_t out_bytes) {
  std::vector<std::uint8_t> out(out_bytes);
  decode_chunk(format, stored.data(), stored.size(), out.data(), out.size());
  return out;
}

}  // namespace quantem::codec::test_support
