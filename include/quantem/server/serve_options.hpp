#pragma once
// Options of `quantem-gpu serve` and their validation (docs/protocol.md,
// '1. Starting it' and '6. Security'). CLI11 only fills the struct (serve_cli.hpp); every rule
// lives here so it is testable without a command line.
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "quantem/core/logging.hpp"

namespace quantem::server {

struct ServeOptions {
  std::string data_folder;
  std::string backend = "cuda";                 // --backend cuda|cpu
  std::string gpus = "auto";                    // --gpus auto|0,1
  std::optional<long long> gpu;                 // --gpu N
  long long port = 8780;                        // --port (0 only with --port-file)
  std::string port_file;                        // --port-file: write the bound port here
  std::string implementation_revision;          // --implementation-revision
  long long cpu_devices = 1;                    // --cpu-devices
  std::string device_budget;                    // --device-budget BYTES (suffixes allowed) or FRACTION (0.8, 80%)
  std::string idle_release;                     // --idle-release DURATION (90s, 30m, 2h); empty: off
  long long cpu_threads = 0;                    // --cpu-threads (0: all cores)
  long long cache_entries = 8;                  // --cache-entries (per device)
  bool no_tile_sums = false;                    // --no-tile-sums: crops decode every frame (A/B, memory)
  long long http_threads = 16;                  // --http-threads
  long long http_spin_us = 1000;                // --http-spin-us: busy-wait window for responses and requests
  std::string host = "127.0.0.1";               // --host
  bool allow_non_loopback = false;              // --allow-non-loopback
  std::string auth = "none";                    // --auth none|token
  std::string unix_socket;                      // --unix-socket PATH: listen there instead of TCP
  double shutdown_grace_seconds = 2.0;          // --shutdown-grace
  double header_timeout_seconds = 5.0;          // --header-timeout
  double inspect_timeout_seconds = 10.0;        // --inspect-timeout: the inspector's deadline per master
  std::string log_level;                        // --log-level (empty: $QUANTEM_GPU_LOG_LEVEL, else info)
  bool exit_on_stdin_close = false;             // --exit-on-stdin-close: stop cleanly when stdin reaches its end
  std::string export_dir;                       // --export-dir: exports are written only below it; empty: off
  long long inspect_workers = 0;                // --inspect-workers (0: one per core, at most 8)
  std::string catalog_cache;                    // --catalog-cache PATH|off (empty: the default path)
};

// A start-up refusal caused by the configuration (an option or environment
// value, the host having no usable GPU, the token, the runtime folder): the
// message goes to stderr at error priority and the process exits 78
// (exit_status::configuration; the replaced service exited 1 with the same
// texts), so that systemd does not restart it (RestartPreventExitStatus=).
class ServeUsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The validated form.
struct ServeSettings {
  std::string data_folder;  // absolute, not symlink-resolved
  bool cpu_backend = false;
  std::optional<std::vector<int>> gpu_indices;  // nullopt: "auto"
  int port = 8780;
  std::string port_file;
  std::string implementation_revision;  // never empty
  int cpu_devices = 1;
  std::uint64_t device_budget_bytes = 0;  // 0: backend default (or the fraction below)
  double device_budget_fraction = 0.0;    // of each device's memory (CPU: of RAM, shared); 0: default 0.8
  std::chrono::milliseconds idle_release{0};  // 0: off
  unsigned cpu_threads = 0;
  std::size_t cache_entries = 8;
  bool tile_sums = true;  // build residents' tile sums (off with --no-tile-sums)
  int http_threads = 16;
  std::chrono::microseconds http_spin{1000};
  std::string host;
  bool non_loopback = false;  // host is not loopback (allowed with the flag; warn)
  bool token_auth = false;
  std::string unix_socket;  // empty: TCP on host:port
  std::chrono::milliseconds shutdown_grace{2000};
  std::chrono::milliseconds header_timeout{5000};
  std::chrono::milliseconds inspect_timeout{10000};
  std::optional<logging::Level> log_level;  // nullopt: as configured at start (environment, else info)
  bool exit_on_stdin_close = false;
  std::string export_dir;  // absolute; empty: the export route answers how to enable it
  std::size_t inspect_workers = 1;
  std::string catalog_cache;  // the cache file; empty: no cache
};

// Checks every option; throws ServeUsageError with the reference's texts:
//   "--gpu must be zero or greater"
//   "--gpus must be 'auto' or comma-separated CUDA indices"
//   "--gpus must contain CUDA indices zero or greater"
//   "--port must be between 1 and 65535"
// and clear messages for the additions (backend, sizes, host, auth).
ServeSettings validate_serve_options(const ServeOptions& options);

// "--gpus" without "auto": pieces parsed like Python int() (spaces, '+', '_'),
// duplicates dropped (first kept).
std::vector<int> parse_gpu_list(const std::string& spec);

// Byte sizes: plain bytes ("1048576"), SI (kB, MB, GB, TB: powers of 1000),
// binary (KiB, MiB, GiB, TiB: powers of 1024), "K/M/G/T" as binary, "B";
// case-insensitive, fractions allowed ("1.5GiB"); nullopt when malformed.
std::optional<std::uint64_t> parse_byte_size(const std::string& text);

// --device-budget: a byte size as above, or a fraction of device memory
// written as a unitless decimal in (0, 1] ("0.8", "1.0") or a percentage
// ("80%"). Exactly one of the fields is non-zero; nullopt when malformed or zero.
struct DeviceBudget {
  std::uint64_t bytes = 0;
  double fraction = 0.0;
};
std::optional<DeviceBudget> parse_device_budget(const std::string& text);

// Durations: a non-negative number with a unit ms, s, m (minutes) or h
// ("90s", "30m", "1.5h"); a plain number is seconds. nullopt when malformed.
std::optional<std::chrono::milliseconds> parse_duration(const std::string& text);

// The revision reported to clients: the option, else
// $QUANTEM_GPU_IMPLEMENTATION_REVISION, else the build's git revision.
std::string resolve_implementation_revision(const std::string& option_value);

}  // namespace quantem::server
