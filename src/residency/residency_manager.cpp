#include "quantem/residency/residency_manager.hpp"

#include <pthread.h>

#include <algorithm>
#include <utility>
#include <condition_variable>
#include <deque>
#include <new>
#include <thread>

#include <spdlog/spdlog.h>

#include "quantem/catalog/catalog.hpp"

namespace quantem::residency {

const char* const kNoDeviceCanAdmitMessage =
    "No configured CUDA GPU can admit the exact load. Crop the scan region or increase scan/detector binning.";
const char* const kLoadDidNotFitMessage =
    "The exact load did not fit on any configured CUDA GPU. Crop the scan region or increase scan/detector binning.";

std::string peak_exceeds_budget_message(std::uint64_t peak_bytes, std::uint64_t largest_budget_bytes) {
  return "Requested exact load needs a " + catalog::format_size(peak_bytes) +
         " transition peak but the largest per-GPU data-cache budget is " + catalog::format_size(largest_budget_bytes) +
         ". Crop the scan region or increase scan/detector binning.";
}

const char* const kStaleInspectionMessage =
    "The acquisition's files changed while this request was being prepared; retry the request.";

const char* residency_state_name(ResidencyState state) noexcept {
  switch (state) {
    case ResidencyState::absent: return "absent";
    case ResidencyState::loading: return "loading";
    case ResidencyState::resident: return "resident";
    case ResidencyState::failed: return "failed";
  }
  return "absent";
}

namespace {

class SteadyResidencyClock final : public ResidencyClock {
 public:
  std::chrono::steady_clock::time_point now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

std::shared_ptr<ResidencyClock> steady_residency_clock() { return std::make_shared<SteadyResidencyClock>(); }

struct ResidencyManager::Sync {
  std::mutex mutex;
  std::condition_variable changed;  // any state change: load finished, pin released, eviction, shutdown
  std::shared_ptr<ResidencyClock> clock;
  // Load runners alive, and whether the manager is gone (a runner that comes
  // back from a stuck read after shutdown touches nothing but this).
  std::size_t runners = 0;
  bool manager_gone = false;
};

struct ResidencyManager::Entry {
  std::string master_path;
  catalog::Acquisition acquisition;  // the inspection the load uses (signature included)
  backend::LoadEstimate estimate;
  std::size_t device_position = 0;
  // While loading: the bytes reserved on the device. Set to admitted_bytes when
  // an attempt is admitted or queued again; grown and released by the load.
  std::uint64_t reserved_bytes = 0;
  std::uint64_t admitted_bytes = 0;                  // what the current attempt was admitted with
  std::optional<std::uint64_t> refused_growth_bytes;  // the reservation a load asked for and did not get
  ResidencyState state = ResidencyState::loading;
  std::shared_ptr<backend::Resident> resident;  // the manager's owner (each lease holds another until it ends)
  std::shared_ptr<backend::LoadProgress> progress = std::make_shared<backend::LoadProgress>();
  std::optional<Error> failure;
  std::uint64_t last_used = 0;
  std::chrono::steady_clock::time_point last_used_time;  // by the manager's clock: idle release
  std::uint64_t pins = 0;     // leases alive + requests waiting for this load
  bool detached = false;      // no longer in entries_ (evicted, cancelled, stale)
  bool load_started = false;  // the loader has taken it off its queue
  // When a started load was cancelled: past kCancelledLoadGrace its
  // reservation no longer counts (a load stuck in a read never frees it).
  std::optional<std::chrono::steady_clock::time_point> cancelled_at;
  std::optional<std::string> preserved;  // the active acquisition the current attempt keeps
  std::deque<Attempt> fallbacks;         // where an out-of-memory load goes next
  std::shared_ptr<std::mutex> compute_mutex = std::make_shared<std::mutex>();
  std::uint64_t tile_sum_bytes = 0;  // admitted for its tile sums on a host-memory budget
};

struct ResidencyManager::DeviceLoader {
  std::deque<EntryPtr> queue;
  std::thread thread;   // takes loads off the queue and starts a runner for each
  std::size_t running = 0;  // runners of this device that have not ended
};

namespace {

// Load errors that describe the attempt rather than the data: the next request retries.
bool is_transient(ErrorKind kind) {
  return kind == ErrorKind::payload_too_large || kind == ErrorKind::unavailable || kind == ErrorKind::conflict;
}

std::string loader_thread_name(int device_index) {
  return ("quantem-load-" + std::to_string(device_index)).substr(0, 15);  // the kernel keeps 15 characters
}

}  // namespace

// What a running load holds, reported to the manager (grow, release).
class ResidencyManager::Reservation final : public backend::LoadReservation {
 public:
  Reservation(ResidencyManager& manager, EntryPtr job, int device_index)
      : manager_(manager), job_(std::move(job)), device_index_(device_index) {}
  int device_index() const override { return device_index_; }
  std::uint64_t reserved_bytes() const override {
    std::lock_guard<std::mutex> lock(manager_.sync_->mutex);
    return job_->reserved_bytes;
  }
  void grow(std::uint64_t bytes) override { manager_.grow_reservation(job_, bytes); }
  void release(std::uint64_t bytes) override { manager_.release_reservation(job_, bytes); }

