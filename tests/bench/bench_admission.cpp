// Admission benchmark: how fast a load larger than every device budget is
// refused (413 "Requested exact load needs a ... transition peak ..."), which
// must happen before anything is allocated or read (goal: <= 2 ms).
//
// Three paths, each timed `repeats` times on one synthesized acquisition:
//  - manager:    ResidencyManager::acquire() with an inspected acquisition
//                (estimate + budget check, no I/O);
//  - route:      BrowseService::handle() for GET /api/browse/realspace without
//                sockets (query parsing, catalog resolution with its stat of
//                every source file, readiness, plan, admission, error body);
//  - http:       the same request over a loopback TCP connection to the real
//                HTTP server (keep-alive client), as a viewer sees it.
// Prints one JSON document.
//
// usage: bench_admission [repeats [scan_rows scan_cols detector_rows detector_cols]]
//   defaults: 2000 repeats, a 128 x 128 scan of 96 x 96 detector frames.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/error.hpp"
#include "quantem/residency/residency_manager.hpp"
#include "quantem/server/browse_service.hpp"
#include "quantem/server/catalog_service.hpp"
#include "quantem/server/http_server.hpp"
#include "quantem/server/metrics.hpp"
#include "quantem/synth/synth.hpp"
#include "test_support.hpp"

namespace {

using Clock = std::chrono::steady_clock;

nlohmann::json summary(std::vector<double> microseconds) {
  std::sort(microseconds.begin(), microseconds.end());
  auto at = [&](double q) { return microseconds[std::min(microseconds.size() - 1, std::size_t(q * microseconds.size()))]; };
  return {{"min_us", microseconds.front()}, {"median_us", at(0.5)}, {"p99_us", at(0.99)},
          {"max_us", microseconds.back()}, {"repeats", microseconds.size()}};
}

template <typename Call>
std::vector<double> time_calls(int repeats, Call&& call) {
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(repeats));
  for (int i = 0; i < repeats; ++i) {
    const auto start = Clock::now();
    call();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace quantem;
  spdlog::set_level(spdlog::level::warn);  // stdout carries only the JSON document
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 2000;
  synth::SynthOptions synth_options;
  synth_options.scan_rows = argc > 5 ? std::strtoull(argv[2], nullptr, 10) : 128;
  synth_options.scan_cols = argc > 5 ? std::strtoull(argv[3], nullptr, 10) : 128;
  synth_options.detector_rows = argc > 5 ? std::strtoull(argv[4], nullptr, 10) : 96;
  synth_options.detector_cols = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 96;
  synth_options.frames_per_shard = 4096;  // several shards: resolution stats each of them
  synth_options.prefix = "bench";
  if (repeats < 1) {
    std::cerr << "usage: bench_admission [repeats [scan_rows scan_cols detector_rows detector_cols]]\n";
    return 2;
  }

  test::TempDir folder;
  synth_options.output_dir = folder.file("sess");
  const auto written = synth::write_acquisition(synth_options);

  // Two virtual devices of 1 MiB: every real acquisition is above every budget.
  backend::CpuBackendOptions cpu;
  cpu.virtual_devices = 2;
  cpu.budget_bytes_per_device = 1 << 20;
  cpu.threads = 1;
  const auto backend = backend::make_cpu_backend(cpu);
  residency::ResidencyManager residency(*backend, residency::ResidencyOptions{});
  server::CatalogService catalog(folder.path());
  server::Metrics metrics;
  server::BrowseConfig config;
  config.implementation_revision = "bench";
  server::BrowseService service(config, *backend, residency, catalog, metrics);
  service.set_ready(true);

  const catalog::Acquisition acquisition = catalog.resolve("sess", "bench_master.h5");
  const backend::LoadEstimate estimate = backend->estimate_load(acquisition);
  std::string refusal;
  const auto manager_us = time_calls(repeats, [&] {
    try {
      residency.acquire(acquisition);
    } catch (const Error& error) {
      if (error.kind() != ErrorKind::payload_too_large) throw;
      refusal = error.what();
    }
  });

  const std::string target = "/api/browse/realspace?session=sess&file=bench_master.h5&mode=BF";
  server::HttpRequest request;
  request.method = "GET";
  request.path = "/api/browse/realspace";
  request.query = "session=sess&file=bench_master.h5&mode=BF";
  request.headers.emplace_back("host", "127.0.0.1");
  int route_status = 0;
  const auto route_us = time_calls(repeats, [&] { route_status = service.handle(request).status; });

  server::HttpServer http([&service](const server::HttpRequest& r) { return service.handle(r); },
                          server::HttpServerOptions{});
  const int port = http.bind("127.0.0.1", 0);
  std::thread server_thread([&] { http.run(); });
  httplib::Client client("127.0.0.1", port);
  client.set_keep_alive(true);
  int http_status = 0;
  std::string http_detail;
  for (int warm = 0; warm < 10; ++warm) client.Get(target.c_str());
  const auto http_us = time_calls(repeats, [&] {
    auto response = client.Get(target.c_str());
    http_status = response ? response->status : -1;
    if (response) http_detail = response->body;
  });
  http.stop();
  server_thread.join();

  const auto counters = residency.counters();
  nlohmann::ordered_json report;
  report["benchmark"] = "admission_refusal_413";
  report["goal_ms"] = 2.0;
  report["acquisition"] = {{"scan", {synth_options.scan_rows, synth_options.scan_cols}},
                           {"detector", {synth_options.detector_rows, synth_options.detector_cols}},
                           {"source_files", acquisition.signature.size()},
                           {"stored_bytes", written.stored_bytes},
                           {"estimated_resident_bytes", estimate.resident_bytes},
                           {"estimated_transition_peak_bytes", estimate.transition_peak_bytes},
                           {"largest_device_budget_bytes", residency.max_budget_bytes()}};
  report["refusal"] = refusal;
  report["manager"] = summary(manager_us);
  report["route"] = summary(route_us);
  report["route"]["status"] = route_status;
  report["http"] = summary(http_us);
  report["http"]["status"] = http_status;
  report["http"]["detail"] = nlohmann::json::parse(http_detail, nullptr, false).value("detail", http_detail);
  report["loads_started"] = counters.loads_started;  // 0: nothing was ever loaded or allocated
  report["admission_rejections"] = counters.admission_rejections;
  const double worst_median_ms = std::max({report["manager"]["median_us"].get<double>(),
                                           report["route"]["median_us"].get<double>(),
                                           report["http"]["median_us"].get<double>()}) / 1000.0;
  report["meets_goal"] = worst_median_ms <= 2.0 && route_status == 413 && http_status == 413 &&
                         counters.loads_started == 0;
  std::cout << report.dump(2) << "\n";
  return 0;
}
