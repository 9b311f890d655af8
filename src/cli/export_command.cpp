#include "export_command.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/backend/cuda_backend.hpp"
#include "quantem/catalog/shard_storage.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/version.hpp"
#include "quantem/export/export.hpp"
#include "quantem/inspector/inspector.hpp"
#include "quantem/protocol/documents.hpp"
#include "quantem/residency/residency_manager.hpp"

namespace quantem::cli {

namespace {

std::atomic<bool> interrupted{false};

extern "C" void on_interrupt(int) { interrupted = true; }

// "R0:R1,C0:C1" into the four crop values; false when malformed.
bool parse_scan_crop(const std::string& text, ExportCommandOptions& options) {
  long long r0 = 0, r1 = 0, c0 = 0, c1 = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%lld:%lld,%lld:%lld%c", &r0, &r1, &c0, &c1, &tail) != 4) return false;
  options.row_start = r0;
  options.row_stop = r1;
  options.column_start = c0;
  options.column_stop = c1;
  return true;
}

plan::BrowsePlan plan_of(const ExportCommandOptions& options) {
  plan::BrowsePlan plan;
  const int given = int(options.row_start.has_value()) + int(options.row_stop.has_value()) +
                    int(options.column_start.has_value()) + int(options.column_stop.has_value());
  if (given != 0 && given != 4) throw bad_request("scan crop requires row_start, row_stop, column_start, and column_stop");
  if (given == 4) {
    if (*options.row_start < 0 || *options.column_start < 0 || *options.row_stop <= *options.row_start ||
        *options.column_stop <= *options.column_start) {
      throw bad_request("scan crop must be a nonempty half-open (row, column) region");
    }
    plan.crop = plan::ScanRegion{static_cast<std::uint64_t>(*options.row_start),
                                 static_cast<std::uint64_t>(*options.row_stop),
                                 static_cast<std::uint64_t>(*options.column_start),
                                 static_cast<std::uint64_t>(*options.column_stop)};
  }
  if (options.scan_bin < 1 || options.det_bin < 1) throw bad_request("scan_bin and det_bin must be positive integers");
  plan.scan_bin = static_cast<std::uint64_t>(options.scan_bin);
  plan.detector_bin = static_cast<std::uint64_t>(options.det_bin);
  return plan;
}

std::unique_ptr<backend::Backend> make_backend(const ExportCommandOptions& options) {
  if (options.backend == "cpu") {
    backend::CpuBackendOptions cpu;
    cpu.threads = options.threads;
    return backend::make_cpu_backend(cpu);
  }
  // Never a silent CPU fallback: without CUDA this throws "CUDA unavailable: ...".
  backend::CudaBackendOptions cuda;
  cuda.device_indices = {options.gpu};
  return backend::make_cuda_backend(cuda);
}

void draw_progress(const exporter::ExportProgress& progress) {
  const std::uint64_t total = progress.frames_total.load();
  const std::uint64_t done = progress.frames_done.load();
  const double fraction = total == 0 ? 0.0 : static_cast<double>(done) / static_cast<double>(total);
  constexpr int kWidth = 40;
  const int filled = static_cast<int>(fraction * kWidth);
  std::fprintf(stderr, "\r[%.*s%.*s] %5.1f%% %llu/%llu frames %s ", filled, "########################################",
               kWidth - filled, "                                        ", fraction * 100.0,
               static_cast<unsigned long long>(done), static_cast<unsigned long long>(total),
               exporter::export_stage_name(progress.stage.load()));
  std::fflush(stderr);
}

// Forwards Ctrl-C to the export and draws the bar until `finished`.
class ProgressWatcher {
 public:
  ProgressWatcher(exporter::ExportProgress& progress, bool draw) : progress_(progress), draw_(draw) {
    thread_ = std::thread([this] {
      while (!finished_) {
        if (interrupted) progress_.cancel_requested = true;
        if (draw_) draw_progress(progress_);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (draw_) {
        draw_progress(progress_);
        std::fputc('\n', stderr);
      }
    });
  }
  ~ProgressWatcher() {
    finished_ = true;
    thread_.join();
  }

 private:
  exporter::ExportProgress& progress_;
  bool draw_;
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

nlohmann::ordered_json report_document(const exporter::ExportReport& report, const std::string& backend_name) {
  return {{"master", report.master_path},
          {"folder", report.folder},
          {"name", report.name},
          {"backend", backend_name},
          {"encoder", report.encoder},
          {"shape", {report.scan_rows, report.scan_cols, report.detector_rows, report.detector_cols}},
          {"dtype", dtype_name(report.dtype)},
          {"frames", report.frames},
          {"data_files", report.data_files},
          {"stored_bytes", report.stored_bytes},
          {"output_bytes", report.output_bytes},
          {"source_bytes", report.source_bytes},
          {"dense_bytes", report.dense_bytes},
          {"seconds", exporter::stage_seconds_document<nlohmann::ordered_json>(report.seconds)}};
}

}  // namespace

CLI::App* add_export_command(CLI::App& app, ExportCommandOptions& options) {
  auto* command = app.add_subcommand("export", "Save a plan (scan crop, scan bin, detector bin) of an acquisition as an "
                                               "Arina-style acquisition in OUT_DIR/<name>/");
  command->add_option("master", options.master, "The source *_master.h5")->required();
  command->add_option("out_dir", options.output_folder, "Existing folder the export is written into")->required();
  command->add_option("--row-start", options.row_start, "Scan crop: first row (half-open, as the image routes)");
  command->add_option("--row-stop", options.row_stop, "Scan crop: row stop");
  command->add_option("--column-start", options.column_start, "Scan crop: first column");
  command->add_option("--column-stop", options.column_stop, "Scan crop: column stop");
  command->add_option("--scan-crop", options.scan_crop, "Scan crop as ROW_START:ROW_STOP,COLUMN_START:COLUMN_STOP");
  command->add_option("--scan-bin", options.scan_bin, "Scan bin (sums bin x bin positions; uint32 out)")
      ->capture_default_str();
  command->add_option("--det-bin", options.det_bin, "Detector bin (sums bin x bin pixels; uint32 out)")
      ->capture_default_str();
  command->add_option("--frames-per-file", options.frames_per_file, "Frames per data file (0: 100000)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--backend", options.backend, "cuda|cpu (cpu is explicit; never a fallback)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  command->add_option("--gpu", options.gpu, "CUDA device (cuda backend)")->capture_default_str()->check(CLI::NonNegativeNumber);
  command->add_option("--threads", options.threads, "Read and encode threads (0: all cores, at most 256)")
      ->check(CLI::Range(0, 256));
  command->add_flag("!--no-progress", options.progress, "No progress bar");
  return command;
}

int run_export_command(const ExportCommandOptions& given) {
  ExportCommandOptions options = given;
  if (!options.scan_crop.empty() && !parse_scan_crop(options.scan_crop, options)) {
    std::cerr << "--scan-crop must be ROW_START:ROW_STOP,COLUMN_START:COLUMN_STOP, got '" << options.scan_crop << "'\n";
    return 2;
  }
  exporter::ExportRequest request;
  request.plan = plan_of(options);
  request.output_folder = options.output_folder;
  request.frames_per_file = options.frames_per_file;
  request.threads = options.threads;
  request.implementation_revision = build_git_revision();

  const std::unique_ptr<backend::Backend> backend = make_backend(options);
  // Like the daemon: libhdf5 runs on the source's files in the inspector only.
  inspector::Inspector inspector;
  catalog::set_shard_storage_source(inspector.shard_storage_function());
  struct ResetStorageSource {
    ~ResetStorageSource() { catalog::set_shard_storage_source({}); }
  } reset_storage_source;
  const catalog::Acquisition source = inspector.inspect(options.master);
  if (!source.status.loadable) throw conflict(source.name + " is not loadable: " + source.status.reason);
  // A data file of an acquisition holds its frames inline and no detector
  // record (ntrigger): exporting it alone would invent a scan shape.
  const bool links_data = std::any_of(source.shards.begin(), source.shards.end(),
                                      [](const catalog::Shard& shard) { return shard.external; });
  if (!links_data && !source.ntrigger) {
    throw unprocessable(options.master + " is not the master of an acquisition (no linked data files, no "
                        "detectorSpecific/ntrigger; a data file cannot be exported alone): give its *_master.h5");
  }
  request.source_identity = protocol::signature_digest(source.signature);
  const exporter::ExportLayout layout = exporter::plan_export(source, request);

  exporter::ExportProgress progress;
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  exporter::ExportReport report;
  {
    ProgressWatcher watcher(progress, options.progress && ::isatty(STDERR_FILENO));
    // One export and the process ends: no tile sums built beside it (they
    // serve crops of later requests, and would take the device from the export).
    residency::ResidencyOptions residency_options;
    residency_options.tile_sums = false;
    residency::ResidencyManager residency(*backend, residency_options);
    const residency::ResidentLease lease = residency.acquire(source);
    residency::WorkingMemoryGrant working_memory;
    if (options.backend == "cpu") {  // the CPU backend's device is host memory
      working_memory = residency.admit_working_memory(lease->device_index(), layout.working_bytes,
                                                      "the export of " + layout.name);
    }
    report = exporter::export_plan(*lease, source, layout, request, progress,
                                   [&lease] { return lease.lock_compute(); });
  }
  std::cout << report_document(report, backend->name()).dump() << "\n";
  return 0;
}

}  // namespace quantem::cli
