#include "quantem/server/serve.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cuda_backend.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/version.hpp"
#include "quantem/residency/residency_manager.hpp"
#include "quantem/server/browse_service.hpp"
#include "quantem/server/catalog_service.hpp"
#include "quantem/server/http_server.hpp"
#include "quantem/server/metrics.hpp"

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
                   "Data-cache budget per device (GPU or CPU virtual device), e.g. 64MiB, 2GB, 1.5GiB (default: 80% of device memory; CPU: 80% of RAM shared)");
  serve.add_option("--cpu-threads", options.cpu_threads, "CPU backend: worker threads (default: every core)");
  serve.add_option("--cache-entries", options.cache_entries, "Resident acquisitions per device, least recently used evicted (default 8)");
  serve.add_option("--http-threads", options.http_threads, "HTTP worker threads (default 16)");
  serve.add_option("--host", options.host, "Bind address (default 127.0.0.1; loopback only unless --allow-non-loopback)");
  serve.add_flag("--allow-non-loopback", options.allow_non_loopback, "Allow a --host that is not a loopback address");
  serve.add_option("--unix-socket", options.unix_socket,
                   "Listen on this Unix socket (mode 0600, directory created 0700) instead of TCP")
      ->excludes("--port")->excludes("--port-file")->excludes("--host");
  serve.add_option("--shutdown-grace", options.shutdown_grace_seconds,
                   "Seconds requests in flight may finish after SIGTERM/SIGINT (default 2)");
  serve.add_option("--header-timeout", options.header_timeout_seconds,
                   "Seconds a client has to send a whole request line and headers; also the keep-alive idle timeout (default 5)");
  serve.add_option("--auth", options.auth,
                   "none (default) or token (from $QUANTEM_GPU_TOKEN, $QUANTEM_GPU_TOKEN_FILE, else generated; "
                   "written to the 0600 runtime file)");
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

std::string trim(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  std::size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  return text.substr(start);
}

struct TokenSource {
  std::string token;
  std::string origin;  // "environment", "file <path>", "generated"
};

TokenSource obtain_token() {
  if (const char* env = std::getenv("QUANTEM_GPU_TOKEN"); env && *env) return {env, "$QUANTEM_GPU_TOKEN"};
  if (const char* path = std::getenv("QUANTEM_GPU_TOKEN_FILE"); path && *path) {
    std::ifstream in(path);
    std::stringstream content;
    content << in.rdbuf();
    const std::string token = trim(content.str());
    if (!in || token.empty()) throw ServeUsageError(std::string("cannot read a token from $QUANTEM_GPU_TOKEN_FILE (") + path + ")");
    return {token, std::string("file ") + path};
  }
  return {hex_random_token(), "generated"};
}

std::string runtime_directory() {
  if (const char* dir = std::getenv("QUANTEM_GPU_RUNTIME_DIR"); dir && *dir) return dir;
  if (const char* dir = std::getenv("XDG_RUNTIME_DIR"); dir && *dir) return std::string(dir) + "/quantem-gpu";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.local/share/quantem-gpu/runtime";
  return "/tmp/quantem-gpu-" + std::to_string(getuid());
}

// Writes `content` to `path` with mode 0600 (replacing an older file), in a
// 0700 directory. Returns an error text, empty on success.
std::string write_private_file(const std::string& path, const std::string& content) {
  const std::filesystem::path file(path);
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  if (ec) return "cannot create " + file.parent_path().string() + ": " + ec.message();
  ::chmod(file.parent_path().c_str(), 0700);
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot create " + path + ": " + std::strerror(errno);
  std::size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string error = std::strerror(errno);
      ::close(fd);
      return "cannot write " + path + ": " + error;
    }
    written += static_cast<std::size_t>(n);
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

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

std::unique_ptr<backend::Backend> make_backend(const ServeSettings& settings, const ServeOptions& options) {
  if (!settings.cpu_backend) {
    // Never a silent CPU fallback: without CUDA (build or device) this throws "CUDA unavailable: ...".
    backend::CudaBackendOptions cuda;
    if (settings.gpu_indices) cuda.device_indices = *settings.gpu_indices;
    cuda.budget_bytes = settings.device_budget_bytes;
    return backend::make_cuda_backend(cuda);
  }
  if (options.gpu || options.gpus != "auto") {
    spdlog::warn("--gpu/--gpus select CUDA devices and are ignored by --backend cpu (use --cpu-devices)");
  }
  backend::CpuBackendOptions cpu;
  cpu.virtual_devices = settings.cpu_devices;
  cpu.budget_bytes_per_device = settings.device_budget_bytes;
  cpu.threads = settings.cpu_threads;
  return backend::make_cpu_backend(cpu);
}

}  // namespace

