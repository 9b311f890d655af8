// Several realspace products of one plan computed together (the products
// route) against the one-product path, and the several-mask primitive behind
// them against one mask at a time, on CPU residents: every mode, several
// plans (crops inside and across frame groups, scan and detector bins),
// overlapping masks, and sums past uint32.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "dense_fixture.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/core/error.hpp"
#include "quantem/products/products.hpp"

namespace quantem::products {
namespace {

using test::DenseCase;

std::shared_ptr<backend::Resident> resident_of(const DenseCase& c, unsigned threads = 2) {
  const auto bytes = c.source_bytes();
  backend::CpuResidentOptions options;
  options.threads = threads;
  return backend::make_cpu_resident(c.acquisition(), bytes.data(), bytes.size(), options);
}

std::vector<plan::PlanGeometry> plans_of(const DenseCase& c) {
  std::vector<plan::BrowsePlan> plans(7);
  plans[1].crop = plan::ScanRegion{1, c.scan_rows - 1, 2, c.scan_cols};           // across groups
  plans[2].crop = plan::ScanRegion{0, 1, 1, 5};                                    // inside one group
  plans[3].scan_bin = 2;
  plans[4].detector_bin = 2;
  plans[5].crop = plan::ScanRegion{1, c.scan_rows, 0, c.scan_cols - 1};
  plans[5].scan_bin = 3;                                                           // partial edge bins
  plans[5].detector_bin = 3;
  plans[6].scan_bin = c.scan_rows;                                                 // one bin per row band
  std::vector<plan::PlanGeometry> geometries;
  for (const auto& p : plans) {
    geometries.push_back(plan::resolve_plan(p, c.scan_rows, c.scan_cols, c.detector_rows, c.detector_cols));
  }
  return geometries;
}

std::vector<RealspaceRequest> every_mode_request(bool given_centre) {
  struct Preset {
    RealspaceMode mode;
    double inner, outer;
  };
  const Preset presets[] = {{RealspaceMode::BF, 0, 1},       {RealspaceMode::ABF, 0.5, 1},  {RealspaceMode::ADF, 1, 3},
                            {RealspaceMode::HAADF, 2, 4},    {RealspaceMode::DF, 0.3, 5},   {RealspaceMode::CoMx, 0, 1},
                            {RealspaceMode::CoMy, 0, 1},     {RealspaceMode::CoMmag, 0, 1}, {RealspaceMode::DPC, 0, 1},
                            {RealspaceMode::iCoM, 0, 1}};
  std::vector<RealspaceRequest> requests;
  for (const Preset& p : presets) {
    RealspaceRequest r;
    r.mode = p.mode;
    r.inner = p.inner;
    r.outer = p.outer;
    if (given_centre) {
      r.center_row = 5.25;
      r.center_col = 6.5;
    }
    requests.push_back(r);
  }
  return requests;
}

void expect_same_image(const Image& together, const Image& single, const std::string& what) {
  EXPECT_EQ(together.height, single.height) << what;
  EXPECT_EQ(together.width, single.width) << what;
  EXPECT_EQ(together.is_float, single.is_float) << what;
  EXPECT_EQ(together.values, single.values) << what;  // float bits: exact equality
  EXPECT_EQ(together.narrow_counts, single.narrow_counts) << what;
  EXPECT_EQ(together.counts, single.counts) << what;
  EXPECT_EQ(together.value_divisor, single.value_divisor) << what;
}

void expect_same_geometry(const UsedGeometry& a, const UsedGeometry& b, const std::string& what) {
  EXPECT_EQ(a.center_row, b.center_row) << what;
  EXPECT_EQ(a.center_col, b.center_col) << what;
  EXPECT_EQ(a.inner_radius_px, b.inner_radius_px) << what;
  EXPECT_EQ(a.outer_radius_px, b.outer_radius_px) << what;
  ASSERT_EQ(a.bright_field.has_value(), b.bright_field.has_value()) << what;
  if (a.bright_field) {
    EXPECT_EQ(a.bright_field->center_row, b.bright_field->center_row) << what;
    EXPECT_EQ(a.bright_field->radius, b.bright_field->radius) << what;
  }
}

TEST(RealspaceTogether, EveryModeEqualsItsOneProductOnEveryPlan) {
  const DenseCase cases[] = {
      test::random_case("u16", DType::uint16, 9, 13, 14, 12, 3, 700, 3, 9000),
      test::random_case("u8", DType::uint8, 7, 10, 11, 11, 5, 40, 0, 0),
      test::random_case("u32", DType::uint32, 8, 9, 12, 10, 7, 90000, 2, 1u << 30, true),
  };
  for (const DenseCase& c : cases) {
    // Separate residents: nothing the one path caches helps the other.
    const auto single_resident = resident_of(c);
    const auto together_resident = resident_of(c);
    for (const bool given_centre : {false, true}) {
      const auto requests = every_mode_request(given_centre);
      for (const plan::PlanGeometry& g : plans_of(c)) {
        std::vector<UsedGeometry> used;
        const std::vector<Image> images = realspace_together(*together_resident, g, requests, used);
        ASSERT_EQ(images.size(), requests.size());
        ASSERT_EQ(used.size(), requests.size());
        for (std::size_t i = 0; i < requests.size(); ++i) {
          const std::string what = c.name + " " + plan::to_string(g) + " request " + std::to_string(i);
          UsedGeometry single_used;
          const Image single = realspace(*single_resident, g, requests[i], single_used);
          expect_same_image(images[i], single, what);
          expect_same_geometry(used[i], single_used, what);
        }
      }
    }
  }
}

TEST(RealspaceTogether, AnySubsetInAnyOrderAndTheFitOnce) {
  const DenseCase c = test::random_case("subset", DType::uint16, 6, 7, 12, 12, 11, 500, 1, 4000);
  const auto resident = resident_of(c);
  const auto reference = resident_of(c);
  const plan::PlanGeometry g = plans_of(c)[0];
  auto all = every_mode_request(false);
  const std::vector<RealspaceRequest> subset = {all[9], all[2], all[5], all[0]};  // iCoM, ADF, CoMx, BF
  std::vector<UsedGeometry> used;
  const auto images = realspace_together(*resident, g, subset, used);
  for (std::size_t i = 0; i < subset.size(); ++i) {
    UsedGeometry single_used;
    expect_same_image(images[i], realspace(*reference, g, subset[i], single_used), "subset " + std::to_string(i));
  }
  // The BF fit and the CoM maps (and iCoM) once each.
  EXPECT_EQ(resident->derived_cache().computations(), 3u);
  EXPECT_TRUE(realspace_together(*resident, g, {}, used).empty());
}

// Masks that overlap, nest, cover nothing or everything, from a seed.
std::vector<std::vector<std::uint8_t>> random_masks(std::size_t count, std::uint64_t pixels, std::uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<std::vector<std::uint8_t>> masks;
  for (std::size_t m = 0; m < count; ++m) {
    std::vector<std::uint8_t> mask(pixels, 0);
    const unsigned kind = m % 4;
    for (std::uint64_t p = 0; p < pixels; ++p) {
      if (kind == 0) mask[p] = random() % 3 == 0 ? 1 : 0;
      if (kind == 1) mask[p] = random() % 5 != 0 ? 7 : 0;  // any non-zero byte selects
      if (kind == 2) mask[p] = p < pixels / 2 ? 1 : 0;
      if (kind == 3) mask[p] = m == 3 ? 0 : 1;               // nothing, then everything
    }
    masks.push_back(std::move(mask));
  }
  return masks;
}

TEST(MaskedSumsTogether, EqualOneMaskAtATimeForAnyNumberOfMasks) {
  const DenseCase cases[] = {
      test::random_case("u16", DType::uint16, 7, 11, 13, 9, 21, 800, 2, 7000),
      test::random_case("u8", DType::uint8, 5, 6, 8, 8, 23, 30, 0, 0),
      test::random_case("u32", DType::uint32, 6, 5, 9, 9, 29, 70000, 1, 1u << 31, true),
  };
  for (const DenseCase& c : cases) {
    const auto resident = resident_of(c);
    for (const plan::PlanGeometry& g : plans_of(c)) {
      for (const std::size_t count : {1u, 2u, 3u, 6u, 7u, 8u, 11u}) {
        const auto masks = random_masks(count, g.detector_pixels(), count * 101 + g.scan_bin);
        const auto together = resident->masked_sums_u32(g, masks);
        ASSERT_EQ(together.size(), count);
        for (std::size_t m = 0; m < count; ++m) {
          const auto one = resident->masked_sum_u32(g, masks[m]);
          const std::string what = c.name + " " + plan::to_string(g) + " masks " + std::to_string(count) + " #" +
                                   std::to_string(m);
          ASSERT_EQ(together[m].has_value(), one.has_value()) << what;
          if (one) {
            EXPECT_EQ(*together[m], *one) << what;
          }
        }
      }
    }
  }
}

TEST(MaskedSumsTogether, ASumPastUint32IsNulloptForItsMaskOnly) {
  DenseCase c;
  c.name = "wide";
  c.dtype = DType::uint32;
  c.scan_rows = 2;
  c.scan_cols = 2;
  c.detector_rows = 4;
  c.detector_cols = 4;
  c.counts.assign(c.frames() * c.frame_pixels(), 1u << 30);
  const auto resident = resident_of(c);
  const plan::PlanGeometry g = plan::resolve_plan({}, 2, 2, 4, 4);
  std::vector<std::uint8_t> one_pixel(16, 0), all(16, 1);
  one_pixel[5] = 1;
  const auto sums = resident->masked_sums_u32(g, {one_pixel, all});
  ASSERT_TRUE(sums[0].has_value());
  EXPECT_EQ(*sums[0], std::vector<std::uint32_t>(4, 1u << 30));
  EXPECT_FALSE(sums[1].has_value());  // 16 * 2^30 per position

  // realspace_together keeps the exact uint64 sums there, as realspace does.
  RealspaceRequest bf;
  bf.outer = 100;  // the whole detector
  RealspaceRequest com;
  com.mode = RealspaceMode::CoMx;
  std::vector<UsedGeometry> used;
  const auto images = realspace_together(*resident, g, {com, bf}, used);
  EXPECT_TRUE(images[1].narrow_counts.empty());
  EXPECT_EQ(images[1].counts, std::vector<std::uint64_t>(4, std::uint64_t{16} << 30));
}

TEST(MaskedSumsTogether, EveryMaskIsCheckedAgainstThePlan) {
  const DenseCase c = test::random_case("checks", DType::uint16, 3, 3, 6, 6, 1, 100, 0, 0);
  const auto resident = resident_of(c);
  const plan::PlanGeometry g = plan::resolve_plan({}, 3, 3, 6, 6);
  const std::vector<std::uint8_t> good(g.detector_pixels(), 1), short_mask(g.detector_pixels() - 1, 1);
  try {
    resident->masked_sums_u32(g, {good, short_mask});
    FAIL() << "a mask of the wrong size was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::bad_request);
  }
  EXPECT_TRUE(resident->masked_sums_u32(g, {}).empty());
}

// A resident with only the required primitives (those of the CPU resident
// it wraps): masked_sums_u32 is the base class's default, one masked sum per
// mask, as on a backend without a several-mask walk (the CUDA resident).
class OneMaskAtATimeResident final : public backend::Resident {
 public:
  explicit OneMaskAtATimeResident(std::shared_ptr<backend::Resident> inner) : inner_(std::move(inner)) {}
  int device_index() const override { return inner_->device_index(); }
  std::uint64_t resident_bytes() const override { return inner_->resident_bytes(); }
  std::string encoding() const override { return "one-mask-at-a-time"; }
  DType resident_dtype() const override { return inner_->resident_dtype(); }
  const catalog::Acquisition& source() const override { return inner_->source(); }
  int masked_sum_calls = 0;

