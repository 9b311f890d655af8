#include "quantem/inspector/inspector.hpp"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <future>
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

std::size_t default_inspect_workers(std::size_t limit) {
  const unsigned cores = std::thread::hardware_concurrency();
  return std::max<std::size_t>(1, std::min<std::size_t>(limit, cores == 0 ? 1 : cores));
}

// Spawns the workers from one long-lived thread: PR_SET_PDEATHSIG fires when
// the *thread* that created the child ends, and requests come from threads
// that come and go (a catalog build's, an HTTP worker's).
class Inspector::Spawner {
 public:
  Spawner() : thread_([this] { loop(); }) {}
  ~Spawner() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  Spawner(const Spawner&) = delete;
  Spawner& operator=(const Spawner&) = delete;

  // Runs `task` on the spawner thread and returns its result.
  int run(std::function<int()> task) {
    std::packaged_task<int()> packaged(std::move(task));
    auto result = packaged.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(packaged));
    }
    wake_.notify_one();
    return result.get();
  }

 private:
  void loop() {
    pthread_setname_np(pthread_self(), "quantem-spawn");
    while (true) {
      std::packaged_task<int()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return done_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<int()>> queue_;
  bool done_ = false;
  std::thread thread_;  // last: started once the rest exists
};

Inspector::Inspector(InspectorOptions options) : options_([&] {
  options.workers = std::max<std::size_t>(1, options.workers);
  options.strikes_to_condemn = std::max(1u, options.strikes_to_condemn);
  return options;
}()), spawner_(std::make_unique<Spawner>()), slots_(options_.workers) {}

Inspector::~Inspector() {
  std::vector<pid_t> running;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (auto& slot : slots_) {
      if (slot.pid <= 0) continue;
      ::close(slot.socket);  // the worker reads end of input and exits
      slot.socket = -1;
      running.push_back(slot.pid);
      slot.pid = 0;
    }
  }
  for (const pid_t pid : running) reap(pid, kExitGrace);
}

void Inspector::shutdown() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) return;
  stopping_ = true;
  for (auto& slot : slots_) {
    if (slot.pid <= 0) continue;
    // A pid is reaped only after it is cleared under this lock, so it is still ours.
    ::kill(slot.pid, SIGKILL);
    if (slot.busy) {
      ::shutdown(slot.socket, SHUT_RDWR);  // the request in flight ends now; its caller reaps
    } else {
      ::close(slot.socket);
      slot.socket = -1;
      reap(slot.pid, std::chrono::milliseconds(0));
      slot.pid = 0;
    }
  }
  slot_freed_.notify_all();
}

void Inspector::throw_if_stopping() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) throw Error(ErrorKind::unavailable, "the master inspector is stopping");
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
  for (const auto& slot : slots_)
    if (slot.pid > 0) return slot.pid;
  return 0;
}
std::vector<pid_t> Inspector::worker_pids() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<pid_t> pids;
  for (const auto& slot : slots_)
    if (slot.pid > 0) pids.push_back(slot.pid);
  return pids;
}

void Inspector::forget_failures() {
  std::lock_guard<std::mutex> lock(mutex_);
  remembered_.clear();
}

bool Inspector::forget_failure(const std::string& master_path) {
  const std::string path = catalog::named_acquisition(master_path).master_path;
  std::lock_guard<std::mutex> lock(mutex_);
  return remembered_.erase(path) > 0;
}

std::size_t Inspector::lease_slot() {
  std::unique_lock<std::mutex> lock(mutex_);
  std::size_t chosen = slots_.size();
  slot_freed_.wait(lock, [&] {
    if (stopping_) return true;
    // A free slot with a running worker first: no start-up cost.
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].busy) continue;
      if (chosen == slots_.size() || (slots_[chosen].pid <= 0 && slots_[i].pid > 0)) chosen = i;
    }
    return chosen != slots_.size();
  });
  if (stopping_) throw Error(ErrorKind::unavailable, "the master inspector is stopping");
  slots_[chosen].busy = true;
  return chosen;
}

