#include "quantem/server/serve.hpp"

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "quantem/core/clock.hpp"
#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/backend/cuda_backend.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/io.hpp"
#include "quantem/core/exit_codes.hpp"
#include "quantem/core/logging.hpp"
#include "quantem/catalog/catalog.hpp"
#include "quantem/catalog/shard_storage.hpp"
#include "quantem/core/text.hpp"
#include "quantem/core/version.hpp"
#include "quantem/inspector/inspector.hpp"
#include "quantem/residency/residency_manager.hpp"
#include "quantem/server/browse_service.hpp"
#include "quantem/server/catalog_service.hpp"
#include "quantem/server/export_routes.hpp"
#include "quantem/server/metadata_route.hpp"
#include "quantem/server/http_server.hpp"
#include "quantem/server/metrics.hpp"
#include "quantem/server/runtime_files.hpp"
#include "quantem/server/security.hpp"
#include "quantem/server/service_manager.hpp"

namespace quantem::server {

void add_serve_options(CLI::App& serve, ServeOptions& options) {
  serve.add_option("data_folder", options.data_folder, "Folder searched recursively for *_master.h5 acquisitions")
      ->required();
  serve.add_option("--backend", options.backend, "cuda (default) or cpu; the CPU backend is used only when named");
  auto* gpus = serve.add_option("--gpus", options.gpus, "'auto' (every visible CUDA device) or comma-separated indices");
  auto* gpu = serve.add_option_function<long long>(
      "--gpu", [&options](const long long& value) { options.gpu = value; }, "One CUDA device index");
  gpu->excludes(gpus);
  gpus->excludes(gpu);
  serve.add_option("--port", options.port, "Loopback TCP port (default 8780)");
  serve.add_option("--port-file", options.port_file,
                   "Write the bound port to this file once listening (with --port 0: an ephemeral port)");
  serve.add_option("--implementation-revision", options.implementation_revision,
                   "Revision reported to clients (default: $QUANTEM_GPU_IMPLEMENTATION_REVISION, else the build's git revision)");
  serve.add_option("--cpu-devices", options.cpu_devices, "CPU backend: number of virtual devices (default 1)");
  serve.add_option("--device-budget", options.device_budget,
                   "Data-cache budget per device (GPU or CPU virtual device): bytes such as 64MiB, 2GB, 1.5GiB, or a "
                   "fraction of device memory such as 0.8 or 80% (default: 0.8 of device memory; CPU: of RAM, shared)");
  serve.add_option("--idle-release", options.idle_release,
                   "Release residents unused for this long and return their device memory, e.g. 90s, 30m, 2h "
                   "(default: off)");
  serve.add_option("--cpu-threads", options.cpu_threads, "CPU backend: worker threads (default: every core)");
  serve.add_option("--cache-entries", options.cache_entries, "Resident acquisitions per device, least recently used evicted (default 8)");
  serve.add_flag("--no-tile-sums", options.no_tile_sums,
                 "Keep no per-tile summed patterns beside residents: a crop's summed pattern decodes every frame "
                 "of the crop (same values, less memory)");
  serve.add_option("--http-threads", options.http_threads, "HTTP worker threads (default 16)");
  serve.add_option("--http-spin-us", options.http_spin_us,
                   "Microseconds an HTTP thread busy-waits for the next response or request before it sleeps "
                   "(default 1000; 0: always sleep). Trades a little CPU for the wake-up latency of an idle core");
  serve.add_option("--host", options.host, "Bind address (default 127.0.0.1; loopback only unless --allow-non-loopback)");
  serve.add_flag("--allow-non-loopback", options.allow_non_loopback, "Allow a --host that is not a loopback address");
  serve.add_option("--unix-socket", options.unix_socket,
                   "Listen on this Unix socket (mode 0600, directory created 0700) instead of TCP")
      ->excludes("--port")->excludes("--port-file")->excludes("--host");
  serve.add_option("--shutdown-grace", options.shutdown_grace_seconds,
                   "Seconds requests in flight may finish after SIGTERM/SIGINT (default 2)");
  serve.add_option("--header-timeout", options.header_timeout_seconds,
                   "Seconds a client has to send a whole request line and headers; also the keep-alive idle timeout (default 5)");
  serve.add_option("--export-dir", options.export_dir,
                   "Folder the export route writes into (exports of plans as Arina-style acquisitions); off without it")
      ->check(CLI::Validator(
          [](std::string& value) {
            return value.empty() ? std::string("an empty --export-dir names no folder (leave the option out to turn "
                                               "exports off)")
                                 : std::string();
          },
          "FOLDER"));
  serve.add_option("--inspect-timeout", options.inspect_timeout_seconds,
                   "Seconds the master inspector may take for one master before it is stopped and the master "
                   "reported not loadable (default 10)");
  serve.add_option("--inspect-workers", options.inspect_workers,
                   "Inspector worker processes: masters inspected at once (default 0: one per core, at most 8)");
  serve.add_option("--catalog-cache", options.catalog_cache,
                   "The catalog cache file, or 'off' (default: $XDG_CACHE_HOME or ~/.cache, "
                   "quantem-gpu/catalog-<hash of the data folder>.bin)");
  serve.add_option("--auth", options.auth,
                   "none (default) or token (from $QUANTEM_GPU_TOKEN, $QUANTEM_GPU_TOKEN_FILE, else generated; "
                   "written to the 0600 runtime file)");
  serve.add_option("--log-level", options.log_level,
                   std::string("Least severe log lines written: ") + logging::level_names() +
                       " (default: $QUANTEM_GPU_LOG_LEVEL, else info; debug adds one line per request)");
  serve.add_flag("--exit-on-stdin-close", options.exit_on_stdin_close,
                 "Stop cleanly when standard input reaches its end (a launcher such as `ssh host 'quantem-gpu "
                 "serve ...'` without a terminal closed its session)");
}

ExpandedArguments expand_option_prefixes(const CLI::App& command, const std::vector<std::string>& arguments) {
  std::vector<std::string> names;  // every long option name, without the dashes
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back(name);
  }
  ExpandedArguments result{arguments, {}};
  for (std::string& argument : result.arguments) {
    if (argument == "--") break;
    if (argument.size() <= 2 || argument.compare(0, 2, "--") != 0) continue;
    const std::size_t equals = argument.find('=');
    const std::string given = argument.substr(2, equals == std::string::npos ? std::string::npos : equals - 2);
    if (std::find(names.begin(), names.end(), given) != names.end()) continue;
    std::vector<std::string> matches;
    for (const std::string& name : names)
      if (name.compare(0, given.size(), given) == 0) matches.push_back(name);
    if (matches.size() == 1) {
      argument = "--" + matches.front() + (equals == std::string::npos ? "" : argument.substr(equals));
    } else if (matches.size() > 1) {
      std::sort(matches.begin(), matches.end());
      std::string message = "ambiguous option: --" + given + " could match";
      for (std::size_t i = 0; i < matches.size(); ++i) message += (i == 0 ? " --" : ", --") + matches[i];
      return {arguments, message};
    }
  }
  return result;
}

