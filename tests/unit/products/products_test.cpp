// Products on hand-built residents: the reference's worked examples, the
// bright-field fit rules, the scan ROI, mode names, caching and determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "dense_fixture.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/core/error.hpp"
#include "quantem/products/products.hpp"

namespace quantem::products {
namespace {

using test::DenseCase;

DenseCase constant_case(std::uint64_t scan_rows, std::uint64_t scan_cols, std::uint64_t detector_rows,
                        std::uint64_t detector_cols, std::uint64_t value) {
  DenseCase c;
  c.name = "constant";
  c.dtype = DType::uint16;
  c.scan_rows = scan_rows;
  c.scan_cols = scan_cols;
  c.detector_rows = detector_rows;
  c.detector_cols = detector_cols;
  c.counts.assign(c.frames() * c.frame_pixels(), value);
  return c;
}

std::shared_ptr<backend::Resident> resident_of(const DenseCase& c, unsigned threads = 2) {
  const auto bytes = c.source_bytes();
  backend::CpuResidentOptions options;
  options.threads = threads;
  return backend::make_cpu_resident(c.acquisition(), bytes.data(), bytes.size(), options);
}

plan::PlanGeometry full_plan(const DenseCase& c) {
  return plan::resolve_plan({}, c.scan_rows, c.scan_cols, c.detector_rows, c.detector_cols);
}

TEST(RealspaceShape, ReferenceWorkedExampleOnAnAllOnesDetector) {
  const DenseCase c = constant_case(1, 1, 4, 4, 1);
  const auto resident = resident_of(c);
  const plan::PlanGeometry g = full_plan(c);
  ShapeRequest request;
  request.center_col = 1.5;
  request.center_row = 1.5;
  request.outer = 1.6;
  UsedGeometry used;
  request.shape = DetectorShape::circle;
  EXPECT_EQ(realspace_shape(*resident, g, request, used).integer_values(), std::vector<std::uint64_t>{12});
  request.shape = DetectorShape::square;
  EXPECT_EQ(realspace_shape(*resident, g, request, used).integer_values(), std::vector<std::uint64_t>{16});
  request.shape = DetectorShape::annulus;
  request.inner = 0.0;
  EXPECT_EQ(realspace_shape(*resident, g, request, used).integer_values(), std::vector<std::uint64_t>{12});
  EXPECT_EQ(used.center_row, 1.5);
  EXPECT_EQ(used.outer_radius_px, 1.6);
  request.inner = 1.0;  // excludes the 4 pixels at d² = 0.5
  EXPECT_EQ(realspace_shape(*resident, g, request, used).integer_values(), std::vector<std::uint64_t>{8});
  request.shape = DetectorShape::circle;
  request.inner = -5.0;  // ignored by circles
  EXPECT_EQ(realspace_shape(*resident, g, request, used).integer_values(), std::vector<std::uint64_t>{12});
}

TEST(ScanRoi, ReferenceWorkedExamples) {
  RegionRequest circle;
  circle.shape = ScanRoiShape::circle;
  circle.center_row = 2;
  circle.center_col = 3;
  circle.radius = 1.1;
  EXPECT_EQ(scan_roi_positions(circle, 5, 6), (std::vector<std::uint64_t>{9, 14, 15, 16, 21}));
  RegionRequest square = circle;
  square.shape = ScanRoiShape::square;
  square.radius = 1.0;
  EXPECT_EQ(scan_roi_positions(square, 5, 6), (std::vector<std::uint64_t>{8, 9, 10, 14, 15, 16, 20, 21, 22}));
}

TEST(ScanRoi, ClipsToTheGridAndRejectsEmptyOrInvalidRegions) {
  RegionRequest request;
  request.shape = ScanRoiShape::square;
  request.center_row = -0.5;
  request.center_col = 5.5;
  request.radius = 1.0;
  EXPECT_EQ(scan_roi_positions(request, 5, 6), (std::vector<std::uint64_t>{5}));
  const auto text = [](const RegionRequest& r) -> std::string {
    try {
      scan_roi_positions(r, 5, 6);
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::bad_request);
      return error.what();
    }
    return "accepted";
  };
  request.center_row = -3.0;
  EXPECT_EQ(text(request), "scan ROI does not include any scan positions");
  RegionRequest between;  // a circle between grid points
  between.center_row = 1.5;
  between.center_col = 1.5;
  between.radius = 0.5;
  EXPECT_EQ(text(between), "scan ROI does not include any scan positions");
  between.radius = 0.0;
  EXPECT_EQ(text(between), "scan ROI radius must be greater than zero");
  between.radius = std::nan("");
  EXPECT_EQ(text(between), "scan ROI radius must be greater than zero");
  between.radius = 1.0;
  between.center_col = INFINITY;
  EXPECT_EQ(text(between), "scan ROI center must be finite");
}

TEST(RegionDiffraction, ReferenceExampleSumMeanAndMax) {
  DenseCase c = constant_case(2, 2, 3, 2, 0);
  for (std::uint64_t f = 0; f < 4; ++f)
    for (std::uint64_t p = 0; p < 6; ++p) c.counts[f * 6 + p] = (f + 1) * 10 + p;
  const auto resident = resident_of(c);
  const plan::PlanGeometry g = full_plan(c);
  RegionRequest request;
  request.center_row = 0.5;
  request.center_col = 0.5;
  request.radius = 1.0;
  request.reduce = RegionRequest::Reduce::mean;
  // Narrowed to the wire's uint32 (every value fits), as a pattern is.
  const Image mean = region_diffraction(*resident, g, request);
  EXPECT_EQ(mean.narrow_counts, (std::vector<std::uint32_t>{100, 104, 108, 112, 116, 120}));
  EXPECT_TRUE(mean.counts.empty());
  EXPECT_EQ(mean.value_divisor, 4u);
  EXPECT_EQ(mean.height, 3u);
  EXPECT_EQ(mean.width, 2u);
  request.reduce = RegionRequest::Reduce::sum;
  const Image sum = region_diffraction(*resident, g, request);
  EXPECT_EQ(sum.narrow_counts, mean.narrow_counts);
  EXPECT_EQ(sum.value_divisor, 1u);
  request.reduce = RegionRequest::Reduce::max;
  const Image max = region_diffraction(*resident, g, request);
  EXPECT_EQ(max.narrow_counts, (std::vector<std::uint32_t>{40, 41, 42, 43, 44, 45}));
  EXPECT_EQ(max.value_divisor, 1u);
}

TEST(RegionDiffraction, SumsAboveUint32StayExactInUint64) {
  // Four frames of 2^31 per pixel: the region's sum 2^33 does not fit uint32;
  // its max (2^31) does.
  DenseCase c = constant_case(2, 2, 3, 2, 0);
  c.dtype = DType::uint32;
  c.counts.assign(c.frames() * c.frame_pixels(), 0x80000000ull);
  const auto resident = resident_of(c);
  RegionRequest request;
  request.center_row = 0.5;
  request.center_col = 0.5;
  request.radius = 1.0;
  request.reduce = RegionRequest::Reduce::sum;
  const Image sum = region_diffraction(*resident, full_plan(c), request);
  EXPECT_TRUE(sum.narrow_counts.empty());  // never wrapped: the wire encoder reports the overflow
  EXPECT_EQ(sum.counts, std::vector<std::uint64_t>(6, 4ull << 31));
  request.reduce = RegionRequest::Reduce::max;
  const Image max = region_diffraction(*resident, full_plan(c), request);
  EXPECT_EQ(max.narrow_counts, std::vector<std::uint32_t>(6, 0x80000000u));
}

TEST(SelectedDiffraction, ClampsIndicesIntoThePlanGrid) {
  DenseCase c = constant_case(3, 4, 2, 2, 0);
  for (std::uint64_t f = 0; f < 12; ++f)
    for (std::uint64_t p = 0; p < 4; ++p) c.counts[f * 4 + p] = f * 4 + p;
  const auto resident = resident_of(c);
  const plan::PlanGeometry g = full_plan(c);
  // sx = row 99 -> last row, sy = column -5 -> 0: frame [2, 0] = frame 8.
  const Image image = selected_diffraction(*resident, g, 99, -5);
  EXPECT_EQ(image.integer_values(), (std::vector<std::uint64_t>{32, 33, 34, 35}));
  EXPECT_EQ(image.height, 2u);
  EXPECT_EQ(selected_diffraction(*resident, g, 1, 0).integer_values(), (std::vector<std::uint64_t>{16, 17, 18, 19}));
  // A scan-binned plan sums up to bin² frames with divisor 1.
  plan::BrowsePlan binned;
  binned.scan_bin = 3;
  const plan::PlanGeometry gb = plan::resolve_plan(binned, 3, 4, 2, 2);
  const Image last = selected_diffraction(*resident, gb, 0, 7);  // the partial 3 x 1 column block: frames 3, 7, 11
  EXPECT_EQ(last.integer_values(), (std::vector<std::uint64_t>{12 + 28 + 44, 13 + 29 + 45, 14 + 30 + 46, 15 + 31 + 47}));
  EXPECT_EQ(last.value_divisor, 1u);
}

TEST(SelectedDiffraction, PatternsFittingUint32ComeNarrowAndLargerOnesStayExactInUint64) {
  DenseCase c = constant_case(2, 2, 4, 4, 7);
  const Image small = selected_diffraction(*resident_of(c), full_plan(c), 1, 1);
  EXPECT_EQ(small.narrow_counts, std::vector<std::uint32_t>(16, 7));
  EXPECT_TRUE(small.counts.empty());
  // Scan bin 2 sums four frames of 2^31: 2^33 > 2^32 - 1.
  c.dtype = DType::uint32;
  c.counts.assign(c.frames() * c.frame_pixels(), 0x80000000ull);
  plan::BrowsePlan binned;
  binned.scan_bin = 2;
  const Image large = selected_diffraction(*resident_of(c), plan::resolve_plan(binned, 2, 2, 4, 4), 0, 0);
  EXPECT_TRUE(large.narrow_counts.empty());  // never wrapped: the wire encoder reports the overflow
  EXPECT_EQ(large.counts, std::vector<std::uint64_t>(16, 4ull << 31));
}

TEST(FitBrightField, ThresholdIsMeanPlusPopulationStdWithAStrictComparison) {
  // 4 x 4 mean pattern: four pixels at 10, the rest at 0. mean = 2.5,
  // std = sqrt((4·7.5² + 12·2.5²)/16) = 4.33 -> threshold 6.83: the four pixels pass.
  std::vector<std::uint64_t> pattern(16, 0);
  for (const int p : {5, 6, 9, 10}) pattern[static_cast<std::size_t>(p)] = 30;  // 3 positions -> mean 10
  const BrightFieldGeometry fit = fit_bright_field(pattern, 3, 4, 4);
  EXPECT_DOUBLE_EQ(fit.center_row, 1.5);
  EXPECT_DOUBLE_EQ(fit.center_col, 1.5);
  EXPECT_DOUBLE_EQ(fit.radius, std::sqrt(4.0 / M_PI));
}

TEST(FitBrightField, FlatPatternFallsBackToTheCentreAndAQuarterOfTheShortSide) {
  const BrightFieldGeometry fit = fit_bright_field(std::vector<std::uint64_t>(6 * 10, 7), 5, 6, 10);
  EXPECT_DOUBLE_EQ(fit.center_row, 3.0);
  EXPECT_DOUBLE_EQ(fit.center_col, 5.0);
  EXPECT_DOUBLE_EQ(fit.radius, 1.5);
  const BrightFieldGeometry odd = fit_bright_field(std::vector<std::uint64_t>(5 * 7, 0), 1, 5, 7);
  EXPECT_DOUBLE_EQ(odd.center_row, 2.5);
  EXPECT_DOUBLE_EQ(odd.center_col, 3.5);
  EXPECT_DOUBLE_EQ(odd.radius, 1.25);
}

TEST(Realspace, ModeNamesAreExactAndCaseSensitive) {
  EXPECT_EQ(realspace_mode_from_name("BF"), RealspaceMode::BF);
  EXPECT_EQ(realspace_mode_from_name("HAADF"), RealspaceMode::HAADF);
  EXPECT_EQ(realspace_mode_from_name("CoMmag"), RealspaceMode::CoMmag);
  EXPECT_EQ(realspace_mode_from_name("iCoM"), RealspaceMode::iCoM);
  EXPECT_FALSE(realspace_mode_from_name("bf").has_value());
  EXPECT_FALSE(realspace_mode_from_name("ICOM").has_value());
  EXPECT_FALSE(realspace_mode_from_name("BF ").has_value());
}

TEST(Realspace, AnnulusModesShareOneRuleAndDefaultsGiveTheBrightFieldDisk) {
  const DenseCase c = test::random_case("modes", DType::uint16, 5, 4, 15, 13, 7, 400, 2, 900);
  const auto resident = resident_of(c);
  const plan::PlanGeometry g = full_plan(c);
  RealspaceRequest request;
  UsedGeometry used;
  const Image bf = realspace(*resident, g, request, used);
  EXPECT_FALSE(bf.is_float);
  EXPECT_EQ(bf.height, 5u);
  EXPECT_EQ(bf.width, 4u);
  ASSERT_TRUE(used.bright_field.has_value());
  EXPECT_DOUBLE_EQ(*used.outer_radius_px, std::max(1.0, used.bright_field->radius));
  EXPECT_FALSE(used.inner_radius_px.has_value());
  for (const RealspaceMode mode : {RealspaceMode::ABF, RealspaceMode::ADF, RealspaceMode::HAADF, RealspaceMode::DF}) {
    request.mode = mode;
    EXPECT_EQ(realspace(*resident, g, request, used).integer_values(), bf.integer_values());  // inner 0, outer 1: the BF disk
  }
  request.inner = 0.6;
  request.outer = 1.4;
  request.mode = RealspaceMode::ABF;
  const Image abf = realspace(*resident, g, request, used);
  EXPECT_DOUBLE_EQ(*used.inner_radius_px, 0.6 * used.bright_field->radius);
  for (const RealspaceMode mode : {RealspaceMode::ADF, RealspaceMode::HAADF, RealspaceMode::DF}) {
    request.mode = mode;
    EXPECT_EQ(realspace(*resident, g, request, used).integer_values(), abf.integer_values());
  }
}

TEST(RealspaceShape, SumsFittingUint32ComeNarrowAndLargerOnesStayExactInUint64) {
  DenseCase c = constant_case(1, 2, 4, 4, 1);
  ShapeRequest request;
  request.center_col = 1.5;
  request.center_row = 1.5;
  request.outer = 1.6;  // 12 pixels
  UsedGeometry used;
  const Image small = realspace_shape(*resident_of(c), full_plan(c), request, used);
  EXPECT_EQ(small.narrow_counts, (std::vector<std::uint32_t>{12, 12}));
  EXPECT_TRUE(small.counts.empty());
  c.dtype = DType::uint32;
  c.counts.assign(c.frames() * c.frame_pixels(), 0x80000000ull);  // 12 x 2^31 > 2^32 - 1
  const Image large = realspace_shape(*resident_of(c), full_plan(c), request, used);
  EXPECT_TRUE(large.narrow_counts.empty());  // never wrapped: the wire encoder reports the overflow
  EXPECT_EQ(large.counts, (std::vector<std::uint64_t>{12ull << 31, 12ull << 31}));
}

TEST(Realspace, OuterRadiusIsAtLeastOnePixelBeyondTheInner) {
  const DenseCase c = constant_case(1, 2, 9, 9, 1);
  const auto resident = resident_of(c);
  const plan::PlanGeometry g = full_plan(c);
  RealspaceRequest request;
  request.outer = 0.0;  // -> outer_px = inner_px + 1 = 1: the centre and its 4 neighbours
  request.center_row = 4.0;
  request.center_col = 4.0;
  UsedGeometry used;
  EXPECT_EQ(realspace(*resident, g, request, used).integer_values(), (std::vector<std::uint64_t>{5, 5}));
  EXPECT_DOUBLE_EQ(*used.outer_radius_px, 1.0);
  request.inner = std::nan("");  // Python max(0, nan) keeps 0
  request.outer = std::nan("");
  EXPECT_EQ(realspace(*resident, g, request, used).integer_values(), (std::vector<std::uint64_t>{5, 5}));
}

TEST(Realspace, CenterOfMassIsAbsoluteInBinnedPixelsAndZeroForEmptyFrames) {
  DenseCase c = constant_case(1, 3, 4, 6, 0);
  c.counts[0 * 24 + 1 * 6 + 5] = 3;  // frame 0: one pixel at (1, 5)
  c.counts[1 * 24 + 3 * 6 + 0] = 2;  // frame 1: (3, 0) and (0, 2)
  c.counts[1 * 24 + 0 * 6 + 2] = 2;  // frame 2 stays empty
  const auto resident = resident_of(c);
  const plan::PlanGeometry g = full_plan(c);
  RealspaceRequest request;
  UsedGeometry used;
  request.mode = RealspaceMode::CoMy;
  const Image com_row = realspace(*resident, g, request, used);
  EXPECT_TRUE(com_row.is_float);
  EXPECT_EQ(com_row.values, (std::vector<float>{1.0f, 1.5f, 0.0f}));
  request.mode = RealspaceMode::CoMx;
  EXPECT_EQ(realspace(*resident, g, request, used).values, (std::vector<float>{5.0f, 1.0f, 0.0f}));
  request.mode = RealspaceMode::CoMmag;
  const Image magnitude = realspace(*resident, g, request, used);
  EXPECT_FLOAT_EQ(magnitude.values[0], std::hypot(1.0f, 5.0f));
  EXPECT_FLOAT_EQ(magnitude.values[1], std::hypot(1.5f, 1.0f));
  request.mode = RealspaceMode::DPC;
  EXPECT_EQ(realspace(*resident, g, request, used).values, magnitude.values);
  // Detector bin 4: coordinates r / 4.
  plan::BrowsePlan binned;
  binned.detector_bin = 4;
  const plan::PlanGeometry gb = plan::resolve_plan(binned, 1, 3, 4, 6);
  request.mode = RealspaceMode::CoMx;
  EXPECT_EQ(realspace(*resident, gb, request, used).values, (std::vector<float>{1.0f, 0.0f, 0.0f}));
}

TEST(Realspace, IntegratedCenterOfMassOfAConstantFieldIsZero) {
  const DenseCase c = constant_case(4, 6, 5, 5, 2);
  const auto resident = resident_of(c);
  RealspaceRequest request;
  request.mode = RealspaceMode::iCoM;
  UsedGeometry used;
  const Image image = realspace(*resident, full_plan(c), request, used);
  ASSERT_EQ(image.values.size(), 24u);
  for (const float v : image.values) EXPECT_NEAR(v, 0.0f, 1e-6f);
}

TEST(PlanCaching, BrightFieldFitAndCenterOfMassAreComputedOncePerGeometry) {
  const DenseCase c = test::random_case("cache", DType::uint16, 6, 6, 11, 11, 9, 300, 0, 0);
  const auto resident = resident_of(c);
  const plan::PlanGeometry g = full_plan(c);
  plan::BrowsePlan binned;
  binned.scan_bin = 2;
  const plan::PlanGeometry gb = plan::resolve_plan(binned, 6, 6, 11, 11);
  UsedGeometry used;
  RealspaceRequest bf;
  realspace(*resident, g, bf, used);
  realspace(*resident, g, bf, used);
  EXPECT_EQ(resident->derived_cache().computations(), 1u);
  RealspaceRequest com;
  com.mode = RealspaceMode::CoMx;
  realspace(*resident, g, com, used);
  com.mode = RealspaceMode::CoMy;
  realspace(*resident, g, com, used);
  EXPECT_EQ(resident->derived_cache().computations(), 2u);
  realspace(*resident, gb, bf, used);
  EXPECT_EQ(resident->derived_cache().computations(), 3u);
  // Concurrent first requests for one plan compute it once.
  plan::BrowsePlan other;
  other.detector_bin = 2;
  const plan::PlanGeometry go = plan::resolve_plan(other, 6, 6, 11, 11);
  std::vector<std::thread> threads;
  std::vector<std::vector<std::uint64_t>> results(4);
  for (std::size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      UsedGeometry mine;
      results[t] = realspace(*resident, go, RealspaceRequest{}, mine).counts;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(resident->derived_cache().computations(), 4u);
  for (const auto& result : results) EXPECT_EQ(result, results[0]);
}

TEST(Determinism, OneAndTwoThreadsGiveIdenticalProducts) {
  const DenseCase c = test::random_case("threads", DType::uint16, 9, 7, 16, 15, 17, 700, 2, 5000);
  const auto one = resident_of(c, 1);
  const auto two = resident_of(c, 2);
  plan::BrowsePlan browse_plan;
  browse_plan.crop = plan::ScanRegion{1, 9, 0, 6};
  browse_plan.scan_bin = 3;
  browse_plan.detector_bin = 2;
  for (const plan::PlanGeometry& g : {full_plan(c), plan::resolve_plan(browse_plan, 9, 7, 16, 15)}) {
    for (const RealspaceMode mode : {RealspaceMode::BF, RealspaceMode::ADF, RealspaceMode::CoMx, RealspaceMode::iCoM}) {
      RealspaceRequest request;
      request.mode = mode;
      request.inner = 0.5;
      request.outer = 2.0;
      UsedGeometry used_one, used_two;
      const Image a = realspace(*one, g, request, used_one);
      const Image b = realspace(*two, g, request, used_two);
      EXPECT_EQ(a.counts, b.counts);
      EXPECT_EQ(a.values, b.values);
    }
    RegionRequest region;
    region.center_row = 1.0;
    region.center_col = 1.0;
    region.radius = 5.0;
    EXPECT_EQ(region_diffraction(*one, g, region).counts, region_diffraction(*two, g, region).counts);
  }
}

}  // namespace
}  // namespace quantem::products
