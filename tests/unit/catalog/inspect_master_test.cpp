// Per-master inspection: readiness texts (docs/protocol.md, 'Masters, sessions and readiness'),
// shapes, dtypes, filters, pixel masks, calibration and sizes, on fixtures
// written by h5py (tests/support/python/catalog_fixtures.py) and on the real
// Arina files.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <filesystem>

#include "catalog_fixtures.hpp"
#include "quantem/catalog/acquisition.hpp"

namespace quantem::catalog {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

const char* kReadyReason = "master and detector sources are complete, readable, and internally consistent";
const char* kReadyAction = "Ready to open with Show4DSTEM.";

std::uint64_t file_size(const std::string& path) { return static_cast<std::uint64_t>(fs::file_size(path)); }

std::string normal(const std::string& path) { return fs::path(path).lexically_normal().string(); }

std::vector<std::uint64_t> shape_of(const Acquisition& a) {
  return {a.scan_rows, a.scan_cols, a.detector_rows, a.detector_cols};
}

class InspectMaster : public ::testing::Test {
 protected:
  Acquisition make_and_inspect(const std::string& stem, const std::string& options) {
    test::make_acquisitions(dir_, {dir_.path() + " " + stem + " " + options});
    return inspect_master(dir_.file(stem + "_master.h5"));
  }
  TempDir dir_;
};

TEST_F(InspectMaster, ReadyExternalMasterReportsShapeDtypeAndSize) {
  const auto a = make_and_inspect("sample", "--shard-frames 2,2 --ntrigger 4");
  EXPECT_TRUE(a.status.loadable) << a.status.reason;
  EXPECT_EQ(a.status.reason, kReadyReason);
  EXPECT_EQ(a.status.action, kReadyAction);
  EXPECT_EQ(shape_of(a), (std::vector<std::uint64_t>{2, 2, 4, 4}));
  ASSERT_TRUE(a.dtype.has_value());
  EXPECT_EQ(*a.dtype, DType::uint16);
  EXPECT_EQ(a.chunk_format.filter, codec::ChunkFilter::bitshuffle_lz4);
  EXPECT_EQ(a.chunk_format.element_size, 2u);
  EXPECT_EQ(a.stored_frames, 4u);
  EXPECT_EQ(a.expected_frames, std::optional<std::uint64_t>(4));
  EXPECT_EQ(a.name, "sample_master.h5");
  EXPECT_EQ(a.stem, "sample");
  EXPECT_EQ(a.master_path, dir_.file("sample_master.h5"));
  ASSERT_EQ(a.shards.size(), 2u);
  EXPECT_EQ(a.shards[0].link_name, "data_000001");
  EXPECT_EQ(a.shards[1].file_path, dir_.file("sample_data_000002.h5"));
  EXPECT_EQ(a.shards[1].dataset_path, "/entry/data/data");
  EXPECT_TRUE(a.shards[1].external);
  EXPECT_EQ(a.shards[1].frame_count, 2u);
  EXPECT_EQ(a.size_bytes, file_size(dir_.file("sample_master.h5")) + file_size(dir_.file("sample_data_000001.h5")) +
                              file_size(dir_.file("sample_data_000002.h5")));
  ASSERT_EQ(a.signature.size(), 3u);
  EXPECT_EQ(a.signature[0].path, a.master_path);
  EXPECT_TRUE(a.signature[2].exists);
  EXPECT_EQ(restat_signature(a.signature), a.signature);
  EXPECT_TRUE(a.pixel_mask.empty());
  EXPECT_FALSE(a.scan_sampling_A.has_value());
}

TEST_F(InspectMaster, ShortFrameCountWaitsForFrames) {
  const auto a = make_and_inspect("short", "--shard-frames 4 --ntrigger 9");
  EXPECT_FALSE(a.status.loadable);
  EXPECT_EQ(a.status.reason, "stored frame count is 4; expected 9 from master metadata ntrigger=9, nimages=1");
  EXPECT_EQ(a.status.action, "Wait for the remaining detector frames or chunks to finish writing, then poll again.");
  EXPECT_EQ(shape_of(a), (std::vector<std::uint64_t>{3, 3, 4, 4}));
  ASSERT_TRUE(a.dtype.has_value());
  EXPECT_EQ(*a.dtype, DType::uint16);
}

TEST_F(InspectMaster, TooManyFramesAsksForExplicitShape) {
  const auto a = make_and_inspect("long", "--shard-frames 6 --ntrigger 4");
  EXPECT_EQ(a.status.reason, "stored frame count is 6; expected 4 from master metadata ntrigger=4, nimages=1");
  EXPECT_EQ(a.status.action,
            "Pass the correct explicit scan_shape or repair the master frame-count metadata before loading.");
}

TEST_F(InspectMaster, MissingShardNamesTheFileAndLeavesDetectorUnknown) {
  const auto a = make_and_inspect("pending", "--shard-frames 4 --ntrigger 4 --missing-shards 1");
  EXPECT_FALSE(a.status.loadable);
  EXPECT_EQ(a.status.reason, "linked detector file is missing: " + dir_.file("pending_data_000001.h5"));
  EXPECT_EQ(a.status.action,
            "Finish copying or writing the linked detector file next to the master, then poll again.");
  EXPECT_EQ(shape_of(a), (std::vector<std::uint64_t>{2, 2, 0, 0}));
  EXPECT_FALSE(a.dtype.has_value());
  EXPECT_EQ(a.size_bytes, file_size(dir_.file("pending_master.h5")));
  ASSERT_EQ(a.signature.size(), 2u);
  EXPECT_FALSE(a.signature[1].exists);
  EXPECT_FALSE(a.shards[0].exists);
}

TEST_F(InspectMaster, SignatureNoticesAShardAppearing) {
  const auto a = make_and_inspect("grow", "--shard-frames 4 --ntrigger 4 --missing-shards 1");
  test::write_file(dir_.file("grow_data_000001.h5"), {1, 2, 3});
  const auto fresh = restat_signature(a.signature);
  EXPECT_NE(fresh, a.signature);
  EXPECT_TRUE(fresh[1].exists);
  EXPECT_EQ(fresh[1].size_bytes, 3);
  EXPECT_EQ(fresh[0], a.signature[0]);
}

TEST_F(InspectMaster, OddShardNamesAreFollowedAndCounted) {
  const auto a = make_and_inspect("odd", "--shard-frames 4 --ntrigger 4 --shard-name payload.h5");
  EXPECT_TRUE(a.status.loadable) << a.status.reason;
  EXPECT_EQ(a.shards[0].file_path, dir_.file("payload.h5"));
  EXPECT_EQ(a.size_bytes, file_size(dir_.file("odd_master.h5")) + file_size(dir_.file("payload.h5")));
}

TEST_F(InspectMaster, OddLinkNamesAreNotSources) {
  // Only names fully matching data_NNNNNN are sources; "data_1" is not, so
  // there is no source at all.
  const auto a = make_and_inspect("badlink", "--shard-frames 4 --ntrigger 4 --link-name data_{i}");
  EXPECT_EQ(a.status.reason, "master has no entry/data/data dataset or data_NNNNNN sources");
  EXPECT_EQ(a.status.action,
            "Wait for detector data links to finish writing, or recopy the complete acquisition group.");
}

TEST_F(InspectMaster, AbsoluteAndParentRelativeLinksResolve) {
  const auto absolute = make_and_inspect("abs", "--shard-frames 2,2 --ntrigger 4 --absolute-links");
  EXPECT_TRUE(absolute.status.loadable) << absolute.status.reason;
  EXPECT_EQ(absolute.shards[1].file_path, dir_.file("abs_data_000002.h5"));

  test::make_acquisitions(dir_, {dir_.path() + "/sub rel --shard-frames 4 --ntrigger 4 --shard-name ../elsewhere/rel_{i}.h5"});
  const auto parent = inspect_master(dir_.path() + "/sub/rel_master.h5");
  EXPECT_TRUE(parent.status.loadable) << parent.status.reason;
  EXPECT_EQ(parent.shards[0].file_path, dir_.path() + "/elsewhere/rel_1.h5");
}

TEST_F(InspectMaster, LinkedDatasetMissing) {
  const auto a = make_and_inspect("nodset", "--shard-frames 4 --ntrigger 4 --write-dataset /entry/data/other");
  EXPECT_EQ(a.status.reason, "linked detector dataset is missing: " + dir_.file("nodset_data_000001.h5") +
                                 ":/entry/data/data");
  EXPECT_EQ(a.status.action, "Repair the external link or recopy the acquisition so it targets entry/data/data.");
}

TEST_F(InspectMaster, LinkedFileEmptyOrGarbage) {
  test::make_acquisitions(dir_, {dir_.path() + " empty --shard-frames 4 --ntrigger 4 --missing-shards 1",
                                 dir_.path() + " junk --shard-frames 4 --ntrigger 4 --missing-shards 1"});
  test::write_file(dir_.file("empty_data_000001.h5"), {});
  test::write_file(dir_.file("junk_data_000001.h5"), std::vector<std::uint8_t>(4000, 0x5a));
  const auto empty = inspect_master(dir_.file("empty_master.h5"));
  EXPECT_EQ(empty.status.reason, "linked detector file is empty: " + dir_.file("empty_data_000001.h5"));
  EXPECT_EQ(empty.status.action, "Wait for the linked detector HDF5 file to finish writing, then poll again.");
  const auto junk = inspect_master(dir_.file("junk_master.h5"));
  const std::string prefix = "linked detector file is not readable HDF5: " + dir_.file("junk_data_000001.h5") + " (";
  EXPECT_EQ(junk.status.reason.substr(0, prefix.size()), prefix) << junk.status.reason;
  EXPECT_NE(junk.status.reason.find("file signature not found"), std::string::npos) << junk.status.reason;
  EXPECT_EQ(junk.status.action,
            "Wait for the detector writer to close or flush the file, then poll again; recopy it if the error "
            "persists.");
  EXPECT_EQ(junk.size_bytes, file_size(dir_.file("junk_master.h5")) + 4000);
}

TEST_F(InspectMaster, SidecarGivesNonSquareScanShape) {
  test::make_acquisitions(dir_, {dir_.path() + " side --shard-frames 15 --sidecar 3,5",
                                 dir_.path() + " sidetrig --shard-frames 8,7 --ntrigger 15 --sidecar 3,5",
                                 dir_.path() + " prescan --shard-frames 18 --sidecar 3,5,1",
                                 dir_.path() + " mismatch --shard-frames 15 --sidecar 3,4"});
  const auto side = inspect_master(dir_.file("side_master.h5"));
  EXPECT_TRUE(side.status.loadable) << side.status.reason;
  EXPECT_EQ(shape_of(side), (std::vector<std::uint64_t>{3, 5, 4, 4}));
  EXPECT_EQ(side.scan_shape_basis, "STEM Metadata sidecar side.h5");
  // The sidecar is not a linked file: it does not count in the size.
  EXPECT_EQ(side.size_bytes, file_size(dir_.file("side_master.h5")) + file_size(dir_.file("side_data_000001.h5")));

  const auto triggered = inspect_master(dir_.file("sidetrig_master.h5"));
  EXPECT_TRUE(triggered.status.loadable) << triggered.status.reason;
  EXPECT_EQ(shape_of(triggered), (std::vector<std::uint64_t>{3, 5, 4, 4}));

  const auto prescan = inspect_master(dir_.file("prescan_master.h5"));
  EXPECT_TRUE(prescan.status.loadable) << prescan.status.reason;
  EXPECT_EQ(shape_of(prescan), (std::vector<std::uint64_t>{3, 6, 4, 4}));

  // 3 x 4 does not explain 15 frames, and 15 is no square: unknown, still loadable.
  const auto mismatch = inspect_master(dir_.file("mismatch_master.h5"));
  EXPECT_TRUE(mismatch.status.loadable) << mismatch.status.reason;
  EXPECT_EQ(shape_of(mismatch), (std::vector<std::uint64_t>{0, 0, 4, 4}));
}

TEST_F(InspectMaster, SquareGuessFromFrameTotal) {
  test::make_acquisitions(dir_, {dir_.path() + " sq --shard-frames 2,2 --ntrigger 2 --nimages 2",
                                 dir_.path() + " six --shard-frames 6 --ntrigger 6",
                                 dir_.path() + " stored --shard-frames 9"});
  const auto nimages = inspect_master(dir_.file("sq_master.h5"));
  EXPECT_TRUE(nimages.status.loadable) << nimages.status.reason;
  // ntrigger x nimages, not ntrigger alone (the reference's guess, tightened).
  EXPECT_EQ(shape_of(nimages), (std::vector<std::uint64_t>{2, 2, 4, 4}));
  const auto six = inspect_master(dir_.file("six_master.h5"));
  EXPECT_TRUE(six.status.loadable) << six.status.reason;
  EXPECT_EQ(shape_of(six), (std::vector<std::uint64_t>{0, 0, 4, 4}));
  const auto stored = inspect_master(dir_.file("stored_master.h5"));
  EXPECT_TRUE(stored.status.loadable) << stored.status.reason;
  EXPECT_FALSE(stored.expected_frames.has_value());
  EXPECT_EQ(shape_of(stored), (std::vector<std::uint64_t>{3, 3, 4, 4}));
}

TEST_F(InspectMaster, ScanShapeAttributes) {
  test::make_acquisitions(dir_, {dir_.path() + " root --shard-frames 6 --scan-shape root:2,3",
                                 dir_.path() + " dset --shard-frames 6 --scan-shape dataset:3,2",
                                 dir_.path() + " conflict --shard-frames 4 --scan-shape root:2,2 --scan-shape entry_data:4,1",
                                 dir_.path() + " wrong --shard-frames 4 --scan-shape root:2,3",
                                 dir_.path() + " rootds --shard-frames 6 --scan-shape root_dataset:6,1"});
  const auto root = inspect_master(dir_.file("root_master.h5"));
  EXPECT_TRUE(root.status.loadable) << root.status.reason;
  EXPECT_EQ(shape_of(root), (std::vector<std::uint64_t>{2, 3, 4, 4}));
  EXPECT_EQ(root.expected_frames, std::optional<std::uint64_t>(6));

  const auto dset = inspect_master(dir_.file("dset_master.h5"));
  EXPECT_TRUE(dset.status.loadable) << dset.status.reason;
  EXPECT_EQ(shape_of(dset), (std::vector<std::uint64_t>{3, 2, 4, 4}));

  const auto conflict = inspect_master(dir_.file("conflict_master.h5"));
  EXPECT_EQ(conflict.status.reason, "detector sources have inconsistent scan_shape metadata: (2, 2), (4, 1)");
  EXPECT_EQ(conflict.status.action,
            "Repair the conflicting scan_shape attributes, or pass the correct explicit scan_shape after confirming "
            "the acquisition layout.");

  const auto wrong = inspect_master(dir_.file("wrong_master.h5"));
  EXPECT_EQ(wrong.status.reason, "stored frame count is 4; expected 6 from HDF5 scan_shape=(2, 3)");

  const auto root_dataset = inspect_master(dir_.file("rootds_master.h5"));
  EXPECT_TRUE(root_dataset.status.loadable) << root_dataset.status.reason;
  EXPECT_EQ(shape_of(root_dataset), (std::vector<std::uint64_t>{6, 1, 4, 4}));
}

TEST_F(InspectMaster, ScanShapeThatContradictsNtriggerIsNotLoadable) {
  const auto a = make_and_inspect("contra", "--shard-frames 4 --ntrigger 4 --scan-shape root:3,3");
  EXPECT_FALSE(a.status.loadable);
  EXPECT_EQ(a.status.reason,
            "scan shape (3, 3) from root attribute scan_shape covers 9 frames; the detector sources store 4");
}

TEST_F(InspectMaster, FrameMetadataMustBePositive) {
  test::make_acquisitions(dir_, {dir_.path() + " zero --shard-frames 4 --ntrigger 0",
                                 dir_.path() + " noimg --shard-frames 4 --ntrigger 4 --nimages 0"});
  const auto zero = inspect_master(dir_.file("zero_master.h5"));
  EXPECT_EQ(zero.status.reason, "master ntrigger metadata is not positive: 0");
  EXPECT_EQ(zero.status.action,
            "Wait for acquisition metadata to finish writing, or repair ntrigger before loading.");
  const auto nimages = inspect_master(dir_.file("noimg_master.h5"));
  EXPECT_EQ(nimages.status.reason, "master nimages metadata is not positive: 0");
  EXPECT_EQ(nimages.status.action,
            "Wait for acquisition metadata to finish writing, or repair nimages before loading.");
}

TEST_F(InspectMaster, SupportedDtypes) {
  test::make_acquisitions(dir_, {dir_.path() + " u8 --shard-frames 4 --ntrigger 4 --dtype uint8",
                                 dir_.path() + " u16 --shard-frames 4 --ntrigger 4 --dtype uint16",
                                 dir_.path() + " u32 --shard-frames 4 --ntrigger 4 --dtype uint32",
                                 dir_.path() + " i16 --shard-frames 4 --ntrigger 4 --dtype int16",
                                 dir_.path() + " f32 --shard-frames 4 --ntrigger 4 --dtype float32 --filter none"});
  const std::pair<const char*, DType> cases[] = {{"u8", DType::uint8}, {"u16", DType::uint16}, {"u32", DType::uint32}};
  for (const auto& [stem, dtype] : cases) {
    const auto a = inspect_master(dir_.file(std::string(stem) + "_master.h5"));
    EXPECT_TRUE(a.status.loadable) << stem << ": " << a.status.reason;
    ASSERT_TRUE(a.dtype.has_value()) << stem;
    EXPECT_EQ(*a.dtype, dtype);
    EXPECT_EQ(a.chunk_format.element_size, dtype_size(dtype));
  }
  const auto i16 = inspect_master(dir_.file("i16_master.h5"));
  EXPECT_FALSE(i16.status.loadable);
  EXPECT_EQ(i16.status.reason, "detector dataset " + dir_.file("i16_data_000001.h5") +
                                   ":/entry/data/data has dtype <i2; expected unsigned 8, 16 or 32-bit integers "
                                   "(uint8, uint16, uint32)");
  EXPECT_FALSE(i16.dtype.has_value());
  EXPECT_EQ(shape_of(i16), (std::vector<std::uint64_t>{2, 2, 4, 4}));
  const auto f32 = inspect_master(dir_.file("f32_master.h5"));
  EXPECT_NE(f32.status.reason.find("has dtype <f4;"), std::string::npos) << f32.status.reason;
}

TEST_F(InspectMaster, InlineMasters) {
  test::make_acquisitions(dir_, {dir_.path() + " inl --shard-frames inline:4 --filter none",
                                 dir_.path() + " multi --shard-frames inline:2,2 --ntrigger 4",
                                 dir_.path() + " flat --shard-frames inline:1 --raw-shape 16,4"});
  const auto inl = inspect_master(dir_.file("inl_master.h5"));
  EXPECT_TRUE(inl.status.loadable) << inl.status.reason;
  EXPECT_EQ(shape_of(inl), (std::vector<std::uint64_t>{2, 2, 4, 4}));
  ASSERT_EQ(inl.shards.size(), 1u);
  EXPECT_FALSE(inl.shards[0].external);
  EXPECT_EQ(inl.shards[0].link_name, "data");
  EXPECT_EQ(inl.shards[0].file_path, inl.master_path);
  EXPECT_EQ(inl.chunk_format.filter, codec::ChunkFilter::none);
  EXPECT_EQ(inl.size_bytes, file_size(inl.master_path));
  EXPECT_EQ(inl.signature.size(), 1u);

  const auto multi = inspect_master(dir_.file("multi_master.h5"));
  EXPECT_TRUE(multi.status.loadable) << multi.status.reason;
  ASSERT_EQ(multi.shards.size(), 2u);
  EXPECT_EQ(multi.shards[1].dataset_path, "/entry/data/data_000002");

  const auto flat = inspect_master(dir_.file("flat_master.h5"));
  EXPECT_EQ(flat.status.reason,
            "detector dataset /entry/data/data has shape (16, 4); expected at least (frame, det_row, det_col)");
  EXPECT_EQ(flat.status.action, "Repair or reacquire the dataset with explicit frame and two detector dimensions.");
}

TEST_F(InspectMaster, InconsistentSources) {
  test::make_acquisitions(dir_, {dir_.path() + " dets --shard-frames 2,2 --det-per-shard 4x4,8x8",
                                 dir_.path() + " types --shard-frames 2,2 --dtype-per-shard uint16,uint32"});
  const auto dets = inspect_master(dir_.file("dets_master.h5"));
  EXPECT_EQ(dets.status.reason, "detector sources have inconsistent detector shapes: (4, 4), (8, 8)");
  EXPECT_EQ(shape_of(dets), (std::vector<std::uint64_t>{2, 2, 0, 0}));
  EXPECT_FALSE(dets.dtype.has_value());
  const auto types = inspect_master(dir_.file("types_master.h5"));
  EXPECT_EQ(types.status.reason, "detector sources have inconsistent dtypes: <u2, <u4");
  EXPECT_EQ(types.status.action,
            "Repair or reacquire the acquisition so every detector chunk uses the same stored dtype.");
}

TEST_F(InspectMaster, UnsupportedFiltersAreNotLoadable) {
  test::make_acquisitions(dir_, {dir_.path() + " gz --shard-frames 4 --ntrigger 4 --filter gzip",
                                 dir_.path() + " zs --shard-frames 4 --ntrigger 4 --filter bszstd",
                                 dir_.path() + " lz --shard-frames 4 --ntrigger 4 --filter lz4"});
  const auto gz = inspect_master(dir_.file("gz_master.h5"));
  EXPECT_FALSE(gz.status.loadable);
  EXPECT_EQ(gz.status.reason, "detector dataset " + dir_.file("gz_data_000001.h5") +
                                  ":/entry/data/data uses an unsupported HDF5 filter pipeline: deflate (1); expected "
                                  "bitshuffle-LZ4 (32008), LZ4 (32004) or no filter");
  EXPECT_EQ(gz.status.action,
            "Recompress the detector data with bitshuffle-LZ4 (as DECTRIS writers do), LZ4 or no filter, then poll "
            "again.");
  EXPECT_EQ(shape_of(gz), (std::vector<std::uint64_t>{2, 2, 4, 4}));
  const auto zs = inspect_master(dir_.file("zs_master.h5"));
  EXPECT_NE(zs.status.reason.find("bitshuffle (32008) with zstd compression"), std::string::npos)
      << zs.status.reason;
  const auto lz = inspect_master(dir_.file("lz_master.h5"));
  EXPECT_TRUE(lz.status.loadable) << lz.status.reason;
  EXPECT_EQ(lz.chunk_format.filter, codec::ChunkFilter::lz4);
}

TEST_F(InspectMaster, MixedCompressionIsNotLoadable) {
  test::make_acquisitions(dir_, {dir_.path() + " mixed --shard-frames 2,2 --ntrigger 4 --missing-shards 2",
                                 dir_.path() + " other --shard-frames 2,2 --filter none --missing-shards 1 "
                                               "--shard-name mixed_data_{i:06d}.h5"});
  const auto mixed = inspect_master(dir_.file("mixed_master.h5"));
  EXPECT_EQ(mixed.status.reason, "detector sources use inconsistent compression: none, bitshuffle-LZ4");
  EXPECT_EQ(mixed.status.action,
            "Repair or reacquire the acquisition so every detector chunk uses the same compression.");
}

TEST_F(InspectMaster, ChunkingMustBeOneFramePerChunk) {
  const auto a = make_and_inspect("pairs", "--shard-frames 4 --ntrigger 4 --chunk-frames 2");
  EXPECT_FALSE(a.status.loadable);
  EXPECT_EQ(a.status.reason, "detector dataset " + dir_.file("pairs_data_000001.h5") +
                                 ":/entry/data/data is stored in chunks of (2, 4, 4); expected one frame per chunk "
                                 "(1, 4, 4)");
  EXPECT_EQ(a.status.action,
            "Rewrite the detector data with one frame per chunk (chunk shape (1, rows, cols)), then poll again.");
}

TEST_F(InspectMaster, ContiguousUnfilteredIsLoadable) {
  const auto a = make_and_inspect("contig", "--shard-frames 4 --ntrigger 4 --filter contiguous");
  EXPECT_TRUE(a.status.loadable) << a.status.reason;
  EXPECT_EQ(a.chunk_format.filter, codec::ChunkFilter::none);
}

TEST_F(InspectMaster, UnwrittenChunksAreNotReady) {
  const auto a = make_and_inspect("partial", "--shard-frames 4 --ntrigger 4 --unwritten 2");
  EXPECT_FALSE(a.status.loadable);
  EXPECT_EQ(a.status.reason, "detector dataset " + dir_.file("partial_data_000001.h5") +
                                 ":/entry/data/data has 2 of 4 frame chunks written");
  EXPECT_EQ(a.status.action, "Wait for the remaining detector frames or chunks to finish writing, then poll again.");
  const auto contiguous = make_and_inspect("nodata", "--shard-frames 4 --ntrigger 4 --unwritten 0 --filter contiguous");
  EXPECT_EQ(contiguous.status.reason,
            "detector dataset " + dir_.file("nodata_data_000001.h5") + ":/entry/data/data has no data written yet");
}

TEST_F(InspectMaster, PixelMaskUsesTheLow16Bits) {
  test::make_acquisitions(
      dir_, {dir_.path() + " mask --shard-frames 4 --ntrigger 4 --mask 4x4:uint32:0,0=1;1,1=0x80000000;2,3=0x100;3,3=0x10",
             dir_.path() + " smask --shard-frames 4 --ntrigger 4 --mask 4x4:int8:1,2=-1",
             dir_.path() + " wmask --shard-frames 4 --ntrigger 4 --mask 3x3:uint32:0,0=1"});
  const auto mask = inspect_master(dir_.file("mask_master.h5"));
  EXPECT_TRUE(mask.status.loadable) << mask.status.reason;
  ASSERT_EQ(mask.pixel_mask.size(), 16u);
  EXPECT_EQ(mask.masked_pixel_count, 3u);
  EXPECT_EQ(mask.pixel_mask[0], 1);
  EXPECT_EQ(mask.pixel_mask[5], 0);  // only bit 31 (virtual pixel): informational
  EXPECT_EQ(mask.pixel_mask[11], 1);
  EXPECT_EQ(mask.pixel_mask[15], 1);

  const auto signed_mask = inspect_master(dir_.file("smask_master.h5"));
  EXPECT_EQ(signed_mask.masked_pixel_count, 1u);
  ASSERT_EQ(signed_mask.pixel_mask.size(), 16u);
  EXPECT_EQ(signed_mask.pixel_mask[6], 1);

  // A mask of the wrong shape is ignored; the acquisition stays loadable.
  const auto wrong = inspect_master(dir_.file("wmask_master.h5"));
  EXPECT_TRUE(wrong.status.loadable) << wrong.status.reason;
  EXPECT_TRUE(wrong.pixel_mask.empty());
  EXPECT_EQ(wrong.masked_pixel_count, 0u);
}

TEST_F(InspectMaster, Calibration) {
  test::make_acquisitions(
      dir_, {dir_.path() + " cal --shard-frames 4 --root-attr scan_sampling_A=0.5 --root-attr k_pixel_size_mrad=0.25",
             dir_.path() + " alt --shard-frames 4 --root-attr scan_sampling_angstrom=str:1.5 "
                           "--root-attr detector_sampling_mrad=2",
             dir_.path() + " nan --shard-frames 4 --root-attr scan_sampling_A=nan --root-attr k_pixel_size_mrad=inf"});
  const auto cal = inspect_master(dir_.file("cal_master.h5"));
  EXPECT_EQ(cal.scan_sampling_A, std::optional<double>(0.5));
  EXPECT_EQ(cal.k_pixel_size_mrad, std::optional<double>(0.25));
  const auto alt = inspect_master(dir_.file("alt_master.h5"));
  EXPECT_EQ(alt.scan_sampling_A, std::optional<double>(1.5));
  EXPECT_EQ(alt.k_pixel_size_mrad, std::optional<double>(2.0));
  const auto nan = inspect_master(dir_.file("nan_master.h5"));
  EXPECT_FALSE(nan.scan_sampling_A.has_value());
  EXPECT_FALSE(nan.k_pixel_size_mrad.has_value());
}

TEST_F(InspectMaster, MalformedMastersAreReportedNotThrown) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  const std::string missing = dir_.file("gone_master.h5");
  const auto gone = inspect_master(missing);
  EXPECT_EQ(gone.status.reason, "master file is missing: " + missing);
  EXPECT_EQ(gone.status.action, "Wait for the master file to be atomically renamed into place, then poll again.");
  EXPECT_EQ(shape_of(gone), (std::vector<std::uint64_t>{0, 0, 0, 0}));

