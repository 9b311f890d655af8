#pragma once
// Which acquisition is resident on which device: the one admission path both
// backends share (plan -> admit -> run). docs/admission.md has the rules with
// examples, the reference's admission and residency behaviour adapted to one
// resident per acquisition.
//
// One resident per acquisition, keyed by master path and source signature:
// every plan (crop, bins) is a view of it, and a resident whose files changed
// is never served (it is dropped and reloaded).
//
// Admission, before any allocation, on the caller's thread under one lock
// (so the decision order is the arrival order):
//  1. the backend's estimate (resident bytes, transition peak). A peak above
//     every device budget: 413 "Requested exact load needs a ...";
//  2. candidate devices by the capacity model (capacity.hpp) in the order
//     fewest residents, largest available peak, lowest fill, lowest index;
//     first preserving the active acquisition, then without preserving it.
//     None: 413 "No configured CUDA GPU can admit the exact load. ...";
//  3. on the first candidate where room can be made, and only there, the least
//     recently used residents that no request is using (unpinned) and that are
//     not preserved are evicted until the entry count is below
//     max_entries_per_device and resident + loading + draining + the new peak
//     fit the budget; then more while free memory is below the peak plus
//     headroom. A device where only pinned residents, loads in progress or
//     draining bytes stand in the way makes the caller wait (bounded by
//     busy_wait_limit, then 503). Nowhere: 413 "The exact load did not fit ...".
//  4. the reservation is the estimate's transition peak (staging + provisional
//     resident). While the load runs it grows the reservation before each
//     allocation beyond it (backend::LoadReservation): idle least recently
//     used residents on that device only are evicted for it (the bounded
//     wait of step 3 applies when only pinned or draining bytes stand in the
//     way); growth that cannot be had fails the attempt with
//     payload_too_large, the backend frees it, and the next candidate is tried
//     with the size the load asked for. When the load returns, the
//     reservation becomes the resident's resident_bytes();
//  5. the load runs on that device's loader thread (one per device: loads on
//     one device are serialised, loads on different devices overlap). When
//     the backend runs out of memory (Error payload_too_large), the attempt has
//     freed what it took; one more least recently used resident on that device
//     is evicted and the load retried there; with nothing left to evict, the
//     next candidate is tried; after the last, the load fails with the third
//     413 text alone.
//
// A lease (ResidentLease) pins its resident: while any copy of it lives, the
// resident is never evicted by admission. An explicit eviction or a source
// change removes a pinned resident from the catalogue of residents at once,
// but its bytes stay counted ("draining") until the last lease is gone.
//
// Idle release (ResidencyOptions::idle_release, off by default): residents no
// request has used for that long (not pinned, not loading) are evicted by a
// background check and the backend returns its cached device memory to the
// driver (Backend::trim_device_memory); the next request loads them again.
//
// Tile sums (ResidencyOptions::tile_sums): once a load is published, the
// resident's tile sums (backend/tile_sums.hpp) are queued on one background
// thread ("quantem-tiles") that sums one tile at a time under the lease's
// compute lock, so a request waits at most for one tile. Where a device's
// budget is host memory (the CPU backend), the table's bytes are admitted
// then against the budget beside the resident (nothing is evicted for them:
// without room the tile sums are skipped) and count with the resident's
// bytes until it is dropped. Eviction and shutdown cancel a build at its next
// tile; a build in progress holds the resident only while one tile is summed.
//
// Region-first loads: a load whose backend publishes its resident early
// (backend::LoadProgress::rows_held; the CPU backend) hands it to requests
// whose rows it holds while the load goes on into the same resident: one
// admission, one reservation, one resident. Its bytes count as the load's
// reservation until the load ends. A load that fails or is cancelled after
// publishing is never retried on another device or in place: the resident
// serves no new request, its leases drain it, and the next request loads
// again. The whole resident is published (state resident) only when the load
// returns and its files are unchanged.
//
// Threads: public methods may be called from any thread. Backend::load runs
// only on the loader thread of its device (named "quantem-load-<index>"); a
// CUDA backend binds the device on that thread before device work. Compute on
// a resident runs on the caller's thread under the lease's compute lock.
// Every wait is bounded (ResidencyOptions).
#include <chrono>
#include <cstdint>
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
#include "quantem/residency/capacity.hpp"

