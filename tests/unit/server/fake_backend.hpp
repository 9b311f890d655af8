#pragma once
// A backend double for residency and service tests: devices with fixed
// budgets, per-acquisition estimates, loads that can be held at a gate or
// made to fail, and a record of every load.
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/core/error.hpp"

namespace quantem::test {

class FakeResident : public backend::Resident {
 public:
  FakeResident(const catalog::Acquisition& source, int device, std::uint64_t bytes)
      : source_(source), device_(device), bytes_(bytes) {}
  int device_index() const override { return device_; }
  std::uint64_t resident_bytes() const override { return bytes_; }
  std::string encoding() const override { return "fake"; }
  DType resident_dtype() const override { return DType::uint16; }
  const catalog::Acquisition& source() const override { return source_; }
  std::vector<std::uint64_t> pattern_sum(const plan::PlanGeometry&) override { return {}; }
  std::vector<std::uint64_t> masked_sum(const plan::PlanGeometry&, const std::vector<std::uint8_t>&) override { return {}; }
  backend::CenterOfMassSums center_of_mass_sums(const plan::PlanGeometry&) override { return {}; }
  std::vector<std::uint64_t> frame(const plan::PlanGeometry&, std::uint64_t, std::uint64_t) override { return {}; }
  std::vector<std::uint64_t> region_reduce(const plan::PlanGeometry&, const std::vector<std::uint64_t>&,
                                           backend::RegionReduce) override {
    return {};
  }

 private:
  catalog::Acquisition source_;
  int device_;
  std::uint64_t bytes_;
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
    auto it = estimates_.find(acquisition.master_path);
    if (it != estimates_.end()) return it->second;
    return default_estimate_;
  }
  std::shared_ptr<backend::Resident> load(const catalog::Acquisition& acquisition, int device_index,
                                          backend::LoadProgress& progress) override {
    std::unique_lock<std::mutex> lock(mutex_);
    loads_.emplace_back(acquisition.master_path, device_index);
    progress.bytes_total = 100;
    progress.stage = backend::LoadStage::reading;
    // Polls the cancellation flag as a real load does at chunk boundaries.
    while (!gate_open_ && !progress.cancel_requested) gate_changed_.wait_for(lock, std::chrono::milliseconds(2));
    if (progress.cancel_requested) throw unavailable("cancelled");
    auto failure = failures_.find(acquisition.master_path);
    if (failure != failures_.end()) throw failure->second;
    progress.bytes_done = 100;
    progress.stage = backend::LoadStage::done;
    auto estimate = estimates_.count(acquisition.master_path) ? estimates_.at(acquisition.master_path) : default_estimate_;
    return std::make_shared<FakeResident>(acquisition, device_index, estimate.resident_bytes);
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
  void fail(const std::string& path, Error error) {
    std::lock_guard<std::mutex> lock(mutex_);
    failures_.erase(path);
    failures_.emplace(path, std::move(error));
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
    gate_changed_.notify_all();
  }
  std::vector<std::pair<std::string, int>> loads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return loads_;
  }

 private:
  std::vector<backend::DeviceInfo> devices_;
  mutable std::mutex mutex_;
  std::condition_variable gate_changed_;
  bool gate_open_ = true;
  std::map<std::string, backend::LoadEstimate> estimates_;
  backend::LoadEstimate default_estimate_{10, 10};
  std::map<int, std::uint64_t> free_;
  std::map<std::string, Error> failures_;
  std::vector<std::pair<std::string, int>> loads_;
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
