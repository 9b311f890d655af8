#include "quantem/residency/residency_manager.hpp"

#include <algorithm>

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

struct ResidencyManager::Entry {
  std::string master_path;
  catalog::Acquisition acquisition;  // the inspection the load uses (signature included)
  int device = 0;
  ResidencyState state = ResidencyState::loading;
  std::uint64_t reserved_bytes = 0;  // transition peak held while loading
  std::shared_ptr<backend::Resident> resident;
  std::shared_ptr<backend::LoadProgress> progress = std::make_shared<backend::LoadProgress>();
  std::optional<Error> failure;
  std::uint64_t last_used = 0;
};

namespace {

constexpr std::uint64_t kOneGiB = 1ULL << 30;

bool same_signature(const catalog::SourceSignature& a, const catalog::SourceSignature& b) { return a == b; }

// Load errors that describe the attempt rather than the data: the next request retries.
bool is_transient(ErrorKind kind) {
  return kind == ErrorKind::payload_too_large || kind == ErrorKind::unavailable || kind == ErrorKind::conflict;
}

}  // namespace

ResidencyManager::ResidencyManager(backend::Backend& backend, ResidencyOptions options)
    : backend_(backend), options_(options), devices_(backend.devices()) {
  if (options_.max_entries_per_device == 0) options_.max_entries_per_device = 1;
  loader_ = std::thread([this] { loader_loop(); });
}

ResidencyManager::~ResidencyManager() { shutdown(); }

void ResidencyManager::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !loader_.joinable()) return;
    stopping_ = true;
    for (auto& [path, entry] : entries_) entry->progress->cancel_requested = true;
    for (auto& entry : queue_) entry->progress->cancel_requested = true;
  }
  changed_.notify_all();
  if (loader_.joinable()) loader_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.clear();
  entries_.clear();
  draining_.clear();
  active_.reset();
  changed_.notify_all();
}

std::uint64_t ResidencyManager::max_budget_bytes() const {
  std::uint64_t largest = 0;
  for (const auto& device : devices_) largest = std::max(largest, device.budget_bytes);
  return largest;
}

void ResidencyManager::touch_locked(const EntryPtr& entry) { entry->last_used = ++clock_; }

std::uint64_t ResidencyManager::draining_bytes_locked(int device) const {
  draining_.erase(std::remove_if(draining_.begin(), draining_.end(), [](const Draining& d) { return d.resident.expired(); }),
                  draining_.end());
  std::uint64_t total = 0;
  for (const auto& d : draining_)
    if (d.device == device) total += d.bytes;
  return total;
}

void ResidencyManager::remove_locked(const EntryPtr& entry) {
  auto it = entries_.find(entry->master_path);
  if (it == entries_.end() || it->second != entry) return;
  if (entry->state == ResidencyState::resident && entry->resident) {
    if (entry->resident.use_count() > 1) {
      draining_.push_back({entry->resident, entry->device, entry->resident->resident_bytes()});
    }
    ++counters_.evictions;
    spdlog::info("evicted {} from device {}", entry->master_path, entry->device);
  }
  if (entry->state == ResidencyState::loading) entry->progress->cancel_requested = true;
  if (active_ && *active_ == entry->master_path) active_.reset();
  entries_.erase(it);
}

ResidencyManager::EntryPtr ResidencyManager::lookup_locked(const catalog::Acquisition& acquisition, bool& stale_caller) {
  auto it = entries_.find(acquisition.master_path);
  if (it == entries_.end()) return nullptr;
  EntryPtr entry = it->second;
  if (same_signature(entry->acquisition.signature, acquisition.signature)) return entry;
  if (catalog::restat_signature(entry->acquisition.signature) == entry->acquisition.signature) {
    // The entry still matches the files: the caller's inspection is the stale one.
    stale_caller = true;
    return nullptr;
  }
  // The files changed: the old resident (or load, or failure) is stale.
  spdlog::info("{} changed on disk; dropping its {} entry", acquisition.master_path, residency_state_name(entry->state));
  remove_locked(entry);
  changed_.notify_all();
  return nullptr;
}

