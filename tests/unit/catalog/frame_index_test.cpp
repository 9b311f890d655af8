// build_frame_index against HDF5's own answer: h5py's dset.id.get_chunk_info
// (offset, address, size, filter mask) and read_direct_chunk (the chunk's raw
// bytes, hashed) for every chunk, on generated files (v1 B-trees of one and
// several levels, fixed arrays, single chunks, the extensible-array fallback,
// user blocks, contiguous data) and on the real Arina and Eiger data files.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "catalog_fixtures.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/error.hpp"

namespace quantem::catalog {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

std::uint64_t fnv1a64(const std::uint8_t* data, std::size_t size) {
  std::uint64_t value = 0xCBF29CE484222325ull;
  for (std::size_t i = 0; i < size; ++i) {
    value ^= data[i];
    value *= 0x100000001B3ull;
  }
  return value;
}

nlohmann::json chunk_info(const std::string& file, const std::string& dataset = "/entry/data/data") {
  const auto result = test::run_python_script("catalog_fixtures.py", "chunk-info " + test::shell_quote(file) + " " +
                                                                          test::shell_quote(dataset));
  return nlohmann::json::parse(result.output);
}

// Checks frames [first, first + count) of `index` against HDF5's chunks of
// `file`. HDF5 1.10.8 reports chunk addresses relative to the file's base
// address (the user block size); the index holds absolute file offsets, which
// the hash of the bytes found there confirms.
void expect_matches_info(const FrameIndex& index, std::size_t first, const std::string& file,
                         const nlohmann::json& info, std::uint64_t user_block = 0) {
  const auto bytes = test::read_file(file);
  const std::uint64_t frames = info["shape"][0].get<std::uint64_t>();
  ASSERT_LE(first + frames, index.frames.size());
  if (info.contains("contiguous_offset")) {
    const std::uint64_t frame_bytes = index.frames[first].stored_bytes;
    for (std::uint64_t i = 0; i < frames; ++i) {
      EXPECT_EQ(index.frames[first + i].file_offset, info["contiguous_offset"].get<std::uint64_t>() + i * frame_bytes);
    }
    return;
  }
  ASSERT_EQ(info["chunks"].size(), frames) << file;
  for (const auto& chunk : info["chunks"]) {
    const std::uint64_t frame = chunk["offset"][0].get<std::uint64_t>();
    const FrameLocation& location = index.frames.at(first + frame);
    EXPECT_EQ(index.shard_paths.at(location.shard), file);
    EXPECT_EQ(location.file_offset, user_block + chunk["byte_offset"].get<std::uint64_t>()) << "frame " << frame;
    EXPECT_EQ(location.stored_bytes, chunk["size"].get<std::uint64_t>()) << "frame " << frame;
    EXPECT_EQ(location.filter_mask, chunk["filter_mask"].get<std::uint32_t>()) << "frame " << frame;
    // The bytes at the offset are the chunk HDF5 returns (absolute addressing).
    ASSERT_LE(location.file_offset + location.stored_bytes, bytes.size());
    EXPECT_EQ(std::to_string(fnv1a64(bytes.data() + location.file_offset, location.stored_bytes)),
              chunk["fnv1a64"].get<std::string>())
        << "frame " << frame;
  }
}

void expect_matches_hdf5(const FrameIndex& index, std::size_t first, const std::string& file,
                         std::uint64_t user_block = 0) {
  expect_matches_info(index, first, file, chunk_info(file), user_block);
}

class FrameIndexTest : public ::testing::Test {
 protected:
  Acquisition make(const std::string& stem, const std::string& options) {
    return test::make_loadable(dir_, stem, options);
  }
  TempDir dir_;
};

TEST_F(FrameIndexTest, SingleChunk) {
  const auto a = make("one", "--shard-frames 1 --det 8x8");
  const auto index = build_frame_index(a);
  ASSERT_EQ(index.frames.size(), 1u);
  ASSERT_EQ(index.shard_paths.size(), 1u);
  expect_matches_hdf5(index, 0, dir_.file("one_data_000001.h5"));
  EXPECT_EQ(index.stored_bytes_total, index.frames[0].stored_bytes);
}

TEST_F(FrameIndexTest, MultiLevelBtree) {
  // 5000 chunks of 4x4: leaves hold at most 64 entries, so the tree has three levels.
  const auto a = make("many", "--shard-frames 5000 --ntrigger 5000 --dtype uint8");
  const auto index = build_frame_index(a);
  ASSERT_EQ(index.frames.size(), 5000u);
  expect_matches_hdf5(index, 0, dir_.file("many_data_000001.h5"));
  std::uint64_t total = 0;
  for (const auto& frame : index.frames) total += frame.stored_bytes;
  EXPECT_EQ(index.stored_bytes_total, total);
}

TEST_F(FrameIndexTest, SeveralShardsInOrder) {
  const auto a = make("three", "--shard-frames 3,2,4 --ntrigger 9 --dtype uint32");
  const auto index = build_frame_index(a);
  ASSERT_EQ(index.frames.size(), 9u);
  ASSERT_EQ(index.shard_paths.size(), 3u);
  expect_matches_hdf5(index, 0, dir_.file("three_data_000001.h5"));
  expect_matches_hdf5(index, 3, dir_.file("three_data_000002.h5"));
  expect_matches_hdf5(index, 5, dir_.file("three_data_000003.h5"));
  EXPECT_EQ(index.frames[4].shard, 1u);
  EXPECT_EQ(index.frames[8].shard, 2u);
}

TEST_F(FrameIndexTest, InspectionsAndIndexBuildsOnManyThreadsAgree) {
  // The daemon's watcher inspects masters while loaders build frame indexes
  // (whose chunk-index walk runs on worker threads of its own). Run both from
  // several threads at once and require every result to equal the serial one.
  // The catalog also serialises its HDF5 calls for libhdf5 builds that are not
  // thread-safe (Debian's is, so here the test guards our own threading).
  const auto a = make("busy", "--shard-frames 300,200 --ntrigger 500 --dtype uint16");
  const FrameIndex serial = build_frame_index(a);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 15; ++i) {
        if ((t + i) % 2 == 0) {
          const Acquisition again = inspect_master(dir_.file("busy_master.h5"));
          if (!again.status.loadable || again.stored_frames != a.stored_frames) ++mismatches;
        } else {
          const FrameIndex index = build_frame_index(a);
          if (index.frames.size() != serial.frames.size() || index.stored_bytes_total != serial.stored_bytes_total)
            ++mismatches;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_F(FrameIndexTest, LatestFormatFixedArrayPaged) {
  // libver latest + fixed dimensions: fixed-array index, paged above 1024 entries.
  const auto a = make("fixed", "--shard-frames 1500 --libver latest");
  const auto index = build_frame_index(a);
  expect_matches_hdf5(index, 0, dir_.file("fixed_data_000001.h5"));
}

TEST_F(FrameIndexTest, LatestFormatFixedArrayUnfiltered) {
  const auto a = make("plainfixed", "--shard-frames 9 --libver latest --filter none");
  const auto index = build_frame_index(a);
  expect_matches_hdf5(index, 0, dir_.file("plainfixed_data_000001.h5"));
  EXPECT_EQ(index.frames[0].stored_bytes, 4u * 4u * 2u);
}

TEST_F(FrameIndexTest, LatestFormatSingleChunkIndex) {
  const auto a = make("single", "--shard-frames 1 --libver latest");
  const auto index = build_frame_index(a);
  expect_matches_hdf5(index, 0, dir_.file("single_data_000001.h5"));
}

TEST_F(FrameIndexTest, LatestFormatImplicitIndex) {
  // Early allocation, no filter, fixed dimensions: chunks at computed addresses.
  const auto a = make("implicit", "--shard-frames 7 --libver latest --filter none --alloc-early");
  const auto index = build_frame_index(a);
  expect_matches_hdf5(index, 0, dir_.file("implicit_data_000001.h5"));
  for (std::size_t i = 1; i < index.frames.size(); ++i) {
    EXPECT_EQ(index.frames[i].file_offset, index.frames[0].file_offset + i * 32u);
  }
}

TEST_F(FrameIndexTest, ExtensibleArrayFallsBackToHdf5WithUserBlock) {
  // libver latest + an unlimited frame axis: extensible array, read through
  // H5Dget_chunk_info; the user block shifts every address.
  const auto a = make("ext", "--shard-frames 300 --libver latest --unlimited --userblock 512");
  const auto index = build_frame_index(a);
  expect_matches_hdf5(index, 0, dir_.file("ext_data_000001.h5"), 512);
}

TEST_F(FrameIndexTest, BtreeWithUserBlock) {
  const auto a = make("ub", "--shard-frames 70 --userblock 1024 --unlimited");
  const auto index = build_frame_index(a);
  expect_matches_hdf5(index, 0, dir_.file("ub_data_000001.h5"), 1024);
}

TEST_F(FrameIndexTest, ContiguousAndInline) {
  const auto contiguous = make("contig", "--shard-frames 5 --filter contiguous");
  const auto index = build_frame_index(contiguous);
  ASSERT_EQ(index.frames.size(), 5u);
  EXPECT_EQ(index.frames[1].stored_bytes, 32u);
  expect_matches_hdf5(index, 0, dir_.file("contig_data_000001.h5"));

  const auto inline_master = make("inl", "--shard-frames inline:3,2 --ntrigger 5 --dtype uint32");
  const auto inline_index = build_frame_index(inline_master);
  ASSERT_EQ(inline_index.frames.size(), 5u);
  ASSERT_EQ(inline_index.shard_paths.size(), 1u);  // both sources live in the master
  const auto first = chunk_info(dir_.file("inl_master.h5"), "/entry/data/data_000001");
  const auto second = chunk_info(dir_.file("inl_master.h5"), "/entry/data/data_000002");
  EXPECT_EQ(inline_index.frames[2].file_offset, first["chunks"][2]["byte_offset"].get<std::uint64_t>());
  EXPECT_EQ(inline_index.frames[4].file_offset, second["chunks"][1]["byte_offset"].get<std::uint64_t>());
}

TEST_F(FrameIndexTest, RefusesAcquisitionsThatAreNotLoadable) {
  test::make_acquisitions(dir_, {dir_.path() + " gone --shard-frames 4 --missing-shards 1"});
  const auto a = inspect_master(dir_.file("gone_master.h5"));
  ASSERT_FALSE(a.status.loadable);
  try {
    (void)build_frame_index(a);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::conflict);
  }
}

TEST_F(FrameIndexTest, CorruptBtreeIsAnErrorNotACrash) {
  // Break one "TREE" signature at a time (chunk B-tree nodes and the group
  // B-trees): every build must throw a typed error, and breaking a leaf the
  // daemon reads itself must be reported as corrupt data.
  const auto a = make("bad", "--shard-frames 200 --ntrigger 200");
  const std::string shard = dir_.file("bad_data_000001.h5");
  const auto pristine = test::read_file(shard);
  int signatures = 0, corrupt = 0;
  for (std::size_t i = 0; i + 4 <= pristine.size(); ++i) {
    if (pristine[i] != 'T' || pristine[i + 1] != 'R' || pristine[i + 2] != 'E' || pristine[i + 3] != 'E') continue;
    ++signatures;
    auto bytes = pristine;
    bytes[i + 1] = 'X';
    test::write_file(shard, bytes);
    try {
      (void)build_frame_index(a);
      ADD_FAILURE() << "no error with the signature at " << i << " broken";
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::corrupt_data) ++corrupt;
    }
  }
  test::write_file(shard, pristine);
  EXPECT_GE(signatures, 3);
  EXPECT_GE(corrupt, 1);
  EXPECT_EQ(build_frame_index(a).frames.size(), 200u);
}

TEST_F(FrameIndexTest, ShardRewrittenSinceInspectionIsAConflict) {
  const auto a = make("moved", "--shard-frames 4");
  test::make_acquisitions(dir_, {dir_.path() + " moved --shard-frames 6"});
  try {
    (void)build_frame_index(a);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::conflict) << e.what();
  }
}

