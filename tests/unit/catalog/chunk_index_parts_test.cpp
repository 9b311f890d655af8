// The chunk index cut into parts (split_chunk_index / visit_chunk_index_part)
// on h5py-written files: for every cut, walking the parts in order visits the
// same chunks in the same order as visit_chunks (as many as HDF5 counts), also
// when several threads walk the parts at once. That each chunk matches HDF5's
// is checked by frame_index_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "catalog_fixtures.hpp"
#include "chunk_index.hpp"
#include "quantem/hdf5/error.hpp"
#include "quantem/hdf5/read.hpp"
#include "quantem/core/error.hpp"

namespace quantem::catalog::detail {
namespace {

using test::TempDir;

struct Chunk {
  std::vector<std::uint64_t> element_offsets;
  std::uint64_t file_offset = 0;
  std::uint64_t stored_bytes = 0;
  std::uint32_t filter_mask = 0;
  bool operator==(const Chunk& other) const {
    return element_offsets == other.element_offsets && file_offset == other.file_offset &&
           stored_bytes == other.stored_bytes && filter_mask == other.filter_mask;
  }
};

// What build_frame_index gets from HDF5 before walking: sizes, layout, extent.
struct OpenedDataset {
  std::unique_ptr<RawFile> raw;
  DataLayout layout;
  std::vector<std::uint64_t> dims, max_dims;
  std::uint64_t hdf5_chunk_count = 0;  // H5Dget_num_chunks: the independent count
};

OpenedDataset open_dataset(const std::string& path, bool count_chunks_with_hdf5 = true) {
  const auto file = hdf5::File::open_read_only(path);
  const auto dataset = hdf5::open_dataset(file.id(), "/entry/data/data");
  const auto space = dataset.space();
  const int rank = H5Sget_simple_extent_ndims(space.id());
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), max_dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space.id(), dims.data(), max_dims.data());
  OpenedDataset opened;
  opened.raw = std::make_unique<RawFile>(path, FileAddressing{file.offset_size(), file.length_size(), file.user_block_size()});
  opened.layout = read_data_layout(*opened.raw, dataset.object_header_address());
  opened.dims.assign(dims.begin(), dims.end());
  opened.max_dims.assign(max_dims.begin(), max_dims.end());
  if (count_chunks_with_hdf5) opened.hdf5_chunk_count = dataset.allocated_chunk_count();
  return opened;
}

ChunkVisitor collect_into(std::vector<Chunk>& chunks, std::size_t rank) {
  return [&chunks, rank](const std::uint64_t* element_offsets, std::uint64_t file_offset, std::uint64_t stored_bytes,
                         std::uint32_t filter_mask) {
    chunks.push_back({std::vector<std::uint64_t>(element_offsets, element_offsets + rank), file_offset, stored_bytes,
                      filter_mask});
  };
}

std::vector<Chunk> visit_whole(const OpenedDataset& d) {
  std::vector<Chunk> chunks;
  EXPECT_TRUE(visit_chunks(*d.raw, d.layout, d.dims, d.max_dims, collect_into(chunks, d.dims.size())));
  return chunks;
}

// Walks the parts with `threads` threads, each part's chunks kept apart, then
// joined in part order.
std::vector<Chunk> visit_in_parts(const OpenedDataset& d, const ChunkIndexParts& parts, unsigned threads) {
  std::vector<std::vector<Chunk>> by_part(parts.parts.size());
  std::atomic<std::size_t> next{0};
  const auto work = [&] {
    for (std::size_t part = next.fetch_add(1); part < parts.parts.size(); part = next.fetch_add(1)) {
      visit_chunk_index_part(*d.raw, parts, part, collect_into(by_part[part], d.dims.size()));
    }
  };
  std::vector<std::thread> workers;
  for (unsigned t = 1; t < threads; ++t) workers.emplace_back(work);
  work();
  for (auto& worker : workers) worker.join();
  std::vector<Chunk> chunks;
  for (const auto& part : by_part) chunks.insert(chunks.end(), part.begin(), part.end());
  return chunks;
}

class ChunkIndexPartsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    test::make_acquisitions(*dir_, {
                                       // 5000 chunks: a v1 B-tree of three levels.
                                       dir_->path() + " btree --shard-frames 5000 --dtype uint8",
                                       dir_->path() + " userblock --shard-frames 2000 --unlimited --userblock 1024",
                                       dir_->path() + " frames4 --shard-frames 4000 --chunk-frames 4 --dtype uint8",
                                       // Fixed arrays: paged above 1024 entries, unfiltered, implicit, single chunk.
                                       dir_->path() + " paged --shard-frames 3000 --libver latest --dtype uint8",
                                       dir_->path() + " unfiltered --shard-frames 9 --libver latest --filter none",
                                       dir_->path() +
                                           " implicit --shard-frames 3000 --libver latest --filter none --alloc-early",
                                       dir_->path() + " single --shard-frames 1 --libver latest",
                                   });
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string data_file(const std::string& stem) { return dir_->file(stem + "_data_000001.h5"); }
  static TempDir* dir_;
};

TempDir* ChunkIndexPartsTest::dir_ = nullptr;

