#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "fake_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/residency/residency_manager.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::residency;
using quantem::test::FakeBackend;
using quantem::test::fake_acquisition;

namespace {

ResidencyOptions options(std::size_t entries = 8) {
  ResidencyOptions o;
  o.max_entries_per_device = entries;
  o.load_wait_limit = std::chrono::seconds(20);
  o.drain_wait_limit = std::chrono::milliseconds(200);
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
  for (int i = 0; i < 2000; ++i) {
    if (manager.status(a).state == state) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

}  // namespace

TEST(ResidencyManager, PlacesWholeAcquisitionsOnTheLeastPopulatedDeviceAndReusesHits) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(80, 90);
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a"), b = fake_acquisition("b");
  const auto resident_a = manager.acquire(a);
  const auto resident_b = manager.acquire(b);
  EXPECT_EQ(resident_a->device_index(), 0);
  EXPECT_EQ(resident_b->device_index(), 1);
  EXPECT_EQ(manager.acquire(a), resident_a);  // a hit: the same object, no reload
  EXPECT_EQ(backend.loads().size(), 2u);
  const auto usage = manager.device_usage();
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].resident_entries, 1u);
  EXPECT_EQ(usage[1].resident_entries, 1u);
  EXPECT_EQ(usage[0].resident_bytes, 80u);
  EXPECT_EQ(manager.counters().loads_completed, 2u);
}

TEST(ResidencyManager, RefusesAPeakAboveEveryBudgetBeforeLoading) {
  FakeBackend backend({100, 60});
  backend.set_default_estimate(128, 128);
  ResidencyManager manager(backend, options());
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(fake_acquisition("big")); }, &kind),
            "Requested exact load needs a 128 B transition peak but the largest per-GPU data-cache budget is 100 B. "
            "Crop the scan region or increase scan/detector binning.");
  EXPECT_EQ(kind, ErrorKind::payload_too_large);
  EXPECT_TRUE(backend.loads().empty());
  EXPECT_EQ(manager.counters().admission_rejections, 1u);
  EXPECT_EQ(manager.status(fake_acquisition("big")).state, ResidencyState::absent);
}

TEST(ResidencyManager, LruEvictsOnlyOnTheChosenDevice) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(80, 90);
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a"), b = fake_acquisition("b"), c = fake_acquisition("c");
  manager.acquire(a);
  manager.acquire(b);
  EXPECT_EQ(manager.acquire(c)->device_index(), 0);
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
  manager.acquire(b);  // b is now the most recently used...
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

TEST(ResidencyManager, AdvertisedCapacityMatchesTheAdmissionBoundary) {
  FakeBackend backend({100});
  backend.set_estimate("/fake/active_master.h5", 30, 30);
  ResidencyManager manager(backend, options());
  const auto active = fake_acquisition("active");
  manager.acquire(active);
  manager.mark_active(active.master_path);
  const auto usage = manager.device_usage()[0];
  // Exactly the advertised resident capacity is admitted next to the active acquisition...
  backend.set_estimate("/fake/fits_master.h5", *usage.available_resident_bytes, *usage.available_resident_bytes);
  EXPECT_EQ(manager.acquire(fake_acquisition("fits"))->device_index(), 0);
  EXPECT_EQ(manager.status(active).state, ResidencyState::resident);
  // ...one byte more only by evicting it (second pass).
  manager.mark_active(active.master_path);
  backend.set_estimate("/fake/over_master.h5", 71, 71);
  manager.acquire(fake_acquisition("over"));
  EXPECT_EQ(manager.status(active).state, ResidencyState::absent);
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
  backend.clear_failure(a.master_path);
  manager.request_load(a);
  EXPECT_TRUE(wait_for_state(manager, a, ResidencyState::resident));
  EXPECT_EQ(backend.loads().size(), 2u);
  EXPECT_EQ(manager.counters().loads_failed, 1u);
}

TEST(ResidencyManager, BackgroundLoadReportsProgressAndState) {
  FakeBackend backend({100});
  backend.close_gate();
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a");
  const auto queued = manager.request_load(a);
  EXPECT_EQ(queued.state, ResidencyState::loading);
  EXPECT_EQ(queued.device_index, 0);
  EXPECT_EQ(manager.find(a), nullptr);
  EXPECT_EQ(manager.device_usage()[0].resident_entries, 1u);
  backend.open_gate();
  ASSERT_TRUE(wait_for_state(manager, a, ResidencyState::resident));
  const auto status = manager.status(a);
  EXPECT_EQ(status.resident_bytes, 10u);
  EXPECT_EQ(status.bytes_done, 100u);
  EXPECT_EQ(status.bytes_total, 100u);
  EXPECT_EQ(status.encoding, "fake");
  EXPECT_NE(manager.find(a), nullptr);
}

