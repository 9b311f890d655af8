// Admission, placement, LRU, pins, out-of-memory retries, bounded waits and
// per-device loaders, through a fake backend with injected faults
// (the reference's admission and eviction behaviours, adapted to one resident
// per acquisition).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <ostream>
#include <thread>

#include "fake_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/plan/plan.hpp"
#include "quantem/residency/residency_manager.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::residency;
using quantem::test::FakeBackend;
using quantem::test::fake_acquisition;

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

bool wait_for_state(ResidencyManager& manager, const catalog::Acquisition& a, ResidencyState state) {
  for (int i = 0; i < 5000; ++i) {
    if (manager.status(a).state == state) return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

bool wait_until(const std::function<bool()>& condition) {
  for (int i = 0; i < 5000; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

std::vector<std::pair<std::string, int>> loads(std::initializer_list<std::pair<const char*, int>> expected) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [name, device] : expected) out.emplace_back(std::string("/fake/") + name + "_master.h5", device);
  return out;
}

}  // namespace

// ---- capacity telemetry (items 2-5) ------------------------------------------------

TEST(ResidencyManager, CapacityFollowsTheReferenceModel) {
  FakeBackend backend({100});
  backend.set_estimate("/fake/active_master.h5", 30, 30);
  backend.set_estimate("/fake/other_master.h5", 20, 20);
  ResidencyManager manager(backend, options());
  const auto active = fake_acquisition("active"), other = fake_acquisition("other");
  manager.acquire(active);
  manager.acquire(other);
  manager.mark_active(active.master_path);
  auto usage = manager.device_usage()[0];
  EXPECT_EQ(usage.resident_bytes, 50u);
  EXPECT_EQ(usage.active_resident_bytes, 30u);
  EXPECT_EQ(usage.evictable_bytes, 20u);
  EXPECT_EQ(usage.available_peak_bytes, 100u);  // free memory unknown: the budget
  EXPECT_EQ(usage.available_resident_bytes, 70u);
  backend.set_free(0, 10);
  usage = manager.device_usage()[0];
  EXPECT_EQ(usage.free_bytes, 10u);
  EXPECT_EQ(usage.available_peak_bytes, 30u);  // free 10 + evictable 20
  EXPECT_EQ(usage.available_resident_bytes, 70u);
}

TEST(ResidencyManager, WorkingMemoryIsAdmittedBesideTheResidentsAndCountedUntilReleased) {
  FakeBackend backend({100});
  backend.set_estimate("/fake/a_master.h5", 60, 60);
  backend.set_estimate("/fake/b_master.h5", 30, 30);
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a"), b = fake_acquisition("b");
  const auto lease = manager.acquire(a);
  ErrorKind kind{};
  const std::string refused = error_text([&] { manager.admit_working_memory(0, 41, "the export of a"); }, &kind);
  EXPECT_EQ(kind, ErrorKind::payload_too_large);
  EXPECT_NE(refused.find("the export of a needs 41 bytes"), std::string::npos) << refused;
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 60u);  // a refusal holds nothing
  WorkingMemoryGrant grant = manager.admit_working_memory(0, 40, "the export of a");
  EXPECT_EQ(grant.bytes(), 40u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 100u);
  // A load that needs the granted bytes waits for them (like pinned bytes), then loads.
  auto loading = std::async(std::launch::async, [&] { return bool(manager.acquire(b)); });
  EXPECT_EQ(loading.wait_for(100ms), std::future_status::timeout);
  EXPECT_EQ(manager.status(b).state, ResidencyState::absent);
  grant = WorkingMemoryGrant{};
  EXPECT_TRUE(loading.get());
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 90u);
  EXPECT_THROW(manager.admit_working_memory(7, 1, "x"), Error);
}

TEST(ResidencyManager, ALoadOfExactlyTheAdvertisedCapacityIsAdmittedNextToTheActiveOne) {
  FakeBackend backend({100});
  backend.set_estimate("/fake/active_master.h5", 30, 30);
  backend.set_estimate("/fake/other_master.h5", 20, 20);
  ResidencyManager manager(backend, options());
  const auto active = fake_acquisition("active"), other = fake_acquisition("other");
  manager.acquire(active);
  manager.acquire(other);
  manager.mark_active(active.master_path);
  backend.set_free(0, 10);
  const auto usage = manager.device_usage()[0];
  const backend::LoadEstimate exact{*usage.available_resident_bytes, *usage.available_peak_bytes};
  EXPECT_TRUE(is_candidate(usage, exact));
  EXPECT_FALSE(is_candidate(usage, {exact.resident_bytes + 1, exact.transition_peak_bytes}));
  EXPECT_FALSE(is_candidate(usage, {exact.resident_bytes, exact.transition_peak_bytes + 1}));
  backend.set_estimate("/fake/fits_master.h5", exact.resident_bytes, exact.transition_peak_bytes);
  EXPECT_EQ(manager.acquire(fake_acquisition("fits"))->device_index(), 0);
  EXPECT_EQ(manager.status(active).state, ResidencyState::resident);  // kept: the other one made room
  EXPECT_EQ(manager.status(other).state, ResidencyState::absent);
}

TEST(ResidencyManager, OneByteAboveTheCapacityNextToTheActiveOneEvictsIt) {
  FakeBackend backend({100});
  backend.set_estimate("/fake/active_master.h5", 30, 30);
  ResidencyManager manager(backend, options());
  const auto active = fake_acquisition("active");
  manager.acquire(active);
  manager.mark_active(active.master_path);
  backend.set_estimate("/fake/over_master.h5", 71, 71);
  manager.acquire(fake_acquisition("over"));  // only the second pass (not preserving) admits it
  EXPECT_EQ(manager.status(active).state, ResidencyState::absent);
  EXPECT_EQ(manager.device_usage()[0].active_resident_bytes, 0u);
}

TEST(ResidencyManager, ActiveAcquisitionOnOneDevicePreservesCapacityOnAnother) {
  FakeBackend backend({100, 100});
  backend.set_estimate("/fake/active_master.h5", 60, 60);
  ResidencyManager manager(backend, options());
  const auto active = fake_acquisition("active");
  ASSERT_EQ(manager.acquire(active)->device_index(), 0);
  manager.mark_active(active.master_path);
  const auto usage = manager.device_usage();
  EXPECT_EQ(usage[0].available_resident_bytes, 40u);
  EXPECT_EQ(usage[1].available_resident_bytes, 100u);
  backend.set_estimate("/fake/next_master.h5", 50, 70);
  EXPECT_EQ(manager.acquire(fake_acquisition("next"))->device_index(), 1);
  EXPECT_EQ(manager.status(active).state, ResidencyState::resident);
}

// ---- placement, hits and LRU (items 6, 10-12) ------------------------------------------

TEST(ResidencyManager, PlacesWholeAcquisitionsOnTheLeastPopulatedDeviceAndReusesHits) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(80, 90);
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a"), b = fake_acquisition("b");
  const auto resident_a = manager.acquire(a);
  const auto resident_b = manager.acquire(b);
  EXPECT_EQ(resident_a->device_index(), 0);
  EXPECT_EQ(resident_b->device_index(), 1);
  EXPECT_EQ(manager.acquire(a).get(), resident_a.get());  // a hit: the same object, on its device, no reload
  EXPECT_EQ(backend.loads(), loads({{"a", 0}, {"b", 1}}));
  const auto usage = manager.device_usage();
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].resident_entries, 1u);
  EXPECT_EQ(usage[1].resident_entries, 1u);
  EXPECT_EQ(usage[0].resident_bytes, 80u);
  EXPECT_EQ(manager.counters().loads_completed, 2u);
}