int run_serve(const ServeOptions& options) {
  // Block the stop signals before any thread exists; they are taken with sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ServeSettings settings;
  try {
    settings = validate_serve_options(options);
  } catch (const ServeUsageError& error) {
    std::cerr << error.what() << "\n";
    return 1;
  }
  if (settings.non_loopback) {
    spdlog::warn("binding the non-loopback address {}: every host that can reach it can read your data{}", settings.host,
                 settings.token_auth ? " with the token" : " (no token: consider --auth token)");
  }

  std::unique_ptr<backend::Backend> backend;
  std::optional<TokenSource> token;
  try {
    backend = make_backend(settings, options);
    if (settings.token_auth) token = obtain_token();
  } catch (const ServeUsageError& error) {
    std::cerr << error.what() << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << error.what() << "\n";
    return 1;
  }
  for (const auto& device : backend->devices()) {
    spdlog::info("{} device {}: {} (budget {} B)", backend->name(), device.index, device.name, device.budget_bytes);
  }

  residency::ResidencyOptions residency_options;
  residency_options.max_entries_per_device = settings.cache_entries;
  residency::ResidencyManager residency(*backend, residency_options);
  CatalogService catalog(settings.data_folder, watching_catalog_options());
  Metrics metrics;
  BrowseConfig config;
  config.implementation_revision = settings.implementation_revision;
  if (token) {
    config.access.mode = AuthMode::token;
    config.access.token = token->token;
  }
  BrowseService service(config, *backend, residency, catalog, metrics);

  HttpServerOptions http_options;
  http_options.threads = settings.http_threads;
  http_options.shutdown_grace = settings.shutdown_grace;
  http_options.header_timeout = settings.header_timeout;
  HttpServer http([&service](const HttpRequest& request) { return service.handle(request); }, http_options);
  int port = 0;
  try {
    if (settings.unix_socket.empty()) {
      port = http.bind(settings.host, settings.port);
    } else {
      http.bind_unix(settings.unix_socket);
    }
  } catch (const std::exception& error) {
    std::cerr << error.what() << "\n";
    return 1;
  }

  const std::string host_for_url = settings.host.find(':') != std::string::npos ? "[" + settings.host + "]" : settings.host;
  const std::string url = settings.unix_socket.empty() ? "http://" + host_for_url + ":" + std::to_string(port)
                                                      : "unix:" + settings.unix_socket;
  const std::string runtime_file = runtime_directory() + "/server-" + std::to_string(getpid()) + ".json";
  {
    nlohmann::ordered_json runtime;
    runtime["url"] = url;
    runtime["host"] = settings.host;
    runtime["port"] = settings.unix_socket.empty() ? nlohmann::ordered_json(port) : nlohmann::ordered_json(nullptr);
    runtime["unix_socket"] = settings.unix_socket.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(settings.unix_socket);
    runtime["pid"] = getpid();
    runtime["version"] = version_string();
    runtime["implementation_revision"] = settings.implementation_revision;
    runtime["backend"] = backend->name();
    runtime["data_folder"] = settings.data_folder;
    runtime["started_at"] = utc_now();
    runtime["token"] = token ? nlohmann::ordered_json(token->token) : nlohmann::ordered_json(nullptr);
    const std::string error = write_private_file(runtime_file, runtime.dump(2) + "\n");
    if (!error.empty()) {
      if (token) {
        std::cerr << "cannot write the runtime file that holds the token: " << error << "\n";
        return 1;
      }
      spdlog::warn("runtime file not written: {}", error);
    } else if (token) {
      spdlog::info("token ({}) written to {}", token->origin, runtime_file);
    }
  }
  if (!settings.port_file.empty() && !write_port_file(settings.port_file, port)) {
    std::cerr << "cannot write the port file " << settings.port_file << "\n";
    ::unlink(runtime_file.c_str());
    return 1;
  }
  spdlog::info("quantem-gpu {} ({}) serving {} on {} with the {} backend", version_string(),
               settings.implementation_revision, settings.data_folder, url, backend->name());

  // Changed files invalidate the residents and cached images built from them (stop_watching()
  // below ends the calls before `service` goes away).
  catalog.on_sources_changed([&residency, &service](const SourceChange& change) {
    residency.drop_changed_sources(change.overflow ? std::vector<std::string>{} : change.files);
    service.drop_cached_images(change.masters, change.overflow);
  });
  std::atomic<bool> server_finished{false};
  std::thread server_thread([&] {
    try {
      http.run();
    } catch (const std::exception& error) {
      spdlog::error("HTTP server stopped: {}", error.what());
    }
    server_finished = true;
  });
  std::thread catalog_thread([&] {
    try {
      catalog.catalog(false);
      service.set_ready(true);
      spdlog::info("ready");
    } catch (const std::exception& error) {
      spdlog::error("the catalog could not be built: {}", error.what());
    }
  });

  int exit_code = 0;
  while (true) {
    timespec timeout{0, 200'000'000};
    const int signal_number = sigtimedwait(&stop_signals, nullptr, &timeout);
    if (signal_number == SIGINT || signal_number == SIGTERM) {
      spdlog::info("signal {} received: stopping", signal_number);
      break;
    }
    if (server_finished) {
      spdlog::error("the HTTP server stopped unexpectedly");
      exit_code = 1;
      break;
    }
  }
  service.set_ready(false);
  http.stop();
  // Cancel loads and wake requests waiting for them before joining the HTTP
  // workers, so no worker waits out a long load.
  catalog.stop_watching();
  residency.shutdown();
  server_thread.join();
  catalog_thread.join();
  ::unlink(runtime_file.c_str());
  spdlog::info("stopped");
  return exit_code;
}

}  // namespace quantem::server
