// Reservation growth while a load runs (LoadReservation), idle release with a
// fake clock, and placement / per-device LRU / growth on 2 and 3 devices,
// through the fake backend (fake_backend.hpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "fake_backend.hpp"
#include "quantem/residency/residency_manager.hpp"

using namespace quantem;
using namespace quantem::residency;
using quantem::test::fake_acquisition;
using quantem::test::FakeBackend;

namespace {

using namespace std::chrono_literals;

ResidencyOptions options(std::size_t entries = 8) {
  ResidencyOptions o;
  o.max_entries_per_device = entries;
  o.load_wait_limit = std::chrono::seconds(20);
  o.busy_wait_limit = std::chrono::seconds(20);
  return o;
}

std::string error_text(const std::function<void()>& fn, ErrorKind* kind = nullptr) {
  try {
    fn();
  } catch (const Error& error) {
    if (kind) *kind = error.kind();
    return error.what();
  }
  return "no error";
}

bool wait_until(const std::function<bool()>& condition) {
  for (int i = 0; i < 5000; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

std::string path_of(const std::string& name) { return "/fake/" + name + "_master.h5"; }

// Checks, at every granted grow, that the manager reserves at least what is
// alive on every device (residents + the load's temporaries).
struct ReservationWatch {
  std::atomic<int> grows{0};
  std::atomic<int> violations{0};
  void attach(FakeBackend& backend, ResidencyManager& manager) {
    backend.set_growth_observer([this, &backend, &manager](int, std::uint64_t) {
      ++grows;
      for (const auto& usage : manager.device_usage()) {
        if (usage.resident_bytes < backend.alive_bytes(usage.info.index)) ++violations;
      }
    });
  }
};

class FakeClock final : public ResidencyClock {
 public:
  std::chrono::steady_clock::time_point now() const override { return start_ + offset_.load(); }
  void advance(std::chrono::milliseconds by) { offset_ = offset_.load() + by; }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::atomic<std::chrono::milliseconds> offset_{std::chrono::milliseconds(0)};
};

}  // namespace

// ---- growth ------------------------------------------------------------------------

TEST(ReservationGrowth, GrowsWithinTheBudgetAndEndsAtTheResidentsRealSize) {
  FakeBackend backend({100});
  backend.set_estimate(path_of("grow"), 10, 30);  // provisional resident 10, staging 20
  backend.set_growth(path_of("grow"), {20, 25}, 60);
  ResidencyManager manager(backend, options());
  ReservationWatch watch;
  watch.attach(backend, manager);
  const auto lease = manager.acquire(fake_acquisition("grow"));
  EXPECT_EQ(lease->resident_bytes(), 60u);
  EXPECT_EQ(watch.grows, 2);
  EXPECT_EQ(watch.violations, 0);
  EXPECT_EQ(backend.resident_above_reservation(), 0);
  // Once loaded, the reservation is the resident's real size: the temporaries are gone.
  const auto usage = manager.device_usage()[0];
  EXPECT_EQ(usage.resident_bytes, 60u);
  EXPECT_EQ(backend.alive_bytes(0), 60u);
  const auto counters = manager.counters();
  EXPECT_EQ(counters.reservation_growths, 2u);
  EXPECT_EQ(counters.growth_refusals, 0u);
  EXPECT_EQ(counters.loads_completed, 1u);
}

TEST(ReservationGrowth, AdmissionReservesOnlyTheProvisionalPeakSoTwoLoadsShareADevice) {
  // Each needs 40 at the end; a dense bound of 90 each would never share the device.
  FakeBackend backend({100});
  backend.set_default_estimate(10, 20);
  backend.set_growth(path_of("one"), {20}, 40);
  backend.set_growth(path_of("two"), {20}, 40);
  ResidencyManager manager(backend, options());
  ReservationWatch watch;
  watch.attach(backend, manager);
  manager.acquire(fake_acquisition("one"));
  manager.acquire(fake_acquisition("two"));
  EXPECT_EQ(manager.status(fake_acquisition("one")).state, ResidencyState::resident);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 80u);
  EXPECT_EQ(watch.violations, 0);
}

TEST(ReservationGrowth, ReportsTheGrowingReservationWhileTheLoadRuns) {
  FakeBackend backend({100});
  backend.set_estimate(path_of("slow"), 10, 30);
  backend.set_growth(path_of("slow"), {40}, 50);
  ResidencyManager manager(backend, options());
  std::atomic<std::uint64_t> reserved_seen{0};
  backend.set_growth_observer([&](int, std::uint64_t reserved) {
    reserved_seen = manager.device_usage()[0].resident_bytes;
    EXPECT_EQ(reserved, 70u);
    EXPECT_EQ(manager.status(fake_acquisition("slow")).reserved_bytes, 70u);
    EXPECT_EQ(manager.status(fake_acquisition("slow")).state, ResidencyState::loading);
  });
  manager.acquire(fake_acquisition("slow"));
  EXPECT_EQ(reserved_seen.load(), 70u);  // admitted 30 + grown 40, reported as loading bytes
  EXPECT_EQ(manager.status(fake_acquisition("slow")).reserved_bytes, 50u);  // now the resident's real size
}

TEST(ReservationGrowth, EvictsAnIdleLeastRecentlyUsedResidentOnTheSameDeviceOnly) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(40, 40);
  backend.set_estimate(path_of("grow"), 10, 20);
  backend.set_growth(path_of("grow"), {50}, 60);
  ResidencyManager manager(backend, options());
  ReservationWatch watch;
  watch.attach(backend, manager);
  const auto a = fake_acquisition("a"), b = fake_acquisition("b"), c = fake_acquisition("c");
  manager.acquire(a);  // device 0, least recently used of all
  manager.acquire(b);  // device 1
  manager.acquire(c);  // device 0
  ASSERT_EQ(manager.status(b).device_index, 1);
  // Fewest entries: device 1. Admitted 20 next to b's 40; growing to 70 needs b's bytes.
  const auto lease = manager.acquire(fake_acquisition("grow"));
  EXPECT_EQ(lease->device_index(), 1);
  EXPECT_EQ(manager.status(b).state, ResidencyState::absent);
  EXPECT_EQ(manager.status(a).state, ResidencyState::resident);  // older, but on the other device
  EXPECT_EQ(manager.status(c).state, ResidencyState::resident);
  EXPECT_EQ(manager.device_usage()[1].resident_bytes, 60u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 80u);
  EXPECT_EQ(watch.violations, 0);
  EXPECT_EQ(manager.counters().evictions, 1u);
}

