#pragma once
// `quantem-gpu export MASTER OUT_DIR [plan options] [--gpu N | --backend cpu]`:
// saves one plan of an acquisition as an Arina-style acquisition
// (quantem/export/export.hpp), loading it first through the same admission as
// the daemon's loads. Prints the report as JSON on stdout; a progress bar on
// stderr when stderr is a terminal. Ctrl-C cancels (nothing is left).
#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace quantem::cli {

struct ExportCommandOptions {
  std::string master;
  std::string output_folder;
  std::optional<std::int64_t> row_start, row_stop, column_start, column_stop;
  std::string scan_crop;  // "R0:R1,C0:C1", the same four values at once
  std::int64_t scan_bin = 1;
  std::int64_t det_bin = 1;
  std::uint64_t frames_per_file = 0;
  std::string backend = "cuda";
  int gpu = 0;
  unsigned threads = 0;
  bool progress = true;
};

CLI::App* add_export_command(CLI::App& app, ExportCommandOptions& options);
int run_export_command(const ExportCommandOptions& options);

}  // namespace quantem::cli
