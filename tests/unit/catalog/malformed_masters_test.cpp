// Crafted hostile masters (tests/support/python/malformed_masters.py) inspected
// in-process, as the inspector worker does (decision 0012; inspector_test checks
// the worker gives the same answers): every one is reported as not
// loadable with a reason, none throws, crashes the test process or hangs
// (the FIFO and the link cycles), and a valid master inspected afterwards in
// the same process is still loadable.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "quantem/catalog/acquisition.hpp"
#include "test_support.hpp"

namespace quantem::catalog {
namespace {

using test::TempDir;

class MalformedMasters : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    test::run_python_script("malformed_masters.py", dir_->path());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static Acquisition inspect(const std::string& name) {
    const auto started = std::chrono::steady_clock::now();
    Acquisition acquisition = inspect_master(dir_->file(name + "_master.h5"));
    // Generous: each takes milliseconds; this catches a hang that ends, or a slow path.
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10)) << name;
    return acquisition;
  }
  static TempDir* dir_;
};

TempDir* MalformedMasters::dir_ = nullptr;

TEST_F(MalformedMasters, EachIsReportedNotLoadableWithAReason) {
  for (const char* name : {"truncated_superblock", "bad_superblock", "link_to_garbage", "link_to_folder",
                           "link_to_fifo", "link_to_itself", "soft_link_cycle", "external_cycle", "huge_dims",
                           "zero_detector"}) {
    SCOPED_TRACE(name);
    const Acquisition acquisition = inspect(name);
    EXPECT_FALSE(acquisition.status.loadable) << acquisition.status.reason;
    EXPECT_FALSE(acquisition.status.reason.empty());
    EXPECT_FALSE(acquisition.status.action.empty());
  }
}

TEST_F(MalformedMasters, SpecificReasons) {
  EXPECT_EQ(inspect("truncated_superblock").status.reason.rfind("master file is not readable HDF5: ", 0), 0u);
  // The linked file cannot be read: named in the reason.
  for (const char* name : {"link_to_garbage", "link_to_folder", "link_to_fifo"}) {
    const Acquisition acquisition = inspect(name);
    EXPECT_FALSE(acquisition.status.loadable) << name;
    ASSERT_EQ(acquisition.shards.size(), 1u) << name << ": " << acquisition.status.reason;
  }
  // 2^40 declared frames, none written: never loadable, no overflow in the frame arithmetic.
  const Acquisition huge = inspect("huge_dims");
  EXPECT_EQ(huge.detector_rows, 65536u);
  EXPECT_EQ(huge.stored_frames, std::uint64_t{1} << 40);
}

TEST_F(MalformedMasters, ScanShapeBeyondAnyFrameCountIsNotLoadable) {
  const Acquisition acquisition = inspect("huge_scan_attr");
  EXPECT_FALSE(acquisition.status.loadable) << acquisition.status.reason;
}

TEST_F(MalformedMasters, ALinkTargetTwoThousandGroupsDeepInspectsQuickly) {
  // Valid, and loadable; path look-ups were quadratic in the depth (30 s here)
  // while holding the process-wide HDF5 lock. Now milliseconds; the bound is generous.
  const auto started = std::chrono::steady_clock::now();
  const Acquisition deep = inspect("deep_groups");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  EXPECT_TRUE(deep.status.loadable) << deep.status.reason;
  EXPECT_EQ(deep.stored_frames, 4u);
}

TEST_F(MalformedMasters, AValidMasterStillInspectsAfterTheHostileOnes) {
  for (const char* name : {"bad_superblock", "external_cycle", "link_to_fifo", "huge_dims"}) inspect(name);
  const Acquisition valid = inspect("valid");
  EXPECT_TRUE(valid.status.loadable) << valid.status.reason;
  EXPECT_EQ(valid.stored_frames, 4u);
}

}  // namespace
}  // namespace quantem::catalog