TEST(ReservationGrowth, NeverEvictsTheActiveAcquisitionItsAdmissionPreserved) {
  // The growth on device 0 cannot take the active acquisition there: the
  // attempt fails, and the load moves to device 1 asking for the size it
  // learned (room made there by the usual rules).
  FakeBackend backend({100, 100});
  backend.set_estimate(path_of("view"), 60, 60);
  backend.set_default_estimate(30, 30);
  backend.set_estimate(path_of("grow"), 10, 20);
  backend.set_growth(path_of("grow"), {40}, 50);
  ResidencyManager manager(backend, options());
  ReservationWatch watch;
  watch.attach(backend, manager);
  const auto view = fake_acquisition("view"), old = fake_acquisition("old"), recent = fake_acquisition("recent");
  manager.acquire(view);    // device 0
  manager.acquire(old);     // device 1
  manager.acquire(recent);  // device 1 (fill 30/100 below 60/100)
  ASSERT_EQ(manager.status(recent).device_index, 1);
  manager.mark_active(view.master_path);
  const auto lease = manager.acquire(fake_acquisition("grow"));  // fewest entries: device 0
  EXPECT_EQ(lease->device_index(), 1);
  EXPECT_EQ(lease->resident_bytes(), 50u);
  EXPECT_EQ(manager.status(view).state, ResidencyState::resident);
  EXPECT_EQ(manager.status(old).state, ResidencyState::absent);  // device 1's least recently used
  EXPECT_EQ(manager.status(recent).state, ResidencyState::resident);
  EXPECT_EQ(backend.loads()[3], std::make_pair(path_of("grow"), 0));
  EXPECT_EQ(backend.loads()[4], std::make_pair(path_of("grow"), 1));
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 60u);
  EXPECT_EQ(backend.alive_bytes(0), 60u);
  EXPECT_EQ(manager.device_usage()[1].resident_bytes, 80u);
  EXPECT_EQ(manager.counters().growth_refusals, 1u);
  EXPECT_EQ(watch.violations, 0);
}