TEST(ResidencyManager, LruEvictsOnlyOnTheChosenDevice) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(80, 90);
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a"), b = fake_acquisition("b"), c = fake_acquisition("c");
  manager.acquire(a);
  manager.acquire(b);
  EXPECT_EQ(manager.acquire(c)->device_index(), 0);
  EXPECT_EQ(backend.loads(), loads({{"a", 0}, {"b", 1}, {"c", 0}}));
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);
  EXPECT_EQ(manager.status(b).state, ResidencyState::resident);
  EXPECT_EQ(manager.status(c).state, ResidencyState::resident);
  EXPECT_EQ(manager.counters().evictions, 1u);
}

TEST(ResidencyManager, PreservesTheActiveAcquisitionAndPlacesTheLoadElsewhere) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(80, 90);
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a"), b = fake_acquisition("b"), c = fake_acquisition("c");
  manager.acquire(a);
  manager.acquire(b);
  manager.acquire(b);                  // b is now the most recently used...
  manager.mark_active(a.master_path);  // ...but a is active
  EXPECT_EQ(manager.acquire(c)->device_index(), 1);
  EXPECT_EQ(manager.status(a).state, ResidencyState::resident);
  EXPECT_EQ(manager.status(b).state, ResidencyState::absent);
}

TEST(ResidencyManager, EvictsTheActiveAcquisitionWhenItIsTheOnlyTransition) {
  FakeBackend backend({100});
  backend.set_default_estimate(80, 90);
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a"), b = fake_acquisition("b");
  manager.acquire(a);
  manager.mark_active(a.master_path);
  EXPECT_EQ(manager.acquire(b)->device_index(), 0);
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);
  EXPECT_EQ(manager.device_usage()[0].active_resident_bytes, 0u);  // active cleared with the eviction
}

TEST(ResidencyManager, EntryLimitBoundsEachDeviceInLeastRecentlyUsedOrder) {
  FakeBackend backend({1000});
  ResidencyManager manager(backend, options(2));
  const auto a = fake_acquisition("a"), b = fake_acquisition("b"), c = fake_acquisition("c");
  manager.acquire(a);
  manager.acquire(b);
  manager.find(a);  // a becomes the most recently used
  manager.acquire(c);
  EXPECT_EQ(manager.status(a).state, ResidencyState::resident);
  EXPECT_EQ(manager.status(b).state, ResidencyState::absent);
  EXPECT_EQ(manager.status(c).state, ResidencyState::resident);
}

TEST(ResidencyManager, TwoDevicesWithOneEntryEachPlaceAndEvictExactlyByTheRules) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(10, 10);
  ResidencyManager manager(backend, options(1));
  const auto a = fake_acquisition("a"), b = fake_acquisition("b"), c = fake_acquisition("c");
  const auto d = fake_acquisition("d"), e = fake_acquisition("e");
  manager.acquire(a);  // both empty: lowest index
  manager.acquire(b);  // fewest residents: device 1
  manager.acquire(c);  // one entry each, equal peak and fill: lowest index; LRU on device 0 only (a)
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);
  EXPECT_EQ(manager.status(b).state, ResidencyState::resident);
  EXPECT_EQ(*manager.status(c).device_index, 0);
  manager.mark_active(c.master_path);  // c is what the viewer shows
  manager.acquire(d);                  // device 0 keeps c: d replaces b on device 1
  EXPECT_EQ(manager.status(b).state, ResidencyState::absent);
  EXPECT_EQ(*manager.status(d).device_index, 1);
  EXPECT_EQ(manager.status(c).state, ResidencyState::resident);
  manager.mark_active(d.master_path);
  manager.acquire(e);  // now device 1 keeps d: e replaces c on device 0
  EXPECT_EQ(manager.status(c).state, ResidencyState::absent);
  EXPECT_EQ(*manager.status(e).device_index, 0);
  EXPECT_EQ(backend.loads(), loads({{"a", 0}, {"b", 1}, {"c", 0}, {"d", 1}, {"e", 0}}));
  EXPECT_EQ(manager.counters().evictions, 3u);
}

TEST(ResidencyManager, TheAggregateBudgetNeverAdmitsOneVolume) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(150, 150);  // fits 2 x 100 together, no single device
  ResidencyManager manager(backend, options());
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(fake_acquisition("big")); }, &kind),
            peak_exceeds_budget_message(150, 100));
  EXPECT_EQ(kind, ErrorKind::payload_too_large);
  EXPECT_EQ(manager.aggregate_budget_bytes(), 200u);
  EXPECT_EQ(manager.max_budget_bytes(), 100u);
  EXPECT_TRUE(backend.loads().empty());
}

// ---- the three 413s (items 20, 35) ----------------------------------------------

TEST(ResidencyManager, RefusesAPeakAboveEveryBudgetBeforeLoading) {
  FakeBackend backend({100, 60});
  backend.set_default_estimate(128, 128);
  ResidencyManager manager(backend, options());
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(fake_acquisition("big")); }, &kind),
            "Requested exact load needs a 128 B transition peak but the largest per-GPU data-cache budget is 100 B. "
            "Crop the scan region or increase scan/detector binning.");
  EXPECT_EQ(kind, ErrorKind::payload_too_large);
  EXPECT_EQ(error_text([&] { manager.request_load(fake_acquisition("big")); }), peak_exceeds_budget_message(128, 100));
  EXPECT_TRUE(backend.loads().empty());
  EXPECT_EQ(backend.alive_bytes(0) + backend.alive_bytes(1), 0u);
  EXPECT_EQ(manager.counters().admission_rejections, 2u);
  EXPECT_EQ(manager.counters().loads_started, 0u);
  EXPECT_EQ(manager.status(fake_acquisition("big")).state, ResidencyState::absent);
}

TEST(ResidencyManager, NoCandidateDeviceIsTheSecondText) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(50, 50);
  backend.set_free(0, 10);  // another process holds the memory of both devices
  backend.set_free(1, 20);
  ResidencyManager manager(backend, options());
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(fake_acquisition("x")); }, &kind), kNoDeviceCanAdmitMessage);
  EXPECT_EQ(kind, ErrorKind::payload_too_large);
  EXPECT_STREQ(kNoDeviceCanAdmitMessage,
               "No configured CUDA GPU can admit the exact load. Crop the scan region or increase scan/detector binning.");
  EXPECT_TRUE(backend.loads().empty());
}

TEST(ResidencyManager, PersistentOutOfMemoryIsTheThirdTextAloneAfterEveryCandidate) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(40, 40);
  backend.set_physical_memory(0, 30);  // the budgets promise more than the devices have
  backend.set_physical_memory(1, 30);
  ResidencyManager manager(backend, options());
  const auto x = fake_acquisition("x");
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(x); }, &kind), kLoadDidNotFitMessage);  // no backend text attached
  EXPECT_EQ(kind, ErrorKind::payload_too_large);
  EXPECT_STREQ(kLoadDidNotFitMessage,
               "The exact load did not fit on any configured CUDA GPU. Crop the scan region or increase scan/detector "
               "binning.");
  EXPECT_EQ(backend.loads(), loads({{"x", 0}, {"x", 1}}));
  EXPECT_EQ(manager.status(x).state, ResidencyState::absent);  // transient: the next request tries again
  EXPECT_EQ(manager.counters().out_of_memory_retries, 2u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes + manager.device_usage()[1].resident_bytes, 0u);
}