namespace {

std::string hex_random_token() {
  unsigned char bytes[32];
  std::size_t filled = 0;
  while (filled < sizeof bytes) {
    const ssize_t n = getrandom(bytes + filled, sizeof bytes - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::internal, std::string("getrandom failed: ") + std::strerror(errno));
    }
    filled += static_cast<std::size_t>(n);
  }
  static const char* const hex = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(hex[b >> 4]);
    token.push_back(hex[b & 15]);
  }
  return token;
}

struct TokenSource {
  std::string token;
  std::string origin;  // "environment", "file <path>", "generated"
};

// What a token file that is not a regular file is, for the refusal.
const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Reads the token file like ssh reads a private key: refused when another user
// owns it or when group or others may access it. Opened without blocking
// (a FIFO with no writer would otherwise hold start-up forever) and refused
// unless it is a regular file.
std::string read_token_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    throw ServeUsageError("cannot read a token from $QUANTEM_GPU_TOKEN_FILE (" + path + "): " + std::strerror(errno));
  }
  struct stat status {};
  if (::fstat(fd, &status) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    throw ServeUsageError("cannot read a token from $QUANTEM_GPU_TOKEN_FILE (" + path + "): " + error);
  }
  if (!S_ISREG(status.st_mode)) {
    ::close(fd);
    throw ServeUsageError("cannot read a token from $QUANTEM_GPU_TOKEN_FILE (" + path + "): it is " +
                          file_type_name(status.st_mode) + ", not a regular file");
  }
  if (const std::string refusal = token_file_refusal(path, status.st_uid, status.st_mode, ::getuid()); !refusal.empty()) {
    ::close(fd);
    throw ServeUsageError(refusal);
  }
  std::string content;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string error = std::strerror(errno);
      ::close(fd);
      throw ServeUsageError("cannot read a token from $QUANTEM_GPU_TOKEN_FILE (" + path + "): " + error);
    }
    if (n == 0) break;
    content.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  const std::string token(trim(content));
  if (token.empty()) throw ServeUsageError("cannot read a token from $QUANTEM_GPU_TOKEN_FILE (" + path + "): it is empty");
  return token;
}