TEST(ReservationGrowth, GrowthBeyondTheBudgetFailsWithTheTyped413AndFreesEverything) {
  FakeBackend backend({100});
  backend.set_estimate(path_of("other"), 30, 30);
  backend.set_estimate(path_of("huge"), 10, 20);
  backend.set_growth(path_of("huge"), {40, 70}, 120);
  ResidencyManager manager(backend, options());
  const auto other = fake_acquisition("other"), huge = fake_acquisition("huge");
  manager.acquire(other);
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(huge); }, &kind), kLoadDidNotFitMessage);
  EXPECT_EQ(kind, ErrorKind::payload_too_large);
  // Nothing half-loaded is served, its reservation and temporaries are gone,
  // the other resident is untouched (the refusal evicts nothing) and still served.
  EXPECT_EQ(manager.status(huge).state, ResidencyState::absent);
  EXPECT_FALSE(manager.find(huge));
  EXPECT_TRUE(manager.find(other));
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 30u);
  EXPECT_EQ(backend.alive_bytes(0), 30u);
  const auto counters = manager.counters();
  EXPECT_EQ(counters.growth_refusals, 1u);
  EXPECT_EQ(counters.reservation_growths, 1u);
  EXPECT_EQ(counters.evictions, 0u);
  EXPECT_EQ(counters.admission_rejections, 1u);
  EXPECT_EQ(counters.out_of_memory_retries, 0u);
}

TEST(ReservationGrowth, GrowthBlockedByAResidentInUseWaitsForItsLease) {
  FakeBackend backend({100});
  backend.set_estimate(path_of("used"), 50, 50);
  backend.set_estimate(path_of("grow"), 10, 20);
  backend.set_growth(path_of("grow"), {50}, 60);
  ResidencyManager manager(backend, options());
  ReservationWatch watch;
  watch.attach(backend, manager);
  auto lease = std::make_unique<ResidentLease>(manager.acquire(fake_acquisition("used")));
  manager.request_load(fake_acquisition("grow"));  // admitted: 50 + 20 fit; the growth to 70 needs "used"
  ASSERT_TRUE(backend.wait_loads(2));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(manager.status(fake_acquisition("grow")).state, ResidencyState::loading);
  lease.reset();
  ASSERT_TRUE(wait_until(
      [&] { return manager.status(fake_acquisition("grow")).state == ResidencyState::resident; }));
  EXPECT_EQ(manager.status(fake_acquisition("used")).state, ResidencyState::absent);
  EXPECT_EQ(watch.violations, 0);
}

TEST(ReservationGrowth, GrowthWaitingForAResidentInUseIsBounded) {
  FakeBackend backend({100});
  backend.set_estimate(path_of("used"), 50, 50);
  backend.set_estimate(path_of("grow"), 10, 20);
  backend.set_growth(path_of("grow"), {50}, 60);
  ResidencyOptions o = options();
  o.busy_wait_limit = 100ms;
  ResidencyManager manager(backend, o);
  const auto lease = manager.acquire(fake_acquisition("used"));
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(fake_acquisition("grow")); }, &kind), kLoadDidNotFitMessage);
  EXPECT_EQ(kind, ErrorKind::payload_too_large);
  EXPECT_EQ(manager.status(fake_acquisition("used")).state, ResidencyState::resident);
  EXPECT_EQ(backend.alive_bytes(0), 50u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 50u);
}

TEST(ReservationGrowth, ARefusedGrowthMovesToTheNextDeviceWithTheLearnedSize) {
  FakeBackend backend({100, 200});
  backend.set_estimate(path_of("first"), 10, 10);
  backend.set_estimate(path_of("big"), 10, 20);
  backend.set_growth(path_of("big"), {130}, 140);  // 150 at most: only device 1 can hold it
  ResidencyManager manager(backend, options());
  ReservationWatch watch;
  watch.attach(backend, manager);
  manager.acquire(fake_acquisition("first"));  // device 1 (the larger available peak), so "big" starts on device 0
  ASSERT_EQ(manager.status(fake_acquisition("first")).device_index, 1);
  const auto lease = manager.acquire(fake_acquisition("big"));
  EXPECT_EQ(lease->device_index(), 1);
  EXPECT_EQ(lease->resident_bytes(), 140u);
  const auto loads = backend.loads();
  ASSERT_EQ(loads.size(), 3u);
  EXPECT_EQ(loads[1], std::make_pair(path_of("big"), 0));
  EXPECT_EQ(loads[2], std::make_pair(path_of("big"), 1));
  EXPECT_EQ(backend.alive_bytes(0), 0u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 0u);
  EXPECT_EQ(manager.device_usage()[1].resident_bytes, 150u);
  EXPECT_EQ(manager.counters().growth_refusals, 1u);
  EXPECT_EQ(watch.violations, 0);
}