DeviceUsage ResidencyManager::usage_locked(const backend::DeviceInfo& device, bool preserve_active) const {
  DeviceUsage usage;
  usage.info = device;
  usage.free_bytes = backend_.free_bytes(device.index);
  std::uint64_t resident = 0, pinned = 0, active = 0;
  for (const auto& [path, entry] : entries_) {
    if (entry->device != device.index) continue;
    if (entry->state == ResidencyState::resident) {
      const std::uint64_t bytes = entry->resident->resident_bytes();
      resident += bytes;
      ++usage.resident_entries;
      if (preserve_active && active_ && *active_ == path) active += bytes;
    } else if (entry->state == ResidencyState::loading) {
      pinned += entry->reserved_bytes;
      ++usage.resident_entries;
    }
  }
  pinned += draining_bytes_locked(device.index);
  usage.resident_bytes = resident + pinned;
  usage.active_resident_bytes = active;
  usage.evictable_bytes = resident - active;
  const std::uint64_t budget = device.budget_bytes;
  const std::uint64_t held = active + pinned;
  if (budget > 0) {
    std::uint64_t peak = budget > pinned ? budget - pinned : 0;
    if (usage.free_bytes) peak = std::min(peak, *usage.free_bytes + usage.evictable_bytes);
    usage.available_peak_bytes = peak;
    usage.available_resident_bytes = budget > held ? budget - held : 0;
  } else if (usage.free_bytes) {
    usage.available_peak_bytes = *usage.free_bytes + usage.evictable_bytes;
  }
  return usage;
}

std::vector<DeviceUsage> ResidencyManager::device_usage() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<DeviceUsage> usages;
  for (const auto& device : devices_) usages.push_back(usage_locked(device, true));
  return usages;
}

bool ResidencyManager::make_room_locked(int device_index, std::uint64_t peak_bytes,
                                        const std::optional<std::string>& preserved, bool& blocked_by_draining) {
  const auto device_it =
      std::find_if(devices_.begin(), devices_.end(), [&](const backend::DeviceInfo& d) { return d.index == device_index; });
  if (device_it == devices_.end()) return false;
  const std::uint64_t budget = device_it->budget_bytes;
  const auto free = backend_.free_bytes(device_index);
  std::uint64_t projected_free = free.value_or(0);
  const std::uint64_t required_free = peak_bytes + std::min(kOneGiB, peak_bytes / 20);
  while (true) {
    std::uint64_t used = draining_bytes_locked(device_index), entries = 0;
    EntryPtr victim;
    for (const auto& [path, entry] : entries_) {
      if (entry->device != device_index) continue;
      if (entry->state == ResidencyState::resident) {
        used += entry->resident->resident_bytes();
        ++entries;
        const bool is_preserved = preserved && *preserved == path;
        if (!is_preserved && (!victim || entry->last_used < victim->last_used)) victim = entry;
      } else if (entry->state == ResidencyState::loading) {
        used += entry->reserved_bytes;
        ++entries;
      }
    }
    const bool over_count = entries >= options_.max_entries_per_device;
    const bool over_budget = budget > 0 && used + peak_bytes > budget;
    const bool short_of_free = free.has_value() && projected_free < required_free;
    if (!over_count && !over_budget && !short_of_free) return true;
    if (!victim) {
      blocked_by_draining = draining_bytes_locked(device_index) > 0;
      return false;
    }
    projected_free += victim->resident->resident_bytes();
    remove_locked(victim);
  }
}

