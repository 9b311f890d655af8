// The residency manager over the real CPU backend: a uint32 acquisition whose
// counts need 32-bit codes grows its reservation while it loads (admitted at
// its 16-bit first pass), a budget between the two refuses it while loading
// with the typed 413 and frees everything, and idle release with a fake clock
// frees a resident that the next request loads again, identical.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/backend/tile_sums.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/plan/plan.hpp"
#include "quantem/residency/residency_manager.hpp"
#include "server_fixtures.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::residency;

namespace {

using namespace std::chrono_literals;

catalog::Acquisition wide_fixture(const test::TempDir& dir) {
  test::run_python_script("products_load_fixture.py",
                          "write " + dir.path() + " wide --dtype uint32 --scan 5x7 --det 7x5 --hot 100000 --no-expected");
  catalog::Acquisition acquisition = catalog::inspect_master(dir.file("wide_master.h5"));
  EXPECT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  return acquisition;
}

std::unique_ptr<backend::Backend> cpu_backend(std::uint64_t budget, int devices = 1) {
  backend::CpuBackendOptions options;
  options.threads = 2;
  options.virtual_devices = devices;
  options.budget_bytes_per_device = budget;
  return backend::make_cpu_backend(options);
}

class FakeClock final : public ResidencyClock {
 public:
  std::chrono::steady_clock::time_point now() const override { return start_ + offset_.load(); }
  void advance(std::chrono::milliseconds by) { offset_ = offset_.load() + by; }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::atomic<std::chrono::milliseconds> offset_{std::chrono::milliseconds(0)};
};

}  // namespace

TEST(CpuResidency, AUint32LoadGrowsItsReservationToThe32BitPassAndEndsAtItsResidentSize) {
  test::TempDir dir;
  const auto acquisition = wide_fixture(dir);
  const auto backend = cpu_backend(std::uint64_t{1} << 30);
  const backend::LoadEstimate estimate = backend->estimate_load(acquisition);
  ResidencyManager manager(*backend, ResidencyOptions{});
  const auto lease = manager.acquire(acquisition);
  EXPECT_EQ(lease->resident_dtype(), DType::uint32);
  EXPECT_GT(lease->resident_bytes(), estimate.resident_bytes);
  const auto counters = manager.counters();
  EXPECT_EQ(counters.reservation_growths, 1u);
  EXPECT_EQ(counters.growth_refusals, 0u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, lease->resident_bytes());
  EXPECT_EQ(manager.status(acquisition).reserved_bytes, lease->resident_bytes());
}

TEST(CpuResidency, ABudgetThatAdmitsTheFirstPassButNotThe32BitOneRefusesWhileGrowingAndFreesEverything) {
  test::TempDir dir;
  const auto acquisition = wide_fixture(dir);
  const backend::LoadEstimate estimate = cpu_backend(std::uint64_t{1} << 30)->estimate_load(acquisition);
  ASSERT_LT(estimate.transition_peak_bytes, estimate.max_transition_peak_bytes);
  const auto backend = cpu_backend(estimate.max_transition_peak_bytes - 1);
  const std::uint64_t code_bytes_before = backend::cpu_code_bytes_in_use();
  ResidencyManager manager(*backend, ResidencyOptions{});
  try {
    manager.acquire(acquisition);
    ADD_FAILURE() << "loaded past its budget";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::payload_too_large);
    EXPECT_EQ(std::string(error.what()), kLoadDidNotFitMessage);
  }
  EXPECT_EQ(manager.counters().growth_refusals, 1u);
  EXPECT_EQ(manager.status(acquisition).state, ResidencyState::absent);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 0u);
  EXPECT_EQ(backend::cpu_code_bytes_in_use(), code_bytes_before);
}