TEST(ReservationGrowth, CancellingALoadWhileItsGrowthWaitsFreesEverything) {
  FakeBackend backend({100});
  backend.set_estimate(path_of("used"), 50, 50);
  backend.set_estimate(path_of("grow"), 10, 20);
  backend.set_growth(path_of("grow"), {50}, 60);
  ResidencyManager manager(backend, options());
  const auto lease = manager.acquire(fake_acquisition("used"));
  const auto grow = fake_acquisition("grow");
  manager.request_load(grow);
  ASSERT_TRUE(backend.wait_loads(2));
  std::this_thread::sleep_for(50ms);  // the growth waits for "used"
  EXPECT_TRUE(manager.evict(grow));
  ASSERT_TRUE(wait_until([&] { return manager.device_usage()[0].resident_bytes == 50u; }));
  EXPECT_EQ(backend.alive_bytes(0), 50u);
  EXPECT_EQ(manager.status(grow).state, ResidencyState::absent);
  EXPECT_EQ(manager.status(fake_acquisition("used")).state, ResidencyState::resident);
  EXPECT_EQ(manager.counters().reservation_growths, 0u);
}

// ---- 2 and 3 devices ----------------------------------------------------------------

TEST(ReservationGrowth, TwoAndThreeDevicesPlaceEvictPerDeviceAndGrowOnTheirOwnDevice) {
  for (const std::size_t devices : {2u, 3u}) {
    SCOPED_TRACE(std::to_string(devices) + " devices");
    FakeBackend backend(std::vector<std::uint64_t>(devices, 100));
    backend.set_default_estimate(40, 40);
    backend.set_estimate(path_of("grow"), 10, 10);
    backend.set_growth(path_of("grow"), {70}, 75);
    ResidencyManager manager(backend, options(2));
    ReservationWatch watch;
    watch.attach(backend, manager);
    const int last = static_cast<int>(devices) - 1;
    // Placement: one per device (fewest entries), then a second on each.
    for (std::size_t i = 0; i < devices; ++i) {
      EXPECT_EQ(manager.acquire(fake_acquisition("r" + std::to_string(i)))->device_index(), static_cast<int>(i));
    }
    for (std::size_t i = 0; i < devices; ++i) {
      EXPECT_EQ(manager.acquire(fake_acquisition("s" + std::to_string(i)))->device_index(), static_cast<int>(i));
    }
    // Per-device LRU: device 0 is full (2 entries); its least recently used is
    // s0 once r0 is touched, although r1.. are older over all devices.
    manager.find(fake_acquisition("r0"));
    EXPECT_EQ(manager.acquire(fake_acquisition("h"))->device_index(), 0);
    EXPECT_EQ(manager.status(fake_acquisition("s0")).state, ResidencyState::absent);
    EXPECT_EQ(manager.status(fake_acquisition("r0")).state, ResidencyState::resident);
    for (std::size_t i = 1; i < devices; ++i) {
      EXPECT_EQ(manager.status(fake_acquisition("r" + std::to_string(i))).state, ResidencyState::resident);
    }
    // Growth on the last device evicts only there.
    manager.evict(fake_acquisition("s" + std::to_string(last)));
    const auto lease = manager.acquire(fake_acquisition("grow"));  // fewest entries: the last device
    EXPECT_EQ(lease->device_index(), last);
    EXPECT_EQ(manager.status(fake_acquisition("r" + std::to_string(last))).state, ResidencyState::absent);
    for (int i = 0; i < last; ++i) {
      EXPECT_EQ(manager.status(fake_acquisition("r" + std::to_string(i))).state, ResidencyState::resident);
      EXPECT_EQ(manager.device_usage()[static_cast<std::size_t>(i)].resident_bytes, 80u);
      EXPECT_EQ(backend.alive_bytes(i), 80u);
    }
    EXPECT_EQ(manager.device_usage()[static_cast<std::size_t>(last)].resident_bytes, 75u);
    EXPECT_EQ(backend.alive_bytes(last), 75u);
    EXPECT_EQ(watch.grows, 1);
    EXPECT_EQ(watch.violations, 0);
  }
}

