// CPU backend benchmark: synthesizes a realistic Arina acquisition (or reuses
// one), loads it with the CPU backend and times the products a viewer asks
// for first. Prints one JSON document.
//
// usage: bench_cpu_backend [scan_rows scan_cols detector_rows detector_cols [dtype [threads [folder]]]]
//   defaults: 128 128 192 192 uint16, threads = hardware concurrency, a fresh
//   temporary folder (removed at exit). An existing folder with
//   bench_master.h5 of the same shape is reused (only the load is timed).
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/plan/plan.hpp"
#include "quantem/products/products.hpp"
#include "quantem/synth/synth.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// CPU time of the whole process (all threads), milliseconds: on a shared
// machine it shows the work done when the wall clock shows the contention.
double process_cpu_ms() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

// Runs `call` `repeats` times and returns {min, median} in milliseconds.
nlohmann::json timings(int repeats, const std::function<void()>& before, const std::function<void()>& call) {
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    before();
    const auto start = Clock::now();
    call();
    ms.push_back(milliseconds_since(start));
  }
  std::sort(ms.begin(), ms.end());
  return {{"min_ms", ms.front()}, {"median_ms", ms[ms.size() / 2]}, {"repeats", repeats}};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace quantem;
  std::uint64_t shape[4] = {128, 128, 192, 192};
  for (int i = 0; i < 4 && i + 1 < argc; ++i) shape[i] = std::strtoull(argv[i + 1], nullptr, 10);
  const DType dtype = argc > 5 ? dtype_from_name(argv[5]).value_or(DType::uint16) : DType::uint16;
  const unsigned threads = argc > 6 ? static_cast<unsigned>(std::strtoul(argv[6], nullptr, 10)) : 0;
  std::string folder = argc > 7 ? argv[7] : "";
  const bool temporary = folder.empty();
  if (temporary) {
    folder = (std::filesystem::temp_directory_path() / ("quantem-bench-" + std::to_string(::getpid()))).string();
  }
  std::filesystem::create_directories(folder);
  nlohmann::json report;
  report["benchmark"] = "cpu_backend";
  report["shape"] = {shape[0], shape[1], shape[2], shape[3]};
  report["dtype"] = dtype_name(dtype);
  report["hardware_threads"] = std::thread::hardware_concurrency();

  try {
    const std::string master = folder + "/bench_master.h5";
    catalog::Acquisition acquisition = catalog::inspect_master(master);
    if (!acquisition.status.loadable || acquisition.scan_rows != shape[0] || acquisition.scan_cols != shape[1] ||
        acquisition.detector_rows != shape[2] || acquisition.detector_cols != shape[3] || acquisition.dtype != dtype) {
      synth::SynthOptions options;
      options.output_dir = folder;
      options.prefix = "bench";
      options.scan_rows = shape[0];
      options.scan_cols = shape[1];
      options.detector_rows = shape[2];
      options.detector_cols = shape[3];
      options.dtype = dtype;
      options.preset = synth::Preset::realistic;
      const synth::SynthReport written = synth::write_acquisition(options);
      report["synth"] = {{"seconds", written.seconds}, {"stored_bytes", written.stored_bytes},
                         {"dense_bytes", written.dense_bytes}};
      acquisition = catalog::inspect_master(written.master_path);
    }
    if (!acquisition.status.loadable) throw std::runtime_error("not loadable: " + acquisition.status.reason);

    backend::CpuBackendOptions backend_options;
    backend_options.threads = threads;
    const auto cpu = backend::make_cpu_backend(backend_options);
    const backend::LoadEstimate estimate = cpu->estimate_load(acquisition);
    backend::LoadProgress progress;
    auto start = Clock::now();
    double cpu_start = process_cpu_ms();
    const auto resident = cpu->load(acquisition, 0, progress);
    const double load_ms = milliseconds_since(start);
    report["load"] = {{"ms", load_ms},
                      {"process_cpu_ms", process_cpu_ms() - cpu_start},
                      {"stored_bytes", progress.bytes_total.load()},
                      {"resident_bytes", resident->resident_bytes()},
                      {"estimated_resident_bytes", estimate.resident_bytes},
                      {"estimated_peak_bytes", estimate.transition_peak_bytes},
                      {"encoding", resident->encoding()},
                      {"threads", threads == 0 ? std::thread::hardware_concurrency() : threads}};

    {
      // The same load again after the first resident is dropped: memory the
      // process just returned is usually still backed by the host, so this
      // shows the load without the machine's first-touch cost of fresh pages.
      const auto resident_bytes = resident->resident_bytes();
      std::shared_ptr<backend::Resident> again;
      {
        backend::LoadProgress progress_again;
        auto dropped = cpu->load(acquisition, 0, progress_again);  // a second copy, then measure a third
        dropped.reset();
        backend::LoadProgress progress_third;
        start = Clock::now();
        cpu_start = process_cpu_ms();
        again = cpu->load(acquisition, 0, progress_third);
        report["load_again"] = {{"ms", milliseconds_since(start)}, {"process_cpu_ms", process_cpu_ms() - cpu_start}};
      }
      again.reset();
      // First touch of as many fresh bytes, from as many threads, while the resident is alive.
      const std::size_t bytes = resident_bytes;
      const unsigned touch_threads = threads == 0 ? std::max(1u, std::thread::hardware_concurrency()) : threads;
      std::vector<std::unique_ptr<char[]>> blocks(touch_threads);
      start = Clock::now();
      std::vector<std::thread> touchers;
      for (unsigned t = 0; t < touch_threads; ++t) {
        touchers.emplace_back([&, t] {
          const std::size_t share = bytes / touch_threads;
          blocks[t].reset(new char[share]);
          for (std::size_t i = 0; i < share; i += 4096) blocks[t][i] = static_cast<char>(i);
        });
      }
      for (auto& toucher : touchers) toucher.join();
      report["first_touch_of_resident_bytes_ms"] = milliseconds_since(start);
    }

    const plan::PlanGeometry full = plan::resolve_plan({}, acquisition.scan_rows, acquisition.scan_cols,
                                                       acquisition.detector_rows, acquisition.detector_cols);
    const auto forget = [&] { resident->derived_cache().clear(); };
    const auto nothing = [] {};
    products::UsedGeometry used;
    products::RealspaceRequest bf;
    report["bright_field_fresh"] = timings(5, forget, [&] { products::realspace(*resident, full, bf, used); });
    report["bright_field_cached_fit"] = timings(5, nothing, [&] { products::realspace(*resident, full, bf, used); });
    report["bright_field_geometry"] = {{"center_row", used.bright_field->center_row},
                                       {"center_col", used.bright_field->center_col},
                                       {"radius", used.bright_field->radius}};
    products::RealspaceRequest adf;
    adf.mode = products::RealspaceMode::ADF;
    adf.inner = 1.2;
    adf.outer = 4.0;
    report["annular_dark_field_cached_fit"] =
        timings(5, nothing, [&] { products::realspace(*resident, full, adf, used); });
    report["cbed"] = timings(21, nothing, [&] {
      products::selected_diffraction(*resident, full, static_cast<std::int64_t>(full.scan_rows / 2),
                                     static_cast<std::int64_t>(full.scan_cols / 3));
    });
    products::RealspaceRequest com;
    com.mode = products::RealspaceMode::CoMx;
    report["center_of_mass_fresh"] = timings(3, forget, [&] { products::realspace(*resident, full, com, used); });
    com.mode = products::RealspaceMode::iCoM;
    report["integrated_center_of_mass_cached_com"] =
        timings(3, nothing, [&] { products::realspace(*resident, full, com, used); });
    products::RegionRequest region;
    region.center_row = static_cast<double>(full.scan_rows) / 2.0;
    region.center_col = static_cast<double>(full.scan_cols) / 2.0;
    region.radius = 5.0;
    report["cbed_region_mean_r5"] = timings(5, nothing, [&] { products::region_diffraction(*resident, full, region); });

    plan::BrowsePlan binned_plan;
    binned_plan.scan_bin = 2;
    binned_plan.detector_bin = 2;
    const plan::PlanGeometry binned = plan::resolve_plan(binned_plan, acquisition.scan_rows, acquisition.scan_cols,
                                                         acquisition.detector_rows, acquisition.detector_cols);
    report["bright_field_fresh_scan_bin_2_det_bin_2"] =
        timings(3, forget, [&] { products::realspace(*resident, binned, bf, used); });
    plan::BrowsePlan crop_plan;
    crop_plan.crop = plan::ScanRegion{0, acquisition.scan_rows / 2, 0, acquisition.scan_cols / 2};
    const plan::PlanGeometry cropped = plan::resolve_plan(crop_plan, acquisition.scan_rows, acquisition.scan_cols,
                                                          acquisition.detector_rows, acquisition.detector_cols);
    report["bright_field_fresh_quarter_crop"] =
        timings(3, forget, [&] { products::realspace(*resident, cropped, bf, used); });
  } catch (const std::exception& error) {
    report["error"] = error.what();
    std::cout << report.dump(2) << std::endl;
    if (temporary) std::filesystem::remove_all(folder);
    return 1;
  }
  if (temporary) std::filesystem::remove_all(folder);
  std::cout << report.dump(2) << std::endl;
  return 0;
}