void Inspector::release_slot(std::size_t slot) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slots_[slot].busy = false;
  }
  slot_freed_.notify_one();
}

namespace {
// The master's signature as it stands now (what a remembered verdict was kept for).
catalog::SignatureEntry master_signature(const std::string& master_path) {
  catalog::SignatureEntry entry;
  entry.path = master_path;
  return catalog::restat_signature({entry}).front();
}

// Gives a leased slot back however the request ends.
template <typename Release>
struct SlotLease {
  Release release;
  ~SlotLease() { release(); }
};
template <typename Release>
SlotLease<Release> make_lease(Release release) {
  return SlotLease<Release>{std::move(release)};
}
}  // namespace

bool Inspector::start_worker(std::size_t index, std::string& problem) {
  Slot& slot = slots_[index];
  // Rate limit: a worker that dies at once is not restarted in a tight loop.
  const auto earliest = slot.last_start + options_.restart_interval;
  const auto now = std::chrono::steady_clock::now();
  if (slot.last_start != std::chrono::steady_clock::time_point{} && now < earliest) {
    std::this_thread::sleep_for(earliest - now);
  }
  slot.last_start = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++starts_;
  }

  int sockets[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0) {
    problem = std::string("socketpair failed: ") + std::strerror(errno);
    return false;
  }
  std::vector<std::string> arguments = {"quantem-gpu", "inspect-worker", "--parent-pid", std::to_string(::getpid())};
  if (options_.address_space_limit_bytes != 0) {
    arguments.push_back("--address-space-limit");
    arguments.push_back(std::to_string(options_.address_space_limit_bytes));
  }
  pid_t pid = 0;
  const int spawned = spawner_->run([&] {
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
    std::vector<char*> argv;
    for (auto& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);
    const int result = ::posix_spawn(&pid, options_.executable.c_str(), &actions, &attributes, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    return result;
  });
  ::close(sockets[1]);
  if (spawned != 0) {
    ::close(sockets[0]);
    problem = "cannot start " + options_.executable + ": " + std::strerror(spawned);
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slot.pid = pid;
    slot.socket = sockets[0];
    slot.buffer.clear();
    if (stopping_) ::kill(pid, SIGKILL);  // shutdown() ran while this one started
  }
  std::string hello, why;
  bool timed_out = false;
  if (!read_line(index, options_.deadline, hello, why, timed_out) || hello != kWorkerHello) {
    problem = why.empty() ? "it did not greet (got '" + hello.substr(0, 200) + "')" : why;
    stop_worker(index, problem);
    return false;
  }
  spdlog::debug("inspector: worker {} started", pid);
  return true;
}

void Inspector::stop_worker(std::size_t index, const std::string& why) {
  Slot& slot = slots_[index];
  pid_t pid = 0;
  bool quiet = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pid = slot.pid;
    if (pid <= 0) return;
    quiet = stopping_;
    slot.pid = 0;
    ::close(slot.socket);
    slot.socket = -1;
    slot.buffer.clear();
  }
  ::kill(pid, SIGKILL);
  const std::string ended = reap(pid, std::chrono::milliseconds(0));
  if (quiet) {
    spdlog::debug("inspector: worker {} stopped for the shutdown ({})", pid, ended);
  } else {
    spdlog::warn("inspector: worker {} stopped ({}): {}", pid, ended, why);
  }
}

