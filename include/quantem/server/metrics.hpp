#pragma once
// Prometheus text exposition (version 0.0.4) of the daemon's counters:
// HTTP requests per route and status, product latency histograms, per-stage
// request histograms (the stages of the server-timing header), resident
// bytes and entries per device, loads, evictions and admission rejections.
// Base units, `_total` on counters, no high-cardinality labels (routes are the
// fixed route table; unknown paths count as "other").
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "quantem/residency/residency_manager.hpp"

namespace quantem::server {

// Where one request's time went, stage by stage: each lap() charges the time
// since the previous lap (or the start) to a stage. Rendered as the standard
// `server-timing` header (durations in milliseconds):
//   parse;dur=0.004, resolve;dur=0.031, acquire;dur=0.002, compute;dur=1.020, encode;dur=0.080, total;dur=1.140, cache;desc=miss
// Stage names are string literals (a fixed set, safe as metric labels).
class RequestTiming {
 public:
  RequestTiming();
  void lap(const char* stage);
  // `cache;desc=<description>` ("hit", "miss", "not-modified"); a literal.
  void set_cache(const char* description) { cache_ = description; }
  const char* cache() const { return cache_; }
  double total_seconds() const;
  const std::vector<std::pair<const char*, double>>& stages() const { return stages_; }
  std::string header() const;

 private:
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point last_;
  std::vector<std::pair<const char*, double>> stages_;  // seconds, in order, a stage once
  const char* cache_ = nullptr;
};

class Metrics {
 public:
  static constexpr std::array<double, 14> kLatencyBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                              0.1,    0.25,  0.5,    1.0,   2.5,   5.0,  10.0};
  // Stages are often tens of microseconds.
  static constexpr std::array<double, 16> kStageBuckets = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
                                                            0.001,   0.0025,   0.005,   0.01,   0.025,   0.05,
                                                            0.1,     0.25,     1.0,     5.0};

  // `timing`, when given, adds its stages to quantem_request_stage_seconds.
  void observe_request(const std::string& route, int status, double seconds, bool is_product,
                       const RequestTiming* timing = nullptr);

  std::string render(const std::vector<residency::DeviceUsage>& devices, const residency::ResidencyCounters& counters,
                     std::uint64_t catalog_builds, bool ready) const;

 private:
  // The request counts and histograms (under mutex_).
  void write_requests(std::ostringstream& out) const;

  template <std::size_t N>
  struct Histogram {
    std::array<std::uint64_t, N> buckets{};
    std::uint64_t count = 0;
    double sum = 0;
  };
  using LatencyHistogram = Histogram<kLatencyBuckets.size()>;
  using StageHistogram = Histogram<kStageBuckets.size()>;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, std::uint64_t> requests_;
  std::map<std::string, LatencyHistogram> product_latency_;
  std::map<std::pair<std::string, std::string>, StageHistogram> stages_;  // by (route, stage)
};

}  // namespace quantem::server