// ---- out-of-memory retries (items 18, 19) ---------------------------------------

TEST(ResidencyManager, OutOfMemoryEvictsOneOnThatDeviceAndRetriesTheSameDevice) {
  FakeBackend backend({100});
  backend.set_default_estimate(40, 40);
  backend.set_physical_memory(0, 60);  // first (40) + second (40) do not fit physically
  ResidencyManager manager(backend, options());
  const auto first = fake_acquisition("first"), second = fake_acquisition("second");
  manager.acquire(first);
  EXPECT_EQ(manager.acquire(second)->device_index(), 0);
  EXPECT_EQ(backend.loads(), loads({{"first", 0}, {"second", 0}, {"second", 0}}));
  const auto records = backend.load_records();
  EXPECT_EQ(records[1].alive_bytes_at_start, 40u);  // first still there
  EXPECT_EQ(records[2].alive_bytes_at_start, 0u);   // the failed attempt and the evicted one were freed before the retry
  EXPECT_EQ(manager.status(first).state, ResidencyState::absent);
  EXPECT_EQ(manager.counters().out_of_memory_retries, 1u);
  EXPECT_EQ(manager.counters().evictions, 1u);
}

TEST(ResidencyManager, OutOfMemoryRetryPreservesTheActiveAcquisition) {
  FakeBackend backend({1000});
  backend.set_default_estimate(30, 30);
  backend.set_physical_memory(0, 70);
  ResidencyManager manager(backend, options());
  const auto active = fake_acquisition("active"), inactive = fake_acquisition("inactive"), next = fake_acquisition("next");
  manager.acquire(active);  // the least recently used...
  manager.acquire(inactive);
  manager.mark_active(active.master_path);  // ...but active
  EXPECT_EQ(manager.acquire(next)->device_index(), 0);
  EXPECT_EQ(manager.status(active).state, ResidencyState::resident);
  EXPECT_EQ(manager.status(inactive).state, ResidencyState::absent);
  EXPECT_EQ(backend.out_of_memory_count(), 1);
}

TEST(ResidencyManager, OutOfMemoryWithNothingToEvictMovesToTheNextCandidate) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(40, 40);
  backend.set_physical_memory(0, 10);
  ResidencyManager manager(backend, options());
  EXPECT_EQ(manager.acquire(fake_acquisition("x"))->device_index(), 1);
  EXPECT_EQ(backend.loads(), loads({{"x", 0}, {"x", 1}}));
  const auto records = backend.load_records();
  EXPECT_EQ(records[1].thread_name, "quantem-load-1");  // the retry runs on its new device's loader
}

TEST(ResidencyManager, OutOfMemoryNeverEvictsAResidentInUse) {
  FakeBackend backend({100});
  backend.set_default_estimate(40, 40);
  backend.set_physical_memory(0, 60);
  ResidencyManager manager(backend, options());
  const auto in_use = manager.acquire(fake_acquisition("first"));
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(fake_acquisition("second")); }, &kind), kLoadDidNotFitMessage);
  EXPECT_EQ(manager.status(fake_acquisition("first")).state, ResidencyState::resident);
  EXPECT_EQ(in_use->resident_bytes(), 40u);
}

// ---- pins and bounded waits (items 13, 15, 16) ------------------------------------------

TEST(ResidencyManager, APinnedResidentBlocksEvictionUntilItsLeaseIsReleased) {
  FakeBackend backend({100});
  backend.set_default_estimate(80, 90);
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a"), b = fake_acquisition("b");
  auto lease = manager.acquire(a);
  auto competing = std::async(std::launch::async, [&] { return manager.acquire(b)->device_index(); });
  EXPECT_EQ(competing.wait_for(100ms), std::future_status::timeout);  // still blocked
  EXPECT_EQ(manager.status(a).state, ResidencyState::resident);
  EXPECT_EQ(backend.loads().size(), 1u);
  lease = {};  // the request finishes
  EXPECT_EQ(competing.get(), 0);
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);
  EXPECT_EQ(backend.loads(), loads({{"a", 0}, {"b", 0}}));
}

TEST(ResidencyManager, WaitingForResidentsInUseIsBounded) {
  FakeBackend backend({100});
  backend.set_default_estimate(80, 90);
  auto o = options();
  o.busy_wait_limit = 50ms;
  ResidencyManager manager(backend, o);
  const auto lease = manager.acquire(fake_acquisition("a"));
  ErrorKind kind{};
  const std::string text = error_text([&] { manager.acquire(fake_acquisition("b")); }, &kind);
  EXPECT_EQ(kind, ErrorKind::unavailable);
  EXPECT_NE(text.find("busy with requests or loads"), std::string::npos) << text;
  EXPECT_EQ(manager.counters().busy_timeouts, 1u);
  EXPECT_EQ(backend.loads().size(), 1u);
}

TEST(ResidencyManager, AComputationOnOneResidentDoesNotBlockAnother) {
  FakeBackend backend({100, 100});
  ResidencyManager manager(backend, options());
  const auto a = manager.acquire(fake_acquisition("a"));
  const auto a_again = manager.acquire(fake_acquisition("a"));
  auto busy = a.lock_compute();
  auto other = std::async(std::launch::async, [&] {
    const auto b = manager.acquire(fake_acquisition("b"));
    const auto compute = b.lock_compute();
    return b->device_index();
  });
  EXPECT_EQ(other.get(), 1);  // finished while a's computation holds its lock
  auto same = std::async(std::launch::async, [&] {
    const auto compute = a_again.lock_compute();
    return true;
  });
  EXPECT_EQ(same.wait_for(50ms), std::future_status::timeout);  // the same resident: one computation at a time
  busy.unlock();
  EXPECT_TRUE(same.get());
}

TEST(ResidencyManager, AnEvictedResidentInUseDrainsUntilReleased) {
  FakeBackend backend({100});
  backend.set_default_estimate(60, 60);
  auto o = options();
  o.busy_wait_limit = 50ms;
  ResidencyManager manager(backend, o);
  const auto a = fake_acquisition("a"), b = fake_acquisition("b");
  auto in_use = manager.acquire(a);
  EXPECT_TRUE(manager.evict(a));
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 60u);  // draining
  EXPECT_EQ(manager.device_usage()[0].resident_entries, 0u);
  EXPECT_EQ(in_use->resident_bytes(), 60u);  // the running request still computes on it
  EXPECT_EQ(backend.alive_bytes(0), 60u);
  ErrorKind kind{};
  error_text([&] { manager.acquire(b); }, &kind);
  EXPECT_EQ(kind, ErrorKind::unavailable);  // bounded wait for the draining bytes
  in_use = {};
  EXPECT_EQ(backend.alive_bytes(0), 0u);  // freed with the last lease
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 0u);
  EXPECT_TRUE(manager.acquire(b));
}