// Byte positions of the v1 chunk B-tree leaves ("TREE", node type 1, level 0) of a file.
std::vector<std::size_t> chunk_btree_leaves(const std::vector<std::uint8_t>& bytes) {
  std::vector<std::size_t> leaves;
  for (std::size_t i = 0; i + 8 <= bytes.size(); ++i) {
    if (bytes[i] == 'T' && bytes[i + 1] == 'R' && bytes[i + 2] == 'E' && bytes[i + 3] == 'E' && bytes[i + 4] == 1 &&
        bytes[i + 5] == 0) {
      leaves.push_back(i);
    }
  }
  return leaves;
}

TEST_F(FrameIndexTest, ShardsWalkedByWorkerThreadsMatchHdf5) {
  // Enough frames for several worker threads (one per 4096 frames, up to the
  // hardware threads), each shard's index cut into many parts; B-trees and
  // paged fixed arrays, shards of different sizes.
  test::make_acquisitions(dir_, {dir_.path() + " par --shard-frames 6000,1500,5000 --ntrigger 12500 --dtype uint8",
                                 dir_.path() + " parfa --shard-frames 5000,4500 --ntrigger 9500 --libver latest"});
  const std::vector<std::string> files = {dir_.file("par_data_000001.h5"), dir_.file("par_data_000002.h5"),
                                          dir_.file("par_data_000003.h5"), dir_.file("parfa_data_000001.h5"),
                                          dir_.file("parfa_data_000002.h5")};
  std::string more_files;
  for (std::size_t i = 1; i < files.size(); ++i) more_files += " " + test::shell_quote(files[i]);
  const auto infos = nlohmann::json::parse(
      test::run_python_script("catalog_fixtures.py",
                              "chunk-info " + test::shell_quote(files[0]) + " /entry/data/data" + more_files)
          .output);

  const auto btree = inspect_master(dir_.file("par_master.h5"));
  ASSERT_TRUE(btree.status.loadable) << btree.status.reason;
  const auto index = build_frame_index(btree);
  ASSERT_EQ(index.frames.size(), 12500u);
  ASSERT_EQ(index.shard_paths.size(), 3u);
  expect_matches_info(index, 0, files[0], infos.at(files[0]));
  expect_matches_info(index, 6000, files[1], infos.at(files[1]));
  expect_matches_info(index, 7500, files[2], infos.at(files[2]));
  EXPECT_EQ(index.frames[5999].shard, 0u);
  EXPECT_EQ(index.frames[6000].shard, 1u);
  EXPECT_EQ(index.frames[7500].shard, 2u);
  std::uint64_t total = 0;
  for (const auto& frame : index.frames) total += frame.stored_bytes;
  EXPECT_EQ(index.stored_bytes_total, total);

  const auto fixed = inspect_master(dir_.file("parfa_master.h5"));
  ASSERT_TRUE(fixed.status.loadable) << fixed.status.reason;
  const auto fixed_index = build_frame_index(fixed);
  ASSERT_EQ(fixed_index.frames.size(), 9500u);
  expect_matches_info(fixed_index, 0, files[3], infos.at(files[3]));
  expect_matches_info(fixed_index, 5000, files[4], infos.at(files[4]));

  // The same index on every build, whichever thread walked which part.
  for (int round = 0; round < 3; ++round) {
    const auto again = build_frame_index(btree);
    ASSERT_EQ(again.frames.size(), index.frames.size());
    for (std::size_t i = 0; i < index.frames.size(); ++i) {
      ASSERT_EQ(again.frames[i].file_offset, index.frames[i].file_offset) << "frame " << i;
      ASSERT_EQ(again.frames[i].stored_bytes, index.frames[i].stored_bytes) << "frame " << i;
      ASSERT_EQ(again.frames[i].filter_mask, index.frames[i].filter_mask) << "frame " << i;
      ASSERT_EQ(again.frames[i].shard, index.frames[i].shard) << "frame " << i;
    }
    EXPECT_EQ(again.stored_bytes_total, index.stored_bytes_total);
  }
}