TEST(CpuResidency, IdleReleaseFreesTheResidentAndTheNextRequestLoadsItAgainIdentical) {
  test::TempDir dir;
  const auto master = test::write_synth(dir.file("sess"), "idle", 6, 5);
  const auto acquisition = catalog::inspect_master(master);
  ASSERT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  const auto backend = cpu_backend(std::uint64_t{1} << 30, 2);
  auto clock = std::make_shared<FakeClock>();
  ResidencyOptions options;
  options.idle_release = 30min;
  options.idle_check_interval = 1h;
  options.clock = clock;
  ResidencyManager manager(*backend, options);
  const std::uint64_t code_bytes_before = backend::cpu_code_bytes_in_use();
  const plan::PlanGeometry geometry = plan::resolve_plan({}, acquisition.scan_rows, acquisition.scan_cols,
                                                         acquisition.detector_rows, acquisition.detector_cols);
  std::vector<std::uint64_t> first_sum;
  {
    const auto lease = manager.acquire(acquisition);
    first_sum = lease->pattern_sum(geometry);
  }
  EXPECT_GT(backend::cpu_code_bytes_in_use(), code_bytes_before);
  clock->advance(29min);
  EXPECT_EQ(manager.release_idle_residents(), 0u);
  clock->advance(1min);
  EXPECT_EQ(manager.release_idle_residents(), 1u);
  EXPECT_EQ(manager.status(acquisition).state, ResidencyState::absent);
  EXPECT_EQ(backend::cpu_code_bytes_in_use(), code_bytes_before);
  EXPECT_EQ(manager.counters().idle_releases, 1u);
  const auto lease = manager.acquire(acquisition);
  EXPECT_EQ(lease->pattern_sum(geometry), first_sum);
  EXPECT_EQ(manager.counters().loads_completed, 2u);
}

// Tile sums through the manager: built in the background after the load is
// published, admitted on the CPU device's budget beside the resident and
// counted with it until it is dropped; a crop's summed pattern is the same
// with tile sums off.
TEST(CpuResidency, TileSumsAreBuiltAfterTheLoadCountedWithTheResidentAndDroppedWithIt) {
  test::TempDir dir;
  const auto master = test::write_synth(dir.file("sess"), "tiles", 40, 24);
  const auto acquisition = catalog::inspect_master(master);
  ASSERT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  const std::uint64_t table_bytes = backend::TileGrid::for_scan(40, 24).table_bytes(acquisition.frame_pixels());
  ASSERT_EQ(table_bytes, 3u * 2u * 64u * 8u);
  plan::BrowsePlan crop;
  crop.crop = plan::ScanRegion{3, 40, 5, 24};
  crop.detector_bin = 3;
  const plan::PlanGeometry geometry = plan::resolve_plan(crop, 40, 24, 8, 8);

  const auto backend = cpu_backend(std::uint64_t{1} << 30);
  std::vector<std::uint64_t> decoded;
  std::uint64_t resident_bytes = 0;
  {
    ResidencyOptions off;
    off.tile_sums = false;
    ResidencyManager manager(*backend, off);
    const auto lease = manager.acquire(acquisition);
    decoded = lease->pattern_sum(geometry);
    resident_bytes = lease->resident_bytes();
    EXPECT_EQ(manager.status(acquisition).tile_sums_state, "none");
    EXPECT_EQ(manager.device_usage()[0].resident_bytes, resident_bytes);
  }
  ResidencyManager manager(*backend, ResidencyOptions{});
  {
    const auto lease = manager.acquire(acquisition);
    ASSERT_EQ(lease->tile_sums().wait_settled(10s), backend::TileSumsState::ready) << lease->tile_sums().reason();
    const ResidencyStatus status = manager.status(acquisition);
    EXPECT_EQ(status.tile_sums_state, "ready");
    EXPECT_EQ(status.tile_sums_bytes, table_bytes);
    EXPECT_EQ(status.reserved_bytes, resident_bytes + table_bytes);
    EXPECT_EQ(manager.device_usage()[0].resident_bytes, resident_bytes + table_bytes);
    EXPECT_EQ(lease->pattern_sum(geometry), decoded);
    EXPECT_TRUE(manager.evict(acquisition));
    EXPECT_EQ(manager.device_usage()[0].resident_bytes, resident_bytes + table_bytes);  // draining while in use
    EXPECT_EQ(lease->pattern_sum(geometry), decoded);
  }
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 0u);
}