 private:
  ResidencyManager& manager_;
  EntryPtr job_;
  int device_index_;
};

ResidencyManager::ResidencyManager(backend::Backend& backend, ResidencyOptions options)
    : backend_(backend), options_(options), devices_(backend.devices()), sync_(std::make_shared<Sync>()) {
  if (options_.max_entries_per_device == 0) options_.max_entries_per_device = 1;
  sync_->clock = options_.clock ? options_.clock : steady_residency_clock();
  if (options_.idle_release.count() > 0) {
    if (options_.idle_check_interval.count() <= 0) {
      options_.idle_check_interval = std::clamp<std::chrono::milliseconds>(
          options_.idle_release / 10, std::chrono::seconds(1), std::chrono::seconds(60));
    }
    idle_thread_ = std::thread([this] { idle_loop(); });
  }
  if (options_.tile_sums) tile_builder_ = std::make_unique<backend::TileSumsBuilder>();
  working_bytes_.assign(devices_.size(), 0);
  for (std::size_t position = 0; position < devices_.size(); ++position) {
    loaders_.push_back(std::make_unique<DeviceLoader>());
  }
  for (std::size_t position = 0; position < devices_.size(); ++position) {
    loaders_[position]->thread = std::thread([this, position] { loader_loop(position); });
  }
}

ResidencyManager::~ResidencyManager() { shutdown(); }

void ResidencyManager::shutdown() {
  if (tile_builder_) tile_builder_->shutdown();  // before the lock: a build in progress finishes its tile
  {
    std::lock_guard<std::mutex> lock(sync_->mutex);
    stopping_ = true;
    for (auto& [path, entry] : entries_) entry->progress->cancel_requested = true;
    for (auto& entry : draining_) entry->progress->cancel_requested = true;
  }
  sync_->changed.notify_all();
  for (auto& loader : loaders_) {
    if (loader->thread.joinable()) loader->thread.join();
  }
  if (idle_thread_.joinable()) idle_thread_.join();
  std::unique_lock<std::mutex> lock(sync_->mutex);
  // Cancelled runners end within a batch; one stuck in a read is left behind
  // (it touches only the shared Sync when it comes back).
  if (!sync_->changed.wait_for(lock, options_.busy_wait_limit, [&] { return sync_->runners == 0; })) {
    spdlog::warn("{} loads are stuck in a read; shutting down without them", sync_->runners);
  }
  sync_->manager_gone = true;
  for (auto& loader : loaders_) loader->queue.clear();
  for (auto& [path, entry] : entries_) {
    entry->detached = true;
    if (entry->state == ResidencyState::loading) {
      entry->state = ResidencyState::failed;
      entry->failure = unavailable("the daemon is shutting down");
    }
    if (entry->pins == 0) entry->resident.reset();  // leases still out free theirs on release
  }
  entries_.clear();
  draining_.clear();
  active_.reset();
  sync_->changed.notify_all();
}

std::optional<std::size_t> ResidencyManager::position_of(int device_index) const {
  for (std::size_t position = 0; position < devices_.size(); ++position) {
    if (devices_[position].index == device_index) return position;
  }
  return std::nullopt;
}

std::uint64_t ResidencyManager::max_budget_bytes() const {
  std::uint64_t largest = 0;
  for (const auto& device : devices_) largest = std::max(largest, device.budget_bytes);
  return largest;
}

std::uint64_t ResidencyManager::aggregate_budget_bytes() const {
  std::uint64_t total = 0;
  for (const auto& device : devices_) total += device.budget_bytes;
  return total;
}

void ResidencyManager::touch_locked(Entry& entry) {
  entry.last_used = ++clock_;
  entry.last_used_time = sync_->clock->now();
}

namespace {

// Bytes an entry holds on its device right now.
// A cancelled load that has not ended this long after its cancel is taken for
// stuck (a read that never returns): its reservation stops counting.
constexpr auto kCancelledLoadGrace = std::chrono::seconds(2);

template <typename EntryT>
std::uint64_t held_bytes(const EntryT& entry) {
  if (entry.state == ResidencyState::loading) {
    const bool stuck = entry.cancelled_at && std::chrono::steady_clock::now() - *entry.cancelled_at > kCancelledLoadGrace;
    return stuck ? 0 : entry.reserved_bytes;
  }
  if (entry.state == ResidencyState::resident && entry.resident) {
    return entry.resident->resident_bytes() + entry.tile_sum_bytes;
  }
  // A load that failed after publishing its resident early: held until its leases end.
  if (entry.state == ResidencyState::failed && entry.resident) return entry.resident->resident_bytes();
  return 0;
}

}  // namespace

DeviceHoldings ResidencyManager::holdings_locked(std::size_t device_position, bool preserve_active) const {
  draining_.erase(std::remove_if(draining_.begin(), draining_.end(),
                                 [](const EntryPtr& entry) { return held_bytes(*entry) == 0; }),
                  draining_.end());
  DeviceHoldings holdings;
  holdings.info = devices_[device_position];
  holdings.free_bytes = backend_.free_bytes(holdings.info.index);
  for (const auto& [path, entry] : entries_) {
    if (entry->device_position != device_position) continue;
    if (entry->state == ResidencyState::resident) {
      const std::uint64_t bytes = held_bytes(*entry);
      holdings.resident_bytes += bytes;
      ++holdings.resident_entries;
      if (preserve_active && active_ && *active_ == path) holdings.active_bytes = bytes;
    } else if (entry->state == ResidencyState::loading) {
      holdings.loading_bytes += held_bytes(*entry);
      ++holdings.resident_entries;
    }
  }
  for (const auto& entry : draining_) {
    if (entry->device_position == device_position) holdings.draining_bytes += held_bytes(*entry);
  }
  holdings.loading_bytes += working_bytes_[device_position];
  return holdings;
}

WorkingMemoryGrant ResidencyManager::admit_working_memory(int device_index, std::uint64_t bytes,
                                                          const std::string& purpose) {
  const auto position = position_of(device_index);
  if (!position) throw bad_request("no device " + std::to_string(device_index) + " for " + purpose);
  std::lock_guard<std::mutex> lock(sync_->mutex);
  const DeviceHoldings holdings = holdings_locked(*position, false);
  const std::uint64_t held = holdings.resident_bytes + holdings.loading_bytes + holdings.draining_bytes;
  const std::uint64_t budget = devices_[*position].budget_bytes;
  if (budget != 0 && (held > budget || bytes > budget - held)) {
    throw payload_too_large(purpose + " needs " + std::to_string(bytes) + " bytes of working memory on device " +
                            std::to_string(device_index) + ", which holds " + std::to_string(held) + " of its " +
                            std::to_string(budget) + " byte budget; evict an acquisition or use fewer threads");
  }
  working_bytes_[*position] += bytes;
  WorkingMemoryGrant grant;
  grant.manager_ = this;
  grant.device_position_ = *position;
  grant.bytes_ = bytes;
  return grant;
}

void ResidencyManager::release_working_memory(std::size_t device_position, std::uint64_t bytes) noexcept {
  {
    std::lock_guard<std::mutex> lock(sync_->mutex);
    working_bytes_[device_position] -= std::min(bytes, working_bytes_[device_position]);
  }
  sync_->changed.notify_all();  // admission waiting for room may proceed
}

WorkingMemoryGrant::WorkingMemoryGrant(WorkingMemoryGrant&& other) noexcept
    : manager_(std::exchange(other.manager_, nullptr)),
      device_position_(other.device_position_),
      bytes_(std::exchange(other.bytes_, 0)) {}

WorkingMemoryGrant& WorkingMemoryGrant::operator=(WorkingMemoryGrant&& other) noexcept {
  if (this != &other) {
    if (manager_) manager_->release_working_memory(device_position_, bytes_);
    manager_ = std::exchange(other.manager_, nullptr);
    device_position_ = other.device_position_;
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

WorkingMemoryGrant::~WorkingMemoryGrant() {
  if (manager_) manager_->release_working_memory(device_position_, bytes_);
}

std::vector<DeviceUsage> ResidencyManager::device_usage() const {
  std::lock_guard<std::mutex> lock(sync_->mutex);
  std::vector<DeviceUsage> usages;
  for (std::size_t position = 0; position < devices_.size(); ++position) {
    usages.push_back(device_capacity(holdings_locked(position, true)));
  }
  return usages;
}

ResidencyCounters ResidencyManager::counters() const {
  std::lock_guard<std::mutex> lock(sync_->mutex);
  return counters_;
}

void ResidencyManager::remove_locked(const EntryPtr& entry) {
  auto it = entries_.find(entry->master_path);
  if (it == entries_.end() || it->second != entry) return;
  entries_.erase(it);
  entry->detached = true;
  if (active_ && *active_ == entry->master_path) active_.reset();
  switch (entry->state) {
    case ResidencyState::loading:
      entry->progress->cancel_requested = true;
      if (!entry->load_started) {
        // Still queued: nothing was allocated, the reservation ends now.
        auto& queue = loaders_[entry->device_position]->queue;
        queue.erase(std::remove(queue.begin(), queue.end(), entry), queue.end());
        entry->state = ResidencyState::failed;
        entry->failure = unavailable("the load of " + entry->acquisition.name + " was cancelled");
        entry->progress->stage = backend::LoadStage::cancelled;
      } else {
        // The reservation holds until the backend has freed the attempt, or
        // for kCancelledLoadGrace when the load is stuck in a read.
        entry->cancelled_at = std::chrono::steady_clock::now();
        draining_.push_back(entry);
      }
      break;
    case ResidencyState::resident:
      ++counters_.evictions;
      if (entry->resident) entry->resident->tile_sums().cancel();
      spdlog::info("evicted {} from device {}", entry->master_path, devices_[entry->device_position].index);
      if (entry->pins > 0) {
        draining_.push_back(entry);
      } else {
        entry->resident.reset();
      }
      break;
    case ResidencyState::absent:
    case ResidencyState::failed:
      break;
  }
  sync_->changed.notify_all();
}

ResidencyManager::EntryPtr ResidencyManager::lookup_locked(const catalog::Acquisition& acquisition,
                                                            bool& stale_caller) {
  auto it = entries_.find(acquisition.master_path);
  if (it == entries_.end()) return nullptr;
  EntryPtr entry = it->second;
  if (entry->acquisition.signature == acquisition.signature) return entry;
  if (catalog::restat_signature(entry->acquisition.signature) == entry->acquisition.signature) {
    // The entry still matches the files: the caller's inspection is the stale one.
    stale_caller = true;
    return nullptr;
  }
  // The files changed: the old resident (or load, or failure) is stale.
  spdlog::info("{} changed on disk; dropping its {} entry", acquisition.master_path, residency_state_name(entry->state));
  remove_locked(entry);
  return nullptr;
}

backend::LoadEstimate ResidencyManager::estimate_checked(const catalog::Acquisition& acquisition) {
  const backend::LoadEstimate estimate = backend_.estimate_load(acquisition);
  const bool every_device_has_a_budget =
      std::all_of(devices_.begin(), devices_.end(), [](const backend::DeviceInfo& d) { return d.budget_bytes > 0; });
  const std::uint64_t largest = max_budget_bytes();
  if (every_device_has_a_budget && estimate.transition_peak_bytes > largest) {
    {
      std::lock_guard<std::mutex> lock(sync_->mutex);
      ++counters_.admission_rejections;
    }
    throw payload_too_large(peak_exceeds_budget_message(estimate.transition_peak_bytes, largest));
  }
  return estimate;
}

std::vector<std::vector<ResidencyManager::Attempt>> ResidencyManager::plan_attempts_locked(
    const std::string& master_path, const backend::LoadEstimate& estimate) const {
  std::vector<std::vector<Attempt>> passes;
  const bool have_active = active_.has_value() && *active_ != master_path;
  for (const bool preserve : {true, false}) {
    if (!preserve && !have_active) break;
    const bool preserving = preserve && have_active;
    std::vector<DeviceCapacity> capacities;
    for (std::size_t position = 0; position < devices_.size(); ++position) {
      capacities.push_back(device_capacity(holdings_locked(position, preserving)));
    }
    std::vector<Attempt> pass;
    for (const std::size_t position : order_candidates(capacities, estimate)) pass.push_back({position, preserving});
    passes.push_back(std::move(pass));
  }
  return passes;
}

ResidencyManager::Room ResidencyManager::make_room_locked(std::size_t device_position,
                                                          const backend::LoadEstimate& estimate,
                                                          const std::optional<std::string>& preserved,
                                                          const Entry* self) {
  const std::uint64_t budget = devices_[device_position].budget_bytes;
  const std::uint64_t needed = std::max(estimate.transition_peak_bytes, estimate.resident_bytes);
  std::uint64_t held = 0, entries = 0;
  std::uint64_t kept_bytes = 0, kept_entries = 0;  // what no wait can reclaim: the preserved acquisition
  std::vector<EntryPtr> victims;                    // evictable now, least recently used first
  for (const auto& [path, entry] : entries_) {
    if (entry->device_position != device_position || entry.get() == self) continue;
    if (entry->state != ResidencyState::resident && entry->state != ResidencyState::loading) continue;
    const std::uint64_t bytes = held_bytes(*entry);
    held += bytes;
    ++entries;
    const bool is_preserved = preserved && *preserved == path;
    if (is_preserved) {
      kept_bytes += bytes;
      ++kept_entries;
    } else if (entry->state == ResidencyState::resident && entry->pins == 0) {
      victims.push_back(entry);
    }
  }
  for (const auto& entry : draining_) {
    if (entry->device_position == device_position) held += held_bytes(*entry);
  }
  held += working_bytes_[device_position];  // grants are never evicted
  std::sort(victims.begin(), victims.end(),
            [](const EntryPtr& a, const EntryPtr& b) { return a->last_used < b->last_used; });

  auto fits = [&](std::uint64_t freed, std::uint64_t evicted) {
    return entries - evicted < options_.max_entries_per_device && (budget == 0 || held - freed + needed <= budget);
  };
  std::uint64_t freed = 0;
  std::size_t evicted = 0;
  while (!fits(freed, evicted) && evicted < victims.size()) freed += held_bytes(*victims[evicted++]);
  if (!fits(freed, evicted)) {
    Room room;
    room.worth_waiting =
        kept_entries < options_.max_entries_per_device && (budget == 0 || kept_bytes + needed <= budget);
    return room;
  }
  // Free-memory headroom (the budget is ours; free memory is the device's):
  // evict more while it helps, then load anyway; an out-of-memory load retries.
  if (const auto free = backend_.free_bytes(devices_[device_position].index)) {
    const std::uint64_t required = required_free_bytes(estimate.transition_peak_bytes);
    std::uint64_t projected = *free + freed;
    while (projected < required && evicted < victims.size()) {
      const std::uint64_t bytes = held_bytes(*victims[evicted++]);
      freed += bytes;
      projected += bytes;
    }
  }
  for (std::size_t i = 0; i < evicted; ++i) remove_locked(victims[i]);
  Room room;
  room.made = true;
  return room;
}

bool ResidencyManager::evict_one_locked(std::size_t device_position, const std::optional<std::string>& preserved,
                                        const Entry* self) {
  EntryPtr victim;
  for (const auto& [path, entry] : entries_) {
    if (entry->device_position != device_position || entry.get() == self) continue;
    if (entry->state != ResidencyState::resident || entry->pins > 0) continue;
    if (preserved && *preserved == path) continue;
    if (!victim || entry->last_used < victim->last_used) victim = entry;
  }
  if (!victim) return false;
  remove_locked(victim);
  return true;
}

void ResidencyManager::enqueue_locked(const EntryPtr& entry, bool front) {
  entry->load_started = false;
  auto& queue = loaders_[entry->device_position]->queue;
  if (front) {
    queue.push_front(entry);
  } else {
    queue.push_back(entry);
  }
  sync_->changed.notify_all();
}

ResidencyManager::EntryPtr ResidencyManager::admit_locked(std::unique_lock<std::mutex>& lock,
                                                          const catalog::Acquisition& acquisition,
                                                          const backend::LoadEstimate& estimate,
                                                          const std::optional<backend::ScanWindow>& first) {
  const auto deadline = std::chrono::steady_clock::now() + options_.busy_wait_limit;
  while (true) {
    if (stopping_) throw unavailable("the daemon is shutting down");
    const auto passes = plan_attempts_locked(acquisition.master_path, estimate);
    std::size_t candidates = 0;
    for (const auto& pass : passes) candidates += pass.size();
    if (candidates == 0) {
      ++counters_.admission_rejections;
      throw payload_too_large(kNoDeviceCanAdmitMessage);
    }
    bool worth_waiting = false;
    for (std::size_t p = 0; p < passes.size() && !worth_waiting; ++p) {
      for (std::size_t a = 0; a < passes[p].size(); ++a) {
        const Attempt& attempt = passes[p][a];
        const std::optional<std::string> preserved = attempt.preserve_active ? active_ : std::nullopt;
        const Room room = make_room_locked(attempt.device_position, estimate, preserved, nullptr);
        if (!room.made) {
          worth_waiting = worth_waiting || room.worth_waiting;
          continue;
        }
        auto entry = std::make_shared<Entry>();
        entry->master_path = acquisition.master_path;
        entry->acquisition = acquisition;
        entry->estimate = estimate;
        entry->admitted_bytes = entry->reserved_bytes = estimate.transition_peak_bytes;
        entry->device_position = attempt.device_position;
        entry->preserved = preserved;
        if (first && first->rows.count() < acquisition.scan_rows) {
          entry->progress->first_rows = first->rows;
          if (!first->columns.covers(acquisition.scan_cols)) entry->progress->first_columns = first->columns;
        }
        entry->progress->rows_held = [this, job = std::weak_ptr<Entry>(entry)](
                                         const std::shared_ptr<backend::Resident>& resident) { rows_held(job, resident); };
        for (std::size_t rest = a + 1; rest < passes[p].size(); ++rest) entry->fallbacks.push_back(passes[p][rest]);
        for (std::size_t later = p + 1; later < passes.size(); ++later) {
          for (const Attempt& next : passes[later]) entry->fallbacks.push_back(next);
        }
        touch_locked(*entry);
        entries_[entry->master_path] = entry;
        ++counters_.loads_started;
        spdlog::info("admitted {} on device {} (transition peak {} B, provisional resident {} B, at most {} B)",
                     acquisition.master_path, devices_[entry->device_position].index, estimate.transition_peak_bytes,
                     estimate.resident_bytes, estimate.peak_bound());
        enqueue_locked(entry, false);
        return entry;
      }
    }
    if (!worth_waiting) {
      ++counters_.admission_rejections;
      throw payload_too_large(kLoadDidNotFitMessage);
    }
    // Only residents in use, loads in progress or draining bytes stand in the
    // way: they finish by themselves. Wait for them, bounded.
    if (std::chrono::steady_clock::now() >= deadline) {
      ++counters_.busy_timeouts;
      throw unavailable("every device that could hold " + acquisition.name +
                        " is busy with requests or loads that did not finish within " +
                        std::to_string(options_.busy_wait_limit.count()) + " ms; retry shortly");
    }
    sync_->changed.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(50)));
    bool stale_caller = false;
    if (EntryPtr existing = lookup_locked(acquisition, stale_caller)) return existing;
    if (stale_caller) throw conflict(kStaleInspectionMessage);
  }
}

namespace {

template <typename EntryT>
void unpin(EntryT& entry) {
  if (entry.pins > 0) --entry.pins;
  // The last user of an evicted resident, or of one a failed load published early.
  if (entry.pins == 0 && (entry.detached || entry.state == ResidencyState::failed)) entry.resident.reset();
}

}  // namespace

void ResidencyManager::release_pin(Sync& sync, const EntryPtr& entry) {
  {
    std::lock_guard<std::mutex> lock(sync.mutex);
    unpin(*entry);
    entry->last_used_time = sync.clock->now();  // idle time counts from the end of the last use
  }
  sync.changed.notify_all();
}

ResidentLease ResidencyManager::lease_locked(const EntryPtr& entry) {
  ResidentLease lease;
  std::shared_ptr<Sync> sync = sync_;
  // A pointer whose control block releases the pin once the last copy is
  // gone. It owns the resident too, so a lease never outlives what it points
  // at (whatever replaces the entry's pointer); the last owner lets go after
  // the pin, outside the manager's lock.
  lease.resident_ = std::shared_ptr<backend::Resident>(
      entry->resident.get(), [sync, entry, owner = entry->resident](backend::Resident*) mutable {
        release_pin(*sync, entry);
        owner.reset();
      });
  lease.compute_ = entry->compute_mutex;
  return lease;
}

bool ResidencyManager::can_serve_locked(const Entry& entry, const std::optional<backend::ScanWindow>& window) {
  if (entry.detached || !entry.resident) return false;
  if (entry.state == ResidencyState::resident) return true;
  // A plan over every row waits for the whole resident (then the residency
  // route says resident as soon as such an answer is out).
  if (entry.state != ResidencyState::loading || !window || window->rows.count() >= entry.acquisition.scan_rows) {
    return false;
  }
  return entry.resident->held_rows().holds(*window);
}

ResidentLease ResidencyManager::acquire(const catalog::Acquisition& acquisition,
                                        std::optional<backend::ScanWindow> window) {
  std::unique_lock<std::mutex> lock(sync_->mutex);
  if (stopping_) throw unavailable("the daemon is shutting down");
  bool stale_caller = false;
  EntryPtr entry = lookup_locked(acquisition, stale_caller);
  if (stale_caller) throw conflict(kStaleInspectionMessage);
  if (!entry) {
    lock.unlock();
    // Its frame index, on this thread, which waits for the load anyway: a
    // request that then waits for its device (a daemon still preparing it)
    // finds the index built.
    backend_.prepare_load(acquisition);
    const backend::LoadEstimate estimate = estimate_checked(acquisition);
    lock.lock();
    entry = lookup_locked(acquisition, stale_caller);
    if (stale_caller) throw conflict(kStaleInspectionMessage);
    if (!entry) entry = admit_locked(lock, acquisition, estimate, window);
  }
  ++entry->pins;  // a loaded resident cannot be evicted before this request uses it
  const auto deadline = std::chrono::steady_clock::now() + options_.load_wait_limit;
  while (true) {
    if (stopping_) {
      unpin(*entry);
      throw unavailable("the daemon is shutting down");
    }
    if (can_serve_locked(*entry, window)) {
      touch_locked(*entry);
      return lease_locked(entry);
    }
    if (entry->state == ResidencyState::failed) {
      unpin(*entry);
      throw *entry->failure;
    }
    if (entry->detached) {
      unpin(*entry);
      throw unavailable("the resident of " + acquisition.name +
                        " was evicted or its load cancelled while this request waited; retry");
    }
    if (sync_->changed.wait_until(lock, deadline) == std::cv_status::timeout &&
        entry->state == ResidencyState::loading) {
      unpin(*entry);
      ++counters_.busy_timeouts;
      throw unavailable("timed out waiting for " + acquisition.name +
                        " to load; the load continues, poll /api/browse/residency");
    }
  }
}

ResidentLease ResidencyManager::find(const catalog::Acquisition& acquisition,
                                     std::optional<backend::ScanWindow> window) {
  std::lock_guard<std::mutex> lock(sync_->mutex);
  bool stale_caller = false;
  EntryPtr entry = lookup_locked(acquisition, stale_caller);
  if (!entry || !can_serve_locked(*entry, window)) return {};
  touch_locked(*entry);
  ++entry->pins;
  return lease_locked(entry);
}

ResidencyStatus ResidencyManager::request_load(const catalog::Acquisition& acquisition) {
  std::unique_lock<std::mutex> lock(sync_->mutex);
  if (stopping_) throw unavailable("the daemon is shutting down");
  auto lookup = [&]() -> EntryPtr {
    bool stale_caller = false;
    EntryPtr entry = lookup_locked(acquisition, stale_caller);
    if (stale_caller) throw conflict(kStaleInspectionMessage);
    if (entry && entry->state == ResidencyState::failed) {
      remove_locked(entry);  // an explicit load request retries a remembered failure
      entry = nullptr;
    }
    return entry;
  };
  EntryPtr entry = lookup();
  if (!entry) {
    lock.unlock();
    // No prepare_load here: an explicit load request answers at once, and its
    // load builds the frame index on the loader thread.
    const backend::LoadEstimate estimate = estimate_checked(acquisition);
    lock.lock();
    entry = lookup();
    if (!entry) entry = admit_locked(lock, acquisition, estimate, std::nullopt);
  }
  return status_of(*entry);
}

ResidencyStatus ResidencyManager::status_of(const Entry& entry) const {
  ResidencyStatus status;
  status.state = entry.state;
  status.device_index = devices_[entry.device_position].index;
  status.bytes_done = entry.progress->bytes_done;
  status.bytes_total = entry.progress->bytes_total;
  status.stage = backend::load_stage_name(entry.progress->stage);
  if (!entry.detached) status.reserved_bytes = held_bytes(entry);
  if (entry.state == ResidencyState::resident && entry.resident) {
    status.resident_bytes = entry.resident->resident_bytes();
    status.encoding = entry.resident->encoding();
    status.tile_sums_state = backend::tile_sums_state_name(entry.resident->tile_sums().state());
    status.tile_sums_bytes = entry.resident->tile_sums().bytes();
  }
  if (entry.failure) status.failure_reason = entry.failure->what();
  status.scan_rows = entry.acquisition.scan_rows;
  if (entry.state == ResidencyState::resident) {
    status.scan_rows_resident = status.scan_rows;
  } else if (entry.state == ResidencyState::loading && entry.resident && !entry.detached) {
    const backend::HeldRows& held = entry.resident->held_rows();
    status.scan_rows_resident = held.holds_all() ? status.scan_rows : held.held();
  }
  return status;
}

ResidencyStatus ResidencyManager::status(const catalog::Acquisition& acquisition) const {
  std::lock_guard<std::mutex> lock(sync_->mutex);
  auto it = entries_.find(acquisition.master_path);
  if (it == entries_.end() || it->second->acquisition.signature != acquisition.signature) return {};
  return status_of(*it->second);
}

bool ResidencyManager::evict(const catalog::Acquisition& acquisition) {
  std::lock_guard<std::mutex> lock(sync_->mutex);
  auto it = entries_.find(acquisition.master_path);
  if (it == entries_.end()) return false;
  const EntryPtr entry = it->second;
  remove_locked(entry);
  return true;
}

std::size_t ResidencyManager::drop_changed_sources(const std::vector<std::string>& paths) {
  std::lock_guard<std::mutex> lock(sync_->mutex);
  std::vector<EntryPtr> changed;
  for (const auto& [master, entry] : entries_) {
    const auto& signature = entry->acquisition.signature;
    const bool named = paths.empty() || std::any_of(signature.begin(), signature.end(), [&](const auto& file) {
                         return std::find(paths.begin(), paths.end(), file.path) != paths.end();
                       });
    if (named && catalog::restat_signature(signature) != signature) changed.push_back(entry);
  }
  for (const auto& entry : changed) {
    spdlog::info("{} changed on disk; dropping its {} entry", entry->master_path, residency_state_name(entry->state));
    remove_locked(entry);
  }
  return changed.size();
}

void ResidencyManager::mark_active(const std::string& master_path) {
  std::lock_guard<std::mutex> lock(sync_->mutex);
  auto it = entries_.find(master_path);
  if (it != entries_.end() && it->second->state == ResidencyState::resident) active_ = master_path;
}

void ResidencyManager::schedule_tile_sums_locked(const EntryPtr& entry) {
  if (!tile_builder_) return;
  backend::TileSums& sums = entry->resident->tile_sums();
  const catalog::Acquisition& source = entry->resident->source();
  const std::uint64_t bytes =
      backend::TileGrid::for_scan(source.scan_rows, source.scan_cols).table_bytes(source.frame_pixels());
  if (bytes == 0) {
    sums.set_state(backend::TileSumsState::skipped, "the scan is a single tile");
    return;
  }
  if (backend_.budgets_host_memory()) {
    const DeviceHoldings holdings = holdings_locked(entry->device_position, false);
    const std::uint64_t held = holdings.resident_bytes + holdings.loading_bytes + holdings.draining_bytes;
    const std::uint64_t budget = devices_[entry->device_position].budget_bytes;
    if (budget != 0 && (held > budget || bytes > budget - held)) {
      sums.set_state(backend::TileSumsState::skipped, "the device's budget has no room for the tile sums");
      spdlog::info("{}: no room for {} B of tile sums on device {}; crops decode every frame", entry->master_path,
                   bytes, devices_[entry->device_position].index);
      return;
    }
    entry->tile_sum_bytes = bytes;
  }
  tile_builder_->submit(entry->resident,
                        [mutex = entry->compute_mutex] { return std::unique_lock<std::mutex>(*mutex); });
}

void ResidencyManager::loader_loop(std::size_t device_position) {
  const int device_index = devices_[device_position].index;
  pthread_setname_np(pthread_self(), loader_thread_name(device_index).c_str());
  DeviceLoader& loader = *loaders_[device_position];
  std::unique_lock<std::mutex> lock(sync_->mutex);
  while (true) {
    sync_->changed.wait(lock, [&] {
      return stopping_ || (!loader.queue.empty() && loader.running < options_.parallel_loads_per_device);
    });
    if (stopping_) return;
    EntryPtr job = loader.queue.front();
    loader.queue.pop_front();
    job->load_started = true;
    job->progress->bytes_done = 0;
    job->progress->stage = backend::LoadStage::queued;
    job->reserved_bytes = job->admitted_bytes;
    job->refused_growth_bytes.reset();
    ++loader.running;
    ++sync_->runners;
    // Each load on a runner of its own: one whose read hangs (a FIFO, a dead
    // network file system) holds its runner, not the device (decision 0021).
    std::thread([this, job, device_position, sync = sync_] { run_job(job, device_position, sync); }).detach();
  }
}

void ResidencyManager::run_job(const EntryPtr& job, std::size_t device_position, const std::shared_ptr<Sync>& sync) {
  const int attempt_device = devices_[job->device_position].index;
  pthread_setname_np(pthread_self(), loader_thread_name(attempt_device).c_str());
  std::shared_ptr<backend::Resident> resident;
  std::optional<Error> failure;
  {
    Reservation reservation(*this, job, attempt_device);
    failure = run_load(job, attempt_device, reservation, resident);
  }
  std::unique_lock<std::mutex> lock(sync->mutex);
  if (sync->manager_gone) {  // back from a read that outlived the manager
    --sync->runners;
    lock.unlock();
    resident.reset();
    return;
  }
  --loaders_[device_position]->running;
  if (!failure && (job->detached || stopping_)) {
    resident.reset();  // cancelled meanwhile: nothing of it stays
    failure = unavailable("the load of " + job->acquisition.name + " was cancelled");
  }
  if (!failure) {
    keep_resident_locked(job, std::move(resident), attempt_device);
  } else if (failure->kind() == ErrorKind::payload_too_large && !job->detached && !stopping_ && !job->resident &&
             retry_out_of_memory_locked(job, *failure, attempt_device)) {
    // queued again
  } else {
    if (failure->kind() == ErrorKind::payload_too_large && !job->detached && !stopping_) {
      // A load that published its resident early is not retried (requests may
      // hold it), and fails with the same text as one that fit nowhere.
      ++counters_.admission_rejections;
      failure = payload_too_large(kLoadDidNotFitMessage);  // the text alone, as the reference sends it
    }
    fail_load_locked(job, *failure, attempt_device);
  }
  --sync->runners;
  sync->changed.notify_all();
}

std::optional<Error> ResidencyManager::run_load(const EntryPtr& job, int attempt_device, Reservation& reservation,
                                                std::shared_ptr<backend::Resident>& resident) {
  try {
    resident = backend_.load(job->acquisition, attempt_device, *job->progress, reservation);
    if (!resident) throw internal_error("the backend returned no resident");
    // A resident built from files that changed under the load is never served.
    if (catalog::restat_signature(job->acquisition.signature) != job->acquisition.signature) {
      resident.reset();
      throw conflict("source files changed while " + job->acquisition.name +
                     " was loading; retry once the writer has finished");
    }
  } catch (const Error& error) {
    return error;
  } catch (const std::bad_alloc&) {
    return payload_too_large("out of memory while loading " + job->acquisition.name);
  } catch (const std::exception& error) {
    return internal_error(std::string("load failed: ") + error.what());
  }
  return std::nullopt;
}

void ResidencyManager::rows_held(const std::weak_ptr<Entry>& weak_job,
                                  const std::shared_ptr<backend::Resident>& resident) {
  const EntryPtr job = weak_job.lock();
  if (!job) return;
  std::unique_lock<std::mutex> lock(sync_->mutex);
  if (!job->resident) {
    if (job->detached || stopping_ || job->state != ResidencyState::loading) return;
    lock.unlock();
    // Files already rewritten when the first rows are whole: nothing is
    // published (the load then fails too). A rewrite after this is caught
    // when the load ends (a conflict: the resident serves no new request) or
    // by the watcher, which drops the entry; stat'ing once per row on the
    // load's threads would cost more than it catches.
    const bool unchanged = catalog::restat_signature(job->acquisition.signature) == job->acquisition.signature;
    lock.lock();
    if (!unchanged || job->resident || job->detached || stopping_ || job->state != ResidencyState::loading) return;
    job->resident = resident;
    spdlog::info("{}: the load publishes its resident early on device {} ({} of {} scan rows held)", job->master_path,
                 devices_[job->device_position].index, resident->held_rows().held(), job->acquisition.scan_rows);
  }
  sync_->changed.notify_all();
}

void ResidencyManager::keep_resident_locked(const EntryPtr& job, std::shared_ptr<backend::Resident> resident,
                                            int attempt_device) {
  if (job->resident && job->resident != resident) {
    spdlog::warn("{}: the load returned another resident than the one it published early (a loader bug)",
                 job->master_path);
  }
  if (resident->resident_bytes() > job->reserved_bytes) {
    spdlog::warn("{} holds {} B on device {}, more than the {} B its load reserved (a loader bug)", job->master_path,
                 resident->resident_bytes(), attempt_device, job->reserved_bytes);
  }
  ++counters_.loads_completed;
  job->resident = std::move(resident);
  job->state = ResidencyState::resident;
  touch_locked(*job);
  spdlog::info("{} resident on device {} ({} B, {})", job->master_path, attempt_device,
               job->resident->resident_bytes(), job->resident->encoding());
  schedule_tile_sums_locked(job);
  sync_->changed.notify_all();
}

bool ResidencyManager::retry_out_of_memory_locked(const EntryPtr& job, const Error& failure, int attempt_device) {
  // Out of device memory: the backend freed the attempt. Evict one more on
  // this device and retry here; else move to the next candidate.
  // A refused growth already took every idle resident there: move on at
  // once, asking the next device for the size the load has learned.
  backend::LoadEstimate next_estimate = job->estimate;
  if (job->refused_growth_bytes) {
    next_estimate.transition_peak_bytes = std::max(next_estimate.transition_peak_bytes, *job->refused_growth_bytes);
    spdlog::warn("{} could not grow its reservation on device {}: {}", job->master_path, attempt_device,
                 failure.what());
  } else {
    ++counters_.out_of_memory_retries;
    spdlog::warn("out of memory loading {} on device {}: {}", job->master_path, attempt_device, failure.what());
    if (evict_one_locked(job->device_position, job->preserved, job.get())) {
      enqueue_locked(job, true);
      return true;
    }
  }
  while (!job->fallbacks.empty()) {
    const Attempt next = job->fallbacks.front();
    job->fallbacks.pop_front();
    const std::optional<std::string> preserved = next.preserve_active ? active_ : std::nullopt;
    const std::uint64_t budget = devices_[next.device_position].budget_bytes;
    if (budget > 0 && next_estimate.transition_peak_bytes > budget) continue;
    if (make_room_locked(next.device_position, next_estimate, preserved, job.get()).made) {
      job->device_position = next.device_position;
      job->preserved = preserved;
      job->admitted_bytes = job->reserved_bytes = next_estimate.transition_peak_bytes;
      enqueue_locked(job, true);
      return true;
    }
  }
  return false;
}

void ResidencyManager::fail_load_locked(const EntryPtr& job, const Error& failure, int attempt_device) {
  if (!job->detached) ++counters_.loads_failed;
  job->state = ResidencyState::failed;
  if (job->resident) {
    // Published early: it serves no new request; the leases out drain it.
    if (job->pins == 0) {
      job->resident.reset();
    } else if (std::find(draining_.begin(), draining_.end(), job) == draining_.end()) {
      draining_.push_back(job);
    }
  }
  job->failure = failure;
  if (job->progress->stage != backend::LoadStage::cancelled) job->progress->stage = backend::LoadStage::failed;
  if (!job->detached) {
    spdlog::warn("load of {} on device {} failed: {}", job->master_path, attempt_device, failure.what());
    if (is_transient(failure.kind())) remove_locked(job);
  }
  sync_->changed.notify_all();
}

void ResidencyManager::grow_reservation(const EntryPtr& job, std::uint64_t bytes) {
  std::unique_lock<std::mutex> lock(sync_->mutex);
  const std::size_t position = job->device_position;
  const std::uint64_t budget = devices_[position].budget_bytes;
  const auto deadline = std::chrono::steady_clock::now() + options_.busy_wait_limit;
  auto refuse = [&](const std::string& reason) {
    ++counters_.growth_refusals;
    job->refused_growth_bytes = job->reserved_bytes + bytes;
    throw payload_too_large(job->acquisition.name + " needs " + catalog::format_size(job->reserved_bytes + bytes) +
                            " on device " + std::to_string(devices_[position].index) + " but " + reason +
                            ". Crop the scan region or increase scan/detector binning.");
  };
  while (true) {
    if (stopping_ || job->detached || job->progress->cancel_requested) {
      throw unavailable("the load of " + job->acquisition.name + " was cancelled");
    }
    if (budget > 0 && (bytes > budget || job->reserved_bytes > budget - bytes)) {
      refuse("its data-cache budget is " + catalog::format_size(budget));
    }
    // Bytes on this device, split into what eviction frees now (idle residents),
    // what waiting frees (pinned residents, draining bytes) and what neither
    // frees (this load, the other loads queued behind it, the preserved acquisition).
    std::uint64_t held = 0, fixed = 0;
    std::vector<EntryPtr> victims;
    for (const auto& [path, entry] : entries_) {
      if (entry->device_position != position) continue;
      if (entry->state != ResidencyState::resident && entry->state != ResidencyState::loading) continue;
      const std::uint64_t entry_bytes = held_bytes(*entry);
      held += entry_bytes;
      const bool is_preserved = job->preserved && *job->preserved == path;
      if (entry->state == ResidencyState::loading || is_preserved) {
        fixed += entry_bytes;
      } else if (entry->pins == 0) {
        victims.push_back(entry);
      }
    }
    for (const auto& entry : draining_) {
      if (entry->device_position == position) held += held_bytes(*entry);
    }
    std::sort(victims.begin(), victims.end(),
              [](const EntryPtr& a, const EntryPtr& b) { return a->last_used < b->last_used; });
    std::uint64_t freed = 0;
    std::size_t evicted = 0;
    auto fits = [&] { return budget == 0 || held - freed + bytes <= budget; };
    while (!fits() && evicted < victims.size()) freed += held_bytes(*victims[evicted++]);
    if (fits()) {
      if (const auto free = backend_.free_bytes(devices_[position].index)) {
        // Headroom, as admission takes it: advisory, an allocation that fails is an out-of-memory retry.
        const std::uint64_t required = required_free_bytes(bytes);
        while (*free + freed < required && evicted < victims.size()) freed += held_bytes(*victims[evicted++]);
      }
      for (std::size_t i = 0; i < evicted; ++i) remove_locked(victims[i]);
      job->reserved_bytes += bytes;
      ++counters_.reservation_growths;
      return;
    }
    if (fixed + bytes > budget) {
      refuse("only " + catalog::format_size(budget > fixed ? budget - fixed : 0) + " of its " +
             catalog::format_size(budget) + " data-cache budget can be freed (other loads or the acquisition on view hold the rest)");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      refuse("residents in use there did not finish within " + std::to_string(options_.busy_wait_limit.count()) + " ms");
    }
    sync_->changed.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(50)));
  }
}

void ResidencyManager::release_reservation(const EntryPtr& job, std::uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(sync_->mutex);
    job->reserved_bytes -= std::min(bytes, job->reserved_bytes);
  }
  sync_->changed.notify_all();
}

