// Region-first loads on the CPU backend, on acquisitions written by h5py with
// the official bitshuffle filter: a load asked for a middle band of scan rows
// first publishes its resident (LoadProgress::rows_held) while it goes on;
// crop products computed on it right then equal, value for value, those of
// the finished resident, of a resident loaded plainly, and what h5py reads.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/error.hpp"
#include "quantem/plan/plan.hpp"
#include "cpu_load_fixture.hpp"
#include "test_support.hpp"

namespace quantem::backend {
namespace {

using test::TempDir;

using test_fixture::cpu_backend;
using test_fixture::read_u64;
using test_fixture::write_fixture;

plan::PlanGeometry plan_of(const catalog::Acquisition& acquisition, std::optional<plan::ScanRegion> crop,
                           std::uint64_t scan_bin, std::uint64_t detector_bin) {
  plan::BrowsePlan browse;
  browse.crop = crop;
  browse.scan_bin = scan_bin;
  browse.detector_bin = detector_bin;
  return plan::resolve_plan(browse, acquisition.scan_rows, acquisition.scan_cols, acquisition.detector_rows,
                            acquisition.detector_cols);
}

// The band's rows and `columns` (3..30 unless given), scan bin 1 and 2 (a
// partial edge bin when the band has an odd count of rows), detector bin 1 and 2.
std::vector<plan::PlanGeometry> band_plans(const catalog::Acquisition& acquisition, ScanRows band,
                                           ScanColumns columns = ScanColumns{3, 30}) {
  std::vector<plan::PlanGeometry> plans;
  for (const std::uint64_t scan_bin : {1u, 2u}) {
    for (const std::uint64_t detector_bin : {1u, 2u}) {
      plans.push_back(plan_of(acquisition, plan::ScanRegion{band.first, band.end, columns.first, columns.end},
                              scan_bin, detector_bin));
    }
  }
  return plans;
}

// Every primitive of one plan, each result as uint64 values (a uint32 result
// widened; a nullopt narrowing as one value ~0).
using Products = std::vector<std::vector<std::uint64_t>>;

Products products_of(Resident& resident, const plan::PlanGeometry& g) {
  Products out;
  out.push_back(resident.pattern_sum(g));
  std::vector<std::uint8_t> mask(g.detector_pixels());
  for (std::size_t p = 0; p < mask.size(); ++p) mask[p] = p % 3 != 1 ? 1 : 0;
  const auto narrow = resident.masked_sum_u32(g, mask);
  out.push_back(narrow ? std::vector<std::uint64_t>(narrow->begin(), narrow->end())
                       : std::vector<std::uint64_t>{~std::uint64_t{0}});
  out.push_back(resident.masked_sum(g, mask));
  const CenterOfMassSums com = resident.center_of_mass_sums(g);
  out.push_back(com.total);
  out.push_back(com.row_moment);
  out.push_back(com.col_moment);
  out.push_back(resident.frame(g, 0, 0));
  out.push_back(resident.frame(g, g.scan_rows - 1, g.scan_cols - 1));
  std::vector<std::uint64_t> every(g.positions());
  for (std::uint64_t p = 0; p < every.size(); ++p) every[p] = p;
  out.push_back(resident.region_reduce(g, every, RegionReduce::max));
  out.push_back(resident.region_reduce(g, {0, g.positions() - 1}, RegionReduce::sum));
  return out;
}

std::vector<Products> all_products(Resident& resident, const std::vector<plan::PlanGeometry>& plans) {
  std::vector<Products> out;
  for (const plan::PlanGeometry& g : plans) out.push_back(products_of(resident, g));
  return out;
}

void expect_internal_error(const std::function<void()>& call, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << ": answered";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::internal) << what << ": " << error.what();
  }
}

// What a region-first load's rows_held calls saw.
struct Observed {
  std::vector<std::shared_ptr<Resident>> published;  // the resident of every call
  std::vector<std::uint64_t> held;                   // its rows held at each call
  bool whole_during_load = false;                    // some call saw every row held
  std::optional<std::vector<Products>> early;        // the band's products, at the first call holding it
  std::uint64_t held_when_computed = 0;
};