TEST(ResidencyManager, WaitingForALoadIsBounded) {
  FakeBackend backend({100});
  backend.close_gate();
  auto o = options();
  o.load_wait_limit = std::chrono::milliseconds(50);
  ResidencyManager manager(backend, o);
  ErrorKind kind{};
  const std::string text = error_text([&] { manager.acquire(fake_acquisition("slow")); }, &kind);
  EXPECT_EQ(kind, ErrorKind::unavailable);
  EXPECT_NE(text.find("timed out waiting"), std::string::npos) << text;
  backend.open_gate();
}

TEST(ResidencyManager, ShutdownCancelsARunningLoad) {
  FakeBackend backend({100});
  backend.close_gate();
  ResidencyManager manager(backend, options());
  const auto a = fake_acquisition("a");
  manager.request_load(a);
  for (int i = 0; i < 1000 && backend.loads().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(backend.loads().size(), 1u);
  manager.shutdown();  // returns although the gate stays closed: the load saw the cancellation
  ErrorKind kind{};
  error_text([&] { manager.acquire(a); }, &kind);
  EXPECT_EQ(kind, ErrorKind::unavailable);
}

TEST(ResidencyManager, EvictedResidentInUseKeepsItsBytesUntilReleased) {
  FakeBackend backend({100});
  backend.set_default_estimate(60, 60);
  auto o = options();
  o.drain_wait_limit = std::chrono::milliseconds(100);
  ResidencyManager manager(backend, o);
  const auto a = fake_acquisition("a"), b = fake_acquisition("b");
  auto in_use = manager.acquire(a);
  EXPECT_TRUE(manager.evict(a));
  EXPECT_EQ(manager.status(a).state, ResidencyState::absent);
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 60u);  // draining
  ErrorKind kind{};
  error_text([&] { manager.acquire(b); }, &kind);
  EXPECT_EQ(kind, ErrorKind::unavailable);  // bounded wait for the draining bytes
  in_use.reset();
  EXPECT_EQ(manager.device_usage()[0].resident_bytes, 0u);
  EXPECT_NE(manager.acquire(b), nullptr);
}

TEST(ResidencyManager, ChangedSourceFilesAreNeverServed) {
  quantem::test::TempDir dir;
  const std::string path = dir.file("a_master.h5");
  { std::ofstream(path) << "version 1"; }
  FakeBackend backend({100});
  ResidencyManager manager(backend, options());
  auto a = fake_acquisition("a");
  a.master_path = path;
  catalog::SignatureEntry entry;
  entry.path = path;
  a.signature = catalog::restat_signature({entry});
  ASSERT_TRUE(a.signature[0].exists);
  const auto first = manager.acquire(a);

  { std::ofstream(path) << "version 2, longer"; }
  auto rewritten = a;
  rewritten.signature = catalog::restat_signature(a.signature);
  ASSERT_NE(rewritten.signature, a.signature);
  EXPECT_EQ(manager.find(rewritten), nullptr);
  const auto second = manager.acquire(rewritten);
  EXPECT_NE(second, first);
  EXPECT_EQ(backend.loads().size(), 2u);
  EXPECT_EQ(manager.find(a), nullptr);  // the old signature is gone for good
  EXPECT_EQ(manager.device_usage()[0].resident_entries, 1u);
}

TEST(ResidencyManager, EvictOfAnAbsentAcquisitionReportsFalse) {
  FakeBackend backend({100});
  ResidencyManager manager(backend, options());
  EXPECT_FALSE(manager.evict(fake_acquisition("never")));
}

TEST(ResidencyManager, NoDeviceCanAdmitWhileEveryBudgetIsReservedByLoads) {
  FakeBackend backend({100, 100});
  backend.set_default_estimate(90, 90);
  backend.close_gate();
  ResidencyManager manager(backend, options());
  manager.request_load(fake_acquisition("x"));
  manager.request_load(fake_acquisition("y"));
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.request_load(fake_acquisition("z")); }, &kind), kNoDeviceCanAdmitMessage);
  EXPECT_EQ(kind, ErrorKind::payload_too_large);
  EXPECT_STREQ(kNoDeviceCanAdmitMessage,
               "No configured CUDA GPU can admit the exact load. Crop the scan region or increase scan/detector binning.");
  backend.open_gate();
}

TEST(ResidencyManager, LoadThatFitsNoCandidateAfterEvictionIsRefused) {
  FakeBackend backend({100});
  backend.set_default_estimate(40, 40);
  backend.close_gate();
  ResidencyManager manager(backend, options(1));
  manager.request_load(fake_acquisition("x"));  // loading: holds the only entry slot and cannot be evicted
  ErrorKind kind{};
  EXPECT_EQ(error_text([&] { manager.acquire(fake_acquisition("y")); }, &kind), kLoadDidNotFitMessage);
  EXPECT_EQ(kind, ErrorKind::payload_too_large);
  EXPECT_STREQ(kLoadDidNotFitMessage,
               "The exact load did not fit on any configured CUDA GPU. Crop the scan region or increase scan/detector "
               "binning.");
  for (int i = 0; i < 1000 && backend.loads().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(backend.loads().size(), 1u);  // only x: y was refused before loading
  backend.open_gate();
}
