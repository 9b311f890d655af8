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

namespace {

// One residency (or catalog) counter as Prometheus exposes it.
struct CounterRow {
  const char* name;
  const char* help;
  std::uint64_t residency::ResidencyCounters::*value;
};

const CounterRow kResidencyCounters[] = {
    {"quantem_loads_started_total", "Loads admitted and queued.", &residency::ResidencyCounters::loads_started},
    {"quantem_loads_completed_total", "Loads that produced a resident.", &residency::ResidencyCounters::loads_completed},
    {"quantem_load_failures_total", "Loads that failed.", &residency::ResidencyCounters::loads_failed},
    {"quantem_evictions_total", "Residents evicted.", &residency::ResidencyCounters::evictions},
    {"quantem_admission_rejections_total", "Loads refused by admission.",
     &residency::ResidencyCounters::admission_rejections},
    {"quantem_load_out_of_memory_retries_total",
     "Backend out-of-memory errors answered by evicting or moving on.",
     &residency::ResidencyCounters::out_of_memory_retries},
    {"quantem_busy_timeouts_total", "Bounded waits for busy devices or loads that ended in 503.",
     &residency::ResidencyCounters::busy_timeouts},
    {"quantem_reservation_growths_total", "Reservation growths granted to running loads.",
     &residency::ResidencyCounters::reservation_growths},
    {"quantem_reservation_growth_refusals_total",
     "Reservation growths refused (the load attempt failed with 413).",
     &residency::ResidencyCounters::growth_refusals},
    {"quantem_idle_releases_total", "Residents released after --idle-release without use.",
     &residency::ResidencyCounters::idle_releases},
};

// A gauge of every device: name, help, and its value for one device.
struct DeviceGaugeRow {
  const char* name;
  const char* help;
  std::uint64_t (*value)(const residency::DeviceUsage&);
};

const DeviceGaugeRow kDeviceGauges[] = {
    {"quantem_resident_bytes", "Bytes held on a device by residents, loads in progress and draining residents.",
     [](const residency::DeviceUsage& d) -> std::uint64_t { return d.resident_bytes; }},
    {"quantem_resident_entries", "Residents and loads in progress on a device.",
     [](const residency::DeviceUsage& d) -> std::uint64_t { return d.resident_entries; }},
    {"quantem_device_budget_bytes", "Data-cache budget of a device.",
     [](const residency::DeviceUsage& d) -> std::uint64_t { return d.info.budget_bytes; }},
};

void write_family_header(std::ostringstream& out, const char* name, const char* help, const char* type) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << "\n";
}

void write_counter(std::ostringstream& out, const char* name, const char* help, std::uint64_t value) {
  write_family_header(out, name, help, "counter");
  out << name << ' ' << value << "\n";
}

// The _bucket, _sum and _count series of one labelled histogram.
template <typename Histogram, typename Buckets>
void write_histogram(std::ostringstream& out, const char* name, const std::string& labels, const Buckets& bounds,
                     const Histogram& histogram) {
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    out << name << "_bucket{" << labels << ",le=\"" << number(bounds[i]) << "\"} " << histogram.buckets[i] << "\n";
  }
  out << name << "_bucket{" << labels << ",le=\"+Inf\"} " << histogram.count << "\n"
      << name << "_sum{" << labels << "} " << number(histogram.sum) << "\n"
      << name << "_count{" << labels << "} " << histogram.count << "\n";
}

}  // namespace

std::string Metrics::render(const std::vector<residency::DeviceUsage>& devices,
                            const residency::ResidencyCounters& counters, std::uint64_t catalog_builds,
                            bool ready) const {
  std::ostringstream out;
  write_family_header(out, "quantem_ready", "Whether the daemon is ready (catalog built, devices initialised).", "gauge");
  out << "quantem_ready " << (ready ? 1 : 0) << "\n";
  for (const auto& gauge : kDeviceGauges) {
    write_family_header(out, gauge.name, gauge.help, "gauge");
    for (const auto& d : devices) out << gauge.name << "{device=\"" << d.info.index << "\"} " << gauge.value(d) << "\n";
  }
  for (const auto& counter : kResidencyCounters) write_counter(out, counter.name, counter.help, counters.*counter.value);
  write_counter(out, "quantem_catalog_builds_total", "Catalog builds completed.", catalog_builds);
  write_requests(out);
  return out.str();
}

void Metrics::write_requests(std::ostringstream& out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  write_family_header(out, "quantem_http_requests_total", "HTTP requests by route and status.", "counter");
  for (const auto& [key, count] : requests_) {
    out << "quantem_http_requests_total{route=\"" << key.first << "\",code=\"" << key.second << "\"} " << count << "\n";
  }
  write_family_header(out, "quantem_product_duration_seconds", "Time to answer a successful array request.",
                      "histogram");
  for (const auto& [route, histogram] : product_latency_) {
    write_histogram(out, "quantem_product_duration_seconds", "route=\"" + route + "\"", kLatencyBuckets, histogram);
  }
  write_family_header(out, "quantem_request_stage_seconds",
                      "Time spent in each stage of a request (the server-timing stages).", "histogram");
  for (const auto& [key, histogram] : stages_) {
    write_histogram(out, "quantem_request_stage_seconds", "route=\"" + key.first + "\",stage=\"" + key.second + "\"",
                    kStageBuckets, histogram);
  }
}

}  // namespace quantem::server