// progress.first_rows = band and a rows_held that, at the first call whose
// resident holds the band, computes every plan's products right there and
// checks that a plan over the scan's last row (not held yet: it comes last
// in the load's order) is refused; `then` runs after that, in that call.
void observe(LoadProgress& progress, Observed& seen, const catalog::Acquisition& acquisition, ScanRows band,
             const std::vector<plan::PlanGeometry>& plans, std::function<void(const std::shared_ptr<Resident>&)> then = {}) {
  progress.first_rows = band;
  progress.rows_held = [&seen, &acquisition, band, plans, then](const std::shared_ptr<Resident>& resident) {
    const HeldRows& held = resident->held_rows();
    seen.published.push_back(resident);
    seen.held.push_back(held.held());
    // Every row held would let an uncropped plan read the pattern sum the load fills at its end.
    if (held.holds_all()) seen.whole_during_load = true;
    if (seen.early || !held.holds(band)) return;
    seen.held_when_computed = held.held();
    seen.early = all_products(*resident, plans);
    const std::uint64_t last = acquisition.scan_rows - 1;
    const plan::PlanGeometry last_row = plan_of(acquisition, plan::ScanRegion{last, last + 1, 0, acquisition.scan_cols}, 1, 1);
    expect_internal_error([&] { resident->pattern_sum(last_row); }, "the last row's pattern sum");
    expect_internal_error([&] { resident->frame(last_row, 0, 0); }, "a frame of the last row");
    if (then) then(resident);
  };
}

// The pattern sum over the band at bin 1, and its first frame, from h5py's counts.
void expect_matches_h5py(const std::vector<Products>& products, const catalog::Acquisition& acquisition, ScanRows band,
                         const std::vector<std::uint64_t>& counts) {
  const std::uint64_t pixels = acquisition.frame_pixels();
  std::vector<std::uint64_t> pattern(pixels, 0);
  for (std::uint64_t r = band.first; r < band.end; ++r) {
    for (std::uint64_t c = 3; c < 30; ++c) {
      for (std::uint64_t p = 0; p < pixels; ++p) pattern[p] += counts[(r * acquisition.scan_cols + c) * pixels + p];
    }
  }
  const auto first = counts.begin() + static_cast<std::ptrdiff_t>((band.first * acquisition.scan_cols + 3) * pixels);
  EXPECT_EQ(products[0][0], pattern);  // scan bin 1, detector bin 1
  EXPECT_EQ(products[0][6], std::vector<std::uint64_t>(first, first + static_cast<std::ptrdiff_t>(pixels)));
}

// The whole check for one source: the load publishes early, the band's
// products then equal the finished and a plain load's, every call's resident
// is the one returned, and the rows held only grow.
void expect_region_first_load_exact(const TempDir& dir, const std::string& stem, const catalog::Acquisition& acquisition,
                                    DType resident_dtype) {
  const ScanRows band{5, 8};
  ASSERT_GE(acquisition.scan_rows, 10u);
  ASSERT_NE(acquisition.scan_cols % 32, 0u);
  const std::vector<plan::PlanGeometry> plans = band_plans(acquisition, band);
  Observed seen;
  LoadProgress progress;
  observe(progress, seen, acquisition, band, plans);
  const auto backend = cpu_backend(2);
  const std::shared_ptr<Resident> resident = backend->load(acquisition, 0, progress);
  EXPECT_EQ(resident->resident_dtype(), resident_dtype);
  EXPECT_EQ(progress.stage.load(), LoadStage::done);
  EXPECT_TRUE(resident->held_rows().holds_all());
  ASSERT_TRUE(seen.early.has_value()) << "the load never published its resident holding the band";
  EXPECT_GE(seen.held_when_computed, band.count());
  EXPECT_LT(seen.held_when_computed, acquisition.scan_rows);
  EXPECT_FALSE(seen.whole_during_load) << "a call saw every row held before the load finished its pattern sum";
  for (std::size_t call = 0; call < seen.published.size(); ++call) {
    EXPECT_EQ(seen.published[call], resident) << "call " << call << " published another resident";
    if (call > 0) {
      EXPECT_GT(seen.held[call], seen.held[call - 1]) << "call " << call;
    }
  }
  EXPECT_EQ(all_products(*resident, plans), *seen.early);
  LoadProgress plain_progress;
  const std::shared_ptr<Resident> plain = cpu_backend(2)->load(acquisition, 0, plain_progress);
  EXPECT_EQ(all_products(*plain, plans), *seen.early);
  expect_matches_h5py(*seen.early, acquisition, band, read_u64(dir.file(stem + "_expected.u64")));
  // The whole scan, uncropped, from the finished resident as from the plain one.
  const plan::PlanGeometry whole = plan_of(acquisition, std::nullopt, 1, 1);
  EXPECT_EQ(resident->pattern_sum(whole), plain->pattern_sum(whole));
}