ResidencyManager::EntryPtr ResidencyManager::try_admit_locked(const catalog::Acquisition& acquisition,
                                                               bool& blocked_by_draining) {
  const backend::LoadEstimate estimate = backend_.estimate_load(acquisition);
  const std::uint64_t peak = estimate.transition_peak_bytes;
  const std::uint64_t largest = max_budget_bytes();
  if (peak > largest) {
    ++counters_.admission_rejections;
    throw payload_too_large(peak_exceeds_budget_message(peak, largest));
  }

  bool any_candidate = false;
  const bool have_active = active_.has_value() && active_ != acquisition.master_path;
  for (const bool preserve : {true, false}) {
    if (!preserve && !have_active) break;
    std::vector<DeviceUsage> candidates;
    for (const auto& device : devices_) {
      DeviceUsage usage = usage_locked(device, preserve);
      const bool peak_fits = !usage.available_peak_bytes || peak <= *usage.available_peak_bytes;
      const bool resident_fits = !usage.available_resident_bytes || estimate.resident_bytes <= *usage.available_resident_bytes;
      if (peak_fits && resident_fits) candidates.push_back(std::move(usage));
    }
    std::sort(candidates.begin(), candidates.end(), [](const DeviceUsage& a, const DeviceUsage& b) {
      if (a.resident_entries != b.resident_entries) return a.resident_entries < b.resident_entries;
      const auto peak_a = a.available_peak_bytes.value_or(UINT64_MAX), peak_b = b.available_peak_bytes.value_or(UINT64_MAX);
      if (peak_a != peak_b) return peak_a > peak_b;
      const double fill_a = a.info.budget_bytes ? double(a.resident_bytes) / double(a.info.budget_bytes) : 0.0;
      const double fill_b = b.info.budget_bytes ? double(b.resident_bytes) / double(b.info.budget_bytes) : 0.0;
      if (fill_a != fill_b) return fill_a < fill_b;
      return a.info.index < b.info.index;
    });
    any_candidate = any_candidate || !candidates.empty();
    const std::optional<std::string> preserved = preserve ? active_ : std::nullopt;
    for (const auto& candidate : candidates) {
      if (!make_room_locked(candidate.info.index, peak, preserved, blocked_by_draining)) continue;
      auto entry = std::make_shared<Entry>();
      entry->master_path = acquisition.master_path;
      entry->acquisition = acquisition;
      entry->device = candidate.info.index;
      entry->reserved_bytes = peak;
      entry->progress->bytes_total = 0;
      touch_locked(entry);
      entries_[entry->master_path] = entry;
      queue_.push_back(entry);
      ++counters_.loads_started;
      spdlog::info("admitted {} on device {} (estimated peak {} B, resident {} B)", acquisition.master_path,
                   entry->device, peak, estimate.resident_bytes);
      changed_.notify_all();
      return entry;
    }
  }
  // Bytes of evicted residents that running requests still use are released
  // soon: wait for them (bounded) rather than refuse.
  for (const auto& device : devices_) blocked_by_draining = blocked_by_draining || draining_bytes_locked(device.index) > 0;
  if (blocked_by_draining) return nullptr;
  ++counters_.admission_rejections;
  throw payload_too_large(any_candidate ? kLoadDidNotFitMessage : kNoDeviceCanAdmitMessage);
}

ResidencyManager::EntryPtr ResidencyManager::admit_locked(std::unique_lock<std::mutex>& lock,
                                                          const catalog::Acquisition& acquisition) {
  const auto deadline = std::chrono::steady_clock::now() + options_.drain_wait_limit;
  while (true) {
    if (stopping_) throw unavailable("the daemon is shutting down");
    bool blocked_by_draining = false;
    if (EntryPtr entry = try_admit_locked(acquisition, blocked_by_draining)) return entry;
    // Only residents still used by running requests stand in the way: wait for them (bounded).
    if (std::chrono::steady_clock::now() >= deadline) {
      ++counters_.admission_rejections;
      throw unavailable("devices are busy: evicted acquisitions are still in use by running requests; retry shortly");
    }
    changed_.wait_for(lock, std::chrono::milliseconds(20));
    bool stale_caller = false;
    if (EntryPtr existing = lookup_locked(acquisition, stale_caller)) return existing;
    if (stale_caller) throw conflict(kStaleInspectionMessage);
  }
}

std::shared_ptr<backend::Resident> ResidencyManager::acquire(const catalog::Acquisition& acquisition) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + options_.load_wait_limit;
  bool stale_caller = false;
  EntryPtr entry = lookup_locked(acquisition, stale_caller);
  if (stale_caller) throw conflict(kStaleInspectionMessage);
  if (!entry) entry = admit_locked(lock, acquisition);
  while (true) {
    if (stopping_) throw unavailable("the daemon is shutting down");
    switch (entry->state) {
      case ResidencyState::resident:
        touch_locked(entry);
        return entry->resident;
      case ResidencyState::failed:
        throw *entry->failure;
      case ResidencyState::absent:
      case ResidencyState::loading:
        break;
    }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && entry->state == ResidencyState::loading) {
      throw unavailable("timed out waiting for " + acquisition.name +
                        " to load; the load continues, poll /api/browse/residency");
    }
  }
}