TEST(ResidencyManager, ConcurrentRequestsForOneAcquisitionShareOneLoad) {
  FakeBackend backend({100});
  backend.close_gate();
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a");
  std::vector<std::future<backend::Resident*>> requests;
  for (int i = 0; i < 8; ++i) {
    requests.push_back(std::async(std::launch::async, [&] { return manager.acquire(a).get(); }));
  }
  ASSERT_TRUE(backend.wait_loads(1));
  backend.open_gate();
  backend::Resident* first = requests[0].get();
  for (std::size_t i = 1; i < requests.size(); ++i) EXPECT_EQ(requests[i].get(), first);
  EXPECT_EQ(backend.loads().size(), 1u);
  EXPECT_EQ(manager.counters().loads_started, 1u);
}

// ---- free-memory headroom before a load -------------------------------------------

TEST(ResidencyManager, FreeMemoryHeadroomEvictsAnInactiveResidentBeforeLoading) {
  FakeBackend backend({1000});
  backend.set_default_estimate(100, 100);
  ResidencyManager manager(backend, options());
  const auto old = fake_acquisition("old"), next = fake_acquisition("next");
  manager.acquire(old);
  backend.set_free(0, 100);  // the budget fits, free memory lacks the 5% headroom (105)
  manager.acquire(next);
  EXPECT_EQ(manager.status(old).state, ResidencyState::absent);
  EXPECT_EQ(manager.status(next).state, ResidencyState::resident);
  backend.set_free(0, 105);
  manager.acquire(old);  // enough headroom: next stays
  EXPECT_EQ(manager.status(next).state, ResidencyState::resident);
}

// ---- loaders (items 7, 8) ----------------------------------------------------------

TEST(ResidencyManager, LoadsRunOnTheLoaderThreadOfTheirDevice) {
  FakeBackend backend({100, 100, 100});
  ResidencyManager manager(backend, options());
  for (const char* name : {"a", "b", "c", "d"}) manager.acquire(fake_acquisition(name));
  const auto records = backend.load_records();
  ASSERT_EQ(records.size(), 4u);
  for (const auto& record : records) {
    EXPECT_EQ(record.thread_name, "quantem-load-" + std::to_string(record.device)) << record.master_path;
  }
}

TEST(ResidencyManager, LoadsOverlapOnOneDeviceAndAcrossDevices) {
  // Each load runs on a runner of its own (decision 0021): a load that does
  // not end (a read that hangs) never holds the next one on its device.
  FakeBackend backend({100, 100});
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a"), b = fake_acquisition("b"), c = fake_acquisition("c");
  backend.hold(a.master_path);
  backend.hold(b.master_path);
  manager.request_load(a);  // device 0
  manager.request_load(b);  // device 1
  EXPECT_TRUE(backend.wait_running(2));
  manager.request_load(c);  // device 0 again (fewest entries tie, then lowest index): runs beside a
  EXPECT_EQ(*manager.status(c).device_index, 0);
  EXPECT_TRUE(wait_for_state(manager, c, ResidencyState::resident));
  EXPECT_EQ(manager.status(a).state, ResidencyState::loading);
  backend.release(b.master_path);
  backend.release(a.master_path);
  for (const auto* acquisition : {&a, &b, &c}) {
    EXPECT_TRUE(wait_for_state(manager, *acquisition, ResidencyState::resident)) << acquisition->name;
  }
  EXPECT_EQ(backend.max_running(), 3);
}

TEST(ResidencyManager, ParallelLoadsPerDeviceBoundsTheLoadsRunningOnOneDevice) {
  FakeBackend backend({100, 100});
  ResidencyOptions one_at_a_time = options();
  one_at_a_time.parallel_loads_per_device = 1;
  ResidencyManager manager(backend, one_at_a_time);
  const auto a = fake_acquisition("a"), b = fake_acquisition("b"), c = fake_acquisition("c");
  backend.hold(a.master_path);
  backend.hold(b.master_path);
  manager.request_load(a);  // device 0
  manager.request_load(b);  // device 1
  EXPECT_TRUE(backend.wait_running(2));
  manager.request_load(c);  // device 0 again: queued behind a
  EXPECT_EQ(*manager.status(c).device_index, 0);
  EXPECT_EQ(manager.status(c).stage, "queued");
  backend.release(b.master_path);
  backend.release(a.master_path);
  for (const auto* acquisition : {&a, &b, &c}) {
    EXPECT_TRUE(wait_for_state(manager, *acquisition, ResidencyState::resident)) << acquisition->name;
  }
  EXPECT_EQ(backend.max_running(), 2);
}

TEST(ResidencyManager, ShutdownCancelsARunningLoad) {
  FakeBackend backend({100});
  backend.close_gate();
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a");
  manager.request_load(a);
  ASSERT_TRUE(backend.wait_loads(1));
  manager.shutdown();  // returns although the gate stays closed: the load saw the cancellation
  ErrorKind kind{};
  error_text([&] { manager.acquire(a); }, &kind);
  EXPECT_EQ(kind, ErrorKind::unavailable);
  EXPECT_EQ(backend.alive_bytes(0), 0u);
}

TEST(ResidencyManager, ShutdownReleasesResidentsAndWakesWaiters) {
  FakeBackend backend({100});
  ResidencyManager manager(backend, options());
  manager.acquire(fake_acquisition("a"));
  backend.close_gate();
  auto waiter = std::async(std::launch::async, [&] {
    ErrorKind kind{};
    error_text([&] { manager.acquire(fake_acquisition("b")); }, &kind);
    return kind;
  });
  ASSERT_TRUE(backend.wait_loads(2));
  manager.shutdown();
  EXPECT_EQ(waiter.get(), ErrorKind::unavailable);
  EXPECT_EQ(backend.alive_bytes(0), 0u);
}

// ---- residency state, progress, cancellation -------------------------------------

TEST(ResidencyManager, BackgroundLoadReportsProgressAndState) {
  FakeBackend backend({100});
  backend.close_gate();
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a");
  const auto queued = manager.request_load(a);
  EXPECT_EQ(queued.state, ResidencyState::loading);
  EXPECT_EQ(queued.device_index, 0);
  EXPECT_FALSE(manager.find(a));
  EXPECT_EQ(manager.device_usage()[0].resident_entries, 1u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 10u);  // the reserved transition peak
  ASSERT_TRUE(backend.wait_loads(1));
  EXPECT_TRUE(wait_until([&] { return manager.status(a).stage == "reading"; }));
  EXPECT_EQ(manager.status(a).bytes_total, 100u);
  backend.open_gate();
  ASSERT_TRUE(wait_for_state(manager, a, ResidencyState::resident));
  const auto status = manager.status(a);
  EXPECT_EQ(status.resident_bytes, 10u);
  EXPECT_EQ(status.bytes_done, 100u);
  EXPECT_EQ(status.bytes_total, 100u);
  EXPECT_EQ(status.stage, "done");
  EXPECT_EQ(status.encoding, "fake");
  EXPECT_TRUE(manager.find(a));
  EXPECT_EQ(manager.request_load(a).state, ResidencyState::resident);  // already there: no second load
  EXPECT_EQ(backend.loads().size(), 1u);
}