TokenSource obtain_token() {
  TokenSource source;
  if (const char* env = std::getenv("QUANTEM_GPU_TOKEN"); env && *env) {
    source = {env, "$QUANTEM_GPU_TOKEN"};
  } else if (const char* path = std::getenv("QUANTEM_GPU_TOKEN_FILE"); path && *path) {
    source = {read_token_file(path), std::string("file ") + path};
  } else {
    return {hex_random_token(), "generated"};
  }
  if (const std::string refusal = token_refusal(source.token); !refusal.empty()) {
    throw ServeUsageError("--auth token: " + refusal + " (token from " + source.origin + ")");
  }
  return source;
}

// Writes `content` to `path` with mode 0600 (replacing an older file), in a
// folder that prepare_runtime_directory accepted. Returns an error text,
// empty on success.
std::string write_private_file(const std::string& path, const std::string& content) {
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot create " + path + ": " + std::strerror(errno);
  if (!write_all(fd, content)) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return "cannot write " + path + ": " + error;
  }
  ::close(fd);
  return {};
}

bool write_port_file(const std::string& path, int port) {
  const std::string temporary = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << port << "\n";
    if (!out) return false;
  }
  return std::rename(temporary.c_str(), path.c_str()) == 0;
}

const char* sigabbrev(int signal_number) {
  switch (signal_number) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    default: return "signal";
  }
}

std::unique_ptr<backend::Backend> make_backend(const ServeSettings& settings, const ServeOptions& options) {
  if (!settings.cpu_backend) {
    // Never a silent CPU fallback: without CUDA (build or device) this throws "CUDA unavailable: ...".
    backend::CudaBackendOptions cuda;
    if (settings.gpu_indices) cuda.device_indices = *settings.gpu_indices;
    cuda.budget_bytes = settings.device_budget_bytes;
    if (settings.device_budget_fraction > 0) cuda.budget_fraction = settings.device_budget_fraction;
    try {
      return backend::make_cuda_backend(cuda);
    } catch (const Error& error) {
      // No usable GPU for the devices asked for: a restart finds the same host.
      if (error.kind() == ErrorKind::unavailable) throw ServeUsageError(error.what());
      throw;
    }
  }
  if (options.gpu || options.gpus != "auto") {
    spdlog::warn("--gpu/--gpus select CUDA devices and are ignored by --backend cpu (use --cpu-devices)");
  }
  backend::CpuBackendOptions cpu;
  cpu.virtual_devices = settings.cpu_devices;
  cpu.budget_bytes_per_device = settings.device_budget_bytes;
  if (settings.device_budget_fraction > 0) cpu.budget_fraction = settings.device_budget_fraction;
  cpu.threads = settings.cpu_threads;
  return backend::make_cpu_backend(cpu);
}

// ---- The steps of run_serve, in the order it takes them ----------------------

// Step 1. The signals the daemon handles are blocked before any thread exists
// (threads inherit the mask); the signal loop takes them with sigtimedwait.
// SIGTERM and SIGINT stop it cleanly; SIGHUP re-reads the catalog, unless it
// is a hang-up of the terminal the daemon runs on (then it stops cleanly);
// SIGUSR1 logs the status line. A SIGHUP ignored at start (nohup) stays
// ignored: blocked signals whose action is SIG_IGN are discarded.
sigset_t block_handled_signals() {
  sigset_t handled;
  sigemptyset(&handled);
  sigaddset(&handled, SIGINT);
  sigaddset(&handled, SIGTERM);
  sigaddset(&handled, SIGHUP);
  sigaddset(&handled, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &handled, nullptr);
  return handled;
}

