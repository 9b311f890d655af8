// Bit transposes against the definition of bitshuffle's bit planes (bitshuffle_core.c):
// bit m of byte g of plane p is bit p of element 8g+m.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "codec_test_support.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/error.hpp"

namespace quantem::codec {
namespace {

using test_support::naive_bitshuffle;
using test_support::random_bytes;

TEST(CodecBitshuffle, HandExampleFromReference) {
  const std::vector<std::uint16_t> values = {1, 2, 3, 0x8000, 0, 0, 0, 0x0101};
  std::vector<std::uint8_t> elements;
  for (std::uint16_t v : values) {
    elements.push_back(static_cast<std::uint8_t>(v & 0xFF));
    elements.push_back(static_cast<std::uint8_t>(v >> 8));
  }
  const std::vector<std::uint8_t> expected = {0x85, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                              0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08};
  std::vector<std::uint8_t> shuffled(16);
  bitshuffle_block(elements.data(), shuffled.data(), 8, 2);
  EXPECT_EQ(shuffled, expected);
  EXPECT_EQ(naive_bitshuffle(elements, 2), expected);

  std::vector<std::uint8_t> unshuffled(16);
  bitunshuffle_block(expected.data(), unshuffled.data(), 8, 2);
  EXPECT_EQ(unshuffled, elements);
}

TEST(CodecBitshuffle, MatchesBitDefinitionForEveryBlockShape) {
  // Counts cover the 16-group SIMD path, the 8-group path and single groups,
  // alone and combined; element sizes 3 and 8 take the portable path only.
  std::mt19937_64 rng(7);
  for (std::size_t element_size : {1, 2, 3, 4, 8}) {
    std::vector<std::size_t> counts;
    for (std::size_t count = 8; count <= 1032; count += 8) counts.push_back(count);
    counts.push_back(2048);
    counts.push_back(4096);
    counts.push_back(8192);
    for (std::size_t count : counts) {
      const auto elements = random_bytes(rng, count * element_size);
      const auto expected = naive_bitshuffle(elements, element_size);
      std::vector<std::uint8_t> shuffled(elements.size());
      bitshuffle_block(elements.data(), shuffled.data(), count, element_size);
      ASSERT_EQ(shuffled, expected) << "shuffle, element_size " << element_size << ", count " << count;
      std::vector<std::uint8_t> unshuffled(elements.size());
      bitunshuffle_block(expected.data(), unshuffled.data(), count, element_size);
      ASSERT_EQ(unshuffled, elements) << "unshuffle, element_size " << element_size << ", count " << count;
    }
  }
}

TEST(CodecBitshuffle, WorksOnUnalignedBuffers) {
  std::mt19937_64 rng(11);
  for (std::size_t element_size : {1, 2, 4}) {
    const std::size_t count = 4096 + 8 * 3;
    const std::size_t bytes = count * element_size;
    auto in_storage = random_bytes(rng, bytes + 1);
    std::vector<std::uint8_t> out_storage(bytes + 3);
    const std::vector<std::uint8_t> elements(in_storage.begin() + 1, in_storage.end());
    bitunshuffle_block(in_storage.data() + 1, out_storage.data() + 3, count, element_size);
    const std::vector<std::uint8_t> unshuffled(out_storage.begin() + 3, out_storage.end());
    EXPECT_EQ(naive_bitshuffle(unshuffled, element_size), elements) << "element_size " << element_size;
  }
}

TEST(CodecBitshuffle, SingleBitsLandInTheirPlanes) {
  // Every (element, bit) pair on its own: exactly one bit set in the output, at the defined place.
  for (std::size_t element_size : {1, 2, 4}) {
    const std::size_t count = 256;
    for (std::size_t element = 0; element < count; element += 37) {
      for (std::size_t bit = 0; bit < 8 * element_size; ++bit) {
        std::vector<std::uint8_t> elements(count * element_size, 0);
        elements[element * element_size + bit / 8] = static_cast<std::uint8_t>(1u << (bit % 8));
        std::vector<std::uint8_t> shuffled(elements.size());
        bitshuffle_block(elements.data(), shuffled.data(), count, element_size);
        std::vector<std::uint8_t> expected(elements.size(), 0);
        expected[bit * (count / 8) + element / 8] = static_cast<std::uint8_t>(1u << (element % 8));
        ASSERT_EQ(shuffled, expected) << "element " << element << " bit " << bit;
        std::vector<std::uint8_t> unshuffled(elements.size());
        bitunshuffle_block(expected.data(), unshuffled.data(), count, element_size);
        ASSERT_EQ(unshuffled, elements) << "element " << element << " bit " << bit;
      }
    }
  }
}

TEST(CodecBitshuffle, RejectsCountsNotMultipleOfEight) {
  std::vector<std::uint8_t> in(24), out(24);
  EXPECT_THROW(bitshuffle_block(in.data(), out.data(), 12, 2), Error);
  EXPECT_THROW(bitunshuffle_block(in.data(), out.data(), 12, 2), Error);
  EXPECT_THROW(bitunshuffle_block(in.data(), out.data(), 8, 0), Error);
}

TEST(CodecBitshuffle, DefaultBlockSizesAreTheFormatConstants) {
  EXPECT_EQ(bitshuffle_default_block_elements(1), 8192u);
  EXPECT_EQ(bitshuffle_default_block_elements(2), 4096u);
  EXPECT_EQ(bitshuffle_default_block_elements(4), 2048u);
  EXPECT_EQ(bitshuffle_default_block_elements(8), 1024u);
  EXPECT_EQ(bitshuffle_default_block_elements(3), 2728u);   // 2730 rounded down to a multiple of 8
  EXPECT_EQ(bitshuffle_default_block_elements(128), 128u);  // 64, raised to the minimum of 128
  EXPECT_EQ(bitshuffle_default_block_elements(0), 0u);
}

}  // namespace
}  // namespace quantem::codec
