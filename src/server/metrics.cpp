#include "quantem/server/metrics.hpp"

#include <cstdio>
#include <cstring>
#include <sstream>

namespace quantem::server {

namespace {

std::string number(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.9g", value);
  return buffer;
}

template <typename Histogram, typename Buckets>
void add(Histogram& histogram, const Buckets& bounds, double seconds) {
  for (std::size_t i = 0; i < bounds.size(); ++i)
    if (seconds <= bounds[i]) ++histogram.buckets[i];
  ++histogram.count;
  histogram.sum += seconds;
}

}  // namespace

RequestTiming::RequestTiming() : started_(std::chrono::steady_clock::now()), last_(started_) { stages_.reserve(8); }

void RequestTiming::lap(const char* stage) {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  for (auto& [name, total] : stages_) {
    if (std::strcmp(name, stage) == 0) {
      total += seconds;
      return;
    }
  }
  stages_.emplace_back(stage, seconds);
}

double RequestTiming::total_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

std::string RequestTiming::header() const {
  std::string text;
  char buffer[64];
  for (const auto& [name, seconds] : stages_) {
    std::snprintf(buffer, sizeof buffer, "%s;dur=%.3f, ", name, seconds * 1000.0);
    text += buffer;
  }
  std::snprintf(buffer, sizeof buffer, "total;dur=%.3f", total_seconds() * 1000.0);
  text += buffer;
  if (cache_) {
    text += ", cache;desc=";
    text += cache_;
  }
  return text;
}

void Metrics::observe_request(const std::string& route, int status, double seconds, bool is_product,
                              const RequestTiming* timing) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{route, status}];
  if (timing) {
    for (const auto& [stage, stage_seconds] : timing->stages()) add(stages_[{route, stage}], kStageBuckets, stage_seconds);
  }
  if (!is_product || status != 200) return;
  add(product_latency_[route], kLatencyBuckets, seconds);
}

