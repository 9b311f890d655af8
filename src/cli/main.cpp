// quantem-gpu: the executable is only CLI wiring; every behaviour lives in a
// component library.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "quantem/catalog/catalog.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/version.hpp"
#include "quantem/inspector/inspector.hpp"
#include "quantem/inspector/worker.hpp"
#include "quantem/server/host_info.hpp"
#include "quantem/server/serve.hpp"
#include "quantem/server/serve_options.hpp"
#include "quantem/synth/synth.hpp"

namespace {

// "<N>": the syslog priority prefix journald reads from a service's stderr
// (sd-daemon(3): <3> error ... <7> debug).
class JournalPriorityFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& message, const std::tm&, spdlog::memory_buf_t& destination) override {
    static const char* const prefixes[] = {"<7>", "<7>", "<6>", "<4>", "<3>", "<2>", "<6>"};
    const auto level = static_cast<std::size_t>(message.level);
    const char* prefix = prefixes[level < 7 ? level : 6];
    destination.append(prefix, prefix + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JournalPriorityFlag>(); }
};

void configure_logging() {
  // stdout stays quiet: logs go to stderr. On a terminal with colours; under
  // systemd (stderr connected to the journal: $JOURNAL_STREAM) each line
  // starts with its priority and carries no time (the journal adds it);
  // otherwise plain lines without colour codes.
  const bool journal = std::getenv("JOURNAL_STREAM") != nullptr;
  if (journal) {
    auto logger = spdlog::stderr_logger_mt("quantem");
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JournalPriorityFlag>('*').set_pattern("%*%v");
    logger->set_formatter(std::move(formatter));
    spdlog::set_default_logger(logger);
  } else if (::isatty(STDERR_FILENO)) {
    spdlog::set_default_logger(spdlog::stderr_color_mt("quantem"));
  } else {
    auto logger = spdlog::stderr_logger_mt("quantem");
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    spdlog::set_default_logger(logger);
  }
  spdlog::set_level(spdlog::level::info);
}

