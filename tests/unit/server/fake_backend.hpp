#pragma once
// A backend double for residency and service tests: devices with fixed
// budgets, per-acquisition estimates, and loads with injectable faults:
//  - a gate (all loads, or one acquisition's) that holds loads until opened;
//  - failures, permanent or for the next N loads of an acquisition;
//  - a physical memory size per device: a load whose transition peak does not
//    fit next to the residents still alive there throws payload_too_large
//    (out of memory) after "allocating" and freeing its temporaries;
//  - a record of every load: acquisition, device, thread name, and the bytes
//    alive on that device when it started (to check that freed means freed);
//  - growth: a load "allocates" its estimated transition peak as temporaries,
//    then needs each configured step more, growing its reservation to cover
//    it before "allocating" it (an observer sees every grant), and finishes
//    with a configured resident size; everything temporary is freed when it
//    returns or throws.
//  - early publication (opt in per acquisition, publish_early): a region-first
//    load as the backend contract describes it (LoadProgress::first_rows,
//    rows_held). It creates its resident first, begins its HeldRows with the
//    load's first rows, then for each step holds that many rows, calls
//    progress.rows_held(resident) and waits at that step's gate (open_step);
//    an injected fault (fail_after_step) is thrown once past a gate; it sees a
//    cancellation while waiting. The resident is part of the transition peak:
//    the temporaries are the peak less its bytes.
// Residents count their bytes as alive on their device until destroyed.
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/core/error.hpp"

namespace quantem::test {

// Bytes alive per device, shared by the backend and its residents (which may outlive it).
struct FakeDeviceMemory {
  std::mutex mutex;
  std::map<int, std::uint64_t> alive;
  void add(int device, std::uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    alive[device] += bytes;
  }
  void remove(int device, std::uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    alive[device] -= bytes;
  }
  std::uint64_t on(int device) {
    std::lock_guard<std::mutex> lock(mutex);
    return alive[device];
  }
};

class FakeResident : public backend::Resident {
 public:
  FakeResident(const catalog::Acquisition& source, int device, std::uint64_t bytes,
               std::shared_ptr<FakeDeviceMemory> memory = nullptr)
      : source_(source), device_(device), bytes_(bytes), memory_(std::move(memory)) {
    if (memory_) memory_->add(device_, bytes_);
  }
  ~FakeResident() override {
    if (memory_) memory_->remove(device_, bytes_);
  }
  int device_index() const override { return device_; }
  std::uint64_t resident_bytes() const override { return bytes_; }
  std::string encoding() const override { return "fake"; }
  DType resident_dtype() const override { return DType::uint16; }
  const catalog::Acquisition& source() const override { return source_; }
 protected:
  std::vector<std::uint64_t> compute_pattern_sum(const plan::PlanGeometry&) override { return {}; }
  std::vector<std::uint64_t> compute_masked_sum(const plan::PlanGeometry&, const std::vector<std::uint8_t>&) override {
    return {};
  }
  backend::CenterOfMassSums compute_center_of_mass_sums(const plan::PlanGeometry&) override { return {}; }
  std::vector<std::uint64_t> compute_frame(const plan::PlanGeometry&, std::uint64_t, std::uint64_t) override {
    return {};
  }
  std::vector<std::uint64_t> compute_region_reduce(const plan::PlanGeometry&, const std::vector<std::uint64_t>&,
                                                   backend::RegionReduce) override {
    return {};
  }

 private:
  catalog::Acquisition source_;
  int device_;
  std::uint64_t bytes_;
  std::shared_ptr<FakeDeviceMemory> memory_;
};

struct FakeLoad {
  std::string master_path;
  int device = 0;
  std::string thread_name;
  std::uint64_t alive_bytes_at_start = 0;  // on that device, before this attempt allocated anything
  std::optional<backend::ScanRows> first_rows;  // the load's LoadProgress::first_rows
};

class FakeBackend : public backend::Backend {
 public:
  explicit FakeBackend(std::vector<std::uint64_t> budgets) {
    for (std::size_t i = 0; i < budgets.size(); ++i) {
      backend::DeviceInfo info;
      info.index = static_cast<int>(i);
      info.name = "fake device " + std::to_string(i);
      info.total_memory_bytes = budgets[i] * 2;
      info.budget_bytes = budgets[i];
      devices_.push_back(info);
    }
  }