TEST(ResidencyManager, CancellingARunningLoadFreesEverythingItTook) {
  FakeBackend backend({100});
  backend.set_default_estimate(30, 50);
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a");
  backend.hold(a.master_path);
  auto waiter = std::async(std::launch::async, [&] {
    ErrorKind kind{};
    error_text([&] { manager.acquire(a); }, &kind);
    return kind;
  });
  ASSERT_TRUE(backend.wait_loads(1));
  EXPECT_TRUE(manager.evict(a));  // DELETE while loading
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);
  EXPECT_EQ(waiter.get(), ErrorKind::unavailable);
  // The reservation holds until the backend has given the attempt back.
  EXPECT_TRUE(wait_until([&] { return manager.device_usage()[0].resident_bytes == 0; }));
  EXPECT_EQ(backend.alive_bytes(0), 0u);
  EXPECT_EQ(manager.counters().loads_completed, 0u);
  manager.request_load(a);  // a later load starts afresh
  backend.release(a.master_path);
  EXPECT_TRUE(wait_for_state(manager, a, ResidencyState::resident));
}

TEST(ResidencyManager, CancellingAQueuedLoadReleasesItsReservationAtOnce) {
  FakeBackend backend({100});
  backend.set_default_estimate(30, 40);
  auto o = options();
  o.parallel_loads_per_device = 1;  // b waits in the queue behind a (else it could already run)
  ResidencyManager manager(backend, o);
  const auto a = fake_acquisition("a"), b = fake_acquisition("b");
  backend.hold(a.master_path);
  manager.request_load(a);
  ASSERT_TRUE(backend.wait_loads(1));
  manager.request_load(b);  // same device, queued behind a
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 80u);
  EXPECT_TRUE(manager.evict(b));
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 40u);
  backend.release(a.master_path);
  EXPECT_TRUE(wait_for_state(manager, a, ResidencyState::resident));
  EXPECT_EQ(backend.loads(), loads({{"a", 0}}));  // b never reached the backend
}

TEST(ResidencyManager, WaitingForALoadIsBounded) {
  FakeBackend backend({100});
  backend.close_gate();
  auto o = options();
  o.load_wait_limit = 50ms;
  ResidencyManager manager(backend, o);
  ErrorKind kind{};
  const std::string text = error_text([&] { manager.acquire(fake_acquisition("slow")); }, &kind);
  EXPECT_EQ(kind, ErrorKind::unavailable);
  EXPECT_NE(text.find("timed out waiting"), std::string::npos) << text;
  backend.open_gate();
}

TEST(ResidencyManager, FailedLoadIsRememberedUntilAnExplicitLoad) {
  FakeBackend backend({100});
  const auto a = fake_acquisition("a");
  backend.fail(a.master_path, CorruptChunk("frame 3 of /fake/a_data_000001.h5 does not decode"));
  ResidencyManager manager(backend, options());
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(a); }, &kind), "frame 3 of /fake/a_data_000001.h5 does not decode");
  EXPECT_EQ(kind, ErrorKind::corrupt_data);
  EXPECT_EQ(error_text([&] { manager.acquire(a); }), "frame 3 of /fake/a_data_000001.h5 does not decode");
  EXPECT_EQ(backend.loads().size(), 1u);  // no reload storm
  const auto status = manager.status(a);
  EXPECT_EQ(status.state, ResidencyState::failed);
  EXPECT_EQ(status.failure_reason, "frame 3 of /fake/a_data_000001.h5 does not decode");
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 0u);  // a failure holds nothing
  backend.clear_failure(a.master_path);
  manager.request_load(a);
  EXPECT_TRUE(wait_for_state(manager, a, ResidencyState::resident));
  EXPECT_EQ(backend.loads().size(), 2u);
  EXPECT_EQ(manager.counters().loads_failed, 1u);
}

TEST(ResidencyManager, EvictOfAnAbsentAcquisitionReportsFalse) {
  FakeBackend backend({100});
  ResidencyManager manager(backend, options());
  EXPECT_FALSE(manager.evict(fake_acquisition("never")));
}

// ---- changed source files --------------------------------------------------------

namespace {

catalog::Acquisition acquisition_of_file(const std::string& path) {
  auto a = fake_acquisition("a");
  a.master_path = path;
  catalog::SignatureEntry entry;
  entry.path = path;
  a.signature = catalog::restat_signature({entry});
  return a;
}

}  // namespace

TEST(ResidencyManager, ChangedSourceFilesAreNeverServed) {
  quantem::test::TempDir dir;
  const std::string path = dir.file("a_master.h5");
  { std::ofstream(path) << "version 1"; }
  FakeBackend backend({100});
  ResidencyManager manager(backend, options());
  const auto a = acquisition_of_file(path);
  ASSERT_TRUE(a.signature[0].exists);
  const auto first = manager.acquire(a);

  { std::ofstream(path) << "version 2, longer"; }
  auto rewritten = a;
  rewritten.signature = catalog::restat_signature(a.signature);
  ASSERT_NE(rewritten.signature, a.signature);
  EXPECT_FALSE(manager.find(rewritten));
  const auto second = manager.acquire(rewritten);
  EXPECT_NE(second.get(), first.get());
  EXPECT_EQ(backend.loads().size(), 2u);
  EXPECT_FALSE(manager.find(a));  // the old signature is gone for good
  EXPECT_EQ(manager.device_usage()[0].resident_entries, 1u);
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(a); }, &kind), kStaleInspectionMessage);  // an old inspection: resolve again
  EXPECT_EQ(kind, ErrorKind::conflict);
}

TEST(ResidencyManager, DropChangedSourcesInvalidatesResidentsWhoseFilesChanged) {
  quantem::test::TempDir dir;
  const std::string changing = dir.file("a_master.h5"), steady = dir.file("b_master.h5");
  { std::ofstream(changing) << "version 1"; }
  { std::ofstream(steady) << "steady"; }
  FakeBackend backend({100, 100});
  ResidencyManager manager(backend, options());
  auto a = acquisition_of_file(changing), b = acquisition_of_file(steady);
  auto in_use = manager.acquire(a);
  manager.acquire(b);
  EXPECT_EQ(manager.drop_changed_sources({changing}), 0u);  // nothing changed yet
  { std::ofstream(changing) << "version 2, longer"; }
  EXPECT_EQ(manager.drop_changed_sources({steady}), 0u);  // only named files are checked
  EXPECT_EQ(manager.drop_changed_sources({changing}), 1u);
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);
  EXPECT_EQ(manager.status(b).state, ResidencyState::resident);
  EXPECT_EQ(backend.alive_bytes(0), 10u);  // the running request keeps its (old) data until it finishes
  in_use = {};
  EXPECT_EQ(backend.alive_bytes(0), 0u);
  EXPECT_EQ(manager.drop_changed_sources(), 0u);
}

TEST(ResidencyManager, ALoadWhoseFilesChangeMeanwhileIsDiscarded) {
  quantem::test::TempDir dir;
  const std::string path = dir.file("a_master.h5");
  { std::ofstream(path) << "version 1"; }
  FakeBackend backend({100});
  ResidencyManager manager(backend, options());
  const auto a = acquisition_of_file(path);
  backend.hold(path);
  auto request = std::async(std::launch::async, [&] {
    ErrorKind kind{};
    const std::string text = error_text([&] { manager.acquire(a); }, &kind);
    return std::make_pair(kind, text);
  });
  ASSERT_TRUE(backend.wait_loads(1));
  { std::ofstream(path) << "a writer is still appending"; }  // a growing file
  backend.release(path);
  const auto [kind, text] = request.get();
  EXPECT_EQ(kind, ErrorKind::conflict);
  EXPECT_NE(text.find("changed while"), std::string::npos) << text;
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);
  EXPECT_EQ(backend.alive_bytes(0), 0u);
}

