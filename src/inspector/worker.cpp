#include "quantem/inspector/worker.hpp"

#include <malloc.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/master_metadata.hpp"
#include "quantem/catalog/shard_storage.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/io.hpp"
#include "quantem/core/text.hpp"
#include "quantem/inspector/wire.hpp"

namespace quantem::inspector {

namespace {

using nlohmann::json;

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

std::string error_reply(const std::string& message) {
  return json({{"error", message}}).dump(-1, ' ', false, json::error_handler_t::replace);
}

const std::string& abort_on() {
  static const std::string name = env_or_empty("QUANTEM_TEST_INSPECTOR_ABORT_ON");
  return name;
}
const std::string& hang_on() {
  static const std::string name = env_or_empty("QUANTEM_TEST_INSPECTOR_HANG_ON");
  return name;
}
// NAME:MARKER: abort() when asked about NAME unless MARKER exists, creating it first.
const std::string& abort_once_on() {
  static const std::string spec = env_or_empty("QUANTEM_TEST_INSPECTOR_ABORT_ONCE");
  return spec;
}
void run_test_hooks(const std::string& path) {
  if (!abort_on().empty() && base_name(path) == abort_on()) std::abort();
  if (const auto colon = abort_once_on().find(':'); colon != std::string::npos) {
    const std::string marker = abort_once_on().substr(colon + 1);
    if (base_name(path) == abort_once_on().substr(0, colon) && ::access(marker.c_str(), F_OK) != 0) {
      std::FILE* created = std::fopen(marker.c_str(), "w");
      if (created) std::fclose(created);
      std::abort();
    }
  }
  if (!hang_on().empty() && base_name(path) == hang_on()) {
    while (true) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

std::string dump(const json& reply) { return reply.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string answer_storage(const json& request) {
  if (!request.is_object() || !request.contains("file") || !request.contains("dataset") || !request["file"].is_string() ||
      !request["dataset"].is_string()) {
    return error_reply("expected {\"storage\": {\"file\": PATH, \"dataset\": PATH}}");
  }
  run_test_hooks(request["file"].get<std::string>());
  try {
    const auto storage =
        catalog::read_shard_storage(request["file"].get<std::string>(), request["dataset"].get<std::string>());
    return dump({{"storage", shard_storage_to_json(storage)}});
  } catch (const Error& e) {
    return dump({{"failed", {{"kind", error_kind_name(e.kind())}, {"message", e.what()}}}});
  } catch (const std::bad_alloc&) {
    // RLIMIT_AS: a size read from the file asked for more memory than a shard's facts need.
    return dump({{"failed", {{"kind", "corrupt_data"}, {"message", "reading the shard's storage ran out of memory"}}}});
  } catch (const std::exception& e) {
    return dump({{"failed", {{"kind", "io"}, {"message", e.what()}}}});
  }
}

std::string answer_metadata(const json& request) {
  if (!request.is_string()) return error_reply("expected {\"metadata\": PATH}");
  const std::string path = request.get<std::string>();
  run_test_hooks(path);
  try {
    return dump({{"metadata", master_metadata_to_json(catalog::read_master_metadata(path))}});
  } catch (const Error& e) {
    const bool typed = e.kind() == ErrorKind::not_found || e.kind() == ErrorKind::corrupt_data;
    return dump({{"failed", {{"kind", typed ? error_kind_name(e.kind()) : "io"}, {"message", e.what()}}}});
  } catch (const std::bad_alloc&) {
    return dump({{"failed", {{"kind", "corrupt_data"}, {"message", "reading the master's metadata ran out of memory"}}}});
  } catch (const std::exception& e) {
    return dump({{"failed", {{"kind", "io"}, {"message", e.what()}}}});
  }
}

}  // namespace

std::string answer_request(const std::string& line) {
  try {
    const json request = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!request.is_discarded() && request.is_object() && request.size() == 1 && request.contains("storage")) {
      return answer_storage(request["storage"]);
    }
    if (!request.is_discarded() && request.is_object() && request.size() == 1 && request.contains("metadata")) {
      return answer_metadata(request["metadata"]);
    }
    if (request.is_discarded() || !request.is_object() || request.size() != 1 || !request.contains("inspect") ||
        !request["inspect"].is_string()) {
      return error_reply("expected {\"inspect\": PATH}, {\"storage\": {\"file\": PATH, \"dataset\": PATH}} or {\"metadata\": PATH}");
    }
    const std::string path = request["inspect"].get<std::string>();
    run_test_hooks(path);
    const catalog::Acquisition acquisition = catalog::inspect_master(path);
    return dump({{"acquisition", acquisition_to_json(acquisition)}});
  } catch (const std::exception& e) {
    return error_reply(e.what());
  }
}

int run_inspect_worker(const WorkerOptions& options) {
  // Only stdin, stdout and stderr: nothing of the daemon's (sockets, locks) stays open here.
  ::close_range(3, ~0U, 0);
  // Ctrl-C in a terminal reaches the whole process group: the daemon shuts
  // down and closes our stdin, which ends this loop.
  std::signal(SIGINT, SIG_IGN);
  if (options.parent_pid > 0) {
    // A worker blocked in a read (a hung network mount, a FIFO) never sees its
    // input end, so it must not outlive a daemon that was SIGKILLed.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != static_cast<pid_t>(options.parent_pid)) return 1;
  }
  std::signal(SIGPIPE, SIG_IGN);
  // Every H5Fopen callocs libhdf5's metadata cache, a large block. With
  // glibc's defaults that block is a fresh mapping, or heap trimmed back to
  // the kernel when freed: each open then page-faults its way through it,
  // which profiling showed to be most of a small master's inspection. Keep
  // freed memory mapped for the next open.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
  if (options.address_space_limit_bytes != 0) {
    const rlimit limit{options.address_space_limit_bytes, options.address_space_limit_bytes};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) {
      spdlog::error("inspect-worker: setrlimit(RLIMIT_AS) failed: {}", std::strerror(errno));
      return 1;
    }
  }
  if (!write_all(STDOUT_FILENO, std::string(kWorkerHello) + "\n")) return 1;
  std::string buffer;
  char chunk[65536];
  while (true) {
    const auto newline = buffer.find('\n');
    if (newline != std::string::npos) {
      const std::string line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      if (!write_all(STDOUT_FILENO, answer_request(line) + "\n")) return 1;
      continue;
    }
    if (buffer.size() > kMaxLineBytes) {
      spdlog::error("inspect-worker: a request line longer than {} bytes", kMaxLineBytes);
      return 1;
    }
    const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;  // the daemon closed the pipe (or went away)
    buffer.append(chunk, static_cast<std::size_t>(n));
  }
}

}  // namespace quantem::inspector