  test::write_file(dir_.file("empty_master.h5"), {});
  const auto empty = inspect_master(dir_.file("empty_master.h5"));
  EXPECT_EQ(empty.status.reason, "master file is empty: " + dir_.file("empty_master.h5"));
  EXPECT_EQ(empty.status.action, "Wait for the master HDF5 header to finish writing, then poll again.");

  std::vector<std::uint8_t> garbage(5000);
  for (std::size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<std::uint8_t>(i * 7 + 3);
  test::write_file(dir_.file("garbage_master.h5"), garbage);
  const auto junk = inspect_master(dir_.file("garbage_master.h5"));
  EXPECT_FALSE(junk.status.loadable);
  EXPECT_EQ(junk.status.reason, "master file is not readable HDF5: " + dir_.file("garbage_master.h5") +
                                    " (Unable to open file (file signature not found))");
  EXPECT_EQ(junk.status.action,
            "Wait for the master writer to close or flush the file, then poll again; recopy it if the error persists.");
  EXPECT_EQ(junk.size_bytes, 5000u);

  fs::create_directory(dir_.file("folder_master.h5"));
  const auto folder = inspect_master(dir_.file("folder_master.h5"));
  EXPECT_FALSE(folder.status.loadable);
  EXPECT_EQ(folder.status.reason.rfind("master file is not readable HDF5: " + dir_.file("folder_master.h5"), 0), 0u)
      << folder.status.reason;

  // A real master cut in half: HDF5 refuses it (truncated file).
  auto bytes = test::read_file(test::real_data_dir() + "/arina/rsciio_test_00/test_00_master.h5");
  bytes.resize(bytes.size() / 2);
  test::write_file(dir_.file("cut_master.h5"), bytes);
  const auto cut = inspect_master(dir_.file("cut_master.h5"));
  EXPECT_FALSE(cut.status.loadable);
  EXPECT_EQ(cut.status.reason.rfind("master file is not readable HDF5: " + dir_.file("cut_master.h5") + " (", 0), 0u)
      << cut.status.reason;

  // An HDF5 file without entry/data (the Arina sidecar).
  fs::copy_file(test::real_data_dir() + "/arina/rsciio_test_00/test_00.h5", dir_.file("nogroup_master.h5"));
  const auto nogroup = inspect_master(dir_.file("nogroup_master.h5"));
  EXPECT_EQ(nogroup.status.reason, "master is missing the entry/data group");
  EXPECT_EQ(nogroup.status.action, "Wait for acquisition to finish, or recopy a complete master file.");

  const auto nosource = make_and_inspect("nosource", "--shard-frames none");
  EXPECT_EQ(nosource.status.reason, "master has no entry/data/data dataset or data_NNNNNN sources");
}

TEST_F(InspectMaster, ZeroFrames) {
  const auto a = make_and_inspect("zero", "--shard-frames 0");
  EXPECT_EQ(a.status.reason, "detector sources contain zero stored frames");
  EXPECT_EQ(a.status.action, "Wait for detector frames to be written, then poll again.");
}

TEST(InspectRealArina, Test00IsLoadableWithItsSidecar) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  const std::string master = normal(test::real_data_dir() + "/arina/rsciio_test_00/test_00_master.h5");
  const auto a = inspect_master(master);
  EXPECT_TRUE(a.status.loadable) << a.status.reason;
  EXPECT_EQ(shape_of(a), (std::vector<std::uint64_t>{4, 4, 192, 192}));
  ASSERT_TRUE(a.dtype.has_value());
  EXPECT_EQ(*a.dtype, DType::uint32);
  EXPECT_EQ(a.chunk_format.filter, codec::ChunkFilter::bitshuffle_lz4);
  EXPECT_EQ(a.chunk_format.element_size, 4u);
  EXPECT_EQ(a.scan_shape_basis, "STEM Metadata sidecar test_00.h5");
  EXPECT_EQ(a.size_bytes, 386913u + 17742u);
  EXPECT_EQ(a.ntrigger, std::optional<std::uint64_t>(16));
  ASSERT_EQ(a.pixel_mask.size(), 192u * 192u);
  EXPECT_EQ(a.masked_pixel_count, 0u);  // the sample's mask is all zero
}