// ---- region-first loads: a resident leased while its load goes on ------------------
//
// The fake backend publishes its resident early (FakeBackend::publish_early):
// with steps {2, 4, 8} a load holds 2, then 4, then all 8 scan rows of its
// order (its first rows, then the rows above them, then those below) and waits
// at a gate after each step; it returns once the last gate opens.

namespace quantem::backend {
void PrintTo(const ScanRows& rows, std::ostream* out) { *out << "[" << rows.first << ", " << rows.end << ")"; }
}  // namespace quantem::backend

namespace {

using backend::ScanRows;
using backend::ScanColumns;
using backend::ScanWindow;

// An 8 x 4 scan of 2 x 2 frames: estimates from the fake, rows from here.
catalog::Acquisition scan_of_eight_rows(const std::string& name) {
  auto a = fake_acquisition(name);
  a.scan_rows = 8;
  a.scan_cols = 4;
  a.detector_rows = 2;
  a.detector_cols = 2;
  return a;
}

// A plan cropped to whole scan rows of `a`.
plan::PlanGeometry plan_over(const catalog::Acquisition& a, ScanRows rows) {
  plan::BrowsePlan p;
  p.crop = plan::ScanRegion{rows.first, rows.end, 0, a.scan_cols};
  return plan::resolve_plan(p, a.scan_rows, a.scan_cols, a.detector_rows, a.detector_cols);
}

// The kind of error a pattern sum over `rows` throws on the leased resident ("no error" as none).
std::string pattern_sum_over(const ResidentLease& lease, const catalog::Acquisition& a, ScanRows rows) {
  ErrorKind kind{};
  const std::string text = error_text([&] { lease->pattern_sum(plan_over(a, rows)); }, &kind);
  return text == "no error" ? text : std::string(error_kind_name(kind)) + ": " + text;
}

// Waits (bounded) for a request on another thread; the lease, or an empty one on timeout.
ResidentLease ready(std::future<ResidentLease>& request, std::chrono::milliseconds limit = 10s) {
  if (request.wait_for(limit) != std::future_status::ready) return {};
  return request.get();
}

std::future<ResidentLease> acquire_async(ResidencyManager& manager, const catalog::Acquisition& a,
                                         std::optional<ScanRows> rows = std::nullopt) {
  return std::async(std::launch::async, [&manager, a, rows] { return manager.acquire(a, rows); });
}

// A request expected to fail: its error kind and text.
std::future<std::pair<ErrorKind, std::string>> failing_acquire_async(ResidencyManager& manager,
                                                                      const catalog::Acquisition& a) {
  return std::async(std::launch::async, [&manager, a] {
    ErrorKind kind{};
    const std::string text = error_text([&] { manager.acquire(a); }, &kind);
    return std::make_pair(kind, text);
  });
}

}  // namespace

TEST(ResidencyRegionFirst, ARegionRequestGetsTheResidentWhileItsLoadGoesOn) {
  FakeBackend backend({100});
  backend.set_default_estimate(30, 50);
  const auto a = scan_of_eight_rows("a");
  backend.publish_early(a.master_path, {2, 4, 8});
  ResidencyManager manager(backend, options());
  auto request = acquire_async(manager, a, ScanRows{2, 4});
  const ResidentLease lease = ready(request);  // while the load waits at its first gate
  ASSERT_TRUE(lease);
  ASSERT_TRUE(backend.wait_step(a.master_path, 1));
  EXPECT_FALSE(backend.wait_step(a.master_path, 2, 50ms));  // the load is still running, at its first gate
  const auto records = backend.load_records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].first_rows, (std::optional<ScanRows>{ScanRows{2, 4}}));  // the request's rows come first
  const ResidencyStatus status = manager.status(a);
  EXPECT_EQ(status.state, ResidencyState::loading);
  EXPECT_EQ(status.scan_rows_resident, 2u);
  EXPECT_EQ(status.scan_rows, 8u);
  EXPECT_EQ(status.reserved_bytes, 50u);  // one reservation: the load's
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 50u);
  EXPECT_EQ(manager.device_usage()[0].resident_entries, 1u);
  EXPECT_EQ(manager.counters().loads_completed, 0u);
  // The lease computes over the rows it was handed, and only those.
  EXPECT_EQ(lease->held_rows().held(), 2u);
  EXPECT_EQ(pattern_sum_over(lease, a, {2, 4}), "no error");
  EXPECT_EQ(pattern_sum_over(lease, a, {4, 6}).rfind("internal: scan rows [4, 6)", 0), 0u)
      << pattern_sum_over(lease, a, {4, 6});

  backend.open_step(a.master_path, 3);
  ASSERT_TRUE(wait_for_state(manager, a, ResidencyState::resident));
  EXPECT_EQ(manager.status(a).scan_rows_resident, 8u);
  EXPECT_EQ(manager.acquire(a).get(), lease.get());  // the very resident, now whole
  EXPECT_EQ(backend.loads().size(), 1u);
  EXPECT_EQ(manager.counters().loads_completed, 1u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 30u);
}

// A crop's window: the load gets its rows and its columns first; a window of
// every column is its rows alone.
TEST(ResidencyRegionFirst, ALoadGetsTheRequestsWindowFirstAndEveryColumnIsNoWindow) {
  FakeBackend backend({100});
  const auto a = scan_of_eight_rows("a"), b = scan_of_eight_rows("b");
  ResidencyManager manager(backend, options());
  ASSERT_TRUE(manager.acquire(a, ScanWindow{ScanRows{2, 4}, ScanColumns{1, 3}}));
  ASSERT_TRUE(manager.acquire(b, ScanWindow{ScanRows{2, 4}, ScanColumns{0, 4}}));
  const auto records = backend.load_records();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].first_rows, (std::optional<ScanRows>{ScanRows{2, 4}}));
  ASSERT_TRUE(records[0].first_columns.has_value());
  EXPECT_EQ(records[0].first_columns->first, 1u);
  EXPECT_EQ(records[0].first_columns->end, 3u);
  EXPECT_EQ(records[1].first_rows, (std::optional<ScanRows>{ScanRows{2, 4}}));
  EXPECT_FALSE(records[1].first_columns.has_value());
}

