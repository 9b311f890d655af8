#pragma once
// Which acquisitions are resident, on which device, and in what state.
//
// One resident per acquisition, keyed by master path and source signature: a
// resident whose files changed is never served (it is dropped and reloaded).
// Every plan (crop, bins) is a view of that one resident.
//
// Admission happens before any allocation (plan -> admit -> run):
//  1. the backend's estimate; a transition peak above every device budget is
//     refused with the reference's first 413 text;
//  2. candidate devices (capacity model of reference §5.1: a device qualifies
//     when the peak fits its available peak and the resident fits its available
//     resident bytes), ordered by fewest residents, then most available peak,
//     then lowest fill, then lowest index; first preserving the active
//     acquisition, then (if that admits nothing) without preserving it;
//  3. on the chosen device only, least-recently-used residents are evicted
//     until the entry count is below the per-device limit and the resident
//     bytes + loading reservations + the new peak fit the budget;
//  4. the load runs on one loader thread (loads are serialised, as in the
//     reference); its progress is observable and cancellable.
// Evicted residents still used by a running request keep their bytes counted
// ("draining") until the request releases them.
//
// This is the simple admission of the first protocol issue; the admission
// issue grows it (transition-peak accounting per stage, OOM retry, pinning).
// Thread-safe. Every wait is bounded.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/error.hpp"

namespace quantem::residency {

enum class ResidencyState { absent, loading, resident, failed };
const char* residency_state_name(ResidencyState state) noexcept;  // "absent", "loading", ...

struct ResidencyStatus {
  ResidencyState state = ResidencyState::absent;
  std::optional<int> device_index;
  std::uint64_t resident_bytes = 0;
  std::uint64_t bytes_done = 0;
  std::uint64_t bytes_total = 0;
  std::string stage;           // backend::load_stage_name while loading or after it
  std::string encoding;        // Resident::encoding() when resident
  std::string failure_reason;  // when failed
};

// Live capacity of one device (reference §5.1), including loading
// reservations and draining bytes as non-evictable use.
struct DeviceUsage {
  backend::DeviceInfo info;
  std::optional<std::uint64_t> free_bytes;
  std::uint64_t resident_bytes = 0;      // resident + reserved for loads + draining
  std::uint64_t resident_entries = 0;    // resident + loading
  std::uint64_t active_resident_bytes = 0;
  std::uint64_t evictable_bytes = 0;
  std::optional<std::uint64_t> available_peak_bytes;
  std::optional<std::uint64_t> available_resident_bytes;
};

struct ResidencyCounters {
  std::uint64_t loads_started = 0;
  std::uint64_t loads_completed = 0;
  std::uint64_t loads_failed = 0;
  std::uint64_t evictions = 0;
  std::uint64_t admission_rejections = 0;
};

struct ResidencyOptions {
  std::size_t max_entries_per_device = 8;                        // --cache-entries
  std::chrono::milliseconds load_wait_limit{std::chrono::minutes(10)};  // acquire() waiting for a load
  std::chrono::milliseconds drain_wait_limit{std::chrono::seconds(10)}; // admission waiting for draining bytes
};

// The reference's 413 texts (clients match on them).
std::string peak_exceeds_budget_message(std::uint64_t peak_bytes, std::uint64_t largest_budget_bytes);
extern const char* const kNoDeviceCanAdmitMessage;
extern const char* const kLoadDidNotFitMessage;
extern const char* const kStaleInspectionMessage;  // 409 when a request raced a file rewrite

class ResidencyManager {
 public:
  ResidencyManager(backend::Backend& backend, ResidencyOptions options);
  ~ResidencyManager();  // shutdown()
  ResidencyManager(const ResidencyManager&) = delete;
  ResidencyManager& operator=(const ResidencyManager&) = delete;

  // The resident of this exact source, loading it first when needed and
  // waiting (bounded) for the load. Throws quantem::Error:
  //   payload_too_large (413 texts) when admission refuses,
  //   the load's own error (corrupt_data, io, conflict when files changed
  //   during the load, ...), unavailable when the wait limit passes or the
  //   manager is shutting down.
  std::shared_ptr<backend::Resident> acquire(const catalog::Acquisition& acquisition);

  // The resident when it is already loaded for this exact signature (touches
  // its LRU position), else nullptr. Never loads.
  std::shared_ptr<backend::Resident> find(const catalog::Acquisition& acquisition);

  // Admits and queues a load without waiting. Admission errors throw as in
  // acquire(); a previous failure is retried. Returns the status after queueing.
  ResidencyStatus request_load(const catalog::Acquisition& acquisition);

  ResidencyStatus status(const catalog::Acquisition& acquisition) const;

  // Drops the resident (or cancels the load) of this master. false when absent.
  bool evict(const catalog::Acquisition& acquisition);

  // The active acquisition (set by realspace products) is preserved by the
  // first admission pass.
  void mark_active(const std::string& master_path);

  std::vector<DeviceUsage> device_usage() const;
  ResidencyCounters counters() const;
  std::uint64_t max_budget_bytes() const;

  // Cancels queued and running loads, joins the loader, releases every resident.
  void shutdown();

 private:
  struct Entry;
  using EntryPtr = std::shared_ptr<Entry>;
  struct Draining {
    std::weak_ptr<backend::Resident> resident;
    int device = 0;
    std::uint64_t bytes = 0;
  };

  // The entry for this master and signature; a stale entry (its files changed)
  // is dropped; stale_caller is set when the caller's signature is the stale one.
  EntryPtr lookup_locked(const catalog::Acquisition& acquisition, bool& stale_caller);
  EntryPtr admit_locked(std::unique_lock<std::mutex>& lock, const catalog::Acquisition& acquisition);
  EntryPtr try_admit_locked(const catalog::Acquisition& acquisition, bool& blocked_by_draining);
  bool make_room_locked(int device, std::uint64_t peak_bytes, const std::optional<std::string>& preserved,
                        bool& blocked_by_draining);
  void remove_locked(const EntryPtr& entry);
  void touch_locked(const EntryPtr& entry);
  DeviceUsage usage_locked(const backend::DeviceInfo& device, bool preserve_active) const;
  std::uint64_t draining_bytes_locked(int device) const;
  ResidencyStatus status_of(const EntryPtr& entry) const;
  void loader_loop();

  backend::Backend& backend_;
  ResidencyOptions options_;
  std::vector<backend::DeviceInfo> devices_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, EntryPtr> entries_;  // by master path
  std::deque<EntryPtr> queue_;
  mutable std::vector<Draining> draining_;
  std::optional<std::string> active_;
  std::uint64_t clock_ = 0;
  ResidencyCounters counters_;
  bool stopping_ = false;
  std::thread loader_;
};

}  // namespace quantem::residency
