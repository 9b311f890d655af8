// The encoders against the official filters: byte-identical chunks where the
// official filter links the same liblz4, and a round trip through h5py's
// official decoders for every chunk we write.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "codec_test_support.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/error.hpp"
#include "test_support.hpp"

namespace quantem::codec {
namespace {

using test_support::decode;
using test_support::first_difference;
using test_support::parse_manifest;
using test_support::random_bytes;
using test_support::sparse_elements;

ChunkFormat bitshuffle_format(std::size_t element_size) { return {ChunkFilter::bitshuffle_lz4, element_size}; }

TEST(CodecEncoder, ChunksAreByteIdenticalToTheOfficialFilter) {
  // The chunks written by h5py + the official bitshuffle filter (which links
  // the system liblz4, like quantem) must equal ours for the same elements and block size.
  quantem::test::TempDir dir;
  const auto result = quantem::test::run_python_script("codec_reference.py", "generate " + dir.path());
  const auto chunks = parse_manifest(result.output);
  ASSERT_FALSE(chunks.empty());
  std::size_t identical = 0;
  for (const auto& chunk : chunks) {
    const auto official = quantem::test::read_file(chunk.chunk_path);
    const auto elements = quantem::test::read_file(chunk.frame_path);
    const auto ours = encode_bitshuffle_lz4(elements.data(), chunk.element_count, chunk.element_size,
                                            chunk.block_elements);
    const long long difference = first_difference(ours, official);
    EXPECT_EQ(difference, -1) << chunk.label << " chunk " << chunk.index << ": " << ours.size() << " vs "
                              << official.size() << " bytes, first difference at " << difference;
    if (difference == -1) ++identical;
  }
  EXPECT_EQ(identical, chunks.size());
}

TEST(CodecEncoder, AllZeroFrameMatchesWorkedExample) {
  // The format's worked example: a 192x192 u16 zero frame is a 12-byte header and 9 blocks of
  // 4096 elements, each 47 bytes (4-byte length + LZ4 block): 435 bytes, every block the same.
  const std::vector<std::uint8_t> zeros(192 * 192 * 2, 0);
  const auto chunk = encode_bitshuffle_lz4(zeros.data(), 192 * 192, 2);
  ASSERT_EQ(chunk.size(), 435u);
  const std::vector<std::uint8_t> header = {0, 0, 0, 0, 0, 0x01, 0x20, 0x00, 0, 0, 0x20, 0x00};
  EXPECT_EQ(std::vector<std::uint8_t>(chunk.begin(), chunk.begin() + 12), header);
  std::vector<std::uint8_t> block = {0x00, 0x00, 0x00, 0x2b, 0x1f, 0x00, 0x01, 0x00};
  block.insert(block.end(), 32, 0xff);
  block.insert(block.end(), {0x07, 0x50, 0, 0, 0, 0, 0});
  ASSERT_EQ(block.size(), 47u);
  for (std::size_t index = 0; index < 9; ++index)
    EXPECT_EQ(std::vector<std::uint8_t>(chunk.begin() + 12 + 47 * index, chunk.begin() + 12 + 47 * (index + 1)), block)
        << "block " << index;

  // The real Arina u32 all-zero frame is 858 bytes (18 blocks of 47).
  const std::vector<std::uint8_t> zeros32(192 * 192 * 4, 0);
  EXPECT_EQ(encode_bitshuffle_lz4(zeros32.data(), 192 * 192, 4).size(), 858u);
}

TEST(CodecEncoder, RoundTripsThroughOurDecoder) {
  std::mt19937_64 rng(3);
  for (std::size_t element_size : {1, 2, 3, 4, 8}) {  // 3 and 8: the portable transpose path
    for (std::size_t count : {0, 1, 7, 8, 12, 4100, 4108, 36864, 36867}) {
      for (std::size_t block : {0, 8, 64, 4096}) {
        const auto elements = sparse_elements(rng, count, element_size);
        const auto chunk = encode_bitshuffle_lz4(elements.data(), count, element_size, block);
        EXPECT_EQ(decode(bitshuffle_format(element_size), chunk, elements.size()), elements)
            << "element_size " << element_size << " count " << count << " block " << block;
      }
    }
  }
  for (std::size_t bytes : {0, 1, 100, 8192, 8193, 100000}) {
    for (std::size_t block : {0, 1, 100, 8192}) {
      const auto sparse = sparse_elements(rng, bytes, 1);
      const auto noise = random_bytes(rng, bytes);
      for (const auto& data : {sparse, noise}) {
        const auto chunk = encode_lz4(data.data(), data.size(), block);
        EXPECT_EQ(decode({ChunkFilter::lz4, 1}, chunk, data.size()), data) << "bytes " << bytes << " block " << block;
      }
    }
  }
}

TEST(CodecEncoder, Lz4StoresIncompressibleBlocksRaw) {
  std::mt19937_64 rng(5);
  auto data = random_bytes(rng, 3 * 8192 + 100);
  std::fill(data.begin() + 8192, data.begin() + 2 * 8192, 0);  // block 1 compresses, the others do not
  const auto chunk = encode_lz4(data.data(), data.size(), 8192);
  const ChunkLayout layout = parse_chunk_layout({ChunkFilter::lz4, 1}, chunk.data(), chunk.size(), data.size());
  EXPECT_EQ(layout.block_bytes, 8192u);
  ASSERT_EQ(layout.blocks.size(), 4u);
  EXPECT_TRUE(layout.blocks[0].raw);
  EXPECT_FALSE(layout.blocks[1].raw);
  EXPECT_LT(layout.blocks[1].stored_bytes, 100u);
  EXPECT_TRUE(layout.blocks[2].raw);
  EXPECT_TRUE(layout.blocks[3].raw);
  EXPECT_EQ(layout.blocks[3].decoded_bytes, 100u);
  EXPECT_EQ(decode({ChunkFilter::lz4, 1}, chunk, data.size()), data);

  // The header's block size is clamped to the data size, like the HDF5 LZ4 filter.
  const auto small = encode_lz4(data.data(), 1000);
  EXPECT_EQ(parse_chunk_layout({ChunkFilter::lz4, 1}, small.data(), small.size(), 1000).block_bytes, 1000u);
}

TEST(CodecEncoder, RejectsBadArguments) {
  const std::vector<std::uint8_t> data(64, 0);
  EXPECT_THROW(encode_bitshuffle_lz4(data.data(), 32, 2, 12), Error);
  EXPECT_THROW(encode_bitshuffle_lz4(data.data(), 32, 0, 0), Error);
  EXPECT_THROW(encode_bitshuffle_lz4(data.data(), 32, 4, std::size_t{1} << 62), Error);  // block too large
}

struct RoundTripCase {
  std::string name;
  int filter_id = 0;
  std::size_t element_size = 0;
  std::size_t element_count = 0;
  std::size_t block_elements = 0;  // bitshuffle: requested block; lz4: block bytes
  std::vector<std::uint8_t> elements;
};

TEST(CodecEncoder, OfficialFiltersDecodeOurChunks) {
  std::mt19937_64 rng(17);
  std::vector<RoundTripCase> cases;
  for (std::size_t element_size : {1, 2, 4}) {
    for (std::size_t count : {12, 4100, 4108, 36864, 36867}) {
      for (std::size_t block : {0, 64}) {
        RoundTripCase c{"bslz4_u" + std::to_string(8 * element_size) + "_n" + std::to_string(count) + "_b" +
                            std::to_string(block),
                        test_support::kBitshuffleFilterId,
                        element_size,
                        count,
                        block,
                        sparse_elements(rng, count, element_size)};
        cases.push_back(c);
      }
    }
  }
  for (std::size_t block_bytes : {0, 4096, 8192}) {
    auto elements = sparse_elements(rng, 36867, 2);
    const auto noise = random_bytes(rng, 9000);
    std::copy(noise.begin(), noise.end(), elements.begin() + 20000);  // some blocks are stored raw
    cases.push_back({"lz4_u16_b" + std::to_string(block_bytes), test_support::kLz4FilterId, 2, 36867, block_bytes,
                     elements});
  }

  quantem::test::TempDir dir;
  {
    std::ofstream manifest(dir.file("manifest.txt"));
    for (const auto& c : cases) {
      const auto chunk = c.filter_id == test_support::kBitshuffleFilterId
                             ? encode_bitshuffle_lz4(c.elements.data(), c.element_count, c.element_size, c.block_elements)
                             : encode_lz4(c.elements.data(), c.elements.size(), c.block_elements);
      quantem::test::write_file(dir.file(c.name + ".chunk"), chunk);
      manifest << c.name << ' ' << c.filter_id << ' ' << c.element_size << ' ' << c.element_count << ' '
               << c.block_elements << ' ' << dir.file(c.name + ".chunk") << '\n';
    }
  }
  const auto result =
      quantem::test::run_python_script("codec_reference.py", "roundtrip " + dir.file("manifest.txt") + " " + dir.path());
  for (const auto& c : cases) {
    const std::string decoded_path = dir.file(c.name + ".decoded");
    ASSERT_TRUE(quantem::test::file_exists(decoded_path)) << c.name << " was not decoded:\n" << result.output;
    EXPECT_EQ(quantem::test::read_file(decoded_path), c.elements) << c.name;
  }
}

}  // namespace
}  // namespace quantem::codec