TEST_F(FrameIndexTest, LeafCopiedOverAnotherIsCorruptDataWhateverThreadsWalkThem) {
  // The first leaf's entries written over the last leaf's: its frames have two
  // chunks (found by whichever thread claims them second), the last leaf's none.
  const auto a = make("dup", "--shard-frames 9000 --ntrigger 9000 --dtype uint8");
  const std::string shard = dir_.file("dup_data_000001.h5");
  auto bytes = test::read_file(shard);
  const auto leaves = chunk_btree_leaves(bytes);
  ASSERT_GE(leaves.size(), 100u);
  const std::size_t first = leaves.front(), last = leaves.back();
  const std::size_t entries = bytes[first + 6] | (bytes[first + 7] << 8);
  const std::size_t used_bytes = 24 + entries * 48 + 40;  // header, entries of 40-byte keys + address, last key
  ASSERT_LE(last + used_bytes, bytes.size());
  std::copy(bytes.begin() + first + 8, bytes.begin() + first + used_bytes, bytes.begin() + last + 8);
  bytes[last + 6] = bytes[first + 6];
  bytes[last + 7] = bytes[first + 7];
  test::write_file(shard, bytes);
  for (int round = 0; round < 3; ++round) {
    try {
      (void)build_frame_index(a);
      ADD_FAILURE() << "no error with a leaf duplicated";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::corrupt_data) << e.what();
      EXPECT_NE(std::string(e.what()).find("has two chunks"), std::string::npos) << e.what();
    }
  }
}