// ---- idle release ----------------------------------------------------------------------

TEST(IdleRelease, ReleasesResidentsUnusedForTheConfiguredTimeAndReloadsThemOnTheNextRequest) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(30, 30);
  auto clock = std::make_shared<FakeClock>();
  ResidencyOptions o = options();
  o.idle_release = 30min;
  o.idle_check_interval = 1h;  // the background check stays out of the way: turns are stepped here
  o.clock = clock;
  ResidencyManager manager(backend, o);
  const auto a = fake_acquisition("a"), b = fake_acquisition("b");
  manager.acquire(a);  // device 0
  manager.acquire(b);  // device 1
  clock->advance(20min);
  manager.acquire(b);
  clock->advance(10min - 1ms);
  EXPECT_EQ(manager.release_idle_residents(), 0u);
  clock->advance(1ms);  // a: exactly 30 min unused
  EXPECT_EQ(manager.release_idle_residents(), 1u);
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);
  EXPECT_EQ(manager.status(b).state, ResidencyState::resident);
  EXPECT_EQ(backend.alive_bytes(0), 0u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 0u);
  EXPECT_EQ(backend.trims(), std::vector<int>{0});
  EXPECT_EQ(manager.counters().idle_releases, 1u);
  EXPECT_EQ(manager.counters().evictions, 1u);
  // The next request loads it again.
  EXPECT_TRUE(manager.acquire(a));
  EXPECT_EQ(backend.loads().size(), 3u);
  EXPECT_EQ(manager.status(a).state, ResidencyState::resident);
}

TEST(IdleRelease, NeverReleasesAResidentInUseOrALoadAndCountsFromTheLastUse) {
  FakeBackend backend({100});
  backend.set_default_estimate(30, 30);
  auto clock = std::make_shared<FakeClock>();
  ResidencyOptions o = options();
  o.idle_release = 30min;
  o.idle_check_interval = 1h;
  o.clock = clock;
  ResidencyManager manager(backend, o);
  const auto used = fake_acquisition("used"), loading = fake_acquisition("loading");
  auto lease = std::make_unique<ResidentLease>(manager.acquire(used));
  backend.hold(loading.master_path);
  manager.request_load(loading);
  clock->advance(2h);
  EXPECT_EQ(manager.release_idle_residents(), 0u);
  EXPECT_EQ(manager.status(used).state, ResidencyState::resident);
  EXPECT_EQ(manager.status(loading).state, ResidencyState::loading);
  lease.reset();  // the last use ends now
  clock->advance(29min);
  EXPECT_EQ(manager.release_idle_residents(), 0u);
  clock->advance(1min);
  EXPECT_EQ(manager.release_idle_residents(), 1u);
  EXPECT_EQ(manager.status(used).state, ResidencyState::absent);
  backend.release(loading.master_path);
}

TEST(IdleRelease, IsOffByDefault) {
  FakeBackend backend({100});
  auto clock = std::make_shared<FakeClock>();
  ResidencyOptions o = options();
  o.clock = clock;
  ResidencyManager manager(backend, o);
  manager.acquire(fake_acquisition("a"));
  clock->advance(std::chrono::hours(24 * 365));
  EXPECT_EQ(manager.release_idle_residents(), 0u);
  EXPECT_EQ(manager.status(fake_acquisition("a")).state, ResidencyState::resident);
  EXPECT_TRUE(backend.trims().empty());
}

TEST(IdleRelease, TheBackgroundCheckReleasesWithoutARequest) {
  FakeBackend backend({100});
  auto clock = std::make_shared<FakeClock>();
  ResidencyOptions o = options();
  o.idle_release = 90s;
  o.idle_check_interval = 5ms;
  o.clock = clock;
  ResidencyManager manager(backend, o);
  const auto a = fake_acquisition("a");
  manager.acquire(a);
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(manager.status(a).state, ResidencyState::resident);  // fake time has not moved
  clock->advance(90s);
  EXPECT_TRUE(wait_until([&] { return manager.status(a).state == ResidencyState::absent; }));
  EXPECT_TRUE(wait_until([&] { return backend.trims().size() == 1; }));
  EXPECT_EQ(manager.counters().idle_releases, 1u);
}
