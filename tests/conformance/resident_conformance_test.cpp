// One typed suite for every backend's Resident: each primitive, for many plan
// geometries (crops, scan and detector bins with partial edges), must equal
// the naive reference bit for bit and must not depend on the thread count.
// The CPU resident and the CUDA resident (on a GPU; its cases skip with a
// message on machines without one) run it.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dense_fixture.hpp"
#include "naive_reference.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/backend/cuda_backend.hpp"
#include "quantem/core/error.hpp"
#include "quantem/plan/plan.hpp"

namespace quantem::test {
namespace {

// Whether every value fits the wire's uint32 (a narrowed primitive answers exactly then).
bool fit_uint32(const std::vector<std::uint64_t>& values) {
  return std::all_of(values.begin(), values.end(),
                     [](std::uint64_t v) { return v <= std::numeric_limits<std::uint32_t>::max(); });
}

struct CpuResidentFactory {
  static std::shared_ptr<backend::Resident> make(const DenseCase& c, unsigned threads) {
    const std::vector<std::uint8_t> bytes = c.source_bytes();
    backend::CpuResidentOptions options;
    options.threads = threads;
    return backend::make_cpu_resident(c.acquisition(), bytes.data(), bytes.size(), options);
  }
  // Launch shapes to compare: the CPU resident's thread counts.
  static std::vector<unsigned> launch_shapes() { return {1, 2, 3}; }
  static std::string unavailable_reason() { return {}; }
  static constexpr bool kHoldsDenseCodes = true;
};

// The CUDA resident: the ANS-encoded groups on device 0. Its "launch shapes"
// are group layouts: one group for the whole scan with a seek point every 5
// frames (written by the encoder) and the default recent frames (a whole
// segment); groups of 7 frames with two per encoded batch (several device
// pieces), seek points at frames 3 and 6 (recorded by decoding the groups once
// more) and no recent frames (every frame decoded); and groups of 32 frames
// one per batch without seek points (every decode from a group's first frame)
// nor decode tables built at load (every decoding CTA builds its group's), with
// room for 3 recent frames (fewer than the lookahead and the segment).
struct CudaResidentFactory {
  static std::shared_ptr<backend::Resident> make(const DenseCase& c, unsigned shape) {
    const std::vector<std::uint8_t> bytes = c.source_bytes();
    backend::CudaResidentOptions options;
    if (shape == 1) {
      options.tuning.frames_per_seek_point = 5;
    } else if (shape == 2) {
      options.tuning.frames_per_group = 7;
      options.tuning.groups_per_batch = 2;
      options.tuning.frames_per_seek_point = 3;
      options.tuning.seek_points_from_encoder = false;
      options.tuning.recent_frames_max_bytes = backend::CudaLoadTuning::kNoRecentFrames;
    } else if (shape == 3) {
      options.tuning.recent_frames_max_bytes = 3 * c.frame_pixels() * dtype_size(c.dtype);
      options.tuning.frames_per_group = 32;
      options.tuning.groups_per_batch = 1;
      options.tuning.frames_per_seek_point = backend::CudaLoadTuning::kNoSeekPoints;
      options.tuning.decode_tables_at_load = false;
    }
    return backend::make_cuda_resident(c.acquisition(), bytes.data(), bytes.size(), options);
  }
  static std::vector<unsigned> launch_shapes() { return {1, 2, 3}; }
  static std::string unavailable_reason() {
    if (backend::cuda_device_count() == 0) {
      return "no CUDA device (or a build without CUDA): the CUDA resident's conformance cases are skipped";
    }
    return {};
  }
  static constexpr bool kHoldsDenseCodes = false;  // ANS-encoded: smaller than the dense codes
};

std::vector<DenseCase> dense_cases() {
  return {
      // uint16, odd detector, non-square scan, masked hot pixels.
      random_case("u16_odd", DType::uint16, 7, 5, 9, 11, 11, 900, 3, 60000),
      // uint8 near saturation.
      random_case("u8", DType::uint8, 6, 9, 8, 7, 12, 250, 2, 255),
      // uint32 with unmasked counts above 65535: held as 32-bit codes.
      random_case("u32_wide", DType::uint32, 5, 4, 6, 5, 13, 200000, 1, 3000000000ull, true),
      // uint32 whose only large counts are masked: narrowed to 16-bit codes.
      random_case("u32_narrow", DType::uint32, 4, 6, 7, 6, 14, 1000, 2, 70000),
      // Several frame groups with a partial last one (130 frames), crops crossing groups.
      random_case("u16_groups", DType::uint16, 13, 10, 5, 6, 15, 300, 1, 1000),
      // 45 frames: a second group of 13 lanes (one full block of 8 and 5 more), 42-pixel frames.
      random_case("u16_lanes", DType::uint16, 5, 9, 6, 7, 16, 5000, 2, 65535),
  };
}

std::vector<plan::BrowsePlan> plans_for(const DenseCase& c) {
  std::vector<plan::BrowsePlan> plans;
  plans.push_back({});
  plan::BrowsePlan rows_only;  // whole scan rows, not from the first
  rows_only.crop = plan::ScanRegion{1, c.scan_rows, 0, c.scan_cols};
  plans.push_back(rows_only);
  plan::BrowsePlan p;
  p.crop = plan::ScanRegion{1, c.scan_rows, 0, c.scan_cols - 1};
  plans.push_back(p);
  p.scan_bin = 2;
  p.detector_bin = 2;
  plans.push_back(p);
  plan::BrowsePlan q;
  q.scan_bin = 3;
  q.detector_bin = 4;
  plans.push_back(q);
  q.crop = plan::ScanRegion{0, 3, 1, 3};
  q.scan_bin = 3;
  q.detector_bin = 3;
  plans.push_back(q);
  plan::BrowsePlan whole;
  whole.scan_bin = std::max(c.scan_rows, c.scan_cols);
  whole.detector_bin = std::max(c.detector_rows, c.detector_cols);
  plans.push_back(whole);
  return plans;
}

std::vector<std::vector<std::uint8_t>> masks_for(const plan::PlanGeometry& g, std::uint64_t seed) {
  const std::uint64_t n = g.detector_pixels();
  std::mt19937_64 random(seed);
  std::vector<std::vector<std::uint8_t>> masks;
  masks.emplace_back(n, 0);  // empty
  masks.emplace_back(n, 1);  // full
  for (const double density : {0.2, 0.85}) {  // sparse, and dense (summed as total - complement)
    std::vector<std::uint8_t> mask(n);
    std::bernoulli_distribution in(density);
    for (auto& m : mask) m = in(random) ? 1 : 0;
    masks.push_back(mask);
  }
  std::vector<std::uint8_t> disk(n);
  for (std::uint64_t r = 0; r < g.detector_rows; ++r)
    for (std::uint64_t c = 0; c < g.detector_cols; ++c) {
      const double dr = static_cast<double>(r) - static_cast<double>(g.detector_rows) / 2.0;
      const double dc = static_cast<double>(c) - static_cast<double>(g.detector_cols) / 2.0;
      disk[r * g.detector_cols + c] = dr * dr + dc * dc <= 4.0 ? 1 : 0;
    }
  masks.push_back(disk);
  return masks;
}

template <class Factory>
class ResidentConformance : public ::testing::Test {};

using Backends = ::testing::Types<CpuResidentFactory, CudaResidentFactory>;

#define QUANTEM_SKIP_UNAVAILABLE_BACKEND()                                          \
  do {                                                                              \
    if (const std::string reason = TypeParam::unavailable_reason(); !reason.empty()) \
      GTEST_SKIP() << reason;                                                       \
  } while (0)
TYPED_TEST_SUITE(ResidentConformance, Backends);

TYPED_TEST(ResidentConformance, HoldsNativeTypesAndNarrowsUint32OnlyWhenLossless) {
  QUANTEM_SKIP_UNAVAILABLE_BACKEND();
  for (const DenseCase& c : dense_cases()) {
    const auto resident = TypeParam::make(c, 2);
    const DType expected = c.name == "u32_wide" ? DType::uint32 : c.name == "u8" ? DType::uint8 : DType::uint16;
    EXPECT_EQ(resident->resident_dtype(), expected) << c.name;
    if (TypeParam::kHoldsDenseCodes) {
      EXPECT_GE(resident->resident_bytes(), c.frames() * c.frame_pixels() * dtype_size(expected)) << c.name;
    } else {
      EXPECT_GT(resident->resident_bytes(), 0u) << c.name;
    }
    EXPECT_EQ(resident->source().scan_rows, c.scan_rows);
    EXPECT_EQ(resident->source().masked_pixel_count, c.acquisition().masked_pixel_count);
    EXPECT_GT(resident->source().masked_pixel_count, 0u);
  }
}

TYPED_TEST(ResidentConformance, EveryPrimitiveMatchesTheNaiveReferenceForEveryGeometry) {
  QUANTEM_SKIP_UNAVAILABLE_BACKEND();
  for (const DenseCase& c : dense_cases()) {
    const std::vector<std::uint64_t> content = c.masked_counts();
    for (const unsigned threads : TypeParam::launch_shapes()) {
      const auto resident = TypeParam::make(c, threads);
      for (const plan::BrowsePlan& browse_plan : plans_for(c)) {
        const plan::PlanGeometry g =
            plan::resolve_plan(browse_plan, c.scan_rows, c.scan_cols, c.detector_rows, c.detector_cols);
        const NaiveReference reference(content, g);
        const std::string where = c.name + " threads=" + std::to_string(threads) + " " + plan::to_string(g);

        EXPECT_EQ(resident->pattern_sum(g), reference.pattern_sum()) << where;
        std::uint64_t seed = 1;
        for (const auto& mask : masks_for(g, seed++)) {
          const std::vector<std::uint64_t> want = reference.masked_sum(mask);
          EXPECT_EQ(resident->masked_sum(g, mask), want) << where;
          // Narrowed to uint32 exactly when every sum fits; never wrapped.
          const bool fits = fit_uint32(want);
          const auto narrow = resident->masked_sum_u32(g, mask);
          ASSERT_EQ(narrow.has_value(), fits) << where;
          if (narrow) {
            EXPECT_EQ(std::vector<std::uint64_t>(narrow->begin(), narrow->end()), want) << where;
          }
        }
        // Every mask at once, as a product strip asks (several passes when
        // there are more masks than one pass takes): the same images.
        const std::vector<std::vector<std::uint8_t>> masks = masks_for(g, 1);
        const auto together = resident->masked_sums_u32(g, masks);
        ASSERT_EQ(together.size(), masks.size()) << where;
        for (std::size_t m = 0; m < masks.size(); ++m) {
          const std::vector<std::uint64_t> want = reference.masked_sum(masks[m]);
          ASSERT_EQ(together[m].has_value(), fit_uint32(want)) << where << " together, mask " << m;
          if (together[m]) {
            EXPECT_EQ(std::vector<std::uint64_t>(together[m]->begin(), together[m]->end()), want)
                << where << " together, mask " << m;
          }
        }
        const backend::CenterOfMassSums got = resident->center_of_mass_sums(g);
        const backend::CenterOfMassSums want = reference.center_of_mass_sums();
        EXPECT_EQ(got.total, want.total) << where;
        EXPECT_EQ(got.row_moment, want.row_moment) << where;
        EXPECT_EQ(got.col_moment, want.col_moment) << where;
        for (std::uint64_t row = 0; row < g.scan_rows; ++row)
          for (std::uint64_t col = 0; col < g.scan_cols; ++col)
            ASSERT_EQ(resident->frame(g, row, col), reference.frame(row, col)) << where << " at " << row << "," << col;

        std::vector<std::uint64_t> all(g.positions());
        for (std::uint64_t p = 0; p < g.positions(); ++p) all[p] = p;
        std::vector<std::uint64_t> some = {g.positions() - 1, 0, g.positions() / 2};
        std::sort(some.begin(), some.end());
        some.erase(std::unique(some.begin(), some.end()), some.end());
        std::reverse(some.begin(), some.end());  // any order
        for (const auto& positions : {all, some}) {
          for (const auto reduce : {backend::RegionReduce::sum, backend::RegionReduce::max}) {
            const std::vector<std::uint64_t> region = reference.region_reduce(positions, reduce);
            const std::string what = where + (reduce == backend::RegionReduce::sum ? " sum" : " max");
            EXPECT_EQ(resident->region_reduce(g, positions, reduce), region) << what;
            // Narrowed to uint32 exactly when every value fits; never wrapped.
            const bool fits = fit_uint32(region);
            const auto narrow = resident->region_reduce_u32(g, positions, reduce);
            ASSERT_EQ(narrow.has_value(), fits) << what;
            if (narrow) {
              EXPECT_EQ(std::vector<std::uint64_t>(narrow->begin(), narrow->end()), region) << what << " (uint32)";
            }
          }
        }
      }
    }
  }
}

// A viewer asks for frames along a row, back and forth, and anywhere: every
// order (the CUDA resident's recent frames hit, miss, refill) gives the
// reference's frame, wide and narrowed.
TYPED_TEST(ResidentConformance, FramesInAnyOrderMatchTheReference) {
  QUANTEM_SKIP_UNAVAILABLE_BACKEND();
  for (const DenseCase& c : dense_cases()) {
    const std::vector<std::uint64_t> content = c.masked_counts();
    for (const unsigned shape : TypeParam::launch_shapes()) {
      const auto resident = TypeParam::make(c, shape);
      std::vector<plan::BrowsePlan> plans(3);
      plans[1].crop = plan::ScanRegion{1, c.scan_rows, 1, c.scan_cols};
      plans[2].detector_bin = 2;
      for (const plan::BrowsePlan& browse_plan : plans) {
        const plan::PlanGeometry g =
            plan::resolve_plan(browse_plan, c.scan_rows, c.scan_cols, c.detector_rows, c.detector_cols);
        const NaiveReference reference(content, g);
        std::vector<std::uint64_t> order(g.positions());
        for (std::uint64_t p = 0; p < order.size(); ++p) order[p] = p;
        std::vector<std::uint64_t> walk = order;                       // forward
        walk.insert(walk.end(), order.rbegin(), order.rend());         // backward
        std::mt19937_64 random(shape * 131 + g.positions());
        std::shuffle(order.begin(), order.end(), random);
        walk.insert(walk.end(), order.begin(), order.end());           // anywhere
        walk.insert(walk.end(), {0, 0, g.positions() - 1, 0});         // repeats
        const std::string where = c.name + " shape=" + std::to_string(shape) + " " + plan::to_string(g);
        for (std::size_t k = 0; k < walk.size(); ++k) {
          const std::uint64_t row = walk[k] / g.scan_cols, col = walk[k] % g.scan_cols;
          const std::vector<std::uint64_t> want = reference.frame(row, col);
          if (k % 2 == 0) {
            ASSERT_EQ(resident->frame(g, row, col), want) << where << " at " << row << "," << col;
          } else {
            const auto narrow = resident->frame_u32(g, row, col);
            const bool fits = fit_uint32(want);
            ASSERT_EQ(narrow.has_value(), fits) << where;
            if (narrow) {
              ASSERT_EQ(std::vector<std::uint64_t>(narrow->begin(), narrow->end()), want)
                  << where << " at " << row << "," << col << " (uint32)";
            }
          }
        }
      }
    }
  }
}

TYPED_TEST(ResidentConformance, MaskedPixelsAreZeroBeforeAnySum) {
  QUANTEM_SKIP_UNAVAILABLE_BACKEND();
  const DenseCase c = random_case("masked", DType::uint16, 3, 3, 5, 5, 21, 100, 4, 65535);
  const auto resident = TypeParam::make(c, 2);
  const plan::PlanGeometry g = plan::resolve_plan({}, 3, 3, 5, 5);
  const std::vector<std::uint64_t> pattern = resident->pattern_sum(g);
  for (std::uint64_t p = 0; p < c.frame_pixels(); ++p) {
    if (c.pixel_mask[p] != 0) {
      EXPECT_EQ(pattern[p], 0u) << "masked pixel " << p;
    }
  }
  EXPECT_EQ(resident->masked_sum(g, c.pixel_mask), std::vector<std::uint64_t>(9, 0));
}

TYPED_TEST(ResidentConformance, ConcurrentCallsOnOneResidentAgree) {
  QUANTEM_SKIP_UNAVAILABLE_BACKEND();
  const DenseCase c = random_case("concurrent", DType::uint16, 8, 8, 12, 12, 31, 500, 1, 7);
  plan::BrowsePlan browse_plan;
  browse_plan.scan_bin = 3;
  const plan::PlanGeometry g = plan::resolve_plan(browse_plan, 8, 8, 12, 12);
  const NaiveReference reference(c.masked_counts(), g);
  const plan::PlanGeometry native = plan::resolve_plan({}, 8, 8, 12, 12);
  const NaiveReference native_reference(c.masked_counts(), native);
  const auto masks = masks_for(g, 5);
  for (const unsigned shape : TypeParam::launch_shapes()) {
    const auto resident = TypeParam::make(c, shape);
    std::vector<std::thread> threads;
    std::vector<int> mismatches(4, 0);
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        int& wrong = mismatches[static_cast<std::size_t>(t)];
        for (int round = 0; round < 20; ++round) {
          const auto& mask = masks[static_cast<std::size_t>(round + t) % masks.size()];
          if (resident->masked_sum(g, mask) != reference.masked_sum(mask)) ++wrong;
          if (resident->center_of_mass_sums(g).total != reference.center_of_mass_sums().total) ++wrong;
          // Frames at scan bin 1 from every thread: the CUDA resident's recent frames are shared.
          const auto row = static_cast<std::uint64_t>(round * 3 + t) % 8;
          const auto col = static_cast<std::uint64_t>(round + t) % 8;
          if (resident->frame(native, row, col) != native_reference.frame(row, col)) ++wrong;
          const auto narrow = resident->frame_u32(native, col, row);
          if (!narrow || std::vector<std::uint64_t>(narrow->begin(), narrow->end()) != native_reference.frame(col, row))
            ++wrong;
        }
      });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(mismatches, std::vector<int>(4, 0)) << "shape " << shape;
  }
}