namespace quantem::residency {

enum class ResidencyState { absent, loading, resident, failed };
const char* residency_state_name(ResidencyState state) noexcept;  // "absent", "loading", ...

struct ResidencyStatus {
  ResidencyState state = ResidencyState::absent;
  std::optional<int> device_index;
  std::uint64_t resident_bytes = 0;
  std::uint64_t reserved_bytes = 0;  // held on the device: a load's current reservation, a resident's bytes
  std::uint64_t bytes_done = 0;
  std::uint64_t bytes_total = 0;
  std::string stage;           // backend::load_stage_name while loading or after it
  std::string encoding;        // Resident::encoding() when resident
  std::string failure_reason;  // when failed
  // The resident's tile sums (backend/tile_sums.hpp): state name and the bytes
  // they hold now; "none" and 0 when not resident or tile sums are off.
  std::string tile_sums_state = "none";
  std::uint64_t tile_sums_bytes = 0;
  // Scan rows requests can be answered from: every row when resident; while
  // loading, the rows a load that publishes early holds so far.
  std::uint64_t scan_rows_resident = 0;
  std::uint64_t scan_rows = 0;  // the acquisition's
};

// The capabilities fields of one device (capacity.hpp), live.
using DeviceUsage = DeviceCapacity;

struct ResidencyCounters {
  std::uint64_t loads_started = 0;     // admitted loads
  std::uint64_t loads_completed = 0;
  std::uint64_t loads_failed = 0;
  std::uint64_t evictions = 0;          // residents dropped (LRU, OOM retry, DELETE, changed files)
  std::uint64_t admission_rejections = 0;  // 413s
  std::uint64_t out_of_memory_retries = 0;  // backend OOMs answered by evicting or moving on
  std::uint64_t busy_timeouts = 0;          // bounded waits that ended in 503
  std::uint64_t reservation_growths = 0;    // LoadReservation::grow calls granted
  std::uint64_t growth_refusals = 0;        // grow calls refused (the attempt failed with payload_too_large)
  std::uint64_t idle_releases = 0;          // residents released by the idle check (also counted in evictions)
};

// The time source of idle release; tests inject a fake one.
class ResidencyClock {
 public:
  virtual ~ResidencyClock() = default;
  virtual std::chrono::steady_clock::time_point now() const = 0;
};
std::shared_ptr<ResidencyClock> steady_residency_clock();

struct ResidencyOptions {
  std::size_t max_entries_per_device = 8;  // --cache-entries; 0 is treated as 1
  // acquire() waiting for a load to finish.
  std::chrono::milliseconds load_wait_limit{std::chrono::minutes(10)};
  // Admission waiting for residents in use, loads in progress or draining bytes
  // on the devices it could use.
  std::chrono::milliseconds busy_wait_limit{std::chrono::seconds(30)};
  // Residents unused for this long are released (--idle-release); 0: never.
  std::chrono::milliseconds idle_release{0};
  // How often the background check runs (real time); 0: idle_release / 10,
  // between 1 s and 60 s.
  std::chrono::milliseconds idle_check_interval{0};
  std::shared_ptr<ResidencyClock> clock;  // null: the steady clock
  // Build each published resident's tile sums in the background (--no-tile-sums: off).
  bool tile_sums = true;
  // Loads that run at once on one device, each on a runner thread of its own
  // (a load stuck in a read holds one; decision 0021). Admission still bounds
  // what they reserve together.
  std::size_t parallel_loads_per_device = 4;
};

// The reference's 413 texts (clients match on them).
std::string peak_exceeds_budget_message(std::uint64_t peak_bytes, std::uint64_t largest_budget_bytes);
extern const char* const kNoDeviceCanAdmitMessage;
extern const char* const kLoadDidNotFitMessage;
extern const char* const kStaleInspectionMessage;  // 409 when a request raced a file rewrite

// A pinned resident. Copies share the pin; the resident stays loaded (never
// evicted by admission) until the last copy is destroyed. Empty when default
// constructed or returned by find() for an acquisition that is not resident.
class ResidentLease {
 public:
  ResidentLease() = default;
  explicit operator bool() const { return resident_ != nullptr; }
  backend::Resident& operator*() const { return *resident_; }
  backend::Resident* operator->() const { return resident_.get(); }
  backend::Resident* get() const { return resident_.get(); }

  // One compute at a time per resident (different residents run in parallel).
  // Hold it for the whole product computation.
  std::unique_lock<std::mutex> lock_compute() const { return std::unique_lock<std::mutex>(*compute_); }