TEST_F(FrameIndexTest, ErrorsComeInShardOrderAsFromASerialWalk) {
  // Shard 2 has a broken leaf, shard 3 is gone: shard 2's error is reported,
  // as a walk of one shard after the other would.
  const auto a = make("order", "--shard-frames 5000,5000,5000 --ntrigger 15000 --dtype uint8");
  const std::string second = dir_.file("order_data_000002.h5");
  const auto pristine = test::read_file(second);
  const auto leaves = chunk_btree_leaves(pristine);
  ASSERT_GE(leaves.size(), 10u);
  auto bytes = pristine;
  bytes[leaves[leaves.size() / 2] + 1] = 'X';
  test::write_file(second, bytes);
  fs::remove(dir_.file("order_data_000003.h5"));
  try {
    (void)build_frame_index(a);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::corrupt_data) << e.what();
    EXPECT_NE(std::string(e.what()).find(second), std::string::npos) << e.what();
  }
  test::write_file(second, pristine);
  try {
    (void)build_frame_index(a);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::io) << e.what();
    EXPECT_NE(std::string(e.what()).find("order_data_000003.h5"), std::string::npos) << e.what();
  }
}

TEST(FrameIndexReal, ArinaTest00) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  const std::string directory = test::real_data_dir() + "/arina/rsciio_test_00";
  const auto a = inspect_master(directory + "/test_00_master.h5");
  ASSERT_TRUE(a.status.loadable) << a.status.reason;
  const auto index = build_frame_index(a);
  ASSERT_EQ(index.frames.size(), 16u);
  // The real data file as h5ls lists it: 16 chunks of 858 bytes at 3933, 4791, ...
  for (std::size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(index.frames[i].file_offset, 3933u + 858u * i);
    EXPECT_EQ(index.frames[i].stored_bytes, 858u);
    EXPECT_EQ(index.frames[i].filter_mask, 0u);
  }
  EXPECT_EQ(index.stored_bytes_total, 16u * 858u);
  expect_matches_hdf5(index, 0, index.shard_paths[0]);
}