  std::string name() const override { return "fake"; }
  std::vector<backend::DeviceInfo> devices() const override { return devices_; }
  std::optional<std::uint64_t> free_bytes(int device_index) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(device_index);
    if (it == free_.end()) return std::nullopt;
    return it->second;
  }
  backend::LoadEstimate estimate_load(const catalog::Acquisition& acquisition) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++estimates_made_;
    return estimate_locked(acquisition.master_path);
  }
  using backend::Backend::load;
  std::shared_ptr<backend::Resident> load(const catalog::Acquisition& acquisition, int device_index,
                                          backend::LoadProgress& progress,
                                          backend::LoadReservation& reservation) override {
    const std::string& path = acquisition.master_path;
    std::unique_lock<std::mutex> lock(mutex_);
    char thread_name[32] = {};
    pthread_getname_np(pthread_self(), thread_name, sizeof thread_name);
    loads_.push_back({path, device_index, thread_name, memory_->on(device_index), progress.first_rows});
    ++running_;
    max_running_ = std::max(max_running_, running_);
    changed_.notify_all();
    struct Running {
      FakeBackend& backend;
      ~Running() {
        --backend.running_;
        backend.changed_.notify_all();
      }
    } running{*this};
    progress.bytes_total = 100;
    progress.stage = backend::LoadStage::reading;
    // Polls the cancellation flag as a real load does at chunk boundaries.
    while ((!gate_open_ || held_.count(path)) && !progress.cancel_requested) {
      changed_.wait_for(lock, std::chrono::milliseconds(2));
    }
    if (progress.cancel_requested) {
      progress.stage = backend::LoadStage::cancelled;
      throw unavailable("cancelled");
    }
    auto failure = failures_.find(path);
    if (failure != failures_.end()) {
      auto& [error, remaining] = failure->second;
      const Error thrown = error;
      if (remaining > 0 && --remaining == 0) failures_.erase(failure);
      throw thrown;
    }
    const backend::LoadEstimate estimate = estimate_locked(path);
    auto physical = physical_.find(device_index);
    if (physical != physical_.end() && memory_->on(device_index) + estimate.transition_peak_bytes > physical->second) {
      ++out_of_memory_;
      throw payload_too_large("fake device " + std::to_string(device_index) + " is out of memory");
    }
    const Growth growth = growth_locked(path);
    const std::uint64_t resident_bytes = growth.resident_bytes ? growth.resident_bytes : estimate.resident_bytes;
    auto early = early_.find(path);
    const bool publishes_early = early != early_.end() && early->second.enabled;
    // Temporaries alive until this attempt returns or throws.
    struct Temporaries {
      std::shared_ptr<FakeDeviceMemory> memory;
      int device;
      std::uint64_t bytes = 0;
      void add(std::uint64_t more) {
        memory->add(device, more);
        bytes += more;
      }
      ~Temporaries() { memory->remove(device, bytes); }
    } temporaries{memory_, device_index};
    temporaries.add(publishes_early ? estimate.transition_peak_bytes - std::min(estimate.transition_peak_bytes, resident_bytes)
                                    : estimate.transition_peak_bytes);
    const auto observer = growth_observer_;
    std::uint64_t needed = estimate.transition_peak_bytes;
    lock.unlock();
    for (const std::uint64_t step : growth.steps) {
      needed += step;
      // A retry may start with a reservation that already covers it (the size learned before).
      if (needed > reservation.reserved_bytes()) {
        reservation.grow(needed - reservation.reserved_bytes());  // before the allocation, as the contract says
        if (observer) observer(device_index, reservation.reserved_bytes());
      }
      temporaries.add(step);
    }
    lock.lock();
    if (publishes_early) {
      return publish_early_locked(lock, acquisition, device_index, progress, resident_bytes, early->second);
    }
    progress.bytes_done = 100;
    progress.stage = backend::LoadStage::done;
    if (resident_bytes > reservation.reserved_bytes()) ++resident_above_reservation_;
    return std::make_shared<FakeResident>(acquisition, device_index, resident_bytes, memory_);
  }

  // Loads of path publish their resident early, holding rows_held_steps[k]
  // rows at step k (see the header comment); every gate starts closed.
  void publish_early(const std::string& path, std::vector<std::uint64_t> rows_held_steps) {
    std::lock_guard<std::mutex> lock(mutex_);
    EarlyPublication& early = early_[path];
    early.enabled = true;
    early.steps = std::move(rows_held_steps);
    early.gates_open = 0;
    early.steps_reached = 0;
    early.fault.reset();
  }
  // Opens the next `count` step gates of path's early-publishing loads (a gate lets one load past one step).
  void open_step(const std::string& path, std::size_t count = 1) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      early_[path].gates_open += count;
    }
    changed_.notify_all();
  }
  // The next early-publishing load of path throws error once past the gate of step `step` (0-based).
  void fail_after_step(const std::string& path, std::size_t step, Error error) {
    std::lock_guard<std::mutex> lock(mutex_);
    early_[path].fault.emplace(step, std::move(error));
  }
  // Waits (bounded) until the running early-publishing load of path has
  // published `steps` steps and waits at the gate of the last; false on timeout.
  bool wait_step(const std::string& path, std::size_t steps, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return early_[path].steps_reached >= steps; });
  }
  // Waits (bounded) until no load runs; false on timeout.
  bool wait_idle(std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return running_ == 0; });
  }

  void trim_device_memory(int device_index) override {
    std::lock_guard<std::mutex> lock(mutex_);
    trims_.push_back(device_index);
  }

  // Loads of path grow their reservation by each step in turn, then finish
  // with a resident of resident_bytes (0: the estimate's).
  void set_growth(const std::string& path, std::vector<std::uint64_t> steps, std::uint64_t resident_bytes = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    growth_[path] = Growth{std::move(steps), resident_bytes};
  }
  // Called on the loader thread after every granted grow (device, reservation now), no lock held.
  void set_growth_observer(std::function<void(int, std::uint64_t)> observer) {
    std::lock_guard<std::mutex> lock(mutex_);
    growth_observer_ = std::move(observer);
  }
  std::vector<int> trims() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return trims_;
  }
  int resident_above_reservation() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return resident_above_reservation_;
  }

  void set_estimate(const std::string& path, std::uint64_t resident, std::uint64_t peak) {
    std::lock_guard<std::mutex> lock(mutex_);
    estimates_[path] = backend::LoadEstimate{resident, peak};
  }
  void set_default_estimate(std::uint64_t resident, std::uint64_t peak) {
    std::lock_guard<std::mutex> lock(mutex_);
    default_estimate_ = backend::LoadEstimate{resident, peak};
  }
  void set_free(int device, std::uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[device] = bytes;
  }
  // Device memory a load can really use: residents alive there + the new peak must fit.
  void set_physical_memory(int device, std::uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    physical_[device] = bytes;
  }
  // Every load of path fails with error (times = 0), or only the next `times` loads.
  void fail(const std::string& path, Error error, int times = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    failures_.erase(path);
    failures_.emplace(path, std::make_pair(std::move(error), times));
  }
  void clear_failure(const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex_);
    failures_.erase(path);
  }
  void close_gate() {
    std::lock_guard<std::mutex> lock(mutex_);
    gate_open_ = false;
  }
  void open_gate() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gate_open_ = true;
    }
    changed_.notify_all();
  }
  // Holds the loads of one acquisition until released.
  void hold(const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex_);
    held_.insert(path);
  }
  void release(const std::string& path) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      held_.erase(path);
    }
    changed_.notify_all();
  }
  // Waits (bounded) until `count` loads are running at once; false on timeout.
  bool wait_running(int count, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return running_ >= count; });
  }
  // Waits (bounded) until `count` loads have started; false on timeout.
  bool wait_loads(std::size_t count, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return loads_.size() >= count; });
  }

  std::vector<FakeLoad> load_records() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return loads_;
  }
  std::vector<std::pair<std::string, int>> loads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<std::string, int>> summary;
    for (const auto& load : loads_) summary.emplace_back(load.master_path, load.device);
    return summary;
  }
  int max_running() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return max_running_;
  }
  int out_of_memory_count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return out_of_memory_;
  }
  std::uint64_t estimates_made() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return estimates_made_;
  }
  std::uint64_t alive_bytes(int device) const { return memory_->on(device); }

 private:
  struct Growth {
    std::vector<std::uint64_t> steps;
    std::uint64_t resident_bytes = 0;
  };
  struct EarlyPublication {
    bool enabled = false;
    std::vector<std::uint64_t> steps;  // rows held at each step
    std::size_t gates_open = 0;        // gates opened and not yet passed
    std::size_t steps_reached = 0;     // steps the current load has published
    std::optional<std::pair<std::size_t, Error>> fault;  // thrown once past this step's gate
  };

  // The early-publishing part of a load, with mutex_ held (released around
  // rows_held, which takes the residency's lock, and while waiting at a gate).
  std::shared_ptr<backend::Resident> publish_early_locked(std::unique_lock<std::mutex>& lock,
                                                          const catalog::Acquisition& acquisition, int device_index,
                                                          backend::LoadProgress& progress,
                                                          std::uint64_t resident_bytes, EarlyPublication& early) {
    auto resident = std::make_shared<FakeResident>(acquisition, device_index, resident_bytes, memory_);
    resident->held_rows().begin(acquisition.scan_rows, progress.first_rows.value_or(backend::ScanRows{}));
    early.steps_reached = 0;
    const std::vector<std::uint64_t> steps = early.steps;
    for (std::size_t step = 0; step < steps.size(); ++step) {
      resident->held_rows().hold(steps[step]);
      lock.unlock();
      if (progress.rows_held) progress.rows_held(resident);
      lock.lock();
      ++early.steps_reached;
      changed_.notify_all();
      while (early.gates_open == 0 && !progress.cancel_requested) {
        changed_.wait_for(lock, std::chrono::milliseconds(2));
      }
      if (progress.cancel_requested) {
        progress.stage = backend::LoadStage::cancelled;
        throw unavailable("cancelled");
      }
      --early.gates_open;
      if (early.fault && early.fault->first == step) {
        const Error thrown = early.fault->second;
        early.fault.reset();
        throw thrown;
      }
    }
    resident->held_rows().hold_all();
    progress.bytes_done = 100;
    progress.stage = backend::LoadStage::done;
    return resident;
  }
  Growth growth_locked(const std::string& path) const {
    auto it = growth_.find(path);
    return it != growth_.end() ? it->second : Growth{};
  }
  backend::LoadEstimate estimate_locked(const std::string& path) const {
    auto it = estimates_.find(path);
    return it != estimates_.end() ? it->second : default_estimate_;
  }

  std::vector<backend::DeviceInfo> devices_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool gate_open_ = true;
  std::set<std::string> held_;
  std::map<std::string, backend::LoadEstimate> estimates_;
  backend::LoadEstimate default_estimate_{10, 10};
  std::map<int, std::uint64_t> free_;
  std::map<int, std::uint64_t> physical_;
  std::map<std::string, std::pair<Error, int>> failures_;
  std::vector<FakeLoad> loads_;
  int running_ = 0;
  int max_running_ = 0;
  int out_of_memory_ = 0;
  mutable std::uint64_t estimates_made_ = 0;
  std::map<std::string, Growth> growth_;
  std::map<std::string, EarlyPublication> early_;
  std::function<void(int, std::uint64_t)> growth_observer_;
  std::vector<int> trims_;
  int resident_above_reservation_ = 0;
  std::shared_ptr<FakeDeviceMemory> memory_ = std::make_shared<FakeDeviceMemory>();
};

inline catalog::Acquisition fake_acquisition(const std::string& name) {
  catalog::Acquisition acquisition;
  acquisition.name = name + "_master.h5";
  acquisition.stem = name;
  acquisition.master_path = "/fake/" + acquisition.name;
  acquisition.status.loadable = true;
  return acquisition;  // empty signature: restat_signature() of it is empty too
}

}  // namespace quantem::test
