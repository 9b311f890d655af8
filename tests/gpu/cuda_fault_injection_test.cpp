// Device allocation failure in the middle of a CUDA load, injected
// by the CUDA backend's test hook (set_device_allocation_failure_for_testing):
// acquisition A is resident, then B's load fails at its k-th device allocation
// for every k from the first (the encoder's working buffers) through the ring
// table and the ANS pieces (allocated on the encode worker's thread) to the
// last (the resident's group table). Each failure must be the typed error a
// real out-of-memory is (payload_too_large), leave no resident of B, return
// every device byte (the backend's accounting exactly, cudaMemGetInfo after
// the pool trim within a small tolerance), keep A's products exact (equal to
// the CPU backend's), and let B load again, exact, once the fault is gone.
// Through the residency manager: with A pinned by a lease nothing can be
// evicted, so B fails with the manager's 413 and its accounting returns to
// A's alone; with A unpinned the manager evicts A and reloads B cleanly.
// Skips on machines without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/backend/cuda_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/error.hpp"
#include "quantem/plan/plan.hpp"
#include "quantem/residency/residency_manager.hpp"
#include "quantem/synth/synth.hpp"
#include "test_support.hpp"

namespace quantem::backend {
namespace {

using test::TempDir;

// cudaMemGetInfo after a failed load and the pool trim may differ from before
// by the driver's own bookkeeping (2 MiB pages); a leaked working buffer of
// these loads is larger (a dense batch alone is 64 frames x 3.6 KiB, the
// staging slots 2 x 64 KiB, rounded up to 2 MiB each: several pages in all).
constexpr std::uint64_t kFreeMemoryTolerance = std::uint64_t{8} << 20;

// Small batches, so that B's load makes many allocations on both threads:
// 648 frames in 11 batches of 64, each batch's ANS piece its own allocation.
CudaLoadTuning many_batches_tuning() {
  CudaLoadTuning tuning;
  tuning.frames_per_group = 32;
  tuning.groups_per_batch = 2;
  tuning.staging_bytes = 64 << 10;
  tuning.sub_batch_frames = 20;
  return tuning;
}

std::unique_ptr<CudaBackend> cuda_backend() {
  CudaBackendOptions options;
  options.device_indices = {0};
  options.read_threads = 4;
  options.tuning = many_batches_tuning();
  return make_cuda_backend(options);
}

std::unique_ptr<Backend> cpu_backend() {
  CpuBackendOptions options;
  options.threads = 2;
  options.budget_bytes_per_device = std::uint64_t{1} << 30;
  return make_cpu_backend(options);
}

catalog::Acquisition synthesize(const TempDir& dir, const std::string& prefix, std::uint64_t scan_rows,
                                std::uint64_t scan_cols, std::uint64_t seed) {
  synth::SynthOptions options;
  options.output_dir = dir.path();
  options.prefix = prefix;
  options.scan_rows = scan_rows;
  options.scan_cols = scan_cols;
  options.detector_rows = 48;
  options.detector_cols = 38;
  options.dtype = DType::uint16;
  options.preset = synth::Preset::realistic;
  options.frames_per_shard = 250;
  options.seed = seed;
  options.threads = 4;
  const synth::SynthReport report = synth::write_acquisition(options);
  catalog::Acquisition acquisition = catalog::inspect_master(report.master_path);
  EXPECT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  return acquisition;
}

// What the test compares between backends: BF (a centred disk), the pattern
// sum, the centre-of-mass moments and three frames, on the full plan.
struct Products {
  std::vector<std::uint64_t> bright_field;
  std::vector<std::uint64_t> pattern;
  CenterOfMassSums center_of_mass;
  std::vector<std::vector<std::uint64_t>> frames;