TEST(CpuRegionFirstLoad, Uint16BandProductsOnTheEarlyResidentAreExact) {
  TempDir dir;
  const catalog::Acquisition acquisition = write_fixture(
      dir, "band16", "--scan 12x37 --det 16x14 --shard-frames 200,244 --mask '1,1;7,9' --masked-value 60000");
  expect_region_first_load_exact(dir, "band16", acquisition, DType::uint16);
}

TEST(CpuRegionFirstLoad, Uint8BandProductsOnTheEarlyResidentAreExact) {
  TempDir dir;
  const catalog::Acquisition acquisition =
      write_fixture(dir, "band8", "--dtype uint8 --scan 12x37 --det 12x10 --mask '0,0' --masked-value 99");
  expect_region_first_load_exact(dir, "band8", acquisition, DType::uint8);
}

// Counts above 65535: the 16-bit first pass is thrown away and never
// published; the 32-bit pass publishes the resident the load returns.
TEST(CpuRegionFirstLoad, Uint32WidePassPublishesOnlyTheResidentItReturns) {
  TempDir dir;
  const catalog::Acquisition acquisition =
      write_fixture(dir, "band32", "--dtype uint32 --scan 12x37 --det 10x9 --hot 100000 --mask '3,3' --masked-value 7");
  expect_region_first_load_exact(dir, "band32", acquisition, DType::uint32);
}

// A uint32 source whose counts fit 16 bits has only the first pass, whose
// codes could still have been rebuilt wider: it is published whole.
TEST(CpuRegionFirstLoad, Uint32NarrowedTo16BitsIsPublishedOnlyWhole) {
  TempDir dir;
  const catalog::Acquisition acquisition =
      write_fixture(dir, "narrow", "--dtype uint32 --scan 10x37 --det 8x7 --mask '2,2' --masked-value 200000");
  const ScanRows band{5, 8};
  const std::vector<plan::PlanGeometry> plans = band_plans(acquisition, band);
  Observed seen;
  LoadProgress progress;
  observe(progress, seen, acquisition, band, plans);
  const std::shared_ptr<Resident> resident = cpu_backend(2)->load(acquisition, 0, progress);
  EXPECT_EQ(resident->resident_dtype(), DType::uint16);
  EXPECT_TRUE(seen.published.empty());
  EXPECT_TRUE(resident->held_rows().holds_all());
  expect_matches_h5py(all_products(*resident, plans), acquisition, band, read_u64(dir.file("narrow_expected.u64")));
}

