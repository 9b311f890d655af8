// quantem-gpu: the executable is only CLI wiring; every behaviour lives in a
// component library. Each subcommand is one add_* function that declares its
// options and returns how to run it; main takes the same few steps for all.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "export_command.hpp"
#include "quantem/catalog/catalog.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/exit_codes.hpp"
#include "quantem/core/logging.hpp"
#include "quantem/core/version.hpp"
#include "quantem/inspector/inspector.hpp"
#include "quantem/inspector/worker.hpp"
#include "quantem/server/host_info.hpp"
#include "quantem/server/serve.hpp"
#include "quantem/server/serve_options.hpp"
#include "quantem/synth/synth.hpp"

namespace {

namespace exit_status = quantem::exit_status;

// A declared subcommand: its CLI11 node and what runs when it was given.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// A refused option value of a subcommand other than serve: the text on
// stderr, exit status 2 (a command-line error).
int usage_error(const std::string& message) {
  std::cerr << message << "\n";
  return exit_status::usage;
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

Command add_version(CLI::App& app) {
  return {app.add_subcommand("version", "Print the version and git revision"), [] {
            std::printf("quantem-gpu %s (%s)\n", quantem::version_string(), quantem::build_git_revision());
            return exit_status::ok;
          }};
}

Command add_info(CLI::App& app) {
  struct Options {
    bool json = false;
    std::string device_budget;
  };
  auto options = std::make_shared<Options>();
  auto* command = app.add_subcommand("info", "Check this host: version, CUDA driver/runtime, GPUs with memory and "
                                             "admission budget, running daemons of this user and where they listen");
  command->add_flag("--json", options->json, "Print the report as JSON");
  command->add_option("--device-budget", options->device_budget, "The budget serve would be given (default: 80% of each GPU)");
  return {command, [options] {
            quantem::server::HostInfoOptions info_options;
            if (!options->device_budget.empty()) {
              const auto bytes = quantem::server::parse_byte_size(options->device_budget);
              if (!bytes || *bytes == 0) {
                return usage_error("--device-budget must be a positive byte count such as 64MiB or 2GB, got '" +
                                   options->device_budget + "'");
              }
              info_options.device_budget_bytes = *bytes;
            }
            const auto document = quantem::server::host_info_document(info_options);
            std::cout << (options->json ? document.dump(2) + "\n" : quantem::server::host_info_text(document));
            return exit_status::ok;
          }};
}

Command add_serve(CLI::App& app) {
  auto options = std::make_shared<quantem::server::ServeOptions>();
  auto* command = app.add_subcommand("serve", "Serve the browse protocol (quantem-gpu-browse v1) on loopback HTTP");
  quantem::server::add_serve_options(*command, *options);
  return {command, [options] { return quantem::server::run_serve(*options); }};
}

Command add_catalog(CLI::App& app) {
  auto folder = std::make_shared<std::string>();
  auto* command = app.add_subcommand("catalog", "Print the catalog of a data folder as JSON (GET /api/browse/sessions)");
  command->add_option("data_folder", *folder, "Data folder")->required();
  return {command, [folder] {
            // Like the daemon: libhdf5 runs on the folder's masters in the inspector only.
            quantem::inspector::InspectorOptions inspector_options;
            inspector_options.workers = quantem::inspector::default_inspect_workers();
            quantem::inspector::Inspector inspector(inspector_options);
            quantem::catalog::BuildOptions build;
            build.threads = inspector.workers();
            const auto catalog = quantem::catalog::build_catalog(*folder, inspector.inspect_function(), build);
            std::cout << quantem::catalog::sessions_document(catalog).dump() << "\n";
            return exit_status::ok;
          }};
}

Command add_inspect_worker(CLI::App& app) {
  auto options = std::make_shared<quantem::inspector::WorkerOptions>();
  auto* command = app.add_subcommand("inspect-worker", "Internal: the master inspector that serve and catalog start "
                                                       "(JSON lines on stdin/stdout, decision 0012)");
  command->add_option("--address-space-limit", options->address_space_limit_bytes, "RLIMIT_AS in bytes (0: unchanged)");
  command->add_option("--parent-pid", options->parent_pid, "Exit with this process (0: not checked)");
  command->group("");  // not listed in --help
  return {command, [options] { return quantem::inspector::run_inspect_worker(*options); }};
}

Command add_synth(CLI::App& app) {
  struct Options {
    quantem::synth::SynthOptions synth;
    std::string scan = "16x16", detector = "64x64", dtype = "uint16", preset = "realistic";
  };
  auto options = std::make_shared<Options>();
  auto* command = app.add_subcommand("synth", "Write a synthetic Arina-style acquisition");
  command->add_option("out_dir", options->synth.output_dir, "Output folder")->required();
  command->add_option("--scan", options->scan, "Scan shape ROWSxCOLS")->capture_default_str();
  command->add_option("--detector", options->detector, "Detector shape ROWSxCOLS")->capture_default_str();
  command->add_option("--dtype", options->dtype, "uint8|uint16|uint32")->capture_default_str();
  command->add_option("--frames-per-shard", options->synth.frames_per_shard, "Frames per data file (0: one file)");
  command->add_option("--preset", options->preset, "sparse|realistic|dense")->capture_default_str();
  command->add_option("--seed", options->synth.seed, "Random seed")->capture_default_str();
  command->add_option("--threads", options->synth.threads, "Worker threads (0: all cores)");
  command->add_option("--prefix", options->synth.prefix, "File name prefix")->capture_default_str();
  command->add_option("--scan-sampling-A", options->synth.scan_sampling_A,
                      "Scan step in angstrom, written as entry/data's scan_sampling_A (default: none)");
  command->add_option("--k-pixel-size-mrad", options->synth.k_pixel_size_mrad,
                      "Detector pixel in mrad, written as entry/data's k_pixel_size_mrad (default: none)");
  command->add_option("--high-tension-V", options->synth.high_tension_V,
                      "High tension in volts, written as the sidecar's High Tension and the master's photon_energy "
                      "(default: 300000)");
  command->add_option("--camera-length-m", options->synth.camera_length_m,
                      "Camera length in metres, written as the sidecar's Camera Length (default: 0.115)");
  return {command, [options] {
            quantem::synth::SynthOptions& synth = options->synth;
            if (!parse_pair(options->scan, synth.scan_rows, synth.scan_cols)) {
              return usage_error("--scan must be ROWSxCOLS with positive integers, got '" + options->scan + "'");
            }
            if (!parse_pair(options->detector, synth.detector_rows, synth.detector_cols)) {
              return usage_error("--detector must be ROWSxCOLS with positive integers, got '" + options->detector + "'");
            }
            const auto dtype = quantem::dtype_from_name(options->dtype);
            if (!dtype) return usage_error("--dtype must be uint8, uint16 or uint32, got '" + options->dtype + "'");
            synth.dtype = *dtype;
            const auto preset = quantem::synth::preset_from_name(options->preset);
            if (!preset) return usage_error("--preset must be sparse, realistic or dense, got '" + options->preset + "'");
            synth.preset = *preset;
            const auto report = quantem::synth::write_acquisition(synth);
            nlohmann::json summary = {
                {"master", report.master_path},
                {"frames", report.frames},
                {"dense_bytes", report.dense_bytes},
                {"stored_bytes", report.stored_bytes},
                {"compression_ratio", report.stored_bytes ? double(report.dense_bytes) / double(report.stored_bytes) : 0.0},
                {"seconds", report.seconds}};
            std::cout << summary.dump() << "\n";
            return exit_status::ok;
          }};
}

Command add_export(CLI::App& app) {
  auto options = std::make_shared<quantem::cli::ExportCommandOptions>();
  auto* command = quantem::cli::add_export_command(app, *options);
  return {command, [options] { return quantem::cli::run_export_command(*options); }};
}

// Every subcommand, in the order --help lists them.
std::vector<Command> declare_commands(CLI::App& app) {
  return {add_version(app), add_info(app), add_serve(app), add_export(app),
          add_catalog(app), add_inspect_worker(app), add_synth(app)};
}

// serve's flag spellings are part of the compatibility surface, including
// argparse's unique-prefix abbreviations (docs/protocol.md, '1. Starting it'). Rewrites them in
// `arguments`; returns an error text for an ambiguous prefix.
std::string expand_serve_prefixes(const CLI::App& app, std::vector<std::string>& arguments) {
  if (arguments.size() < 2 || arguments[1] != "serve") return {};
  const std::vector<std::string> serve_arguments(arguments.begin() + 2, arguments.end());
  const auto expanded = quantem::server::expand_option_prefixes(*app.get_subcommand("serve"), serve_arguments);
  if (!expanded.error.empty()) return expanded.error;
  std::copy(expanded.arguments.begin(), expanded.arguments.end(), arguments.begin() + 2);
  return {};
}

// Usage errors exit with status 2, like the argparse CLI of the service we
// replace; --help exits 0. Returns nullopt when parsing succeeded.
std::optional<int> parse_command_line(CLI::App& app, std::vector<std::string> arguments) {
  if (const std::string error = expand_serve_prefixes(app, arguments); !error.empty()) {
    std::cerr << "usage: quantem-gpu serve [OPTIONS] data_folder\n"
              << "quantem-gpu serve: error: " << error << "\n";
    return exit_status::usage;
  }
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? exit_status::ok : exit_status::usage;
  }
  return std::nullopt;
}

// Runs the subcommand that was given. An error that escapes it is a runtime
// failure, logged at error priority.
int run_parsed_command(const std::vector<Command>& commands) {
  try {
    for (const Command& command : commands) {
      if (command.app->parsed()) return command.run();
    }
  } catch (const quantem::Error& e) {
    spdlog::error("{} error: {}", quantem::error_kind_name(e.kind()), e.what());
    return exit_status::failure;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return exit_status::failure;
  }
  return exit_status::ok;
}

}  // namespace

int main(int argc, char** argv) {
  quantem::logging::ignore_broken_pipes();
  // A file size limit (ulimit -f) makes a write fail with EFBIG, reported by
  // the command that wrote, instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  quantem::logging::configure();
  CLI::App app{"quantem-gpu: exact 4D-STEM virtual detectors from GPU-resident acquisitions"};
  app.require_subcommand(1);
  const std::vector<Command> commands = declare_commands(app);
  if (const auto status = parse_command_line(app, std::vector<std::string>(argv, argv + argc))) return *status;
  return run_parsed_command(commands);
}