bool Inspector::read_line(std::size_t index, std::chrono::milliseconds limit, std::string& line, std::string& why,
                          bool& timed_out) {
  Slot& slot = slots_[index];
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char chunk[65536];
  timed_out = false;
  while (true) {
    const auto newline = slot.buffer.find('\n');
    if (newline != std::string::npos) {
      line = slot.buffer.substr(0, newline);
      slot.buffer.erase(0, newline + 1);
      return true;
    }
    if (slot.buffer.size() > kMaxLineBytes) {
      why = "a reply line longer than " + std::to_string(kMaxLineBytes) + " bytes";
      return false;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      why = "no answer within " + std::to_string(limit.count()) + " ms";
      timed_out = true;
      return false;
    }
    pollfd readable{slot.socket, POLLIN, 0};
    const int ready = ::poll(&readable, 1, static_cast<int>(std::min<std::int64_t>(left.count() + 1, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      why = std::string("poll failed: ") + std::strerror(errno);
      return false;
    }
    if (ready == 0) continue;  // the deadline check above ends it
    const ssize_t n = ::recv(slot.socket, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      why = n == 0 ? "the worker closed its output (it died)" : std::string("recv failed: ") + std::strerror(errno);
      return false;
    }
    slot.buffer.append(chunk, static_cast<std::size_t>(n));
  }
}

namespace {
// An idle worker never writes: a readable, hung-up or failed socket means it died.
bool idle_worker_gone(int socket) {
  pollfd entry{socket, POLLIN | POLLRDHUP, 0};
  return ::poll(&entry, 1, 0) != 0;
}
}  // namespace

void Inspector::ensure_worker(std::size_t index) {
  if (slots_[index].pid > 0) return;
  std::string problem;
  bool started = false;
  for (int attempt = 0; attempt < kStartAttempts && !started; ++attempt) {
    throw_if_stopping();
    started = start_worker(index, problem);
  }
  if (!started) {
    throw_if_stopping();
    std::lock_guard<std::mutex> lock(mutex_);
    ++failures_;
    throw Error(ErrorKind::unavailable, "the master inspector cannot start: " + problem);
  }
}

Inspector::Outcome Inspector::round_trip(std::size_t index, const std::string& request,
                                         std::chrono::milliseconds deadline, std::string& reply, std::string& why) {
  // A worker that died while idle (killed, out of memory) is replaced before
  // the request: its death says nothing about the request's file. So is one
  // that dies before taking the request (the send fails).
  bool sent = false;
  for (int attempt = 0; attempt < 2 && !sent; ++attempt) {
    if (slots_[index].pid > 0 && idle_worker_gone(slots_[index].socket)) {
      stop_worker(index, "it had died while idle; replaced before the next request");
    }
    ensure_worker(index);
    sent = send_all(slots_[index].socket, request + "\n");
    if (!sent) {
      why = std::string("sending the request failed: ") + std::strerror(errno);
      stop_worker(index, why + "; replaced before the request");
    }
  }
  bool timed_out = false;
  if (sent && read_line(index, deadline, reply, why, timed_out)) return Outcome::answered;
  std::lock_guard<std::mutex> lock(mutex_);
  ++failures_;
  if (!sent) return Outcome::not_sent;
  return timed_out ? Outcome::missed_deadline : Outcome::died;
}

catalog::ShardStorageFunction Inspector::shard_storage_function() {
  return [this](const std::string& file_path, const std::string& dataset_path) {
    return shard_storage(file_path, dataset_path);
  };
}

template <class Parse>
auto Inspector::ask_worker(const std::string& request, std::chrono::milliseconds deadline, const std::string& what,
                           const Parse& parse) -> decltype(parse(std::string())) {
  const std::size_t slot = lease_slot();
  auto lease = make_lease([this, slot] { release_slot(slot); });
  std::string reply, why;
  if (round_trip(slot, request, deadline, reply, why) == Outcome::answered) {
    try {
      return parse(reply);
    } catch (const ProtocolError& e) {
      why = e.what();
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::internal) throw;  // the worker's typed answer about the file
      why = e.what();                              // the worker refused our request
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++failures_;
  }
  stop_worker(slot, why + " while reading " + what);
  throw_if_stopping();
  throw Error(ErrorKind::corrupt_data, "the inspector stopped while reading " + what + " (" + why + ")");
}

catalog::ShardStorage Inspector::shard_storage(const std::string& file_path, const std::string& dataset_path) {
  return ask_worker(storage_request(file_path, dataset_path), options_.storage_deadline,
                    "the storage of " + file_path + ":" + dataset_path,
                    [](const std::string& reply) { return parse_storage_reply(reply); });
}

Inspector::MetadataFunction Inspector::master_metadata_function() {
  return [this](const std::string& master_path) { return master_metadata(master_path); };
}

catalog::MasterMetadata Inspector::master_metadata(const std::string& master_path) {
  const std::string path = catalog::named_acquisition(master_path).master_path;
  throw_if_stopping();
  if (const auto condemned = remembered_verdict(path, master_signature(path))) {
    throw Error(ErrorKind::corrupt_data, condemned->status.reason);
  }
  return ask_worker(metadata_request(path), options_.deadline, "the metadata of " + path,
                    [&](const std::string& reply) { return parse_metadata_reply(reply, path); });
}

std::optional<catalog::Acquisition> Inspector::remembered_verdict(const std::string& master_path,
                                                                  const catalog::SignatureEntry& master) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto known = remembered_.find(master_path);
  if (known == remembered_.end()) return std::nullopt;
  if (known->second.master == master) return known->second.acquisition;
  remembered_.erase(known);  // the file changed: try it again
  return std::nullopt;
}

catalog::Acquisition Inspector::condemn(const std::string& master_path, const catalog::SignatureEntry& master,
                                        const std::string& why) {
  catalog::Acquisition acquisition = catalog::named_acquisition(master_path);
  acquisition.status = {false, stopped_reason(acquisition.master_path),
                        "Wait for the master writer to close or flush the file, then poll again; recopy it if the "
                        "error persists."};
  acquisition.signature = {master};
  acquisition.size_bytes = master.exists && master.size_bytes > 0 ? static_cast<std::uint64_t>(master.size_bytes) : 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    remembered_[acquisition.master_path] = Remembered{master, acquisition};
  }
  spdlog::error("{} ({}); not retried until the file changes or the catalog is refreshed", acquisition.status.reason,
                why);
  return acquisition;
}

