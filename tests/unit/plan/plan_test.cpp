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

// The binning helpers the request paths use (written with counters instead of
// a division per pixel) against the plain index arithmetic, for every bin
// from 1 to 4 on odd sizes (partial edge bins).
TEST(PlanBinning, SourceMaskAndBinnedSumsEqualThePlainIndexArithmetic) {
  for (std::uint64_t bin = 1; bin <= 4; ++bin) {
    BrowsePlan plan;
    plan.detector_bin = bin;
    plan.scan_bin = bin;
    plan.crop = ScanRegion{1, 8, 2, 11};  // 7 x 9 positions of a 9 x 13 scan
    const PlanGeometry g = resolve_plan(plan, 9, 13, 11, 7);
    SCOPED_TRACE("bin " + std::to_string(bin));
    std::vector<std::uint8_t> binned(g.detector_pixels());
    for (std::size_t i = 0; i < binned.size(); ++i) binned[i] = static_cast<std::uint8_t>((i * 7) % 3);
    const std::vector<std::uint8_t> source = source_detector_mask(g, binned);
    ASSERT_EQ(source.size(), std::size_t{11 * 7});
    for (std::uint64_t r = 0; r < 11; ++r)
      for (std::uint64_t c = 0; c < 7; ++c)
        EXPECT_EQ(source[r * 7 + c], binned[(r / bin) * g.detector_cols + c / bin] != 0 ? 1 : 0) << r << "," << c;

    std::vector<std::uint64_t> pixels(11 * 7);
    for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = i * i + 3;
    const std::vector<std::uint64_t> detector = bin_detector_sums(pixels, 11, 7, bin);
    std::vector<std::uint64_t> expected_detector(g.detector_pixels(), 0);
    for (std::uint64_t r = 0; r < 11; ++r)
      for (std::uint64_t c = 0; c < 7; ++c) expected_detector[(r / bin) * g.detector_cols + c / bin] += pixels[r * 7 + c];
    EXPECT_EQ(detector, expected_detector);

    const std::uint64_t region_rows = 7, region_cols = 9;
    std::vector<std::uint64_t> frames(region_rows * region_cols);
    for (std::size_t i = 0; i < frames.size(); ++i) frames[i] = 1000 + i * 17;
    const std::vector<std::uint64_t> scan = bin_scan_sums(g, frames);
    std::vector<std::uint64_t> expected_scan(g.positions(), 0);
    for (std::uint64_t r = 0; r < region_rows; ++r)
      for (std::uint64_t c = 0; c < region_cols; ++c) expected_scan[(r / bin) * g.scan_cols + c / bin] += frames[r * region_cols + c];
    EXPECT_EQ(scan, expected_scan);
  }
}

}  // namespace
}  // namespace quantem::plan