  bool operator==(const Products& other) const {
    return bright_field == other.bright_field && pattern == other.pattern &&
           center_of_mass.total == other.center_of_mass.total &&
           center_of_mass.row_moment == other.center_of_mass.row_moment &&
           center_of_mass.col_moment == other.center_of_mass.col_moment && frames == other.frames;
  }
};

Products products_of(Resident& resident) {
  const catalog::Acquisition& a = resident.source();
  const plan::PlanGeometry g = plan::resolve_plan({}, a.scan_rows, a.scan_cols, a.detector_rows, a.detector_cols);
  std::vector<std::uint8_t> disk(g.detector_pixels());
  const double radius = static_cast<double>(g.detector_rows) / 5.0;
  for (std::uint64_t r = 0; r < g.detector_rows; ++r) {
    for (std::uint64_t c = 0; c < g.detector_cols; ++c) {
      const double dr = static_cast<double>(r) + 0.5 - static_cast<double>(g.detector_rows) / 2.0;
      const double dc = static_cast<double>(c) + 0.5 - static_cast<double>(g.detector_cols) / 2.0;
      disk[r * g.detector_cols + c] = dr * dr + dc * dc <= radius * radius ? 1 : 0;
    }
  }
  Products products;
  products.bright_field = resident.masked_sum(g, disk);
  products.pattern = resident.pattern_sum(g);
  products.center_of_mass = resident.center_of_mass_sums(g);
  for (const std::uint64_t position : {std::uint64_t{0}, g.positions() / 2, g.positions() - 1}) {
    products.frames.push_back(resident.frame(g, position / g.scan_cols, position % g.scan_cols));
  }
  return products;
}

std::uint64_t device_free_bytes() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  return free_bytes;
}

std::uint64_t absolute_difference(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : b - a; }

// The error of `call`, which must throw quantem::Error of `kind`.
std::string error_text(const std::function<void()>& call, ErrorKind kind) {
  try {
    call();
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), kind) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "the faulted load was served";
  return {};
}

// Clears the hook however the test ends.
struct AllocationFaultCleared {
  ~AllocationFaultCleared() { clear_device_allocation_failure_for_testing(); }
};

class CudaAllocationFault : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
    resident_a_ = synthesize(dir_, "resident", 16, 19, 11);
    faulted_b_ = synthesize(dir_, "faulted", 24, 27, 12);  // 648 frames in three shards
    // The exact reference: the CPU backend's products of the same files.
    const std::unique_ptr<Backend> cpu = cpu_backend();
    LoadProgress progress_a, progress_b;
    expected_a_ = products_of(*cpu->load(resident_a_, cpu->devices().front().index, progress_a));
    expected_b_ = products_of(*cpu->load(faulted_b_, cpu->devices().front().index, progress_b));
    backend_ = cuda_backend();
  }

  // Device bytes as the driver sees them once the backend returned its cached pool memory.
  std::uint64_t trimmed_free_bytes() {
    backend_->trim_device_memory(0);
    return device_free_bytes();
  }

  // B's allocations in one whole load (the fault hook only counting), and B's load proven exact.
  std::uint64_t count_allocations_of_b() {
    AllocationFaultCleared cleared;
    set_device_allocation_failure_for_testing(0);
    {
      LoadProgress progress;
      const std::shared_ptr<Resident> b = backend_->load(faulted_b_, 0, progress);
      EXPECT_TRUE(products_of(*b) == expected_b_) << "B's CUDA products differ from the CPU backend's";
    }
    const DeviceAllocationFaultReport report = clear_device_allocation_failure_for_testing();
    EXPECT_FALSE(report.failure_injected);
    std::printf("B's load makes %llu device allocations\n", static_cast<unsigned long long>(report.allocations_counted));
    return report.allocations_counted;
  }

  TempDir dir_;
  catalog::Acquisition resident_a_, faulted_b_;
  Products expected_a_, expected_b_;
  std::unique_ptr<CudaBackend> backend_;
};