 private:
  friend class ResidencyManager;
  std::shared_ptr<backend::Resident> resident_;  // its deleter releases the pin
  std::shared_ptr<std::mutex> compute_;
};

class ResidencyManager;

// Bytes a job other than a load holds on one device while it runs (an
// export's working memory on the CPU backend, whose devices are host
// memory), admitted by ResidencyManager::admit_working_memory. Counted with
// the device's loading bytes until the grant is destroyed. Empty when
// default constructed. Must not outlive its manager.
class WorkingMemoryGrant {
 public:
  WorkingMemoryGrant() = default;
  WorkingMemoryGrant(WorkingMemoryGrant&& other) noexcept;
  WorkingMemoryGrant& operator=(WorkingMemoryGrant&& other) noexcept;
  WorkingMemoryGrant(const WorkingMemoryGrant&) = delete;
  WorkingMemoryGrant& operator=(const WorkingMemoryGrant&) = delete;
  ~WorkingMemoryGrant();
  std::uint64_t bytes() const { return bytes_; }

 private:
  friend class ResidencyManager;
  ResidencyManager* manager_ = nullptr;
  std::size_t device_position_ = 0;
  std::uint64_t bytes_ = 0;
};

class ResidencyManager {
 public:
  ResidencyManager(backend::Backend& backend, ResidencyOptions options);
  ~ResidencyManager();  // shutdown()
  ResidencyManager(const ResidencyManager&) = delete;
  ResidencyManager& operator=(const ResidencyManager&) = delete;

  // The resident of this exact source, pinned; loads it first when needed and
  // waits (bounded) for the load. Throws quantem::Error:
  //   payload_too_large with one of the three 413 texts;
  //   the load's own error (corrupt_data, io, unprocessable, conflict when the
  //   files changed during the load, ...);
  //   conflict kStaleInspectionMessage when the caller's inspection is older
  //   than the files (resolve again and retry);
  //   unavailable when a bounded wait expires, the load was cancelled, or the
  //   manager is shutting down.
  //
  // Region-first: with `window` (the scan window of the caller's plan: its
  // rows and columns; rows alone mean every column), the lease may come
  // before the load ends, as soon as the resident holds the window
  // (backend::HeldRows); a load this call starts reads it first
  // (backend::LoadProgress::first_rows, first_columns). Without it, every row.
  ResidentLease acquire(const catalog::Acquisition& acquisition,
                        std::optional<backend::ScanWindow> window = std::nullopt);

  // The resident, pinned, when it is already loaded for this exact signature,
  // or its load holds `window` already (every row without it); touches its
  // LRU position. An empty lease otherwise. Never loads.
  ResidentLease find(const catalog::Acquisition& acquisition,
                     std::optional<backend::ScanWindow> window = std::nullopt);

  // Admits and queues a load without waiting for it (POST /load). Admission
  // errors throw as in acquire(); a remembered failure is retried. Returns the
  // status after queueing (resident when it already was).
  ResidencyStatus request_load(const catalog::Acquisition& acquisition);

  ResidencyStatus status(const catalog::Acquisition& acquisition) const;

  // Admits `bytes` of working memory on a device beside what it holds now
  // (residents, loads, draining bytes, other grants): nothing is evicted for
  // them. Throws Error(payload_too_large) naming `purpose` when the device's
  // budget cannot hold them, bad_request for an unknown device. Loads
  // admitted while the grant lives see its bytes as loading bytes.
  WorkingMemoryGrant admit_working_memory(int device_index, std::uint64_t bytes, const std::string& purpose);

  // Drops the resident of this master (its bytes drain while requests use it)
  // or cancels its load (everything the load took is freed by the backend;
  // the reservation is held until then). false when absent.
  bool evict(const catalog::Acquisition& acquisition);

  // Drops every resident, load or remembered failure whose source files
  // changed on disk (stat again). Only entries whose signature names one of
  // `paths` are checked; all entries when `paths` is empty. Returns how many
  // were dropped.
  std::size_t drop_changed_sources(const std::vector<std::string>& paths = {});

  // The active acquisition (the last realspace product) is preserved by the
  // first admission pass and excluded from evictable bytes.
  void mark_active(const std::string& master_path);

  // One turn of the idle check (the background thread calls it too): evicts
  // every resident, pinned by no lease and not loading, unused for at least
  // idle_release by the clock, then asks the backend to trim the devices it
  // freed memory on. Returns how many were released; 0 when idle release is off.
  std::size_t release_idle_residents();

  std::vector<DeviceUsage> device_usage() const;
  ResidencyCounters counters() const;
  std::uint64_t max_budget_bytes() const;        // what a single load may use at most
  std::uint64_t aggregate_budget_bytes() const;  // reported, never used to admit one load

  // Cancels queued and running loads, joins the loaders, releases every
  // resident that no lease holds. Later calls throw unavailable.
  void shutdown();