TEST_F(ChunkIndexPartsTest, EveryCutVisitsTheChunksOfTheWholeWalkInOrder) {
  const std::vector<std::pair<std::string, ChunkIndexKind>> files = {
      {"btree", ChunkIndexKind::btree_v1},          {"userblock", ChunkIndexKind::btree_v1},
      {"frames4", ChunkIndexKind::btree_v1},        {"paged", ChunkIndexKind::fixed_array},
      {"unfiltered", ChunkIndexKind::fixed_array},  {"implicit", ChunkIndexKind::implicit},
      {"single", ChunkIndexKind::single_chunk},
  };
  for (const auto& [stem, kind] : files) {
    SCOPED_TRACE(stem);
    const OpenedDataset d = open_dataset(data_file(stem));
    ASSERT_EQ(d.layout.index_kind, kind);
    const std::vector<Chunk> whole = visit_whole(d);
    ASSERT_EQ(whole.size(), d.hdf5_chunk_count);
    for (const std::size_t wanted : {1, 2, 3, 5, 16, 64, 1000, 100000}) {
      SCOPED_TRACE("wanted parts " + std::to_string(wanted));
      const auto parts = split_chunk_index(*d.raw, d.layout, d.dims, d.max_dims, wanted);
      ASSERT_TRUE(parts.has_value());
      ASSERT_FALSE(parts->parts.empty());
      if (wanted == 1) {
        EXPECT_EQ(parts->parts.size(), 1u);
      }
      EXPECT_EQ(visit_in_parts(d, *parts, 1), whole);
    }
  }
}

TEST_F(ChunkIndexPartsTest, CutsHaveTheWantedSizes) {
  // 5000 chunks in leaves of at most 64: enough subtrees for any small count.
  const OpenedDataset btree = open_dataset(data_file("btree"));
  for (const std::size_t wanted : {2, 8, 64}) {
    const auto parts = split_chunk_index(*btree.raw, btree.layout, btree.dims, btree.max_dims, wanted);
    EXPECT_GE(parts->parts.size(), wanted);
  }
  const auto leaves = split_chunk_index(*btree.raw, btree.layout, btree.dims, btree.max_dims, 100000);
  EXPECT_GE(leaves->parts.size(), 5000u / 64u);
  for (const auto& part : leaves->parts) EXPECT_EQ(part.level, 0);

  // Paged fixed array: parts are whole pages of 1024 entries.
  const OpenedDataset paged = open_dataset(data_file("paged"));
  const auto pages = split_chunk_index(*paged.raw, paged.layout, paged.dims, paged.max_dims, 3);
  ASSERT_TRUE(pages->fixed_array_paged);
  ASSERT_EQ(pages->parts.size(), 3u);
  for (const auto& part : pages->parts) EXPECT_EQ(part.first % pages->fixed_array_page_entries, 0u);

  const OpenedDataset implicit = open_dataset(data_file("implicit"));
  EXPECT_EQ(split_chunk_index(*implicit.raw, implicit.layout, implicit.dims, implicit.max_dims, 3)->parts.size(), 3u);
}

TEST_F(ChunkIndexPartsTest, PartsWalkedByManyThreadsAtOnceGiveTheSameChunks) {
  for (const std::string stem : {"btree", "paged", "implicit"}) {
    SCOPED_TRACE(stem);
    const OpenedDataset d = open_dataset(data_file(stem));
    const std::vector<Chunk> whole = visit_whole(d);
    const auto parts = split_chunk_index(*d.raw, d.layout, d.dims, d.max_dims, 64);
    for (int round = 0; round < 3; ++round) EXPECT_EQ(visit_in_parts(d, *parts, 8), whole);
  }
}

TEST_F(ChunkIndexPartsTest, BrokenNodeIsCorruptDataWhenCutAndWhenWalked) {
  // Copy the B-tree file, break the signature of its last level-1 node: cutting
  // deep enough reads it; walking the part that holds it reads it too.
  const auto pristine = test::read_file(data_file("btree"));
  std::size_t node = 0;
  for (std::size_t i = 0; i + 8 <= pristine.size(); ++i) {
    if (std::equal(pristine.begin() + i, pristine.begin() + i + 4, "TREE") && pristine[i + 4] == 1 &&
        pristine[i + 5] == 1) {
      node = i;
    }
  }
  ASSERT_NE(node, 0u);
  auto bytes = pristine;
  bytes[node + 2] = 'X';
  const std::string broken = dir_->file("broken.h5");
  test::write_file(broken, bytes);
  // Opening with HDF5 reads only the root node, which is intact (counting its
  // chunks would read them all).
  const OpenedDataset d = open_dataset(broken, false);
  try {
    (void)split_chunk_index(*d.raw, d.layout, d.dims, d.max_dims, 100000);
    ADD_FAILURE() << "cutting through a broken node did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::corrupt_data) << e.what();
  }
  const auto parts = split_chunk_index(*d.raw, d.layout, d.dims, d.max_dims, 1);
  try {
    (void)visit_in_parts(d, *parts, 1);
    ADD_FAILURE() << "walking through a broken node did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::corrupt_data) << e.what();
  }
}

}  // namespace
}  // namespace quantem::catalog::detail