TEST(ResidencyRegionFirst, ARequestForRowsNotYetHeldIsAnsweredAsSoonAsTheLoadHoldsThem) {
  FakeBackend backend({100});
  const auto a = scan_of_eight_rows("a");
  backend.publish_early(a.master_path, {2, 4, 8});
  ResidencyManager manager(backend, options());
  auto first_request = acquire_async(manager, a, ScanRows{2, 4});
  const ResidentLease first = ready(first_request);
  ASSERT_TRUE(first);
  ASSERT_TRUE(backend.wait_step(a.master_path, 1));
  // Rows 2 and 3 are held; 0 and 1 come next, then 4 to 7.
  EXPECT_TRUE(manager.find(a, ScanRows{2, 3}));
  EXPECT_EQ(manager.find(a, ScanRows{2, 4}).get(), first.get());
  EXPECT_FALSE(manager.find(a, ScanRows{0, 2}));
  EXPECT_FALSE(manager.find(a, ScanRows{1, 3}));  // partly held
  EXPECT_FALSE(manager.find(a, ScanRows{6, 8}));
  EXPECT_FALSE(manager.find(a));  // every row
  auto above = acquire_async(manager, a, ScanRows{0, 2});
  auto below = acquire_async(manager, a, ScanRows{6, 8});
  EXPECT_EQ(above.wait_for(100ms), std::future_status::timeout);
  EXPECT_EQ(below.wait_for(0ms), std::future_status::timeout);

  backend.open_step(a.master_path);  // rows 0 and 1
  const ResidentLease above_lease = ready(above);
  ASSERT_TRUE(above_lease);
  EXPECT_EQ(above_lease.get(), first.get());
  EXPECT_TRUE(backend.wait_step(a.master_path, 2));
  EXPECT_FALSE(backend.wait_step(a.master_path, 3, 0ms));  // answered before the load ends
  EXPECT_EQ(manager.status(a).state, ResidencyState::loading);
  EXPECT_EQ(manager.status(a).scan_rows_resident, 4u);
  EXPECT_EQ(below.wait_for(100ms), std::future_status::timeout);  // rows 6 and 7 are not held yet
  EXPECT_TRUE(manager.find(a, ScanRows{0, 4}));
  EXPECT_FALSE(manager.find(a, ScanRows{3, 5}));

  backend.open_step(a.master_path);  // every row held, the load not yet returned
  const ResidentLease below_lease = ready(below);
  ASSERT_TRUE(below_lease);
  EXPECT_EQ(below_lease.get(), first.get());
  EXPECT_EQ(manager.status(a).state, ResidencyState::loading);
  EXPECT_EQ(manager.status(a).scan_rows_resident, 8u);
  EXPECT_EQ(pattern_sum_over(below_lease, a, {6, 8}), "no error");

  backend.open_step(a.master_path);
  ASSERT_TRUE(wait_for_state(manager, a, ResidencyState::resident));
  EXPECT_EQ(manager.find(a).get(), first.get());
  EXPECT_EQ(backend.loads().size(), 1u);
}

TEST(ResidencyRegionFirst, AFullPlanWaitsForTheWholeLoad) {
  FakeBackend backend({100});
  const auto a = scan_of_eight_rows("a");
  backend.publish_early(a.master_path, {3, 8});
  ResidencyManager manager(backend, options());
  // What each full-plan request saw when its lease came.
  auto full = [&](std::optional<ScanRows> rows) {
    return std::async(std::launch::async, [&manager, a, rows] {
      const ResidentLease lease = manager.acquire(a, rows);
      return std::make_pair(manager.status(a).state, lease->held_rows().holds_all());
    });
  };
  auto without_rows = full(std::nullopt);  // starts the load: no first rows
  ASSERT_TRUE(backend.wait_step(a.master_path, 1));
  auto every_row = full(ScanRows{0, 8});
  auto region_request = acquire_async(manager, a, ScanRows{0, 3});
  const ResidentLease region = ready(region_request);  // published: rows 0 to 2 are served
  ASSERT_TRUE(region);
  EXPECT_FALSE(manager.find(a, ScanRows{3, 4}));
  EXPECT_EQ(without_rows.wait_for(100ms), std::future_status::timeout);
  EXPECT_EQ(every_row.wait_for(0ms), std::future_status::timeout);
  EXPECT_FALSE(manager.find(a, ScanRows{0, 8}));

  backend.open_step(a.master_path);  // every row held; the load has not returned
  ASSERT_TRUE(backend.wait_step(a.master_path, 2));
  EXPECT_EQ(manager.status(a).scan_rows_resident, 8u);
  EXPECT_EQ(manager.status(a).state, ResidencyState::loading);
  EXPECT_EQ(without_rows.wait_for(100ms), std::future_status::timeout);
  EXPECT_EQ(every_row.wait_for(0ms), std::future_status::timeout);
  EXPECT_FALSE(manager.find(a));
  EXPECT_FALSE(manager.find(a, ScanRows{0, 8}));

  backend.open_step(a.master_path);
  ASSERT_EQ(without_rows.wait_for(10s), std::future_status::ready);
  ASSERT_EQ(every_row.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(without_rows.get(), std::make_pair(ResidencyState::resident, true));
  EXPECT_EQ(every_row.get(), std::make_pair(ResidencyState::resident, true));
  const auto records = backend.load_records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_FALSE(records[0].first_rows.has_value());
}

TEST(ResidencyRegionFirst, EveryRowAsTheRequestsRowsIsNoRegionFirstLoad) {
  FakeBackend backend({100});
  const auto a = scan_of_eight_rows("a");
  backend.publish_early(a.master_path, {8});
  ResidencyManager manager(backend, options());
  auto request = acquire_async(manager, a, ScanRows{0, 8});
  ASSERT_TRUE(backend.wait_step(a.master_path, 1));
  EXPECT_EQ(request.wait_for(100ms), std::future_status::timeout);
  backend.open_step(a.master_path);
  ASSERT_TRUE(ready(request));
  EXPECT_EQ(manager.status(a).state, ResidencyState::resident);
  EXPECT_FALSE(backend.load_records().at(0).first_rows.has_value());
}

TEST(ResidencyRegionFirst, EvictingALoadThatPublishedEarlyDrainsItsLeases) {
  FakeBackend backend({100});
  backend.set_default_estimate(30, 50);
  const auto a = scan_of_eight_rows("a");
  backend.publish_early(a.master_path, {2, 4, 8});
  ResidencyManager manager(backend, options());
  auto request = acquire_async(manager, a, ScanRows{2, 4});
  ResidentLease old_lease = ready(request);
  ASSERT_TRUE(old_lease);
  ASSERT_TRUE(backend.wait_step(a.master_path, 1));
  EXPECT_EQ(backend.alive_bytes(0), 50u);  // the resident's 30 B and the load's other 20 B

  EXPECT_TRUE(manager.evict(a));  // DELETE while loading
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);
  ASSERT_TRUE(backend.wait_idle());  // the load saw the cancellation at its gate
  // The load's temporaries are gone; the resident drains with its lease.
  EXPECT_TRUE(wait_until([&] { return manager.device_usage()[0].resident_bytes == 30; }))
      << manager.device_usage()[0].resident_bytes;
  EXPECT_EQ(manager.device_usage()[0].resident_entries, 0u);
  EXPECT_EQ(backend.alive_bytes(0), 30u);
  EXPECT_EQ(old_lease->resident_bytes(), 30u);
  EXPECT_EQ(old_lease->held_rows().held(), 2u);
  EXPECT_EQ(pattern_sum_over(old_lease, a, {2, 4}), "no error");
  EXPECT_EQ(manager.counters().loads_completed, 0u);
  EXPECT_EQ(manager.counters().loads_failed, 0u);  // a cancellation is no failure

  // New requests never get the old resident: they load again.
  EXPECT_FALSE(manager.find(a, ScanRows{2, 4}));
  EXPECT_FALSE(manager.find(a));
  auto again = acquire_async(manager, a, ScanRows{2, 4});
  ResidentLease new_lease = ready(again);
  ASSERT_TRUE(new_lease);
  EXPECT_NE(new_lease.get(), old_lease.get());
  ASSERT_EQ(backend.loads().size(), 2u);
  EXPECT_EQ(backend.load_records()[1].first_rows, (std::optional<ScanRows>{ScanRows{2, 4}}));
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 80u);  // 30 B draining, 50 B reserved by the new load

  old_lease = {};
  EXPECT_EQ(backend.alive_bytes(0), 50u);  // the new load's alone
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 50u);
  backend.open_step(a.master_path, 3);
  ASSERT_TRUE(wait_for_state(manager, a, ResidencyState::resident));
  new_lease = {};
  EXPECT_TRUE(manager.evict(a));
  EXPECT_EQ(backend.alive_bytes(0), 0u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 0u);
}

