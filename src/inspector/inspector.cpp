#include "quantem/inspector/inspector.hpp"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <spdlog/spdlog.h>

#include "quantem/core/error.hpp"
#include "quantem/inspector/wire.hpp"

extern char** environ;

namespace quantem::inspector {

namespace {

constexpr int kStartAttempts = 3;
constexpr auto kExitGrace = std::chrono::milliseconds(500);

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = ::sigdescr_np(WTERMSIG(status));
    return "killed by signal " + std::to_string(WTERMSIG(status)) + (name ? std::string(" (") + name + ")" : "");
  }
  return "stopped";
}

// Waits up to `grace` for the child to exit, then kills it; returns how it ended.
std::string reap(pid_t pid, std::chrono::milliseconds grace) {
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + grace;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return describe_status(status);
    if (done < 0 && errno != EINTR) return std::string("waitpid failed: ") + std::strerror(errno);
    if (std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return describe_status(status);
}

bool send_all(int fd, const std::string& text) {
  std::size_t sent = 0;
  while (sent < text.size()) {
    const ssize_t n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

std::string stopped_reason(const std::string& master_path) {
  return "master file is not readable HDF5: " + master_path + " (the inspector stopped on this file)";
}

Inspector::Inspector(InspectorOptions options) : options_(std::move(options)) {}

Inspector::~Inspector() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pid_ > 0) {
    ::close(socket_);  // the worker reads end of input and exits
    socket_ = -1;
    reap(pid_, kExitGrace);
    pid_ = 0;
  }
}

catalog::InspectFunction Inspector::inspect_function() {
  return [this](const std::string& master_path) { return inspect(master_path); };
}

std::uint64_t Inspector::worker_starts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return starts_;
}
std::uint64_t Inspector::worker_failures() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failures_;
}
std::size_t Inspector::remembered_failures() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return remembered_.size();
}
pid_t Inspector::worker_pid() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pid_;
}