std::shared_ptr<backend::Resident> ResidencyManager::find(const catalog::Acquisition& acquisition) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool stale_caller = false;
  EntryPtr entry = lookup_locked(acquisition, stale_caller);
  if (!entry || entry->state != ResidencyState::resident) return nullptr;
  touch_locked(entry);
  return entry->resident;
}

ResidencyStatus ResidencyManager::request_load(const catalog::Acquisition& acquisition) {
  std::unique_lock<std::mutex> lock(mutex_);
  bool stale_caller = false;
  EntryPtr entry = lookup_locked(acquisition, stale_caller);
  if (stale_caller) throw conflict(kStaleInspectionMessage);
  if (entry && entry->state == ResidencyState::failed) {
    remove_locked(entry);  // an explicit load request retries a failure
    entry = nullptr;
  }
  if (!entry) entry = admit_locked(lock, acquisition);
  return status_of(entry);
}

ResidencyStatus ResidencyManager::status_of(const EntryPtr& entry) const {
  ResidencyStatus status;
  if (!entry) return status;
  status.state = entry->state;
  status.device_index = entry->device;
  status.bytes_done = entry->progress->bytes_done;
  status.bytes_total = entry->progress->bytes_total;
  status.stage = backend::load_stage_name(entry->progress->stage);
  if (entry->state == ResidencyState::resident) {
    status.resident_bytes = entry->resident->resident_bytes();
    status.encoding = entry->resident->encoding();
  }
  if (entry->failure) status.failure_reason = entry->failure->what();
  return status;
}

ResidencyStatus ResidencyManager::status(const catalog::Acquisition& acquisition) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(acquisition.master_path);
  if (it == entries_.end() || !same_signature(it->second->acquisition.signature, acquisition.signature)) return {};
  return status_of(it->second);
}

bool ResidencyManager::evict(const catalog::Acquisition& acquisition) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(acquisition.master_path);
  if (it == entries_.end()) return false;
  remove_locked(it->second);
  changed_.notify_all();
  return true;
}

void ResidencyManager::mark_active(const std::string& master_path) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.count(master_path)) active_ = master_path;
}

ResidencyCounters ResidencyManager::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

void ResidencyManager::loader_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    EntryPtr job = queue_.front();
    queue_.pop_front();
    auto current = entries_.find(job->master_path);
    if (current == entries_.end() || current->second != job || job->progress->cancel_requested) continue;

    lock.unlock();
    std::shared_ptr<backend::Resident> resident;
    std::optional<Error> failure;
    try {
      resident = backend_.load(job->acquisition, job->device, *job->progress);
      if (!resident) throw internal_error("the backend returned no resident");
      // A resident built from files that changed under the load is never served.
      if (catalog::restat_signature(job->acquisition.signature) != job->acquisition.signature) {
        resident.reset();
        throw conflict("source files changed while " + job->acquisition.name +
                       " was loading; retry once the writer has finished");
      }
    } catch (const Error& error) {
      failure = error;
    } catch (const std::exception& error) {
      failure = internal_error(std::string("load failed: ") + error.what());
    }
    lock.lock();

    current = entries_.find(job->master_path);
    const bool still_wanted = current != entries_.end() && current->second == job && !stopping_;
    if (failure) {
      ++counters_.loads_failed;
      job->state = ResidencyState::failed;
      job->failure = failure;
      job->reserved_bytes = 0;
      job->progress->stage = backend::LoadStage::failed;
      spdlog::warn("load of {} on device {} failed: {}", job->master_path, job->device, failure->what());
      if (still_wanted && is_transient(failure->kind())) entries_.erase(current);
    } else if (still_wanted) {
      ++counters_.loads_completed;
      job->resident = std::move(resident);
      job->state = ResidencyState::resident;
      job->reserved_bytes = 0;
      touch_locked(job);
      spdlog::info("{} resident on device {} ({} B, {})", job->master_path, job->device,
                   job->resident->resident_bytes(), job->resident->encoding());
    } else {
      job->state = ResidencyState::failed;
      job->failure = unavailable("the load of " + job->acquisition.name + " was cancelled");
      job->reserved_bytes = 0;
    }
    changed_.notify_all();
    if (!still_wanted) {
      lock.unlock();
      resident.reset();  // free outside the lock
      lock.lock();
    }
  }
}

}  // namespace quantem::residency