// Tile sums (backend/tile_sums.hpp) built from the resident's own primitives:
// with the table ready, pattern sums of crops at every alignment against the
// 16-position tiles (inside one tile, across tiles, on tile edges, touching
// the scan's edges, one row, one column) and region sums over rectangles of
// plan positions (scan bins with partial edge bins, detector bins) equal the
// naive reference, for 8-, 16- and 32-bit sources.
TYPED_TEST(ResidentConformance, TileSumsGiveTheReferenceSumsOfCropsAtEveryAlignment) {
  QUANTEM_SKIP_UNAVAILABLE_BACKEND();
  const std::vector<DenseCase> cases = {
      random_case("tiles_u8", DType::uint8, 33, 18, 4, 3, 41, 200, 1, 255),
      random_case("tiles_u16", DType::uint16, 37, 35, 3, 4, 42, 3000, 1, 65535, true),
      random_case("tiles_u32", DType::uint32, 20, 34, 3, 3, 43, 200000, 1, 3000000000ull, true),
  };
  for (const DenseCase& c : cases) {
    const std::vector<std::uint64_t> content = c.masked_counts();
    const auto resident = TypeParam::make(c, TypeParam::launch_shapes().front());
    backend::build_tile_sums(resident);
    ASSERT_EQ(resident->tile_sums().state(), backend::TileSumsState::ready) << resident->tile_sums().reason();
    const std::vector<std::uint64_t> row_marks = {0, 1, 15, 16, 17, 32, c.scan_rows - 1, c.scan_rows};
    const std::vector<std::uint64_t> col_marks = {0, 1, 15, 16, 17, c.scan_cols - 1, c.scan_cols};
    for (std::size_t a = 0; a < row_marks.size(); ++a)
      for (std::size_t b = a + 1; b < row_marks.size(); ++b)
        for (std::size_t i = 0; i < col_marks.size(); ++i)
          for (std::size_t j = i + 1; j < col_marks.size(); ++j) {
            if (row_marks[b] > c.scan_rows || row_marks[a] >= row_marks[b] || col_marks[i] >= col_marks[j]) continue;
            plan::BrowsePlan browse_plan;
            browse_plan.crop = plan::ScanRegion{row_marks[a], row_marks[b], col_marks[i], col_marks[j]};
            const std::uint64_t longest = std::max(row_marks[b] - row_marks[a], col_marks[j] - col_marks[i]);
            browse_plan.scan_bin = (a + i) % 3 == 0 ? std::min<std::uint64_t>(3, longest) : 1;
            browse_plan.detector_bin = (b + j) % 2 == 0 ? 2 : 1;
            const plan::PlanGeometry g =
                plan::resolve_plan(browse_plan, c.scan_rows, c.scan_cols, c.detector_rows, c.detector_cols);
            const NaiveReference reference(content, g);
            const std::string where = c.name + " " + plan::to_string(g);
            EXPECT_EQ(resident->pattern_sum(g), reference.pattern_sum()) << where;
            std::vector<std::uint64_t> all(g.positions());
            for (std::uint64_t p = 0; p < g.positions(); ++p) all[p] = p;
            EXPECT_EQ(resident->region_reduce(g, all, backend::RegionReduce::sum),
                      reference.region_reduce(all, backend::RegionReduce::sum))
                << where;
          }
  }
}

