#pragma once
// Prometheus text exposition (version 0.0.4) of the daemon's counters:
// HTTP requests per route and status, product latency histograms, resident
// bytes and entries per device, loads, evictions and admission rejections.
// Base units, `_total` on counters, no high-cardinality labels (routes are the
// fixed route table; unknown paths count as "other").
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "quantem/residency/residency_manager.hpp"

namespace quantem::server {

class Metrics {
 public:
  static constexpr std::array<double, 14> kLatencyBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                              0.1,    0.25,  0.5,    1.0,   2.5,   5.0,  10.0};

  void observe_request(const std::string& route, int status, double seconds, bool is_product);

  std::string render(const std::vector<residency::DeviceUsage>& devices, const residency::ResidencyCounters& counters,
                     std::uint64_t catalog_builds, bool ready) const;

 private:
  struct Histogram {
    std::array<std::uint64_t, kLatencyBuckets.size()> buckets{};
    std::uint64_t count = 0;
    double sum = 0;
  };
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, std::uint64_t> requests_;
  std::map<std::string, Histogram> product_latency_;
};

}  // namespace quantem::server