TEST_F(CudaAllocationFault, EveryAllocationOfALoadFailingIsPayloadTooLargeFreesEverythingAndKeepsServing) {
  LoadProgress progress_a;
  const std::shared_ptr<Resident> a = backend_->load(resident_a_, 0, progress_a);
  ASSERT_TRUE(products_of(*a) == expected_a_) << "A's CUDA products differ from the CPU backend's";
  const std::uint64_t allocations = count_allocations_of_b();  // also loads every kernel once
  // Working buffers (dense slots, statuses, scratch, staging), the ring set-up,
  // one piece per batch (11) and the group table.
  ASSERT_GE(allocations, 20u);

  const std::uint64_t in_use_with_a = cuda_resident_bytes_in_use();
  EXPECT_EQ(in_use_with_a, a->resident_bytes());
  const std::uint64_t free_with_a = trimmed_free_bytes();
  const LoadEstimate estimate = backend_->estimate_load(faulted_b_);
  std::uint64_t largest_drift = 0;
  for (std::uint64_t fail_at = 1; fail_at <= allocations; ++fail_at) {
    const std::string where = "allocation " + std::to_string(fail_at) + " of " + std::to_string(allocations);
    AllocationFaultCleared cleared;
    set_device_allocation_failure_for_testing(fail_at);
    LoadProgress progress;
    LocalLoadReservation reservation(0, estimate.transition_peak_bytes);
    std::shared_ptr<Resident> b;
    const std::string text = error_text([&] { b = backend_->load(faulted_b_, 0, progress, reservation); },
                                        ErrorKind::payload_too_large);
    const DeviceAllocationFaultReport report = clear_device_allocation_failure_for_testing();
    EXPECT_TRUE(report.failure_injected) << where;
    EXPECT_EQ(report.allocations_counted, fail_at) << where << ": the load went on allocating after the failure";
    EXPECT_NE(text.find("not enough device memory on GPU 0 to load " + faulted_b_.name), std::string::npos)
        << where << ": " << text;
    EXPECT_NE(text.find("cudaErrorMemoryAllocation"), std::string::npos) << where << ": " << text;
    EXPECT_FALSE(b) << where;
    EXPECT_EQ(progress.stage.load(), LoadStage::failed) << where;
    // Nothing of B stays: the backend's accounting exactly, the driver's within a page or two.
    EXPECT_EQ(cuda_resident_bytes_in_use(), in_use_with_a) << where;
    const std::uint64_t free_after = trimmed_free_bytes();
    largest_drift = std::max(largest_drift, absolute_difference(free_after, free_with_a));
    EXPECT_LE(absolute_difference(free_after, free_with_a), kFreeMemoryTolerance)
        << where << ": free " << free_after << " B after, " << free_with_a << " B before";
    // A is still served, exactly.
    EXPECT_TRUE(products_of(*a) == expected_a_) << where << ": A's products changed";
  }
  std::printf("largest cudaMemGetInfo difference after a failed load: %llu B\n",
              static_cast<unsigned long long>(largest_drift));

  // Without the fault, B loads and is exact; A is untouched.
  {
    LoadProgress progress;
    const std::shared_ptr<Resident> b = backend_->load(faulted_b_, 0, progress);
    EXPECT_EQ(progress.stage.load(), LoadStage::done);
    EXPECT_TRUE(products_of(*b) == expected_b_) << "B after the faults differs from the CPU backend";
    EXPECT_EQ(cuda_resident_bytes_in_use(), in_use_with_a + b->resident_bytes());
  }
  EXPECT_TRUE(products_of(*a) == expected_a_);
  EXPECT_EQ(cuda_resident_bytes_in_use(), in_use_with_a);
}