TYPED_TEST(ResidentConformance, RejectsForeignGeometriesAndOutOfRangeArguments) {
  QUANTEM_SKIP_UNAVAILABLE_BACKEND();
  const DenseCase c = random_case("errors", DType::uint8, 4, 5, 6, 7, 41, 100, 0, 0);
  const auto resident = TypeParam::make(c, 2);
  const plan::PlanGeometry foreign = plan::resolve_plan({}, 5, 4, 6, 7);
  const auto kind_of = [](auto&& call) {
    try {
      call();
    } catch (const Error& error) {
      return error.kind();
    }
    return ErrorKind::forbidden;  // "did not throw"
  };
  EXPECT_EQ(kind_of([&] { resident->pattern_sum(foreign); }), ErrorKind::internal);
  plan::PlanGeometry forged = plan::resolve_plan({}, 4, 5, 6, 7);
  forged.scan_rows = 3;
  EXPECT_EQ(kind_of([&] { resident->center_of_mass_sums(forged); }), ErrorKind::internal);
  const plan::PlanGeometry g = plan::resolve_plan({}, 4, 5, 6, 7);
  EXPECT_EQ(kind_of([&] { resident->masked_sum(g, std::vector<std::uint8_t>(41, 1)); }), ErrorKind::bad_request);
  EXPECT_EQ(kind_of([&] { resident->frame(g, 4, 0); }), ErrorKind::bad_request);
  EXPECT_EQ(kind_of([&] { resident->region_reduce(g, {20}, backend::RegionReduce::sum); }), ErrorKind::bad_request);
  EXPECT_EQ(kind_of([&] { resident->region_reduce(g, {3, 1, 3}, backend::RegionReduce::max); }), ErrorKind::bad_request);
}

}  // namespace
}  // namespace quantem::test