// The devices' one-time start-up work (Backend::prepare_devices: CUDA's
// contexts, pinned staging slots, the kernels' modules), started on its own
// thread as soon as the backend exists, so that it runs beside everything
// else start-up does (the inspector, binding, the first catalog build).
// wait() joins it; so does the destructor, before the backend goes away.
class DevicePreparation {
 public:
  explicit DevicePreparation(backend::Backend& backend)
      : thread_([&backend] {
          try {
            const auto start = std::chrono::steady_clock::now();
            backend.prepare_devices();
            spdlog::info("devices prepared in {:.3f} s",
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
          } catch (const std::exception& error) {
            spdlog::warn("preparing the devices failed (the first load pays for it): {}", error.what());
          }
        }) {}
  ~DevicePreparation() { wait(); }
  DevicePreparation(const DevicePreparation&) = delete;
  DevicePreparation& operator=(const DevicePreparation&) = delete;
  void wait() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mutex_;
  std::thread thread_;
};

// Step 2. What must exist before anything listens: in token mode the token,
// and the backend (devices initialised; their preparation started). Throws on
// refusal.
struct StartupResources {
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<DevicePreparation> device_preparation;
  std::optional<TokenSource> token;
};

StartupResources acquire_startup_resources(const ServeSettings& settings, const ServeOptions& options) {
  if (settings.non_loopback) {
    spdlog::warn("binding the non-loopback address {}: every host that can reach it can read your data{}", settings.host,
                 settings.token_auth ? " with the token" : " (no token: consider --auth token)");
  }
  StartupResources resources;
  if (settings.token_auth) resources.token = obtain_token();  // first: a refused token costs no device start-up
  const auto start = std::chrono::steady_clock::now();
  resources.backend = make_backend(settings, options);
  const double backend_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  resources.device_preparation = std::make_unique<DevicePreparation>(*resources.backend);
  for (const auto& device : resources.backend->devices()) {
    spdlog::info("{} device {}: {} (budget {} B; backend opened in {:.3f} s)", resources.backend->name(),
                 device.index, device.name, device.budget_bytes, backend_seconds);
  }
  return resources;
}

// build_frame_index gets libhdf5's facts about the shards from the inspector
// worker while this lives (decision 0012): no libhdf5 call on a data-folder
// file in the daemon's process.
struct ShardStorageThroughInspector {
  explicit ShardStorageThroughInspector(inspector::Inspector& inspector) {
    catalog::set_shard_storage_source(inspector.shard_storage_function());
  }
  ~ShardStorageThroughInspector() { catalog::set_shard_storage_source({}); }
  ShardStorageThroughInspector(const ShardStorageThroughInspector&) = delete;
  ShardStorageThroughInspector& operator=(const ShardStorageThroughInspector&) = delete;
};

// Step 3. The daemon's long-lived objects, wired in dependency order (and so
// destroyed in reverse): backend -> inspector -> residency -> catalog -> service
// -> HTTP.
struct DaemonWiring {
  DaemonWiring(const ServeSettings& settings, StartupResources resources)
      : notifier(),
        backend(std::move(resources.backend)),
        device_preparation(std::move(resources.device_preparation)),
        token(std::move(resources.token)),
        inspector(inspector_options(settings)),
        shard_storage(inspector),
        residency(*backend, residency_options(settings)),
        catalog(settings.data_folder, catalog_options(settings, inspector)),
        exports(export_config(settings), residency, catalog),
        service(browse_config(settings, token), *backend, residency, catalog, metrics),
        metadata(catalog, inspector.master_metadata_function()),
        http(service.http_service(), http_options(settings)) {
    // Changed files invalidate the residents and cached images built from them
    // (stop_watching() in the shutdown ends the calls before `service` goes away).
    catalog.on_sources_changed([this](const SourceChange& change) {
      residency.drop_changed_sources(change.overflow ? std::vector<std::string>{} : change.files);
      service.drop_cached_images(change.masters, change.overflow);
    });
    service.set_export_jobs(&exports);
    metadata.add_to(service);
  }

