#include <gtest/gtest.h>

#include <string>

#include "quantem/core/error.hpp"
#include "quantem/plan/plan.hpp"

namespace quantem::plan {
namespace {

std::string bad_request_text(const BrowsePlan& plan, std::uint64_t rows, std::uint64_t cols,
                             std::uint64_t detector_rows, std::uint64_t detector_cols) {
  try {
    resolve_plan(plan, rows, cols, detector_rows, detector_cols);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::bad_request) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "resolve_plan accepted an invalid plan";
  return {};
}

TEST(ResolvePlan, FullScanWithoutBinsKeepsTheSourceShape) {
  const PlanGeometry g = resolve_plan(BrowsePlan{}, 7, 5, 9, 11);
  EXPECT_FALSE(g.cropped);
  EXPECT_EQ(g.region, (ScanRegion{0, 7, 0, 5}));
  EXPECT_EQ(g.scan_rows, 7u);
  EXPECT_EQ(g.scan_cols, 5u);
  EXPECT_EQ(g.detector_rows, 9u);
  EXPECT_EQ(g.detector_cols, 11u);
  EXPECT_EQ(g.positions(), 35u);
  EXPECT_EQ(g.detector_pixels(), 99u);
  EXPECT_EQ(g.source_scan_rows, 7u);
  EXPECT_EQ(g.source_detector_cols, 11u);
}

TEST(ResolvePlan, CropEqualToTheFullScanIsNotACrop) {
  BrowsePlan plan;
  plan.crop = ScanRegion{0, 7, 0, 5};
  const PlanGeometry g = resolve_plan(plan, 7, 5, 4, 4);
  EXPECT_FALSE(g.cropped);
  EXPECT_EQ(g, resolve_plan(BrowsePlan{}, 7, 5, 4, 4));
}

TEST(ResolvePlan, HalfOpenCropSetsTheRegionAndShape) {
  BrowsePlan plan;
  plan.crop = ScanRegion{1, 6, 2, 5};
  const PlanGeometry g = resolve_plan(plan, 7, 5, 4, 4);
  EXPECT_TRUE(g.cropped);
  EXPECT_EQ(g.region, (ScanRegion{1, 6, 2, 5}));
  EXPECT_EQ(g.scan_rows, 5u);
  EXPECT_EQ(g.scan_cols, 3u);
}

TEST(ResolvePlan, PartialEdgeBinsUseCeilingSizes) {
  BrowsePlan plan;
  plan.crop = ScanRegion{0, 7, 1, 5};  // 7 x 4
  plan.scan_bin = 3;
  plan.detector_bin = 4;
  const PlanGeometry g = resolve_plan(plan, 8, 5, 9, 11);
  EXPECT_EQ(g.scan_rows, 3u);  // ceil(7/3)
  EXPECT_EQ(g.scan_cols, 2u);  // ceil(4/3)
  EXPECT_EQ(g.detector_rows, 3u);  // ceil(9/4)
  EXPECT_EQ(g.detector_cols, 3u);  // ceil(11/4)
}

TEST(ResolvePlan, BinsUpToTheLongerAxisAreServed) {
  BrowsePlan plan;
  plan.scan_bin = 7;
  plan.detector_bin = 11;
  const PlanGeometry g = resolve_plan(plan, 7, 5, 9, 11);
  EXPECT_EQ(g.scan_rows, 1u);
  EXPECT_EQ(g.scan_cols, 1u);
  EXPECT_EQ(g.detector_rows, 1u);
  EXPECT_EQ(g.detector_cols, 1u);
  plan.scan_bin = 6;  // not a divisor of either axis
  plan.detector_bin = 10;
  const PlanGeometry h = resolve_plan(plan, 7, 5, 9, 11);
  EXPECT_EQ(h.scan_rows, 2u);
  EXPECT_EQ(h.scan_cols, 1u);
  EXPECT_EQ(h.detector_rows, 1u);
  EXPECT_EQ(h.detector_cols, 2u);
}

TEST(ResolvePlan, EmptyOrInvertedCropsUseTheReferenceText) {
  const std::string text = "scan crop must be a nonempty half-open (row, column) region";
  BrowsePlan plan;
  plan.crop = ScanRegion{3, 3, 0, 2};
  EXPECT_EQ(bad_request_text(plan, 7, 5, 4, 4), text);
  plan.crop = ScanRegion{0, 2, 4, 1};
  EXPECT_EQ(bad_request_text(plan, 7, 5, 4, 4), text);
}

TEST(ResolvePlan, CropBeyondTheSourceUsesTheReferenceText) {
  const std::string text = "scan crop exceeds the source scan shape";
  BrowsePlan plan;
  plan.crop = ScanRegion{0, 8, 0, 5};
  EXPECT_EQ(bad_request_text(plan, 7, 5, 4, 4), text);
  plan.crop = ScanRegion{0, 7, 2, 6};
  EXPECT_EQ(bad_request_text(plan, 7, 5, 4, 4), text);
}

TEST(ResolvePlan, EmptinessIsCheckedBeforeTheUpperBound) {
  BrowsePlan plan;
  plan.crop = ScanRegion{9, 9, 0, 5};
  EXPECT_EQ(bad_request_text(plan, 7, 5, 4, 4), "scan crop must be a nonempty half-open (row, column) region");
}

TEST(ResolvePlan, ZeroOrOversizedBinsNameTheBinAndTheAxis) {
  BrowsePlan plan;
  plan.scan_bin = 0;
  EXPECT_EQ(bad_request_text(plan, 7, 5, 9, 11),
            "scan_bin=0 must be between 1 and 7, the longer axis of the 7 x 5 scan region");
  plan.scan_bin = 8;
  EXPECT_EQ(bad_request_text(plan, 7, 5, 9, 11),
            "scan_bin=8 must be between 1 and 7, the longer axis of the 7 x 5 scan region");
  plan.scan_bin = 1;
  plan.detector_bin = 12;
  EXPECT_EQ(bad_request_text(plan, 7, 5, 9, 11),
            "det_bin=12 must be between 1 and 11, the longer axis of the 9 x 11 detector");
  plan.detector_bin = 0;
  EXPECT_EQ(bad_request_text(plan, 7, 5, 9, 11),
            "det_bin=0 must be between 1 and 11, the longer axis of the 9 x 11 detector");
}

TEST(ResolvePlan, ScanBinIsBoundedByTheCroppedRegion) {
  BrowsePlan plan;
  plan.crop = ScanRegion{0, 2, 0, 3};
  plan.scan_bin = 3;
  EXPECT_EQ(resolve_plan(plan, 7, 5, 4, 4).scan_cols, 1u);
  plan.scan_bin = 4;
  EXPECT_EQ(bad_request_text(plan, 7, 5, 4, 4),
            "scan_bin=4 must be between 1 and 3, the longer axis of the 2 x 3 scan region");
}

TEST(ResolvePlan, UnknownSourceShapeIsUnprocessable) {
  try {
    resolve_plan(BrowsePlan{}, 0, 0, 4, 4);
    FAIL() << "accepted an unknown scan shape";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::unprocessable);
  }
}

TEST(PlanGeometry, EqualityComparesEveryField) {
  BrowsePlan plan;
  plan.scan_bin = 2;
  const PlanGeometry a = resolve_plan(plan, 7, 5, 9, 11);
  PlanGeometry b = a;
  EXPECT_EQ(a, b);
  b.detector_bin = 2;
  EXPECT_FALSE(a == b);
  b = a;
  b.cropped = true;
  EXPECT_FALSE(a == b);
  b = a;
  b.source_detector_rows = 10;
  EXPECT_FALSE(a == b);
  b = a;
  b.region.col_stop = 4;
  EXPECT_FALSE(a == b);
  EXPECT_NE(to_string(a), to_string(resolve_plan(BrowsePlan{}, 7, 5, 9, 11)));
  EXPECT_EQ(to_string(a), to_string(b = a));
}

}  // namespace
}  // namespace quantem::plan
