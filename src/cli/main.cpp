// quantem-gpu: the executable is only CLI wiring; every behaviour lives in a
// component library.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "quantem/catalog/catalog.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/version.hpp"
#include "quantem/server/serve.hpp"
#include "quantem/synth/synth.hpp"

namespace {

void configure_logging() {
  // stdout stays quiet: logs go to stderr.
  auto logger = spdlog::stderr_color_mt("quantem");
  spdlog::set_default_logger(logger);
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

  quantem::server::ServeOptions serve_options;
  auto* serve_cmd = app.add_subcommand("serve", "Serve the browse protocol (quantem-gpu-browse v1) on loopback HTTP");
  quantem::server::add_serve_options(*serve_cmd, serve_options);

  std::string catalog_folder;
  auto* catalog_cmd = app.add_subcommand("catalog", "Print the catalog of a data folder as JSON (GET /api/browse/sessions)");
  catalog_cmd->add_option("data_folder", catalog_folder, "Data folder")->required();

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
    if (version_cmd->parsed()) {
      std::printf("quantem-gpu %s (%s)\n", quantem::version_string(), quantem::build_git_revision());
      return 0;
    }
    if (catalog_cmd->parsed()) {
      const auto catalog = quantem::catalog::build_catalog(catalog_folder);
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