  static inspector::InspectorOptions inspector_options(const ServeSettings& settings) {
    inspector::InspectorOptions options;
    options.deadline = settings.inspect_timeout;
    options.storage_deadline = std::max(options.storage_deadline, settings.inspect_timeout);
    options.workers = settings.inspect_workers;
    return options;
  }
  static CatalogServiceOptions catalog_options(const ServeSettings& settings, inspector::Inspector& inspector) {
    CatalogServiceOptions options = watching_catalog_options();
    options.watch_after_first_build = true;  // readiness does not wait for a large folder's watches
    options.inspect = inspector.inspect_function();
    options.inspect_threads = inspector.workers();
    options.cache_path = settings.catalog_cache;
    options.forget_inspection_failures = [&inspector] { inspector.forget_failures(); };
    options.forget_inspection_failure = [&inspector](const std::string& master) {
      return inspector.forget_failure(master);
    };
    options.condemned = [](const catalog::Acquisition& acquisition) {
      return acquisition.status.reason == inspector::stopped_reason(acquisition.master_path);
    };
    return options;
  }
  static residency::ResidencyOptions residency_options(const ServeSettings& settings) {
    residency::ResidencyOptions options;
    options.max_entries_per_device = settings.cache_entries;
    options.idle_release = settings.idle_release;
    options.tile_sums = settings.tile_sums;
    return options;
  }
  static BrowseConfig browse_config(const ServeSettings& settings, const std::optional<TokenSource>& token) {
    BrowseConfig config;
    config.implementation_revision = settings.implementation_revision;
    if (token) {
      config.access.mode = AuthMode::token;
      config.access.token = token->token;
    }
    return config;
  }
  static ExportJobsConfig export_config(const ServeSettings& settings) {
    ExportJobsConfig config;
    config.export_dir = settings.export_dir;
    config.implementation_revision = settings.implementation_revision;
    config.threads = settings.cpu_threads;
    config.working_memory_on_device = settings.cpu_backend;
    return config;
  }
  static HttpServerOptions http_options(const ServeSettings& settings) {
    HttpServerOptions options;
    options.threads = settings.http_threads;
    options.spin_wait = settings.http_spin;
    options.shutdown_grace = settings.shutdown_grace;
    options.header_timeout = settings.header_timeout;
    return options;
  }

  ServiceManagerNotifier notifier;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<DevicePreparation> device_preparation;  // after backend: joined before it goes
  std::optional<TokenSource> token;
  // Before residency: loads (on the residency's loader threads) read each
  // shard's libhdf5 facts through the inspector until the residency is gone.
  inspector::Inspector inspector;
  ShardStorageThroughInspector shard_storage;
  residency::ResidencyManager residency;
  CatalogService catalog;
  Metrics metrics;
  ExportJobs exports;
  BrowseService service;
  MetadataRoute metadata;  // before http: requests in flight end before it goes
  HttpServer http;
};

// One line for the service manager's STATUS= and SIGUSR1: state, residents
// and each device's use of its budget.
std::string status_line(const DaemonWiring& daemon) {
  std::string line;
  if (auto stale = daemon.catalog.stale_reason()) {
    line = "catalog stale (" + *stale + ")";
  } else {
    line = daemon.service.ready() ? "ready" : "starting";
  }
  std::uint64_t residents = 0, resident_bytes = 0;
  std::string devices;
  for (const auto& usage : daemon.residency.device_usage()) {
    residents += usage.resident_entries;
    resident_bytes += usage.resident_bytes;
    devices += "; " + daemon.backend->name() + " device " + std::to_string(usage.info.index) + ": " +
               catalog::format_size(usage.resident_bytes) + " of " + catalog::format_size(usage.info.budget_bytes) +
               " budget";
  }
  line += "; " + std::to_string(residents) + (residents == 1 ? " resident, " : " residents, ") +
          catalog::format_size(resident_bytes) + devices;
  return line;
}

// Step 4. The runtime file `server-<pid>.json` (0600, in the folder that
// prepare_runtime_directory accepted at start) that tells clients where the
// daemon listens (and, in token mode, the token); the files of daemons that
// died without removing theirs are removed first. Removed by remove() in the
// shutdown.
// Every byte but [A-Za-z0-9._~-] as %XX: a socket path as one URL host.
std::string percent_encode_path(const std::string& path) {
  std::string encoded;
  for (const unsigned char c : path) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '~' || c == '-') {
      encoded += static_cast<char>(c);
    } else {
      char escape[4];
      std::snprintf(escape, sizeof escape, "%%%02X", c);
      encoded += escape;
    }
  }
  return encoded;
}