bool Inspector::start_worker_locked(std::string& problem) {
  // Rate limit: a worker that dies at once is not restarted in a tight loop.
  const auto earliest = last_start_ + options_.restart_interval;
  const auto now = std::chrono::steady_clock::now();
  if (starts_ > 0 && now < earliest) std::this_thread::sleep_for(earliest - now);
  last_start_ = std::chrono::steady_clock::now();
  ++starts_;

  int sockets[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0) {
    problem = std::string("socketpair failed: ") + std::strerror(errno);
    return false;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sockets[1], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, sockets[1], STDOUT_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // The daemon's signal mask (its signal thread blocks SIGTERM and friends) must not reach the worker.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  sigset_t defaults;
  sigfillset(&defaults);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<std::string> arguments = {"quantem-gpu", "inspect-worker"};
  if (options_.address_space_limit_bytes != 0) {
    arguments.push_back("--address-space-limit");
    arguments.push_back(std::to_string(options_.address_space_limit_bytes));
  }
  std::vector<char*> argv;
  for (auto& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, options_.executable.c_str(), &actions, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(sockets[1]);
  if (spawned != 0) {
    ::close(sockets[0]);
    problem = "cannot start " + options_.executable + ": " + std::strerror(spawned);
    return false;
  }
  pid_ = pid;
  socket_ = sockets[0];
  buffer_.clear();
  std::string hello, why;
  if (!read_line_locked(options_.deadline, hello, why) || hello != kWorkerHello) {
    problem = why.empty() ? "it did not greet (got '" + hello.substr(0, 200) + "')" : why;
    stop_worker_locked(problem);
    return false;
  }
  spdlog::debug("inspector: worker {} started", pid_);
  return true;
}

void Inspector::stop_worker_locked(const std::string& why) {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::close(socket_);
  socket_ = -1;
  const std::string ended = reap(pid_, std::chrono::milliseconds(0));
  spdlog::warn("inspector: worker {} stopped ({}): {}", pid_, ended, why);
  pid_ = 0;
  buffer_.clear();
}

bool Inspector::read_line_locked(std::chrono::milliseconds limit, std::string& line, std::string& why) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char chunk[65536];
  while (true) {
    const auto newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return true;
    }
    if (buffer_.size() > kMaxLineBytes) {
      why = "a reply line longer than " + std::to_string(kMaxLineBytes) + " bytes";
      return false;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      why = "no answer within " + std::to_string(limit.count()) + " ms";
      return false;
    }
    pollfd readable{socket_, POLLIN, 0};
    const int ready = ::poll(&readable, 1, static_cast<int>(std::min<std::int64_t>(left.count() + 1, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      why = std::string("poll failed: ") + std::strerror(errno);
      return false;
    }
    if (ready == 0) continue;  // the deadline check above ends it
    const ssize_t n = ::recv(socket_, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      why = n == 0 ? "the worker closed its output (it died)" : std::string("recv failed: ") + std::strerror(errno);
      return false;
    }
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

bool Inspector::exchange_locked(const std::string& request, std::chrono::milliseconds deadline, std::string& reply,
                                std::string& why) {
  if (pid_ <= 0) {
    std::string problem;
    bool started = false;
    for (int attempt = 0; attempt < kStartAttempts && !started; ++attempt) started = start_worker_locked(problem);
    if (!started) {
      ++failures_;
      throw Error(ErrorKind::unavailable, "the master inspector cannot start: " + problem);
    }
  }
  if (!send_all(socket_, request + "\n")) {
    why = std::string("sending the request failed: ") + std::strerror(errno);
  } else if (read_line_locked(deadline, reply, why)) {
    return true;
  }
  ++failures_;
  return false;
}

catalog::ShardStorageFunction Inspector::shard_storage_function() {
  return [this](const std::string& file_path, const std::string& dataset_path) {
    return shard_storage(file_path, dataset_path);
  };
}

catalog::ShardStorage Inspector::shard_storage(const std::string& file_path, const std::string& dataset_path) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string where = file_path + ":" + dataset_path;
  std::string reply, why;
  if (exchange_locked(storage_request(file_path, dataset_path), options_.storage_deadline, reply, why)) {
    try {
      return parse_storage_reply(reply);
    } catch (const ProtocolError& e) {
      why = e.what();
      ++failures_;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::internal) throw;  // the worker's typed answer about the file
      why = e.what();                              // the worker refused our request
      ++failures_;
    }
  }
  stop_worker_locked(why + " while reading the storage of " + where);
  throw Error(ErrorKind::corrupt_data, "the inspector stopped while reading the storage of " + where + " (" + why + ")");
}

catalog::Acquisition Inspector::failure_locked(const std::string& master_path, const catalog::SignatureEntry& master,
                                               const std::string& why) {
  stop_worker_locked(why + " while inspecting " + master_path);
  catalog::Acquisition acquisition = catalog::named_acquisition(master_path);
  acquisition.status = {false, stopped_reason(acquisition.master_path),
                        "Wait for the master writer to close or flush the file, then poll again; recopy it if the "
                        "error persists."};
  acquisition.signature = {master};
  acquisition.size_bytes = master.exists && master.size_bytes > 0 ? static_cast<std::uint64_t>(master.size_bytes) : 0;
  remembered_[acquisition.master_path] = Remembered{master, acquisition};
  spdlog::error("{}; not retried until the file changes", acquisition.status.reason);
  return acquisition;
}

catalog::Acquisition Inspector::inspect(const std::string& master_path) {
  const std::string path = catalog::named_acquisition(master_path).master_path;
  std::lock_guard<std::mutex> lock(mutex_);
  catalog::SignatureEntry master_entry;
  master_entry.path = path;
  master_entry = catalog::restat_signature({master_entry}).front();
  const auto known = remembered_.find(path);
  if (known != remembered_.end()) {
    if (known->second.master == master_entry) return known->second.acquisition;
    remembered_.erase(known);  // the file changed: try it again
  }

  std::string reply, why;
  if (!exchange_locked(inspect_request(path), options_.deadline, reply, why)) {
    return failure_locked(path, master_entry, why);
  }
  try {
    return parse_reply(reply, path);
  } catch (const std::exception& e) {
    ++failures_;
    return failure_locked(path, master_entry, e.what());
  }
}

}  // namespace quantem::inspector
