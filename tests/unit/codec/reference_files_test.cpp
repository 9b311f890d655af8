// Bit-exact decode of every chunk of the real detector files and of files
// written by the official bitshuffle filter, against the decoded chunks that
// h5py reads through the official filters (tests/support/python/codec_reference.py);
// re-encoding every real chunk gives back the detector's bytes.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "codec_test_support.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "test_support.hpp"

namespace quantem::codec {
namespace {

using test_support::first_difference;
using test_support::format_of;
using test_support::parse_manifest;
using test_support::ReferenceChunk;

std::vector<ReferenceChunk> export_real_file(const quantem::test::TempDir& dir, const std::string& relative_path) {
  const std::string path = quantem::test::real_data_dir() + "/" + relative_path;
  if (!quantem::test::file_exists(path)) {
    ADD_FAILURE() << "missing real data file " << path;
    return {};
  }
  const auto result =
      quantem::test::run_python_script("codec_reference.py", "export '" + path + "' /entry/data/data " + dir.path());
  return parse_manifest(result.output);
}

// Decodes every chunk and compares it with the official filter's output; returns how many matched.
std::size_t expect_chunks_decode_exactly(const std::vector<ReferenceChunk>& chunks) {
  std::size_t matched = 0;
  for (const ReferenceChunk& chunk : chunks) {
    const auto stored = quantem::test::read_file(chunk.chunk_path);
    const auto expected = quantem::test::read_file(chunk.frame_path);
    EXPECT_EQ(expected.size(), chunk.element_count * chunk.element_size) << chunk.label << " chunk " << chunk.index;
    std::vector<std::uint8_t> decoded(expected.size());
    try {
      decode_chunk(format_of(chunk), stored.data(), stored.size(), decoded.data(), decoded.size());
    } catch (const std::exception& error) {
      ADD_FAILURE() << chunk.label << " chunk " << chunk.index << ": " << error.what();
      continue;
    }
    const long long difference = first_difference(decoded, expected);
    EXPECT_EQ(difference, -1) << chunk.label << " chunk " << chunk.index << " differs at byte " << difference;
    if (difference == -1) ++matched;
  }
  return matched;
}

// Our encoders reproduce the detector's chunks byte for byte (DECTRIS firmware
// and the Debian liblz4 give the same LZ4 output for these files).
void expect_reencoding_is_identical(const ReferenceChunk& chunk) {
  const auto stored = quantem::test::read_file(chunk.chunk_path);
  const auto elements = quantem::test::read_file(chunk.frame_path);
  std::vector<std::uint8_t> ours;
  if (chunk.filter_id == test_support::kBitshuffleFilterId) {
    ours = encode_bitshuffle_lz4(elements.data(), chunk.element_count, chunk.element_size, chunk.block_elements);
  } else {
    const ChunkLayout layout = parse_chunk_layout(format_of(chunk), stored.data(), stored.size(), elements.size());
    ours = encode_lz4(elements.data(), elements.size(), layout.block_bytes);
  }
  const long long difference = first_difference(ours, stored);
  EXPECT_EQ(difference, -1) << chunk.label << " chunk " << chunk.index << ": re-encoded " << ours.size()
                            << " bytes vs " << stored.size() << " stored, first difference at " << difference;
}

void expect_real_files_decode(const std::vector<std::string>& files, int filter_id, std::size_t element_size,
                              std::size_t chunks_per_file) {
  quantem::test::TempDir dir;
  for (const std::string& file : files) {
    const auto chunks = export_real_file(dir, file);
    ASSERT_EQ(chunks.size(), chunks_per_file) << file;
    for (const auto& chunk : chunks) {
      EXPECT_EQ(chunk.filter_id, filter_id) << file;
      EXPECT_EQ(chunk.element_size, element_size) << file;
    }
    EXPECT_EQ(expect_chunks_decode_exactly(chunks), chunks_per_file) << file;
    for (const auto& chunk : chunks) expect_reencoding_is_identical(chunk);
  }
}

const std::string kEiger = "eiger_h5_testmodes/";

TEST(CodecRealFiles, Eiger2BitshuffleUint8) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  expect_real_files_decode({kEiger + "eiger2_simread7_2datafiles_4images_bslz4_uint8_data_000001.h5",
                            kEiger + "eiger2_simread7_2datafiles_4images_bslz4_uint8_data_000002.h5"},
                           test_support::kBitshuffleFilterId, 1, 2);
}

TEST(CodecRealFiles, Eiger2BitshuffleUint16) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  expect_real_files_decode({kEiger + "eiger2_simread7_2datafiles_4images_bslz4_data_000001.h5",
                            kEiger + "eiger2_simread7_2datafiles_4images_bslz4_data_000002.h5"},
                           test_support::kBitshuffleFilterId, 2, 2);
}