std::optional<catalog::Acquisition> Inspector::inspect_once(const std::string& path, std::string& why,
                                                            bool& timed_out, bool& sent) {
  const std::size_t slot = lease_slot();
  auto lease = make_lease([this, slot] { release_slot(slot); });
  std::string reply;
  const Outcome outcome = round_trip(slot, inspect_request(path), options_.deadline, reply, why);
  timed_out = outcome == Outcome::missed_deadline;
  sent = outcome != Outcome::not_sent;
  if (outcome == Outcome::answered) {
    try {
      return parse_reply(reply, path);
    } catch (const std::exception& e) {
      why = e.what();
      std::lock_guard<std::mutex> lock(mutex_);
      ++failures_;
    }
  }
  stop_worker(slot, why + " while inspecting " + path);
  return std::nullopt;
}

catalog::Acquisition Inspector::inspect(const std::string& master_path) {
  const std::string path = catalog::named_acquisition(master_path).master_path;
  throw_if_stopping();
  const catalog::SignatureEntry master_entry = master_signature(path);
  if (auto condemned = remembered_verdict(path, master_entry)) return std::move(*condemned);
  for (unsigned strikes = 1;; ++strikes) {
    std::string why;
    bool timed_out = false;
    bool sent = true;
    if (auto acquisition = inspect_once(path, why, timed_out, sent)) return std::move(*acquisition);
    throw_if_stopping();  // a worker stopped for the shutdown says nothing about the file
    if (!sent) {  // no worker took the request: nothing against the master
      throw Error(ErrorKind::unavailable, "the master inspector cannot take requests: " + why);
    }
    if (timed_out || strikes >= options_.strikes_to_condemn) return condemn(path, master_entry, why);
    spdlog::warn("inspector: {} while inspecting {} (strike {} of {}); trying it again on a fresh worker", why, path,
                 strikes, options_.strikes_to_condemn);
  }
}

}  // namespace quantem::inspector
