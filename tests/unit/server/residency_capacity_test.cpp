// The capacity model as pure functions (docs/admission.md, '2. The capacity model'
// with the reference's examples, and the candidate order of '3. Admission').
#include <gtest/gtest.h>

#include "quantem/residency/capacity.hpp"

using namespace quantem;
using namespace quantem::residency;

namespace {

DeviceHoldings device(int index, std::uint64_t budget) {
  DeviceHoldings holdings;
  holdings.info.index = index;
  holdings.info.budget_bytes = budget;
  return holdings;
}

backend::LoadEstimate estimate(std::uint64_t resident, std::uint64_t peak) { return {resident, peak}; }

}  // namespace

TEST(CapacityModel, ReportsLiveAdmissionBytesAsTheReference) {
  // budget 100, active 30 + other 20, free 10 -> 50/30/20, peak 30, resident 70.
  DeviceHoldings holdings = device(0, 100);
  holdings.resident_bytes = 50;
  holdings.active_bytes = 30;
  holdings.resident_entries = 2;
  holdings.free_bytes = 10;
  const DeviceCapacity capacity = device_capacity(holdings);
  EXPECT_EQ(capacity.resident_bytes, 50u);
  EXPECT_EQ(capacity.active_resident_bytes, 30u);
  EXPECT_EQ(capacity.evictable_bytes, 20u);
  EXPECT_EQ(capacity.available_peak_bytes, 30u);
  EXPECT_EQ(capacity.available_resident_bytes, 70u);
  EXPECT_EQ(capacity.resident_entries, 2u);
}

TEST(CapacityModel, UsesTheBudgetWhenFreeMemoryIsUnknown) {
  DeviceHoldings holdings = device(0, 100);
  holdings.resident_bytes = 30;
  holdings.active_bytes = 30;
  const DeviceCapacity capacity = device_capacity(holdings);
  EXPECT_FALSE(capacity.free_bytes.has_value());
  EXPECT_EQ(capacity.available_peak_bytes, 100u);
  EXPECT_EQ(capacity.available_resident_bytes, 70u);
}

TEST(CapacityModel, LoadsInProgressAndDrainingBytesCountAsHeldAndReclaimable) {
  DeviceHoldings holdings = device(0, 100);
  holdings.resident_bytes = 10;
  holdings.loading_bytes = 25;
  holdings.draining_bytes = 5;
  holdings.free_bytes = 0;
  const DeviceCapacity capacity = device_capacity(holdings);
  EXPECT_EQ(capacity.resident_bytes, 40u);
  EXPECT_EQ(capacity.evictable_bytes, 40u);
  EXPECT_EQ(capacity.available_peak_bytes, 40u);  // free 0 + everything that will be released
  EXPECT_EQ(capacity.available_resident_bytes, 100u);
}

TEST(CapacityModel, NoBudgetMeansFreeMemoryOrUnlimited) {
  DeviceHoldings holdings = device(0, 0);
  holdings.resident_bytes = 7;
  EXPECT_FALSE(device_capacity(holdings).available_peak_bytes.has_value());
  EXPECT_FALSE(device_capacity(holdings).available_resident_bytes.has_value());
  EXPECT_TRUE(is_candidate(device_capacity(holdings), estimate(1ULL << 40, 1ULL << 40)));
  holdings.free_bytes = 3;
  EXPECT_EQ(device_capacity(holdings).available_peak_bytes, 10u);
}

TEST(CapacityModel, AdvertisedCapacityIsExactlyTheCandidateBoundary) {
  DeviceHoldings holdings = device(2, 100);
  holdings.resident_bytes = 50;
  holdings.active_bytes = 30;
  holdings.free_bytes = 10;
  const DeviceCapacity capacity = device_capacity(holdings);
  const std::uint64_t resident = *capacity.available_resident_bytes, peak = *capacity.available_peak_bytes;
  EXPECT_TRUE(is_candidate(capacity, estimate(resident, peak)));
  EXPECT_FALSE(is_candidate(capacity, estimate(resident + 1, peak)));
  EXPECT_FALSE(is_candidate(capacity, estimate(resident, peak + 1)));
}

TEST(CapacityModel, ActiveAcquisitionOnOneDevicePreservesCapacityOnAnother) {
  DeviceHoldings first = device(0, 100), second = device(1, 100);
  first.resident_bytes = 60;
  first.active_bytes = 60;
  first.resident_entries = 1;
  const std::vector<DeviceCapacity> capacities{device_capacity(first), device_capacity(second)};
  EXPECT_EQ(capacities[0].available_resident_bytes, 40u);
  EXPECT_EQ(capacities[1].available_resident_bytes, 100u);
  EXPECT_EQ(order_candidates(capacities, estimate(50, 70)), std::vector<std::size_t>({1}));
}

TEST(CapacityModel, CandidatesAreOrderedByEntriesThenPeakThenFillThenIndex) {
  // Fewest resident entries first.
  DeviceHoldings crowded = device(0, 100), empty = device(1, 100);
  crowded.resident_entries = 2;
  crowded.resident_bytes = 10;
  EXPECT_EQ(order_candidates({device_capacity(crowded), device_capacity(empty)}, estimate(1, 1)),
            std::vector<std::size_t>({1, 0}));
  // Equal entries: the largest available peak first.
  DeviceHoldings low_free = device(0, 100), high_free = device(1, 100);
  low_free.free_bytes = 50;
  high_free.free_bytes = 90;
  EXPECT_EQ(order_candidates({device_capacity(low_free), device_capacity(high_free)}, estimate(1, 1)),
            std::vector<std::size_t>({1, 0}));
  // Equal entries and peak: the lowest fill (resident / budget), compared exactly.
  DeviceHoldings fuller = device(0, 300), emptier = device(1, 200);
  fuller.resident_entries = emptier.resident_entries = 1;
  fuller.resident_bytes = 101;  // 101/300 > 67/200
  emptier.resident_bytes = 67;
  fuller.free_bytes = emptier.free_bytes = 0;  // available peak = evictable: make them equal
  fuller.active_bytes = 101 - 50;
  emptier.active_bytes = 67 - 50;
  const auto a = device_capacity(fuller), b = device_capacity(emptier);
  ASSERT_EQ(a.available_peak_bytes, b.available_peak_bytes);
  EXPECT_EQ(order_candidates({a, b}, estimate(1, 1)), std::vector<std::size_t>({1, 0}));
  // Everything equal: the lowest device index.
  EXPECT_EQ(order_candidates({device_capacity(device(3, 100)), device_capacity(device(1, 100))}, estimate(1, 1)),
            std::vector<std::size_t>({1, 0}));
}

TEST(CapacityModel, RequiredFreeBytesAddFivePercentUpToOneGiB) {
  EXPECT_EQ(required_free_bytes(100), 105u);
  EXPECT_EQ(required_free_bytes(19), 19u);
  EXPECT_EQ(required_free_bytes(100ULL << 30), (100ULL << 30) + (1ULL << 30));
}