class RuntimeFile {
 public:
  // Returns an error text when the file is required (token mode) and could
  // not be written; otherwise a failure is only a warning.
  std::string write(const std::string& directory, const ServeSettings& settings, const DaemonWiring& daemon, int port) {
    const std::string host_for_url =
        settings.host.find(':') != std::string::npos ? "[" + settings.host + "]" : settings.host;
    // A socket's url is http+unix:// with the socket path percent-encoded
    // (what requests-unixsocket and similar clients take); curl takes curl_args.
    url_ = settings.unix_socket.empty() ? "http://" + host_for_url + ":" + std::to_string(port)
                                        : "http+unix://" + percent_encode_path(settings.unix_socket);
    // What curl needs before a route ("$(...)/api/health/ready"): a browser
    // or curl cannot use the unix: URL by itself.
    nlohmann::ordered_json curl_args = nlohmann::ordered_json::array();
    if (settings.unix_socket.empty()) {
      curl_args.push_back(url_);
    } else {
      curl_args = {"--unix-socket", settings.unix_socket, "http://localhost"};
    }
    remove_stale_runtime_files(directory, getpid());
    path_ = directory + "/server-" + std::to_string(getpid()) + ".json";
    nlohmann::ordered_json runtime;
    runtime["url"] = url_;
    runtime["url_form"] = settings.unix_socket.empty() ? "http" : "http+unix";
    runtime["curl_args"] = curl_args;
    runtime["host"] = settings.host;
    runtime["port"] = settings.unix_socket.empty() ? nlohmann::ordered_json(port) : nlohmann::ordered_json(nullptr);
    runtime["unix_socket"] = settings.unix_socket.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(settings.unix_socket);
    runtime["pid"] = getpid();
    runtime["version"] = version_string();
    runtime["implementation_revision"] = settings.implementation_revision;
    runtime["backend"] = daemon.backend->name();
    runtime["data_folder"] = settings.data_folder;
    runtime["started_at"] = utc_timestamp_now();
    runtime["token"] = daemon.token ? nlohmann::ordered_json(daemon.token->token) : nlohmann::ordered_json(nullptr);
    const std::string error = write_private_file(path_, runtime.dump(2) + "\n");
    if (!error.empty()) {
      path_.clear();
      if (daemon.token) return "cannot write the runtime file that holds the token: " + error;
      spdlog::warn("runtime file not written: {}", error);
    } else if (daemon.token) {
      spdlog::info("token ({}) written to {}", daemon.token->origin, path_);
    }
    return {};
  }
  const std::string& url() const { return url_; }
  void remove() {
    if (!path_.empty()) ::unlink(path_.c_str());
    path_.clear();
  }

 private:
  std::string url_;
  std::string path_;
};

// Step 5. The background threads: the HTTP server, and the first catalog
// build after which the daemon is ready.
struct BackgroundThreads {
  std::atomic<bool> server_finished{false};
  std::thread server;
  std::thread first_catalog;
};

void start_background_threads(DaemonWiring& daemon, BackgroundThreads& threads) {
  threads.server = std::thread([&daemon, &threads] {
    try {
      daemon.http.run();
    } catch (const std::exception& error) {
      spdlog::error("HTTP server stopped: {}", error.what());
    }
    threads.server_finished = true;
  });
  threads.first_catalog = std::thread([&daemon] {
    try {
      // The devices' preparation (started with the backend) runs beside the catalog build.
      try {
        daemon.catalog.catalog(false);
      } catch (...) {
        daemon.device_preparation->wait();
        throw;
      }
      daemon.device_preparation->wait();
      daemon.service.set_ready(true);
      spdlog::info("ready");
      daemon.notifier.ready(status_line(daemon));
    } catch (const std::exception& error) {
      spdlog::error("the catalog could not be built: {}", error.what());
    }
  });
}

// SIGHUP's re-reads of the catalog (like GET /api/browse/sessions?refresh=true),
// on a thread of their own so that the signal loop keeps its watchdog beat;
// signals that arrive during a re-read make one more.
class CatalogRescans {
 public:
  explicit CatalogRescans(CatalogService& catalog) : catalog_(catalog), thread_([this] { run(); }) {}
  ~CatalogRescans() { stop(); }
  CatalogRescans(const CatalogRescans&) = delete;
  CatalogRescans& operator=(const CatalogRescans&) = delete;
  void request() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_ = true;
    }
    wake_.notify_one();
  }
  // Waits for a re-read in progress; none starts afterwards.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [this] { return pending_ || stopping_; });
      if (stopping_) return;
      pending_ = false;
      lock.unlock();
      try {
        const auto catalog = catalog_.catalog(true);
        spdlog::info("SIGHUP: the catalog of {} was read again ({} session{})", catalog->data_folder,
                     catalog->sessions.size(), catalog->sessions.size() == 1 ? "" : "s");
      } catch (const std::exception& error) {
        spdlog::warn("SIGHUP: reading the catalog again failed: {}", error.what());
      }
      lock.lock();
    }
  }

  CatalogService& catalog_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool pending_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

