// catalog::FrameIndexCache: a kept index is used only for the same master at
// the same signature while its files still stat as that signature; errors,
// acquisitions without a signature and entries past the bounds are not kept.
#include <gtest/gtest.h>

#include <filesystem>

#include "catalog_fixtures.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/frame_index_cache.hpp"
#include "quantem/core/error.hpp"

namespace quantem::catalog {
namespace {

using test::TempDir;

class FrameIndexCacheTest : public ::testing::Test {
 protected:
  Acquisition make(const std::string& stem, const std::string& options) {
    return test::make_loadable(dir_, stem, options);
  }
  static void expect_same_frames(const FrameIndex& a, const FrameIndex& b) {
    ASSERT_EQ(a.frames.size(), b.frames.size());
    EXPECT_EQ(a.shard_paths, b.shard_paths);
    EXPECT_EQ(a.stored_bytes_total, b.stored_bytes_total);
    for (std::size_t i = 0; i < a.frames.size(); ++i) {
      EXPECT_EQ(a.frames[i].file_offset, b.frames[i].file_offset) << i;
      EXPECT_EQ(a.frames[i].stored_bytes, b.frames[i].stored_bytes) << i;
      EXPECT_EQ(a.frames[i].shard, b.frames[i].shard) << i;
    }
  }
  TempDir dir_;
};

TEST_F(FrameIndexCacheTest, UnchangedFilesAreIndexedOnce) {
  const Acquisition a = make("kept", "--shard-frames 3,2 --ntrigger 5");
  FrameIndexCache cache;
  const auto first = cache.get(a);
  const auto second = cache.get(a);
  EXPECT_EQ(first.get(), second.get());
  EXPECT_EQ(cache.builds(), 1u);
  EXPECT_EQ(cache.size(), 1u);
  expect_same_frames(*first, build_frame_index(a));
  EXPECT_TRUE(cache.prefetch(a));
  EXPECT_EQ(cache.builds(), 1u);
}

TEST_F(FrameIndexCacheTest, RewrittenFilesAreIndexedAgain) {
  const Acquisition before = make("moving", "--shard-frames 4 --ntrigger 4");
  FrameIndexCache cache;
  const auto old_index = cache.get(before);
  ASSERT_EQ(old_index->frames.size(), 4u);
  // The detector writes the acquisition again, longer: a new inspection has a new signature.
  std::filesystem::remove_all(dir_.path());
  std::filesystem::create_directories(dir_.path());
  const Acquisition after = make("moving", "--shard-frames 6 --ntrigger 6");
  ASSERT_NE(after.signature, before.signature);
  const auto new_index = cache.get(after);
  EXPECT_EQ(new_index->frames.size(), 6u);
  expect_same_frames(*new_index, build_frame_index(after));
  EXPECT_EQ(cache.builds(), 2u);
  // The old inspection no longer matches its files: nothing kept is used for it,
  // and its build reports the change.
  try {
    (void)cache.get(before);
    FAIL() << "expected the changed files to be reported";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::conflict) << error.what();
  }
  EXPECT_FALSE(cache.prefetch(before));
  EXPECT_EQ(cache.get(after)->frames.size(), 6u);
}

TEST_F(FrameIndexCacheTest, ErrorsAndUnsignedAcquisitionsAreNotKept) {
  test::make_acquisitions(dir_, {dir_.path() + " gone --shard-frames 4 --missing-shards 1"});
  const Acquisition gone = inspect_master(dir_.file("gone_master.h5"));
  ASSERT_FALSE(gone.status.loadable);
  FrameIndexCache cache;
  EXPECT_THROW((void)cache.get(gone), Error);
  EXPECT_FALSE(cache.prefetch(gone));
  EXPECT_EQ(cache.size(), 0u);

  Acquisition unsigned_acquisition = make("plain", "--shard-frames 2 --ntrigger 2");
  unsigned_acquisition.signature.clear();
  const auto first = cache.get(unsigned_acquisition);
  const auto second = cache.get(unsigned_acquisition);
  EXPECT_NE(first.get(), second.get());
  EXPECT_EQ(cache.builds(), 2u);
  EXPECT_EQ(cache.size(), 0u);
}

TEST_F(FrameIndexCacheTest, LeastRecentlyUsedGoFirst) {
  const Acquisition a = make("a", "--shard-frames 2 --ntrigger 2");
  const Acquisition b = make("b", "--shard-frames 3 --ntrigger 3");
  const Acquisition c = make("c", "--shard-frames 4 --ntrigger 4");
  FrameIndexCache cache(/*max_entries=*/2);
  (void)cache.get(a);
  (void)cache.get(b);
  (void)cache.get(a);  // b is now the least recently used
  (void)cache.get(c);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.builds(), 3u);
  (void)cache.get(a);
  EXPECT_EQ(cache.builds(), 3u);
  (void)cache.get(b);
  EXPECT_EQ(cache.builds(), 4u);

  // A byte bound smaller than one index keeps none.
  FrameIndexCache tiny(/*max_entries=*/8, /*max_bytes=*/16);
  (void)tiny.get(c);
  EXPECT_EQ(tiny.size(), 0u);
  cache.clear();
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace quantem::catalog
