#pragma once
// Where the time of one product call goes, for benchmarks: a thread may
// install a StageClock; the CUDA resident's masked sum then records the
// steady-clock time of each of its stages into it (mask preparation, enqueued
// work, the wait for the device, the result). Nothing is recorded, and nothing
// costs more than a null check, when no clock is installed.
#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace quantem::backend {

class StageClock {
 public:
  using Clock = std::chrono::steady_clock;

  void start() {
    laps_.clear();
    last_ = Clock::now();
  }
  // Milliseconds since the previous lap (or start()), under `name`.
  void lap(const char* name) {
    const auto now = Clock::now();
    laps_.emplace_back(name, std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  const std::vector<std::pair<std::string, double>>& laps() const { return laps_; }

  // The clock installed on this thread (null: none).
  static StageClock*& current() {
    thread_local StageClock* clock = nullptr;
    return clock;
  }

 private:
  Clock::time_point last_ = Clock::now();
  std::vector<std::pair<std::string, double>> laps_;
};

// Records a lap on this thread's clock, if one is installed.
inline void stage_lap(const char* name) {
  if (StageClock* clock = StageClock::current()) clock->lap(name);
}

}  // namespace quantem::backend