TEST_F(CudaAllocationFault, ThroughTheResidencyManagerAFailedLoadLeavesOnlyTheOtherResidentAccounted) {
  const std::uint64_t allocations = count_allocations_of_b();
  ASSERT_GE(allocations, 20u);
  // Tile sums off: their background build allocates request scratch after
  // each load, which would blur the allocation counts and free memory this
  // test checks (the next test covers them through the manager).
  residency::ResidencyOptions options;
  options.tile_sums = false;
  residency::ResidencyManager manager(*backend_, options);
  const std::uint64_t in_use_before = cuda_resident_bytes_in_use();
  {
    // A pinned by a lease: an out-of-memory retry has nothing it may evict.
    const residency::ResidentLease a = manager.acquire(resident_a_);
    ASSERT_TRUE(a);
    ASSERT_TRUE(products_of(*a) == expected_a_);
    const residency::DeviceUsage usage_with_a = manager.device_usage().at(0);
    EXPECT_EQ(usage_with_a.resident_entries, 1u);
    EXPECT_EQ(usage_with_a.resident_bytes, a->resident_bytes());
    const std::uint64_t in_use_with_a = cuda_resident_bytes_in_use();
    const std::uint64_t free_with_a = trimmed_free_bytes();
    // The first allocation, one on the encode worker's thread in the middle, the last.
    for (const std::uint64_t fail_at : {std::uint64_t{1}, allocations / 2, allocations}) {
      const std::string where = "allocation " + std::to_string(fail_at) + " of " + std::to_string(allocations);
      const residency::ResidencyCounters counters_before = manager.counters();
      AllocationFaultCleared cleared;
      set_device_allocation_failure_for_testing(fail_at);
      const std::string text =
          error_text([&] { (void)manager.acquire(faulted_b_); }, ErrorKind::payload_too_large);
      EXPECT_TRUE(clear_device_allocation_failure_for_testing().failure_injected) << where;
      EXPECT_EQ(text, residency::kLoadDidNotFitMessage) << where;
      const residency::ResidencyCounters counters = manager.counters();
      EXPECT_EQ(counters.out_of_memory_retries, counters_before.out_of_memory_retries + 1) << where;
      EXPECT_EQ(counters.loads_failed, counters_before.loads_failed + 1) << where;
      EXPECT_EQ(counters.evictions, counters_before.evictions) << where;
      // No resident of B, served or remembered; the accounting is A's alone again.
      EXPECT_FALSE(manager.find(faulted_b_)) << where;
      EXPECT_EQ(manager.status(faulted_b_).state, residency::ResidencyState::absent) << where;
      const residency::DeviceUsage usage = manager.device_usage().at(0);
      EXPECT_EQ(usage.resident_entries, 1u) << where;
      EXPECT_EQ(usage.resident_bytes, usage_with_a.resident_bytes) << where;
      EXPECT_EQ(cuda_resident_bytes_in_use(), in_use_with_a) << where;
      EXPECT_LE(absolute_difference(trimmed_free_bytes(), free_with_a), kFreeMemoryTolerance) << where;
      // A is still resident and served, exactly.
      const residency::ResidentLease again = manager.find(resident_a_);
      ASSERT_TRUE(again) << where;
      EXPECT_TRUE(products_of(*again) == expected_a_) << where;
    }
    // Without the fault, B loads beside A and is exact.
    {
      const residency::ResidentLease b = manager.acquire(faulted_b_);
      ASSERT_TRUE(b);
      EXPECT_TRUE(products_of(*b) == expected_b_);
      EXPECT_EQ(manager.device_usage().at(0).resident_entries, 2u);
    }
    EXPECT_TRUE(manager.evict(faulted_b_));
    EXPECT_EQ(cuda_resident_bytes_in_use(), in_use_with_a);
  }

  // A unpinned: the manager answers B's out-of-memory by evicting A and
  // loading B again on the same device, which succeeds (a clean reload).
  {
    const residency::ResidencyCounters counters_before = manager.counters();
    AllocationFaultCleared cleared;
    set_device_allocation_failure_for_testing(allocations / 2);
    const residency::ResidentLease b = manager.acquire(faulted_b_);
    const DeviceAllocationFaultReport report = clear_device_allocation_failure_for_testing();
    EXPECT_TRUE(report.failure_injected);
    EXPECT_EQ(report.allocations_counted, allocations / 2 + allocations);  // the failed attempt, then a whole load
    ASSERT_TRUE(b);
    EXPECT_TRUE(products_of(*b) == expected_b_);
    const residency::ResidencyCounters counters = manager.counters();
    EXPECT_EQ(counters.out_of_memory_retries, counters_before.out_of_memory_retries + 1);
    EXPECT_EQ(counters.evictions, counters_before.evictions + 1);
    EXPECT_FALSE(manager.find(resident_a_));
    const residency::DeviceUsage usage = manager.device_usage().at(0);
    EXPECT_EQ(usage.resident_entries, 1u);
    EXPECT_EQ(usage.resident_bytes, b->resident_bytes());
    EXPECT_EQ(cuda_resident_bytes_in_use(), in_use_before + b->resident_bytes());
  }
  // A loads again on request, exact.
  const residency::ResidentLease a = manager.acquire(resident_a_);
  ASSERT_TRUE(a);
  EXPECT_TRUE(products_of(*a) == expected_a_);
}

TEST_F(CudaAllocationFault, ThroughTheResidencyManagerTileSumsAreBuiltAndLeaveNothingOnTheDeviceAfterEviction) {
  residency::ResidencyManager manager(*backend_, residency::ResidencyOptions{});
  const std::uint64_t in_use_before = cuda_resident_bytes_in_use();
  {
    const residency::ResidentLease a = manager.acquire(resident_a_);
    ASSERT_TRUE(a);
    const TileSumsState state = a->tile_sums().wait_settled(std::chrono::seconds(60));
    EXPECT_TRUE(state == TileSumsState::ready || state == TileSumsState::skipped) << tile_sums_state_name(state);
    EXPECT_TRUE(products_of(*a) == expected_a_);
    EXPECT_EQ(cuda_resident_bytes_in_use(), in_use_before + a->resident_bytes());
  }
  EXPECT_TRUE(manager.evict(resident_a_));
  EXPECT_EQ(cuda_resident_bytes_in_use(), in_use_before);
}

}  // namespace
}  // namespace quantem::backend