bool parse_pair(const std::string& text, std::uint64_t& first, std::uint64_t& second) {
  const auto x = text.find_first_of("xX");
  if (x == std::string::npos) return false;
  try {
    std::size_t used = 0;
    const auto a = std::stoull(text.substr(0, x), &used);
    if (used != x) return false;
    const auto b_text = text.substr(x + 1);
    const auto b = std::stoull(b_text, &used);
    if (used != b_text.size() || a == 0 || b == 0) return false;
    first = a;
    second = b;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  configure_logging();
  CLI::App app{"quantem-gpu: exact 4D-STEM virtual detectors from GPU-resident acquisitions"};
  app.require_subcommand(1);

  auto* version_cmd = app.add_subcommand("version", "Print the version and git revision");

  bool info_json = false;
  std::string info_device_budget;
  auto* info_cmd = app.add_subcommand("info", "Check this host: version, CUDA driver/runtime, GPUs with memory and "
                                              "admission budget, running daemons of this user and where they listen");
  info_cmd->add_flag("--json", info_json, "Print the report as JSON");
  info_cmd->add_option("--device-budget", info_device_budget, "The budget serve would be given (default: 80% of each GPU)");

  quantem::server::ServeOptions serve_options;
  auto* serve_cmd = app.add_subcommand("serve", "Serve the browse protocol (quantem-gpu-browse v1) on loopback HTTP");
  quantem::server::add_serve_options(*serve_cmd, serve_options);

  std::string catalog_folder;
  auto* catalog_cmd = app.add_subcommand("catalog", "Print the catalog of a data folder as JSON (GET /api/browse/sessions)");
  catalog_cmd->add_option("data_folder", catalog_folder, "Data folder")->required();

  quantem::inspector::WorkerOptions worker_options;
  auto* worker_cmd = app.add_subcommand("inspect-worker", "Internal: the master inspector that serve and catalog start "
                                                          "(JSON lines on stdin/stdout, decision 0012)");
  worker_cmd->add_option("--address-space-limit", worker_options.address_space_limit_bytes,
                         "RLIMIT_AS in bytes (0: unchanged)");
  worker_cmd->add_option("--parent-pid", worker_options.parent_pid, "Exit with this process (0: not checked)");
  worker_cmd->group("");  // not listed in --help

  quantem::synth::SynthOptions synth_options;
  std::string scan_text = "16x16", detector_text = "64x64", dtype_text = "uint16", preset_text = "realistic";
  auto* synth_cmd = app.add_subcommand("synth", "Write a synthetic Arina-style acquisition");
  synth_cmd->add_option("out_dir", synth_options.output_dir, "Output folder")->required();
  synth_cmd->add_option("--scan", scan_text, "Scan shape ROWSxCOLS")->capture_default_str();
  synth_cmd->add_option("--detector", detector_text, "Detector shape ROWSxCOLS")->capture_default_str();
  synth_cmd->add_option("--dtype", dtype_text, "uint8|uint16|uint32")->capture_default_str();
  synth_cmd->add_option("--frames-per-shard", synth_options.frames_per_shard, "Frames per data file (0: one file)");
  synth_cmd->add_option("--preset", preset_text, "sparse|realistic|dense")->capture_default_str();
  synth_cmd->add_option("--seed", synth_options.seed, "Random seed")->capture_default_str();
  synth_cmd->add_option("--threads", synth_options.threads, "Worker threads (0: all cores)");
  synth_cmd->add_option("--prefix", synth_options.prefix, "File name prefix")->capture_default_str();

  // serve's flag spellings are part of the compatibility surface, including
  // argparse's unique-prefix abbreviations (reference §1).
  std::vector<std::string> arguments(argv, argv + argc);
  if (arguments.size() > 1 && arguments[1] == "serve") {
    const std::vector<std::string> serve_arguments(arguments.begin() + 2, arguments.end());
    const quantem::server::ExpandedArguments expanded =
        quantem::server::expand_option_prefixes(*serve_cmd, serve_arguments);
    if (!expanded.error.empty()) {
      std::cerr << "usage: quantem-gpu serve [OPTIONS] data_folder\n"
                << "quantem-gpu serve: error: " << expanded.error << "\n";
      return 2;
    }
    std::copy(expanded.arguments.begin(), expanded.arguments.end(), arguments.begin() + 2);
  }
  std::vector<char*> expanded_argv;
  for (std::string& argument : arguments) expanded_argv.push_back(argument.data());

  try {
    app.parse(static_cast<int>(expanded_argv.size()), expanded_argv.data());
  } catch (const CLI::ParseError& e) {
    // Usage errors exit with status 2, like the argparse CLI of the service we
    // replace (reference §1); --help still exits 0.
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }

  try {
    if (serve_cmd->parsed()) return quantem::server::run_serve(serve_options);
    if (worker_cmd->parsed()) return quantem::inspector::run_inspect_worker(worker_options);
    if (version_cmd->parsed()) {
      std::printf("quantem-gpu %s (%s)\n", quantem::version_string(), quantem::build_git_revision());
      return 0;
    }
    if (info_cmd->parsed()) {
      quantem::server::HostInfoOptions info_options;
      if (!info_device_budget.empty()) {
        const auto bytes = quantem::server::parse_byte_size(info_device_budget);
        if (!bytes || *bytes == 0) {
          std::cerr << "--device-budget must be a positive byte count such as 64MiB or 2GB, got '" << info_device_budget << "'\n";
          return 2;
        }
        info_options.device_budget_bytes = *bytes;
      }
      const auto document = quantem::server::host_info_document(info_options);
      std::cout << (info_json ? document.dump(2) + "\n" : quantem::server::host_info_text(document));
      return 0;
    }
    if (catalog_cmd->parsed()) {
      // Like the daemon: libhdf5 runs on the folder's masters in the inspector only.
      quantem::inspector::InspectorOptions inspector_options;
      inspector_options.workers = quantem::inspector::default_inspect_workers();
      quantem::inspector::Inspector inspector(inspector_options);
      quantem::catalog::BuildOptions build;
      build.threads = inspector.workers();
      const auto catalog = quantem::catalog::build_catalog(catalog_folder, inspector.inspect_function(), build);
      std::cout << quantem::catalog::sessions_document(catalog).dump() << "\n";
      return 0;
    }
    if (synth_cmd->parsed()) {
      if (!parse_pair(scan_text, synth_options.scan_rows, synth_options.scan_cols)) {
        std::cerr << "--scan must be ROWSxCOLS with positive integers, got '" << scan_text << "'\n";
        return 2;
      }
      if (!parse_pair(detector_text, synth_options.detector_rows, synth_options.detector_cols)) {
        std::cerr << "--detector must be ROWSxCOLS with positive integers, got '" << detector_text << "'\n";
        return 2;
      }
      const auto dtype = quantem::dtype_from_name(dtype_text);
      if (!dtype) {
        std::cerr << "--dtype must be uint8, uint16 or uint32, got '" << dtype_text << "'\n";
        return 2;
      }
      synth_options.dtype = *dtype;
      const auto preset = quantem::synth::preset_from_name(preset_text);
      if (!preset) {
        std::cerr << "--preset must be sparse, realistic or dense, got '" << preset_text << "'\n";
        return 2;
      }
      synth_options.preset = *preset;
      const auto report = quantem::synth::write_acquisition(synth_options);
      nlohmann::json summary = {{"master", report.master_path},
                                {"frames", report.frames},
                                {"dense_bytes", report.dense_bytes},
                                {"stored_bytes", report.stored_bytes},
                                {"compression_ratio", report.stored_bytes ? double(report.dense_bytes) / double(report.stored_bytes) : 0.0},
                                {"seconds", report.seconds}};
      std::cout << summary.dump() << "\n";
      return 0;
    }
  } catch (const quantem::Error& e) {
    spdlog::error("{} error: {}", quantem::error_kind_name(e.kind()), e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