// Cancelled from inside the call that publishes the band: the load throws
// unavailable, and the resident it published (kept by the caller) still
// answers its held rows exactly and refuses the others; its bytes go with it.
TEST(CpuRegionFirstLoad, ACancelAfterPublishingLeavesThePublishedRowsExact) {
  TempDir dir;
  const catalog::Acquisition acquisition =
      write_fixture(dir, "cancel", "--scan 40x37 --det 16x14 --mask '4,4' --masked-value 500");
  const ScanRows band{17, 20};
  const std::vector<plan::PlanGeometry> plans = band_plans(acquisition, band);
  LoadProgress plain_progress;
  const std::shared_ptr<Resident> plain = cpu_backend(2)->load(acquisition, 0, plain_progress);
  const std::vector<Products> want = all_products(*plain, plans);
  const auto backend = cpu_backend(2);
  const std::uint64_t bytes_before = cpu_code_bytes_in_use();
  // 47 frame groups, the band's 5 first: a run whose other groups all end
  // before the band's last one has nothing left to cancel, and is retried.
  bool cancelled_midway = false;
  for (int attempt = 0; attempt < 5 && !cancelled_midway; ++attempt) {
    Observed seen;
    LoadProgress progress;
    std::shared_ptr<Resident> kept;
    observe(progress, seen, acquisition, band, plans, [&](const std::shared_ptr<Resident>& resident) {
      kept = resident;
      progress.cancel_requested = true;
    });
    try {
      (void)backend->load(acquisition, 0, progress);
      continue;
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::unavailable) << error.what();
    }
    cancelled_midway = true;
    EXPECT_EQ(progress.stage.load(), LoadStage::cancelled);
    ASSERT_NE(kept, nullptr);
    ASSERT_TRUE(seen.early.has_value());
    EXPECT_EQ(*seen.early, want);
    EXPECT_TRUE(kept->held_rows().holds(band));
    EXPECT_FALSE(kept->held_rows().holds_all());
    EXPECT_EQ(all_products(*kept, plans), want);
    const std::uint64_t last = acquisition.scan_rows - 1;
    expect_internal_error(
        [&] { kept->pattern_sum(plan_of(acquisition, plan::ScanRegion{last, last + 1, 0, acquisition.scan_cols}, 1, 1)); },
        "the last row after the cancel");
    expect_internal_error([&] { kept->pattern_sum(plan_of(acquisition, std::nullopt, 1, 1)); },
                          "the whole scan after the cancel");
    seen.published.clear();
    kept.reset();
    EXPECT_EQ(cpu_code_bytes_in_use(), bytes_before);
  }
  EXPECT_TRUE(cancelled_midway);
}

// Window-first: the band's rows at columns 40..60 of 100 come first; the
// first call holding that window (the band's rows are not whole yet: their
// other groups come after) answers every product of the window exactly and
// refuses the band's other columns.
TEST(CpuRegionFirstLoad, AWindowIsPublishedBeforeItsRowsAndItsProductsAreExact) {
  TempDir dir;
  const catalog::Acquisition acquisition =
      write_fixture(dir, "window", "--scan 12x100 --det 8x7 --mask '1,1' --masked-value 900");
  const ScanRows band{5, 8};
  const ScanColumns columns{40, 60};
  const std::vector<plan::PlanGeometry> plans = band_plans(acquisition, band, columns);
  const plan::PlanGeometry band_every_column =
      plan_of(acquisition, plan::ScanRegion{band.first, band.end, 0, acquisition.scan_cols}, 1, 1);
  std::optional<std::vector<Products>> early;
  bool rows_whole_then = true;
  LoadProgress progress;
  progress.first_rows = band;
  progress.first_columns = columns;
  progress.rows_held = [&](const std::shared_ptr<Resident>& resident) {
    if (early || !resident->held_rows().holds(ScanWindow{band, columns})) return;
    rows_whole_then = resident->held_rows().holds(band);
    early = all_products(*resident, plans);
    if (!rows_whole_then) {
      expect_internal_error([&] { resident->pattern_sum(band_every_column); }, "the band's every column");
    }
  };
  const std::shared_ptr<Resident> resident = cpu_backend(2)->load(acquisition, 0, progress);
  ASSERT_TRUE(early.has_value()) << "the load never published its resident holding the window";
  EXPECT_FALSE(rows_whole_then) << "the window was published only once its rows were whole";
  EXPECT_EQ(all_products(*resident, plans), *early);
  LoadProgress plain_progress;
  EXPECT_EQ(all_products(*cpu_backend(2)->load(acquisition, 0, plain_progress), plans), *early);
}

}  // namespace
}  // namespace quantem::backend