TEST(InspectRealArina, Test00WithoutSidecarUsesTheSquareOfNtrigger) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  TempDir dir;
  const std::string source = test::real_data_dir() + "/arina/rsciio_test_00/";
  fs::copy_file(source + "test_00_master.h5", dir.file("test_00_master.h5"));
  fs::copy_file(source + "test_00_data_000001.h5", dir.file("test_00_data_000001.h5"));
  const auto a = inspect_master(dir.file("test_00_master.h5"));
  EXPECT_TRUE(a.status.loadable) << a.status.reason;
  EXPECT_EQ(shape_of(a), (std::vector<std::uint64_t>{4, 4, 192, 192}));
  EXPECT_EQ(a.scan_shape_basis, "square of ntrigger x nimages = 16");
}

TEST(InspectRealArina, MeaPtychoMissingShardIsNotLoadable) {
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  const std::string directory = normal(test::real_data_dir() + "/arina/rsciio_MEA_ptycho_15");
  const auto a = inspect_master(directory + "/MEA_ptycho_15_master.h5");
  EXPECT_FALSE(a.status.loadable);
  EXPECT_EQ(a.status.reason, "linked detector file is missing: " + directory + "/MEA_ptycho_15_data_000001.h5");
  EXPECT_EQ(shape_of(a), (std::vector<std::uint64_t>{24, 24, 0, 0}));
  EXPECT_FALSE(a.dtype.has_value());
  EXPECT_EQ(a.size_bytes, 386913u);
}

}  // namespace
}  // namespace quantem::catalog