TEST(ResidencyRegionFirst, AFailureAfterPublicationIsNotRetriedAndItsLeasesDrain) {
  FakeBackend backend({100});
  backend.set_default_estimate(30, 50);
  const auto a = scan_of_eight_rows("a");
  const std::string reason = "frame 9 of /fake/a_data_000001.h5 does not decode";
  backend.publish_early(a.master_path, {2, 4, 8});
  backend.fail_after_step(a.master_path, 1, CorruptChunk(reason));
  ResidencyManager manager(backend, options());
  auto request = acquire_async(manager, a, ScanRows{2, 4});
  ResidentLease first = ready(request);
  ASSERT_TRUE(first);
  auto whole = failing_acquire_async(manager, a);
  backend.open_step(a.master_path);
  ASSERT_TRUE(backend.wait_step(a.master_path, 2));
  auto above_request = acquire_async(manager, a, ScanRows{0, 2});
  ResidentLease above = ready(above_request);
  ASSERT_TRUE(above);
  EXPECT_EQ(above.get(), first.get());

  backend.open_step(a.master_path);  // the load fails past its second gate
  ASSERT_EQ(whole.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(whole.get(), std::make_pair(ErrorKind::corrupt_data, reason));
  ASSERT_TRUE(wait_for_state(manager, a, ResidencyState::failed));
  ASSERT_TRUE(backend.wait_idle());
  const ResidencyStatus status = manager.status(a);
  EXPECT_EQ(status.failure_reason, reason);
  EXPECT_EQ(status.scan_rows_resident, 0u);
  EXPECT_EQ(status.scan_rows, 8u);
  EXPECT_EQ(status.reserved_bytes, 30u);  // the resident its leases still use
  // Remembered: no new request is served from the resident, none loads again.
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(a, ScanRows{2, 4}); }, &kind), reason);
  EXPECT_EQ(kind, ErrorKind::corrupt_data);
  EXPECT_EQ(error_text([&] { manager.acquire(a); }, &kind), reason);
  EXPECT_FALSE(manager.find(a, ScanRows{2, 4}));
  EXPECT_FALSE(manager.find(a));
  EXPECT_EQ(backend.loads().size(), 1u);
  EXPECT_EQ(manager.counters().loads_failed, 1u);
  // The leases out keep working and hold its bytes until they end.
  EXPECT_EQ(pattern_sum_over(first, a, {2, 4}), "no error");
  EXPECT_EQ(pattern_sum_over(above, a, {0, 2}), "no error");
  EXPECT_EQ(first->resident_bytes(), 30u);
  EXPECT_EQ(backend.alive_bytes(0), 30u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 30u);
  EXPECT_EQ(manager.device_usage()[0].resident_entries, 0u);
  first = {};
  EXPECT_EQ(backend.alive_bytes(0), 30u);
  above = {};
  EXPECT_EQ(backend.alive_bytes(0), 0u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 0u);
  EXPECT_EQ(manager.status(a).reserved_bytes, 0u);
  EXPECT_EQ(manager.status(a).state, ResidencyState::failed);
}

TEST(ResidencyRegionFirst, OutOfMemoryAfterPublicationIsNotRetriedOnAnotherDevice) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(30, 50);
  ResidencyManager manager(backend, options());
  // Before publishing, out of memory moves the load to the next device.
  const auto b = scan_of_eight_rows("b");
  backend.fail(b.master_path, payload_too_large("fake device 0 is out of memory"), 1);
  EXPECT_EQ(manager.acquire(b)->device_index(), 1);
  EXPECT_EQ(backend.loads(), loads({{"b", 0}, {"b", 1}}));
  EXPECT_TRUE(manager.evict(b));

  const auto a = scan_of_eight_rows("a");
  backend.publish_early(a.master_path, {2, 4, 8});
  backend.fail_after_step(a.master_path, 0, payload_too_large("fake device 0 is out of memory"));
  auto whole = failing_acquire_async(manager, a);  // starts the load (rows from 0 up) and waits for all of it
  ASSERT_TRUE(backend.wait_step(a.master_path, 1));
  auto request = acquire_async(manager, a, ScanRows{0, 2});
  ResidentLease early = ready(request);
  ASSERT_TRUE(early);
  ASSERT_EQ(early->device_index(), 0);
  const auto rejections = manager.counters().admission_rejections;
  backend.open_step(a.master_path);  // out of memory past the first gate
  ASSERT_EQ(whole.wait_for(10s), std::future_status::ready);
  // The out-of-memory text of the protocol, no backend text attached.
  EXPECT_EQ(whole.get(), std::make_pair(ErrorKind::payload_too_large, std::string(kLoadDidNotFitMessage)));
  EXPECT_EQ(manager.counters().admission_rejections, rejections + 1);
  ASSERT_TRUE(backend.wait_idle());
  EXPECT_EQ(backend.loads(), loads({{"b", 0}, {"b", 1}, {"a", 0}}));  // no retry here or on device 1
  EXPECT_EQ(manager.counters().out_of_memory_retries, 1u);  // b's
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);  // transient: the next request loads again
  EXPECT_EQ(pattern_sum_over(early, a, {0, 2}), "no error");
  EXPECT_EQ(backend.alive_bytes(0), 30u);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 30u);  // draining
  EXPECT_EQ(manager.device_usage()[1].resident_bytes, 0u);

  backend.open_step(a.master_path, 3);  // the next load runs through
  const ResidentLease next = manager.acquire(a);
  ASSERT_TRUE(next);
  EXPECT_NE(next.get(), early.get());
  EXPECT_EQ(backend.loads().size(), 4u);
  EXPECT_EQ(manager.status(a).state, ResidencyState::resident);
  early = {};
  EXPECT_EQ(backend.alive_bytes(0) + backend.alive_bytes(1), 30u);  // the new resident's alone
  EXPECT_EQ(manager.device_usage()[0].resident_bytes + manager.device_usage()[1].resident_bytes, 30u);
}

TEST(ResidencyRegionFirst, ShutdownCancelsALoadThatPublishedEarlyAndItsLeaseDrains) {
  FakeBackend backend({100});
  backend.set_default_estimate(30, 50);
  const auto a = scan_of_eight_rows("a");
  backend.publish_early(a.master_path, {2, 4, 8});
  ResidencyManager manager(backend, options());
  auto request = acquire_async(manager, a, ScanRows{2, 4});
  ResidentLease lease = ready(request);
  ASSERT_TRUE(lease);
  manager.shutdown();  // returns although no gate opens: the load saw the cancellation
  EXPECT_EQ(backend.alive_bytes(0), 30u);
  EXPECT_EQ(pattern_sum_over(lease, a, {2, 4}), "no error");
  ErrorKind kind{};
  error_text([&] { manager.acquire(a, ScanRows{2, 4}); }, &kind);
  EXPECT_EQ(kind, ErrorKind::unavailable);
  EXPECT_FALSE(manager.find(a, ScanRows{2, 4}));
  lease = {};
  EXPECT_EQ(backend.alive_bytes(0), 0u);
}