std::size_t ResidencyManager::release_idle_residents() {
  std::vector<int> trimmed_devices;
  std::size_t released = 0;
  {
    std::lock_guard<std::mutex> lock(sync_->mutex);
    if (options_.idle_release.count() <= 0 || stopping_) return 0;
    const auto now = sync_->clock->now();
    std::vector<EntryPtr> idle;
    for (const auto& [path, entry] : entries_) {
      if (entry->state == ResidencyState::resident && entry->pins == 0 &&
          now - entry->last_used_time >= options_.idle_release) {
        idle.push_back(entry);
      }
    }
    for (const auto& entry : idle) {
      const int device_index = devices_[entry->device_position].index;
      spdlog::info("idle release: {} was unused for {} s; releasing its {} B on device {}", entry->master_path,
                   std::chrono::duration_cast<std::chrono::seconds>(now - entry->last_used_time).count(),
                   held_bytes(*entry), device_index);
      ++counters_.idle_releases;
      remove_locked(entry);
      if (std::find(trimmed_devices.begin(), trimmed_devices.end(), device_index) == trimmed_devices.end()) {
        trimmed_devices.push_back(device_index);
      }
    }
    released = idle.size();
  }
  for (const int device_index : trimmed_devices) {
    try {
      backend_.trim_device_memory(device_index);
    } catch (const std::exception& error) {
      spdlog::warn("returning cached memory of device {} to the driver failed: {}", device_index, error.what());
    }
  }
  return released;
}

void ResidencyManager::idle_loop() {
  pthread_setname_np(pthread_self(), "quantem-idle");
  while (true) {
    {
      std::unique_lock<std::mutex> lock(sync_->mutex);
      const auto wake = std::chrono::steady_clock::now() + options_.idle_check_interval;
      if (sync_->changed.wait_until(lock, wake, [&] { return stopping_; })) return;
    }
    release_idle_residents();
  }
}

}  // namespace quantem::residency
