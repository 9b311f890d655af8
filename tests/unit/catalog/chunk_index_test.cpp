// The raw object-header reader on hand-built headers: continuation blocks in
// v1 headers and v2 ("OHDR"/"OCHK") headers, gaps, optional v2 fields, and
// malformed headers (loops, out-of-file addresses) that must fail cleanly.
// Layouts of real and h5py-written files are covered by frame_index_test.cpp.
#include <gtest/gtest.h>

#include <cstring>

#include "chunk_index.hpp"
#include "quantem/core/error.hpp"
#include "test_support.hpp"

namespace quantem::catalog::detail {
namespace {

class Bytes {
 public:
  explicit Bytes(std::size_t size) : data_(size, 0) {}
  Bytes& at(std::size_t position) {
    position_ = position;
    return *this;
  }
  Bytes& put(std::uint64_t value, std::size_t width) {
    for (std::size_t i = 0; i < width; ++i) {
      data_.at(position_++) = i < 8 ? static_cast<std::uint8_t>(value >> (8 * i)) : 0;
    }
    return *this;
  }
  Bytes& text(const char* signature) {
    for (std::size_t i = 0; signature[i]; ++i) data_.at(position_++) = static_cast<std::uint8_t>(signature[i]);
    return *this;
  }
  std::size_t position() const { return position_; }
  const std::vector<std::uint8_t>& data() const { return data_; }

 private:
  std::vector<std::uint8_t> data_;
  std::size_t position_ = 0;
};

// Data layout message v3, chunked (1, 4, 4) of 2-byte elements, B-tree at 0x1234: 27 bytes.
void put_layout_v3(Bytes& bytes) {
  bytes.put(3, 1).put(2, 1).put(4, 1).put(0x1234, 8).put(1, 4).put(4, 4).put(4, 4).put(2, 4);
}

DataLayout read_layout(const test::TempDir& dir, const Bytes& bytes) {
  const std::string path = dir.file("header.bin");
  test::write_file(path, bytes.data());
  RawFile file(path, FileAddressing{8, 8, 0});
  return read_data_layout(file, 0);
}

void expect_the_v3_layout(const DataLayout& layout) {
  EXPECT_EQ(layout.message_version, 3u);
  EXPECT_EQ(layout.layout_class, 2u);
  EXPECT_EQ(layout.index_kind, ChunkIndexKind::btree_v1);
  EXPECT_EQ(layout.index_address, 0x1234u);
  EXPECT_EQ(layout.chunk_dims, (std::vector<std::uint64_t>{1, 4, 4}));
  EXPECT_EQ(layout.element_size, 2u);
}

TEST(ObjectHeader, VersionOneWithContinuation) {
  test::TempDir dir;
  Bytes bytes(256);
  // Prefix: version 1, 2 messages, reference count 1, 24 bytes of messages.
  bytes.at(0).put(1, 1).put(0, 1).put(2, 2).put(1, 4).put(24, 4);
  // Continuation message -> 48 bytes at 100.
  bytes.at(16).put(0x10, 2).put(16, 2).put(0, 4).put(100, 8).put(48, 8);
  // The continuation block: a NIL message, then the layout message (padded to 8).
  bytes.at(100).put(0, 2).put(0, 2).put(0, 4);
  bytes.at(108).put(0x08, 2).put(32, 2).put(0, 4);
  put_layout_v3(bytes);
  expect_the_v3_layout(read_layout(dir, bytes));
}

TEST(ObjectHeader, VersionTwoWithTimesCreationOrderGapAndContinuation) {
  test::TempDir dir;
  Bytes bytes(256);
  // OHDR v2, flags: 2-byte chunk size, creation order tracked, times stored.
  bytes.at(0).text("OHDR").put(2, 1).put(0x20 | 0x04 | 0x01, 1);
  bytes.put(0, 16);  // times
  bytes.put(25, 2);  // chunk #0: one 22-byte message and a 3-byte gap
  bytes.put(0x10, 1).put(16, 2).put(0, 1).put(0, 2).put(200, 8).put(41, 8);
  // OCHK block at 200: layout message (6-byte header), then a checksum.
  bytes.at(200).text("OCHK").put(0x08, 1).put(27, 2).put(0, 1).put(7, 2);
  put_layout_v3(bytes);
  expect_the_v3_layout(read_layout(dir, bytes));
}

TEST(ObjectHeader, VersionFourFixedArrayLayout) {
  test::TempDir dir;
  Bytes bytes(128);
  bytes.at(0).put(1, 1).put(0, 1).put(1, 2).put(1, 4).put(40, 4);
  // Layout v4 chunked: flags 0, 4 dims of 4-byte width, index type 3 (page bits 10), address 0x777.
  bytes.at(16).put(0x08, 2).put(32, 2).put(0, 4);
  bytes.put(4, 1).put(2, 1).put(0, 1).put(4, 1).put(4, 1).put(1, 4).put(192, 4).put(192, 4).put(4, 4);
  bytes.put(3, 1).put(10, 1).put(0x777, 8);
  const DataLayout layout = read_layout(dir, bytes);
  EXPECT_EQ(layout.message_version, 4u);
  EXPECT_EQ(layout.index_kind, ChunkIndexKind::fixed_array);
  EXPECT_EQ(layout.index_address, 0x777u);
  EXPECT_EQ(layout.chunk_dims, (std::vector<std::uint64_t>{1, 192, 192}));
  EXPECT_EQ(layout.element_size, 4u);
}

void expect_corrupt(const test::TempDir& dir, const Bytes& bytes) {
  try {
    (void)read_layout(dir, bytes);
    ADD_FAILURE() << "expected corrupt_data";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::corrupt_data) << e.what();
  }
}

TEST(ObjectHeader, MalformedHeadersFailCleanly) {
  test::TempDir dir;
  {  // A continuation that points back to itself.
    Bytes bytes(128);
    bytes.at(0).put(1, 1).put(0, 1).put(1, 2).put(1, 4).put(24, 4);
    bytes.at(16).put(0x10, 2).put(16, 2).put(0, 4).put(64, 8).put(24, 8);
    bytes.at(64).put(0x10, 2).put(16, 2).put(0, 4).put(64, 8).put(24, 8);
    expect_corrupt(dir, bytes);
  }
  {  // A continuation outside the file.
    Bytes bytes(64);
    bytes.at(0).put(1, 1).put(0, 1).put(1, 2).put(1, 4).put(24, 4);
    bytes.at(16).put(0x10, 2).put(16, 2).put(0, 4).put(1u << 20, 8).put(24, 8);
    expect_corrupt(dir, bytes);
  }
  {  // A message longer than its block.
    Bytes bytes(64);
    bytes.at(0).put(1, 1).put(0, 1).put(1, 2).put(1, 4).put(24, 4);
    bytes.at(16).put(0x08, 2).put(400, 2).put(0, 4);
    expect_corrupt(dir, bytes);
  }
  {  // No layout message at all.
    Bytes bytes(64);
    bytes.at(0).put(1, 1).put(0, 1).put(1, 2).put(1, 4).put(8, 4);
    expect_corrupt(dir, bytes);
  }
  {  // Not an object header.
    Bytes bytes(64);
    bytes.at(0).text("JUNK");
    expect_corrupt(dir, bytes);
  }
}

}  // namespace
}  // namespace quantem::catalog::detail
