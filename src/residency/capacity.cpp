#include "quantem/residency/capacity.hpp"

#include <algorithm>
#include <numeric>

namespace quantem::residency {
namespace {
__extension__ typedef unsigned __int128 uint128;  // exact products of two byte counts
}  // namespace

DeviceCapacity device_capacity(const DeviceHoldings& holdings) {
  DeviceCapacity capacity;
  capacity.info = holdings.info;
  capacity.free_bytes = holdings.free_bytes;
  capacity.resident_bytes = holdings.resident_bytes + holdings.loading_bytes + holdings.draining_bytes;
  capacity.resident_entries = holdings.resident_entries;
  capacity.active_resident_bytes = std::min(holdings.active_bytes, capacity.resident_bytes);
  capacity.evictable_bytes = capacity.resident_bytes - capacity.active_resident_bytes;
  const std::uint64_t budget = holdings.info.budget_bytes;
  if (budget > 0) {
    std::uint64_t peak = budget;
    if (holdings.free_bytes) peak = std::min(peak, *holdings.free_bytes + capacity.evictable_bytes);
    capacity.available_peak_bytes = peak;
    capacity.available_resident_bytes =
        budget > capacity.active_resident_bytes ? budget - capacity.active_resident_bytes : 0;
  } else if (holdings.free_bytes) {
    capacity.available_peak_bytes = *holdings.free_bytes + capacity.evictable_bytes;
  }
  return capacity;
}

bool is_candidate(const DeviceCapacity& capacity, const backend::LoadEstimate& estimate) {
  const bool peak_fits =
      !capacity.available_peak_bytes || estimate.transition_peak_bytes <= *capacity.available_peak_bytes;
  const bool resident_fits =
      !capacity.available_resident_bytes || estimate.resident_bytes <= *capacity.available_resident_bytes;
  return peak_fits && resident_fits;
}

std::vector<std::size_t> order_candidates(const std::vector<DeviceCapacity>& capacities,
                                          const backend::LoadEstimate& estimate) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < capacities.size(); ++i) {
    if (is_candidate(capacities[i], estimate)) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t ia, std::size_t ib) {
    const DeviceCapacity& a = capacities[ia];
    const DeviceCapacity& b = capacities[ib];
    if (a.resident_entries != b.resident_entries) return a.resident_entries < b.resident_entries;
    const std::uint64_t peak_a = a.available_peak_bytes.value_or(UINT64_MAX);
    const std::uint64_t peak_b = b.available_peak_bytes.value_or(UINT64_MAX);
    if (peak_a != peak_b) return peak_a > peak_b;
    // Fill resident/budget compared exactly (cross-multiplied); no budget is an empty device.
    const uint128 fill_a = a.info.budget_bytes ? uint128(a.resident_bytes) * (b.info.budget_bytes ? b.info.budget_bytes : 1) : 0;
    const uint128 fill_b = b.info.budget_bytes ? uint128(b.resident_bytes) * (a.info.budget_bytes ? a.info.budget_bytes : 1) : 0;
    if (fill_a != fill_b) return fill_a < fill_b;
    return a.info.index < b.info.index;
  });
  return order;
}

std::uint64_t required_free_bytes(std::uint64_t transition_peak_bytes) {
  constexpr std::uint64_t kOneGiB = 1ULL << 30;
  return transition_peak_bytes + std::min(kOneGiB, transition_peak_bytes / 20);
}

}  // namespace quantem::residency