std::string Metrics::render(const std::vector<residency::DeviceUsage>& devices,
                            const residency::ResidencyCounters& counters, std::uint64_t catalog_builds,
                            bool ready) const {
  std::ostringstream out;
  out << "# HELP quantem_ready Whether the daemon is ready (catalog built, devices initialised).\n"
         "# TYPE quantem_ready gauge\n"
      << "quantem_ready " << (ready ? 1 : 0) << "\n";
  out << "# HELP quantem_resident_bytes Bytes held on a device by residents, loads in progress and draining residents.\n"
         "# TYPE quantem_resident_bytes gauge\n";
  for (const auto& d : devices) out << "quantem_resident_bytes{device=\"" << d.info.index << "\"} " << d.resident_bytes << "\n";
  out << "# HELP quantem_resident_entries Residents and loads in progress on a device.\n"
         "# TYPE quantem_resident_entries gauge\n";
  for (const auto& d : devices) out << "quantem_resident_entries{device=\"" << d.info.index << "\"} " << d.resident_entries << "\n";
  out << "# HELP quantem_device_budget_bytes Data-cache budget of a device.\n"
         "# TYPE quantem_device_budget_bytes gauge\n";
  for (const auto& d : devices) out << "quantem_device_budget_bytes{device=\"" << d.info.index << "\"} " << d.info.budget_bytes << "\n";
  out << "# HELP quantem_loads_started_total Loads admitted and queued.\n# TYPE quantem_loads_started_total counter\n"
      << "quantem_loads_started_total " << counters.loads_started << "\n"
      << "# HELP quantem_loads_completed_total Loads that produced a resident.\n# TYPE quantem_loads_completed_total counter\n"
      << "quantem_loads_completed_total " << counters.loads_completed << "\n"
      << "# HELP quantem_load_failures_total Loads that failed.\n# TYPE quantem_load_failures_total counter\n"
      << "quantem_load_failures_total " << counters.loads_failed << "\n"
      << "# HELP quantem_evictions_total Residents evicted.\n# TYPE quantem_evictions_total counter\n"
      << "quantem_evictions_total " << counters.evictions << "\n"
      << "# HELP quantem_admission_rejections_total Loads refused by admission.\n"
         "# TYPE quantem_admission_rejections_total counter\n"
      << "quantem_admission_rejections_total " << counters.admission_rejections << "\n"
      << "# HELP quantem_load_out_of_memory_retries_total Backend out-of-memory errors answered by evicting or moving on.\n"
         "# TYPE quantem_load_out_of_memory_retries_total counter\n"
      << "quantem_load_out_of_memory_retries_total " << counters.out_of_memory_retries << "\n"
      << "# HELP quantem_busy_timeouts_total Bounded waits for busy devices or loads that ended in 503.\n"
         "# TYPE quantem_busy_timeouts_total counter\n"
      << "quantem_busy_timeouts_total " << counters.busy_timeouts << "\n"
      << "# HELP quantem_reservation_growths_total Reservation growths granted to running loads.\n"
         "# TYPE quantem_reservation_growths_total counter\n"
      << "quantem_reservation_growths_total " << counters.reservation_growths << "\n"
      << "# HELP quantem_reservation_growth_refusals_total Reservation growths refused (the load attempt failed with 413).\n"
         "# TYPE quantem_reservation_growth_refusals_total counter\n"
      << "quantem_reservation_growth_refusals_total " << counters.growth_refusals << "\n"
      << "# HELP quantem_idle_releases_total Residents released after --idle-release without use.\n"
         "# TYPE quantem_idle_releases_total counter\n"
      << "quantem_idle_releases_total " << counters.idle_releases << "\n"
      << "# HELP quantem_catalog_builds_total Catalog builds completed.\n# TYPE quantem_catalog_builds_total counter\n"
      << "quantem_catalog_builds_total " << catalog_builds << "\n";

  std::lock_guard<std::mutex> lock(mutex_);
  out << "# HELP quantem_http_requests_total HTTP requests by route and status.\n"
         "# TYPE quantem_http_requests_total counter\n";
  for (const auto& [key, count] : requests_) {
    out << "quantem_http_requests_total{route=\"" << key.first << "\",code=\"" << key.second << "\"} " << count << "\n";
  }
  out << "# HELP quantem_product_duration_seconds Time to answer a successful array request.\n"
         "# TYPE quantem_product_duration_seconds histogram\n";
  for (const auto& [route, histogram] : product_latency_) {
    for (std::size_t i = 0; i < kLatencyBuckets.size(); ++i) {
      out << "quantem_product_duration_seconds_bucket{route=\"" << route << "\",le=\"" << number(kLatencyBuckets[i])
          << "\"} " << histogram.buckets[i] << "\n";
    }
    out << "quantem_product_duration_seconds_bucket{route=\"" << route << "\",le=\"+Inf\"} " << histogram.count << "\n"
        << "quantem_product_duration_seconds_sum{route=\"" << route << "\"} " << number(histogram.sum) << "\n"
        << "quantem_product_duration_seconds_count{route=\"" << route << "\"} " << histogram.count << "\n";
  }
  out << "# HELP quantem_request_stage_seconds Time spent in each stage of a request (the server-timing stages).\n"
         "# TYPE quantem_request_stage_seconds histogram\n";
  for (const auto& [key, histogram] : stages_) {
    const std::string labels = "route=\"" + key.first + "\",stage=\"" + key.second + "\"";
    for (std::size_t i = 0; i < kStageBuckets.size(); ++i) {
      out << "quantem_request_stage_seconds_bucket{" << labels << ",le=\"" << number(kStageBuckets[i]) << "\"} "
          << histogram.buckets[i] << "\n";
    }
    out << "quantem_request_stage_seconds_bucket{" << labels << ",le=\"+Inf\"} " << histogram.count << "\n"
        << "quantem_request_stage_seconds_sum{" << labels << "} " << number(histogram.sum) << "\n"
        << "quantem_request_stage_seconds_count{" << labels << "} " << histogram.count << "\n";
  }
  return out.str();
}

}  // namespace quantem::server