 private:
  struct Entry;
  struct Sync;
  struct DeviceLoader;
  class Reservation;  // the backend::LoadReservation of one running load
  struct Attempt {
    std::size_t device_position = 0;  // index into devices_
    bool preserve_active = false;
  };
  struct Room {
    bool made = false;
    bool worth_waiting = false;  // only pinned, loading or draining bytes stand in the way
  };
  using EntryPtr = std::shared_ptr<Entry>;

  EntryPtr lookup_locked(const catalog::Acquisition& acquisition, bool& stale_caller);
  backend::LoadEstimate estimate_checked(const catalog::Acquisition& acquisition);
  EntryPtr admit_locked(std::unique_lock<std::mutex>& lock, const catalog::Acquisition& acquisition,
                        const backend::LoadEstimate& estimate, const std::optional<backend::ScanWindow>& first);
  std::vector<std::vector<Attempt>> plan_attempts_locked(const std::string& master_path,
                                                         const backend::LoadEstimate& estimate) const;
  Room make_room_locked(std::size_t device_position, const backend::LoadEstimate& estimate,
                        const std::optional<std::string>& preserved, const Entry* self);
  bool evict_one_locked(std::size_t device_position, const std::optional<std::string>& preserved, const Entry* self);
  void remove_locked(const EntryPtr& entry);
  void touch_locked(Entry& entry);
  DeviceHoldings holdings_locked(std::size_t device_position, bool preserve_active) const;
  ResidencyStatus status_of(const Entry& entry) const;
  ResidentLease lease_locked(const EntryPtr& entry);  // takes over one pin the caller already counted
  static void release_pin(Sync& sync, const EntryPtr& entry);
  void enqueue_locked(const EntryPtr& entry, bool front);
  void loader_loop(std::size_t device_position);
  // One load on its runner thread: run_load, then the outcome under the lock.
  void run_job(const EntryPtr& job, std::size_t device_position, const std::shared_ptr<Sync>& sync);
  // The steps of one load on the loader thread: the backend's load (unlocked;
  // the failure, if any, as a typed error), then with the lock held the
  // resident kept, or an out-of-memory load retried (true: queued again,
  // here after one more eviction or on the next candidate device), or the
  // failure recorded.
  std::optional<Error> run_load(const EntryPtr& job, int attempt_device, Reservation& reservation,
                                std::shared_ptr<backend::Resident>& resident);
  void keep_resident_locked(const EntryPtr& job, std::shared_ptr<backend::Resident> resident, int attempt_device);
  // A load's rows_held call: the resident it publishes early (the first call,
  // when its files are unchanged) and a wake-up for the requests waiting on rows.
  void rows_held(const std::weak_ptr<Entry>& job, const std::shared_ptr<backend::Resident>& resident);
  // Whether the entry can lease its resident to a request for `window` now.
  static bool can_serve_locked(const Entry& entry, const std::optional<backend::ScanWindow>& window);
  bool retry_out_of_memory_locked(const EntryPtr& job, const Error& failure, int attempt_device);
  void fail_load_locked(const EntryPtr& job, const Error& failure, int attempt_device);
  void grow_reservation(const EntryPtr& job, std::uint64_t bytes);
  void release_reservation(const EntryPtr& job, std::uint64_t bytes);
  void idle_loop();
  void schedule_tile_sums_locked(const EntryPtr& entry);
  std::optional<std::size_t> position_of(int device_index) const;

  backend::Backend& backend_;
  ResidencyOptions options_;
  const std::vector<backend::DeviceInfo> devices_;

  std::shared_ptr<Sync> sync_;  // mutex and condition variable, shared with leases
  std::vector<std::unique_ptr<DeviceLoader>> loaders_;  // by device position
  std::thread idle_thread_;                               // only with idle_release
  std::unique_ptr<backend::TileSumsBuilder> tile_builder_;  // only with tile_sums
  // Everything below is guarded by sync_->mutex.
  std::map<std::string, EntryPtr> entries_;  // by master path
  mutable std::vector<EntryPtr> draining_;  // removed entries still holding bytes (pinned, or a load still running)
  std::optional<std::string> active_;
  std::uint64_t clock_ = 0;
  ResidencyCounters counters_;
  bool stopping_ = false;
  std::vector<std::uint64_t> working_bytes_;  // by device position: live WorkingMemoryGrant bytes
  friend class WorkingMemoryGrant;
  void release_working_memory(std::size_t device_position, std::uint64_t bytes) noexcept;
};

}  // namespace quantem::residency