// Masters in a TempDir with absolute links to the real Eiger data files (the
// fixture writes no data file: --missing-shards), one Python start for all.
TEST(FrameIndexReal, EigerDataFiles) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  struct Case {
    std::string prefix;
    DType dtype;
    codec::ChunkFilter filter;
    int files;
  };
  const std::vector<Case> cases = {
      {"eiger2_simread7_2datafiles_4images_bslz4", DType::uint16, codec::ChunkFilter::bitshuffle_lz4, 2},
      {"eiger2_simread7_2datafiles_4images_bslz4_uint8", DType::uint8, codec::ChunkFilter::bitshuffle_lz4, 2},
      {"eiger2_simread7_2datafiles_4images_bslz4_uint32", DType::uint32, codec::ChunkFilter::bitshuffle_lz4, 2},
      {"eiger2_simread7_2datafiles_4images_lz4", DType::uint16, codec::ChunkFilter::lz4, 1},
      {"eiger1_testmode10_2datafiles_4images_bslz4", DType::uint16, codec::ChunkFilter::bitshuffle_lz4, 2},
  };
  TempDir dir;
  const std::string data = fs::path(test::real_data_dir() + "/eiger_h5_testmodes").lexically_normal().string();
  std::vector<std::string> lines;
  std::string files;
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const bool two = cases[c].files == 2;
    lines.push_back(dir.path() + " eiger" + std::to_string(c) + " --shard-frames " + (two ? "2,2" : "2") +
                    " --absolute-links --missing-shards " + (two ? "1,2" : "1") + " --shard-name " + data + "/" +
                    cases[c].prefix + "_data_{i:06d}.h5");
    for (int i = 1; i <= cases[c].files; ++i) files += " " + data + "/" + cases[c].prefix + "_data_00000" + std::to_string(i) + ".h5";
  }
  test::make_acquisitions(dir, lines);
  const auto first_space = files.find(' ', 1);
  const auto result = test::run_python_script(
      "catalog_fixtures.py", "chunk-info " + files.substr(1, first_space - 1) + " /entry/data/data" + files.substr(first_space));
  const auto infos = nlohmann::json::parse(result.output);

  for (std::size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(cases[c].prefix);
    const auto a = inspect_master(dir.file("eiger" + std::to_string(c) + "_master.h5"));
    ASSERT_TRUE(a.status.loadable) << a.status.reason;
    ASSERT_TRUE(a.dtype.has_value());
    EXPECT_EQ(*a.dtype, cases[c].dtype);
    EXPECT_EQ(a.chunk_format.filter, cases[c].filter);
    const auto index = build_frame_index(a);
    ASSERT_EQ(index.frames.size(), static_cast<std::size_t>(2 * cases[c].files));
    for (int i = 1; i <= cases[c].files; ++i) {
      const std::string file = data + "/" + cases[c].prefix + "_data_00000" + std::to_string(i) + ".h5";
      expect_matches_info(index, static_cast<std::size_t>(2 * (i - 1)), file, infos.at(file));
    }
  }
}

}  // namespace
}  // namespace quantem::catalog