// True once standard input has reached its end (or is not open): the
// launcher of `--exit-on-stdin-close` went away. Reads and drops what is
// there without waiting.
bool stdin_reached_end() {
  char buffer[4096];
  while (true) {
    pollfd input{STDIN_FILENO, POLLIN, 0};
    const int ready = ::poll(&input, 1, 0);
    if (ready < 0) return errno != EINTR && errno != EAGAIN;
    if (ready == 0) return false;
    if (input.revents & POLLNVAL) return true;
    if (!(input.revents & (POLLIN | POLLHUP | POLLERR))) return false;
    const ssize_t n = ::read(STDIN_FILENO, buffer, sizeof buffer);
    if (n == 0) return true;
    if (n < 0) return errno != EINTR && errno != EAGAIN;
  }
}

// How SIGHUP is taken (Step 1).
struct HangupPolicy {
  // Started with a terminal on stdout or stderr: SIGHUP then means that
  // terminal went away (remembered at start: a hung-up terminal no longer
  // reports itself as one).
  bool started_on_terminal = false;
  bool stops(const siginfo_t& info) const { return started_on_terminal || info.si_code == SI_KERNEL; }
};

// Step 6. The signal loop: returns the exit code once a stop signal arrives
// or stdin ends with --exit-on-stdin-close (0), or the HTTP server has
// stopped on its own (1). Meanwhile it hands SIGHUP's re-reads to `rescans`,
// keeps the service manager's STATUS= current, sends WATCHDOG=1 when asked
// for, and notices a data folder that went away (logged once by the catalog
// service).
int wait_for_stop(const sigset_t& handled_signals, const BackgroundThreads& threads, DaemonWiring& daemon,
                  const ServeSettings& settings, const HangupPolicy& hangup, CatalogRescans& rescans) {
  using clock = std::chrono::steady_clock;
  const auto watchdog_period = daemon.notifier.watchdog_period();
  auto tick = std::chrono::microseconds(200'000);
  if (watchdog_period.count() > 0) tick = std::min(tick, watchdog_period / 2);
  auto next_watchdog = clock::now();
  auto next_status = clock::now();
  std::string last_status;
  while (true) {
    timespec timeout{static_cast<time_t>(tick.count() / 1'000'000), static_cast<long>(tick.count() % 1'000'000) * 1000};
    siginfo_t info{};
    const int signal_number = sigtimedwait(&handled_signals, &info, &timeout);
    if (signal_number == SIGINT || signal_number == SIGTERM || (signal_number == SIGHUP && hangup.stops(info))) {
      spdlog::info("signal {} ({}) received: stopping", signal_number, sigabbrev(signal_number));
      return exit_status::ok;
    }
    if (signal_number == SIGHUP) {
      spdlog::info("signal {} (SIGHUP) received: reading the catalog again", signal_number);
      rescans.request();
    }
    if (signal_number == SIGUSR1) spdlog::info("status: {}", status_line(daemon));
    if (threads.server_finished) {
      spdlog::error("the HTTP server stopped unexpectedly");
      return exit_status::failure;
    }
    if (settings.exit_on_stdin_close && stdin_reached_end()) {
      spdlog::info("standard input reached its end (--exit-on-stdin-close): stopping");
      return exit_status::ok;
    }
    const auto now = clock::now();
    if (watchdog_period.count() > 0 && now >= next_watchdog) {
      daemon.notifier.watchdog();
      next_watchdog = now + watchdog_period;
    }
    if (now >= next_status) {
      daemon.catalog.check_data_folder();
      if (daemon.notifier.active()) {
        std::string status = status_line(daemon);
        if (status != last_status) daemon.notifier.status(status);
        last_status = std::move(status);
      }
      next_status = now + std::chrono::seconds(1);
    }
  }
}

// Step 7. The shutdown order: the service manager told, not ready, no new
// requests, loads cancelled and requests waiting for them woken (before the
// HTTP workers are joined, so no worker waits out a long load), threads
// joined, runtime file removed.
void shut_down_in_order(DaemonWiring& daemon, BackgroundThreads& threads, CatalogRescans& rescans,
                        RuntimeFile& runtime_file) {
  daemon.notifier.stopping();
  daemon.service.set_ready(false);
  daemon.http.stop();
  rescans.stop();
  daemon.catalog.stop_watching();
  // Requests waiting on a worker (a hung read) end now, not at their deadline.
  daemon.inspector.shutdown();
  // The residency first: an export job waiting for its source's load is
  // released (unavailable) instead of holding the shutdown for the load.
  daemon.residency.shutdown();
  daemon.exports.shutdown();
  threads.server.join();
  threads.first_catalog.join();
  runtime_file.remove();
}

// Response bodies (up to tens of MB) are allocated and freed on every
// request. With glibc's defaults a block above the (dynamic) mmap threshold is
// a fresh mapping, and freed heap memory above the trim threshold goes back to
// the kernel: either way the next body of that size is written into untouched
// pages, one page fault per 4 KiB (tests/bench/bench_host_memory measures
// what that costs). Blocks up to 32 MiB (glibc's largest threshold) come
// from the heap, and up to 256 MiB of freed heap stays mapped for reuse.
// One arena: a body freed by whichever thread (the image cache evicting it,
// the I/O thread after the write) is reused by the next request's worker,
// instead of sitting in another thread's arena while this one grows into
// fresh pages.
void keep_freed_body_memory_mapped() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_ARENA_MAX, 1);
}