 protected:
  std::vector<std::uint64_t> compute_pattern_sum(const plan::PlanGeometry& g) override { return inner_->pattern_sum(g); }
  std::vector<std::uint64_t> compute_masked_sum(const plan::PlanGeometry& g,
                                                const std::vector<std::uint8_t>& mask) override {
    ++masked_sum_calls;
    return inner_->masked_sum(g, mask);
  }
  backend::CenterOfMassSums compute_center_of_mass_sums(const plan::PlanGeometry& g) override {
    return inner_->center_of_mass_sums(g);
  }
  std::vector<std::uint64_t> compute_frame(const plan::PlanGeometry& g, std::uint64_t row, std::uint64_t col) override {
    return inner_->frame(g, row, col);
  }
  std::vector<std::uint64_t> compute_region_reduce(const plan::PlanGeometry& g, const std::vector<std::uint64_t>& p,
                                                   backend::RegionReduce reduce) override {
    return inner_->region_reduce(g, p, reduce);
  }

 private:
  std::shared_ptr<backend::Resident> inner_;
};

TEST(MaskedSumsTogether, TheDefaultIsOneMaskedSumPerMaskWithTheSameValues) {
  const DenseCase c = test::random_case("default", DType::uint16, 7, 9, 12, 12, 31, 600, 2, 8000);
  const auto cpu = resident_of(c);
  OneMaskAtATimeResident wrapped(resident_of(c));
  for (const plan::PlanGeometry& g : plans_of(c)) {
    const auto requests = every_mode_request(false);
    wrapped.masked_sum_calls = 0;
    std::vector<UsedGeometry> used_default, used_cpu;
    const auto by_default = realspace_together(wrapped, g, requests, used_default);
    EXPECT_EQ(wrapped.masked_sum_calls, 5) << plan::to_string(g);  // BF, ABF, ADF, HAADF, DF
    const auto by_cpu = realspace_together(*cpu, g, requests, used_cpu);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      expect_same_image(by_default[i], by_cpu[i], plan::to_string(g) + " request " + std::to_string(i));
    }
  }
}

}  // namespace
}  // namespace quantem::products