TEST(CodecRealFiles, Eiger2BitshuffleUint32) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  expect_real_files_decode({kEiger + "eiger2_simread7_2datafiles_4images_bslz4_uint32_data_000001.h5",
                            kEiger + "eiger2_simread7_2datafiles_4images_bslz4_uint32_data_000002.h5"},
                           test_support::kBitshuffleFilterId, 4, 2);
}

TEST(CodecRealFiles, Eiger1BitshuffleVersion02WithPartialBlockAndTail) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  // 1065 x 1030 = 1 096 950 elements: 267 full blocks, a 3312-element block and 6 raw elements.
  expect_real_files_decode({kEiger + "eiger1_testmode10_2datafiles_4images_bslz4_data_000001.h5",
                            kEiger + "eiger1_testmode10_2datafiles_4images_bslz4_data_000002.h5"},
                           test_support::kBitshuffleFilterId, 2, 2);
}

TEST(CodecRealFiles, Eiger2PlainLz4) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  expect_real_files_decode({kEiger + "eiger2_simread7_2datafiles_4images_lz4_data_000001.h5"},
                           test_support::kLz4FilterId, 2, 2);
}

TEST(CodecRealFiles, ArinaUint32) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  expect_real_files_decode({"arina/rsciio_test_00/test_00_data_000001.h5"}, test_support::kBitshuffleFilterId, 4,
                           16);
}

TEST(CodecRealFiles, Eiger1LayoutHasPartialBlockAndRawTail) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  quantem::test::TempDir dir;
  const auto chunks = export_real_file(dir, kEiger + "eiger1_testmode10_2datafiles_4images_bslz4_data_000001.h5");
  ASSERT_FALSE(chunks.empty());
  const auto stored = quantem::test::read_file(chunks[0].chunk_path);
  const ChunkLayout layout = parse_chunk_layout(format_of(chunks[0]), stored.data(), stored.size(), 1096950u * 2);
  EXPECT_EQ(layout.block_bytes, 8192u);
  ASSERT_EQ(layout.blocks.size(), 268u);
  EXPECT_EQ(layout.blocks.back().decoded_bytes, 3312u * 2);
  EXPECT_EQ(layout.blocks.back().decoded_offset, 267u * 8192);
  EXPECT_EQ(layout.tail_bytes, 12u);
  EXPECT_EQ(layout.tail_stored_offset + layout.tail_bytes, stored.size());
  EXPECT_EQ(layout.tail_decoded_offset, 1096944u * 2);
}

TEST(CodecGeneratedFiles, EveryChunkOfTheOfficialFilterDecodesExactly) {
  quantem::test::TempDir dir;
  const auto result = quantem::test::run_python_script("codec_reference.py", "generate " + dir.path());
  const auto chunks = parse_manifest(result.output);
  // 3 dtypes x (15 counts x 4 frames + 4 diffraction frames) + 8 block-size datasets x 4 frames.
  ASSERT_EQ(chunks.size(), 3u * (15 * 4 + 4) + 8 * 4);
  std::set<std::size_t> element_sizes;
  std::set<std::size_t> tails;
  for (const auto& chunk : chunks) {
    EXPECT_EQ(chunk.filter_id, test_support::kBitshuffleFilterId);
    element_sizes.insert(chunk.element_size);
    tails.insert(chunk.element_count % 8);
  }
  EXPECT_EQ(element_sizes, (std::set<std::size_t>{1, 2, 4}));
  EXPECT_GE(tails.size(), 4u);  // tails of 0, 3, 4, 5, 7 elements are all present
  EXPECT_EQ(expect_chunks_decode_exactly(chunks), chunks.size());
}

}  // namespace
}  // namespace quantem::codec