// Steps 2 and 3 with what they need first: the options validated and applied
// (the log level), the runtime folder ready, the listener bound. A refusal
// throws: ServeUsageError for the configuration, anything else a failure.
struct ListeningDaemon {
  ServeSettings settings;
  std::string runtime_folder;
  std::unique_ptr<DaemonWiring> daemon;
  int port = 0;
};

ListeningDaemon start_listening(const ServeOptions& options) {
  ListeningDaemon started;
  started.settings = validate_serve_options(options);
  const ServeSettings& settings = started.settings;
  if (settings.log_level) {
    logging::set_level(*settings.log_level);
    // The inspector worker (a child of this process) logs at the same level.
    if (!options.log_level.empty()) ::setenv(logging::kLevelVariable, options.log_level.c_str(), 1);
  }
  started.runtime_folder = runtime_directory();
  if (const std::string refusal = prepare_runtime_directory(started.runtime_folder); !refusal.empty()) {
    throw ServeUsageError(refusal);
  }
  started.daemon = std::make_unique<DaemonWiring>(settings, acquire_startup_resources(settings, options));
  if (settings.unix_socket.empty()) {
    started.port = started.daemon->http.bind(settings.host, settings.port);
  } else {
    started.daemon->http.bind_unix(settings.unix_socket);
  }
  return started;
}

// Where the daemon can be found: the runtime file, and the port file when
// asked for. Returns an error text (a failure) when a required file could not
// be written.
std::string announce(ListeningDaemon& started, RuntimeFile& runtime_file) {
  const ServeSettings& settings = started.settings;
  if (std::string error = runtime_file.write(started.runtime_folder, settings, *started.daemon, started.port);
      !error.empty()) {
    return error;
  }
  if (!settings.port_file.empty() && !write_port_file(settings.port_file, started.port)) {
    runtime_file.remove();
    return "cannot write the port file " + settings.port_file;
  }
  return {};
}

}  // namespace

int run_serve(const ServeOptions& options) {
  const auto serve_start = std::chrono::steady_clock::now();
  const sigset_t handled_signals = block_handled_signals();
  const HangupPolicy hangup{::isatty(STDOUT_FILENO) == 1 || ::isatty(STDERR_FILENO) == 1};
  keep_freed_body_memory_mapped();

  ListeningDaemon started;
  try {
    started = start_listening(options);
  } catch (const ServeUsageError& error) {
    logging::fatal(error.what());
    return exit_status::configuration;
  } catch (const std::exception& error) {
    logging::fatal(error.what());
    return exit_status::failure;
  }
  RuntimeFile runtime_file;
  if (const std::string error = announce(started, runtime_file); !error.empty()) {
    logging::fatal(error);
    return exit_status::failure;
  }
  const ServeSettings& settings = started.settings;
  DaemonWiring& daemon = *started.daemon;
  spdlog::info("quantem-gpu {} ({}) serving {} on {} with the {} backend ({:.3f} s after start-up began)",
               version_string(), settings.implementation_revision, settings.data_folder, runtime_file.url(),
               daemon.backend->name(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - serve_start).count());

  BackgroundThreads threads;
  start_background_threads(daemon, threads);
  CatalogRescans rescans(daemon.catalog);
  const int exit_code = wait_for_stop(handled_signals, threads, daemon, settings, hangup, rescans);
  shut_down_in_order(daemon, threads, rescans, runtime_file);
  spdlog::info("stopped");
  return exit_code;
}

}  // namespace quantem::server
