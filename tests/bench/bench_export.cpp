// Export benchmark (prints JSON): synthesizes a realistic Arina acquisition
// (or reuses one), loads it on the CPU backend, then exports plans of it with
// quantem_export and reports the stages (read from the resident, encode,
// write, finish), the wall time and the output size against the source's.
//
//   bench_export [--scan 128x128] [--detector 192x192] [--dtype uint16]
//                [--threads 2] [--work DIR] [--repeat 3]
//                [--plans full,scanbin2,detbin2,crop]
//
// The source is written to DIR/source (kept between runs: delete DIR to
// rewrite it); every export goes to DIR/out and is removed after it is timed.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/version.hpp"
#include "quantem/export/export.hpp"
#include "quantem/synth/synth.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::uint64_t scan_rows = 128, scan_cols = 128, detector_rows = 192, detector_cols = 192;
  std::string dtype = "uint16";
  unsigned threads = 2;
  std::string work = "/tmp/quantem-bench-export";
  int repeat = 3;
  std::vector<std::string> plans = {"full", "scanbin2", "detbin2", "crop"};
};

bool parse_pair(const std::string& text, std::uint64_t& a, std::uint64_t& b) {
  return std::sscanf(text.c_str(), "%llux%llu", reinterpret_cast<unsigned long long*>(&a),
                     reinterpret_cast<unsigned long long*>(&b)) == 2;
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--scan") parse_pair(value, options.scan_rows, options.scan_cols);
    else if (key == "--detector") parse_pair(value, options.detector_rows, options.detector_cols);
    else if (key == "--dtype") options.dtype = value;
    else if (key == "--threads") options.threads = static_cast<unsigned>(std::stoul(value));
    else if (key == "--work") options.work = value;
    else if (key == "--repeat") options.repeat = std::stoi(value);
    else if (key == "--plans") {
      options.plans.clear();
      std::stringstream stream(value);
      for (std::string plan; std::getline(stream, plan, ',');) options.plans.push_back(plan);
    }
  }
  return options;
}

quantem::plan::BrowsePlan plan_named(const std::string& name, const quantem::catalog::Acquisition& source) {
  quantem::plan::BrowsePlan plan;
  if (name == "scanbin2") plan.scan_bin = 2;
  if (name == "detbin2") plan.detector_bin = 2;
  if (name == "crop") plan.crop = quantem::plan::ScanRegion{0, source.scan_rows / 2, 0, source.scan_cols / 2};
  return plan;
}

std::string source_master(const Options& options) {
  const std::string folder = options.work + "/source";
  const std::string master = folder + "/bench_master.h5";
  if (fs::exists(master)) return master;
  quantem::synth::SynthOptions synth;
  synth.output_dir = folder;
  synth.prefix = "bench";
  synth.scan_rows = options.scan_rows;
  synth.scan_cols = options.scan_cols;
  synth.detector_rows = options.detector_rows;
  synth.detector_cols = options.detector_cols;
  synth.dtype = *quantem::dtype_from_name(options.dtype);
  synth.threads = options.threads;
  return quantem::synth::write_acquisition(synth).master_path;
}

json run_plan(const std::string& name, const Options& options, quantem::backend::Resident& resident,
              const quantem::catalog::Acquisition& source) {
  const std::string out = options.work + "/out";
  json runs = json::array();
  std::vector<double> totals;
  for (int r = 0; r < options.repeat; ++r) {
    fs::remove_all(out);
    fs::create_directories(out);
    quantem::exporter::ExportRequest request;
    request.plan = plan_named(name, source);
    request.output_folder = out;
    request.threads = options.threads;
    const auto layout = quantem::exporter::plan_export(source, request);
    quantem::exporter::ExportProgress progress;
    const auto report = quantem::exporter::export_plan(resident, source, layout, request, progress);
    totals.push_back(report.seconds.total);
    runs.push_back({{"read_cpu_s", report.seconds.read},
                    {"encode_cpu_s", report.seconds.encode},
                    {"write_s", report.seconds.write},
                    {"finish_s", report.seconds.finish},
                    {"total_s", report.seconds.total}});
    if (r + 1 == options.repeat) {
      const double best = *std::min_element(totals.begin(), totals.end());
      fs::remove_all(out);
      return {{"plan", name},
              {"name", report.name},
              {"shape", {report.scan_rows, report.scan_cols, report.detector_rows, report.detector_cols}},
              {"dtype", quantem::dtype_name(report.dtype)},
              {"frames", report.frames},
              {"encoder", report.encoder},
              {"dense_bytes", report.dense_bytes},
              {"stored_bytes", report.stored_bytes},
              {"output_bytes", report.output_bytes},
              {"source_bytes", report.source_bytes},
              {"output_over_source", double(report.output_bytes) / double(report.source_bytes)},
              {"best_total_s", best},
              {"frames_per_s", double(report.frames) / best},
              {"dense_gb_per_s", double(report.dense_bytes) / best / 1e9},
              {"runs", runs}};
    }
  }
  return json::object();
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  fs::create_directories(options.work);
  const auto synth_start = Clock::now();
  const std::string master = source_master(options);
  const double synth_seconds = std::chrono::duration<double>(Clock::now() - synth_start).count();
  const auto source = quantem::catalog::inspect_master(master);
  if (!source.status.loadable) {
    std::cerr << "source not loadable: " << source.status.reason << "\n";
    return 1;
  }
  quantem::backend::CpuBackendOptions cpu;
  cpu.threads = options.threads;
  auto backend = quantem::backend::make_cpu_backend(cpu);
  quantem::backend::LoadProgress load_progress;
  const auto load_start = Clock::now();
  auto resident = backend->load(source, 0, load_progress);
  const double load_seconds = std::chrono::duration<double>(Clock::now() - load_start).count();

  json plans = json::array();
  for (const auto& name : options.plans) plans.push_back(run_plan(name, options, *resident, source));
  json out = {{"benchmark", "export"},
              {"revision", quantem::build_git_revision()},
              {"cores", std::thread::hardware_concurrency()},
              {"threads", options.threads},
              {"backend", "cpu"},
              {"source", {{"shape", {source.scan_rows, source.scan_cols, source.detector_rows, source.detector_cols}},
                          {"dtype", options.dtype},
                          {"bytes", source.size_bytes},
                          {"resident_encoding", resident->encoding()},
                          {"synth_s", synth_seconds},
                          {"load_s", load_seconds}}},
              {"note", "read_cpu_s and encode_cpu_s are summed over the worker threads; write_s is the writer "
                       "thread's time in HDF5; output to the page cache (no fsync)"},
              {"plans", plans}};
  std::cout << out.dump(2) << "\n";
  return 0;
}
