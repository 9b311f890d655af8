#pragma once
// The capacity model of one device (docs/admission.md, '2. The capacity model'), as pure functions of a
// snapshot. The capabilities route reports these numbers and admission filters
// candidate devices with exactly the same function, so a load whose estimate
// equals the advertised (available_resident_bytes, available_peak_bytes) is a
// candidate and one byte more in either is not, as in the reference.
//
// Bytes held on a device:
//   resident  Σ resident_bytes() of the acquisitions resident there (pinned or not);
//   loading   Σ current reservations of loads admitted there and not finished: the
//             admitted transition peak, grown by the load as it learns its resident's
//             size (a cancelled load keeps its reservation until the backend has freed it);
//   draining  Σ bytes of residents already evicted (DELETE, changed files) that a
//             running request still uses.
// All of it except the active acquisition can be reclaimed by admission:
// unpinned residents at once (least recently used first), the rest once the
// requests and loads holding it finish (admission waits for them, bounded).
// That is why `evictable_bytes` counts pinned residents, as the reference does.
#include <cstdint>
#include <optional>
#include <vector>

#include "quantem/backend/backend.hpp"

namespace quantem::residency {

// What one device holds, taken under the residency manager's lock.
struct DeviceHoldings {
  backend::DeviceInfo info;                 // index, name, total memory, budget (0: no budget)
  std::optional<std::uint64_t> free_bytes;  // live free memory, nullopt when unknown
  std::uint64_t resident_bytes = 0;
  std::uint64_t loading_bytes = 0;
  std::uint64_t draining_bytes = 0;
  std::uint64_t active_bytes = 0;  // the active acquisition's bytes when it lives here and is preserved
  std::uint64_t resident_entries = 0;  // resident + loading acquisitions
};

// The reference's per-device telemetry fields (capabilities `devices[i]`).
struct DeviceCapacity {
  backend::DeviceInfo info;
  std::optional<std::uint64_t> free_bytes;
  std::uint64_t resident_bytes = 0;         // resident + loading + draining
  std::uint64_t resident_entries = 0;
  std::uint64_t active_resident_bytes = 0;
  std::uint64_t evictable_bytes = 0;        // resident_bytes - active_resident_bytes
  // budget, lowered to free + evictable when free memory is known; with no
  // budget, free + evictable; nullopt when neither is known (unlimited).
  std::optional<std::uint64_t> available_peak_bytes;
  // budget - active; nullopt without a budget (unlimited).
  std::optional<std::uint64_t> available_resident_bytes;
};

DeviceCapacity device_capacity(const DeviceHoldings& holdings);

// A device is a candidate for a load when its transition peak fits the
// available peak and its resident bytes fit the available resident bytes
// (nullopt: unlimited).
bool is_candidate(const DeviceCapacity& capacity, const backend::LoadEstimate& estimate);

// Candidate order (docs/admission.md, '3. Admission'): fewest resident entries, then the largest
// available peak, then the lowest fill (resident_bytes / budget), then the
// lowest device index. Returns the indices into `capacities` of the candidates
// for `estimate`, best first.
std::vector<std::size_t> order_candidates(const std::vector<DeviceCapacity>& capacities,
                                          const backend::LoadEstimate& estimate);

// Free memory admission wants before a load of this transition peak: the peak
// plus 5% headroom, at most 1 GiB (docs/admission.md, '3. Admission').
std::uint64_t required_free_bytes(std::uint64_t transition_peak_bytes);

}  // namespace quantem::residency
