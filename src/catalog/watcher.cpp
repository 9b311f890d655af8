#include "quantem/catalog/watcher.hpp"

#include <dirent.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/statfs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include <spdlog/spdlog.h>

#include "quantem/core/error.hpp"

namespace quantem::catalog {

const char* file_event_name(FileEvent event) noexcept {
  switch (event) {
    case FileEvent::created: return "created";
    case FileEvent::written: return "written";
    case FileEvent::write_closed: return "write_closed";
    case FileEvent::attributes: return "attributes";
    case FileEvent::removed: return "removed";
  }
  return "unknown";
}

namespace {

std::string join_path(const std::string& directory, const std::string& name) {
  if (!directory.empty() && directory.back() == '/') return directory + name;
  return directory + "/" + name;
}

bool is_real_directory(const std::string& path, unsigned char d_type) {
  if (d_type == DT_DIR) return true;
  if (d_type != DT_UNKNOWN) return false;  // symlinks (DT_LNK) to directories are not followed
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

// Names of a directory's entries with their d_type; empty when it cannot be read.
std::vector<std::pair<std::string, unsigned char>> list_directory(const std::string& directory) {
  std::vector<std::pair<std::string, unsigned char>> entries;
  DIR* handle = ::opendir(directory.c_str());
  if (!handle) return entries;
  while (const dirent* entry = ::readdir(handle)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    entries.emplace_back(name, entry->d_type);
  }
  ::closedir(handle);
  return entries;
}

// Filesystems whose files other hosts (or a userspace server) may change
// without the local kernel generating inotify events.
bool is_network_filesystem(const std::string& directory) {
  struct statfs info {};
  if (::statfs(directory.c_str(), &info) != 0) return true;  // unsure: not trusted
  switch (static_cast<std::uint64_t>(info.f_type)) {
    case 0x6969:      // NFS
    case 0x517B:      // SMB
    case 0xFF534D42:  // CIFS
    case 0xFE534D42:  // SMB2
    case 0x65735546:  // FUSE (sshfs, ...)
    case 0x00C36400:  // Ceph
    case 0x0BD00BD0:  // Lustre
    case 0x47504653:  // GPFS
    case 0x013111A8:  // IBRIX
    case 0x6B414653:  // AFS
    case 0x5346414F:  // OpenAFS
    case 0x73757245:  // Coda
    case 0x19830326:  // FhGFS / BeeGFS
    case 0x01021997:  // v9fs (9p)
      return true;
    default:
      return false;
  }
}

// ---- tree snapshots (polling) -----------------------------------------------------

struct FileState {
  bool is_directory = false;
  std::int64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;
  std::uint64_t inode = 0;
  std::uint64_t device = 0;
};
using Snapshot = std::map<std::string, FileState>;

// Everything below `directory` (not the directory itself), by absolute path.
void scan_directory(const std::string& directory, Snapshot& snapshot, int depth = 0) {
  if (depth > 64) return;
  for (const auto& [name, type] : list_directory(directory)) {
    const std::string path = join_path(directory, name);
    const bool is_directory = is_real_directory(path, type);
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) continue;  // vanished, or a dangling link
    FileState state;
    state.is_directory = is_directory;
    state.size = info.st_size;
    state.mtime_ns = static_cast<std::int64_t>(info.st_mtim.tv_sec) * 1000000000LL + info.st_mtim.tv_nsec;
    state.ctime_ns = static_cast<std::int64_t>(info.st_ctim.tv_sec) * 1000000000LL + info.st_ctim.tv_nsec;
    state.inode = info.st_ino;
    state.device = info.st_dev;
    snapshot[path] = state;
    if (is_directory) scan_directory(path, snapshot, depth + 1);
  }
}

// Appends what differs between two scans of one tree to `out`.
void diff_snapshots(const Snapshot& before, const Snapshot& now, FileChanges& out) {
  for (const auto& [path, state] : now) {
    auto old_state = before.find(path);
    if (old_state == before.end()) {
      out.changes.push_back({path, FileEvent::created, state.is_directory});
      continue;
    }
    if (state.is_directory) continue;  // a directory's own times change with its entries
    const FileState& old = old_state->second;
    if (state.size != old.size || state.mtime_ns != old.mtime_ns || state.inode != old.inode ||
        state.device != old.device) {
      out.changes.push_back({path, FileEvent::written, false});
    } else if (state.ctime_ns != old.ctime_ns) {
      out.changes.push_back({path, FileEvent::attributes, false});
    }
  }
  for (const auto& [path, state] : before) {
    if (!now.count(path)) out.changes.push_back({path, FileEvent::removed, state.is_directory});
  }
}

bool is_inside(const std::string& path, const std::string& directory) {
  return path == directory || (path.size() > directory.size() && path.compare(0, directory.size(), directory) == 0 &&
                               path[directory.size()] == '/');
}

// ---- inotify -------------------------------------------------------------------

class InotifyWatcher final : public Watcher {
 public:
  InotifyWatcher(std::string folder, InotifyOptions options)
      : folder_(std::move(folder)), options_(options) {
    while (folder_.size() > 1 && folder_.back() == '/') folder_.pop_back();
    options_.poll_period = std::max(options_.poll_period, std::chrono::milliseconds(1));
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ < 0) throw IoError(std::string("inotify is not available: ") + std::strerror(errno));
    wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_ < 0) {
      const int error = errno;
      ::close(fd_);
      throw IoError(std::string("eventfd failed: ") + std::strerror(error));
    }
    try {
      folder_identity_ = identity_of(folder_);
      if (!folder_identity_) throw IoError("cannot watch " + folder_ + ": not a directory");
      watch_tree(folder_, nullptr, true);
    } catch (...) {
      ::close(fd_);
      ::close(wake_);
      throw;
    }
    next_poll_ = std::chrono::steady_clock::now() + options_.poll_period;
  }
  ~InotifyWatcher() override {
    ::close(fd_);
    ::close(wake_);
  }

  std::string kind() const override { return "inotify"; }

  void interrupt() override {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = ::write(wake_, &one, sizeof one);
  }

  bool reports_changes_in(const std::string& directory) const override {
    std::lock_guard<std::mutex> lock(directories_mutex_);
    if (!folder_identity_) return false;
    for (const auto& [wd, watched] : directories_) {
      if (watched.path == directory) return watched.local;
    }
    return false;
  }

  bool reports_every_change() const override {
    std::lock_guard<std::mutex> lock(directories_mutex_);
    return folder_identity_ && polled_.empty() &&
           std::all_of(directories_.begin(), directories_.end(), [](const auto& d) { return d.second.local; });
  }

  WatcherHealth health() const override {
    WatcherHealth health;
    health.kind = kind();
    health.poll_period = options_.poll_period;
    std::lock_guard<std::mutex> lock(directories_mutex_);
    health.watched_directories = directories_.size();
    for (const auto& [root, snapshot] : polled_) {
      health.polled_directories += 1 + static_cast<std::size_t>(std::count_if(
                                           snapshot.begin(), snapshot.end(), [](const auto& e) { return e.second.is_directory; }));
    }
    health.folder_present = folder_identity_.has_value();
    health.refollows = refollows_;
    return health;
  }

  bool has_unread_changes() const override {
    pollfd fds[1] = {{fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 1, 0);
    return ready != 0;  // readable, or an error: unsure
  }

  FileChanges wait(std::chrono::milliseconds timeout) override {
    FileChanges out;
    follow_folder(out);
    poll_if_due(out);
    if (!out.empty()) return out;
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, static_cast<int>(wait_limit(timeout).count()));
    if (ready <= 0) {  // timeout or EINTR
      poll_if_due(out);
      return out;
    }
    if (fds[1].revents & POLLIN) {
      std::uint64_t count = 0;
      [[maybe_unused]] const ssize_t got = ::read(wake_, &count, sizeof count);
      return out;
    }
    read_events(out);
    return out;
  }

 private:
  static constexpr std::uint32_t kMask = IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB | IN_DELETE |
                                         IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR |
                                         IN_EXCL_UNLINK;
  using Identity = std::pair<std::uint64_t, std::uint64_t>;  // device, inode

  static std::optional<Identity> identity_of(const std::string& path) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) return std::nullopt;
    return Identity{info.st_dev, info.st_ino};
  }

  // The poll() timeout: the caller's, shortened to the next scan of polled directories.
  std::chrono::milliseconds wait_limit(std::chrono::milliseconds timeout) const {
    auto limit = std::min<std::chrono::milliseconds>(timeout, std::chrono::milliseconds(1 << 30));
    if (polled_.empty()) return limit;
    const auto until_poll = std::chrono::duration_cast<std::chrono::milliseconds>(next_poll_ - std::chrono::steady_clock::now());
    return std::max(std::chrono::milliseconds(0), std::min(limit, until_poll + std::chrono::milliseconds(1)));
  }

  void read_events(FileChanges& out) {
    alignas(inotify_event) char buffer[64 * 1024];
    begin_read();  // before the queue empties (see Watcher::reads_begun)
    while (true) {
      const ssize_t length = ::read(fd_, buffer, sizeof buffer);
      if (length <= 0) break;  // EAGAIN: drained
      for (ssize_t offset = 0; offset < length;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + offset);
        offset += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
        handle(*event, out);
      }
    }
    poll_if_due(out);
  }

  bool watch_limit_reached() const {
    std::lock_guard<std::mutex> lock(directories_mutex_);
    return options_.watch_limit > 0 && directories_.size() >= options_.watch_limit;
  }

  // Watches `directory` and every real directory below it; when `out` is set,
  // reports what is already inside as created (it appeared before its watch).
  // A directory that inotify cannot watch for want of watches is polled
  // instead, with everything below it.
  void watch_tree(const std::string& directory, FileChanges* out, bool is_root) {
    const bool limited = watch_limit_reached();
    const int wd = limited ? -1 : ::inotify_add_watch(fd_, directory.c_str(), kMask);
    if (wd < 0) {
      const int error = limited ? ENOSPC : errno;
      if (error == ENOSPC || error == ENOMEM) {
        poll_tree(directory, out, limited ? "the configured watch limit" : std::strerror(error));
        return;
      }
      if (is_root) throw IoError("cannot watch " + directory + " with inotify: " + std::strerror(error));
      spdlog::debug("not watching {}: {}", directory, std::strerror(error));
      return;
    }
    const bool local = !is_network_filesystem(directory);
    {
      std::lock_guard<std::mutex> lock(directories_mutex_);
      directories_[wd] = WatchedDirectory{directory, local};
    }
    for (const auto& [name, type] : list_directory(directory)) {
      const std::string path = join_path(directory, name);
      const bool is_directory = is_real_directory(path, type);
      if (out) out->changes.push_back({path, FileEvent::created, is_directory});
      if (is_directory) watch_tree(path, out, false);
    }
  }

  void poll_tree(const std::string& directory, FileChanges* out, const std::string& reason) {
    Snapshot snapshot;
    scan_directory(directory, snapshot);
    if (out) {
      for (const auto& [path, state] : snapshot) out->changes.push_back({path, FileEvent::created, state.is_directory});
    }
    std::size_t roots = 0;
    {
      std::lock_guard<std::mutex> lock(directories_mutex_);
      polled_[directory] = std::move(snapshot);
      roots = polled_.size();
    }
    if (!limit_logged_) {
      limit_logged_ = true;
      spdlog::warn("inotify cannot watch every directory of {} ({}): {} and what is below it are polled every {} ms "
                   "(raise fs.inotify.max_user_watches to watch them; /api/health/ready counts the polled directories)",
                   folder_, reason, directory, options_.poll_period.count());
    } else {
      spdlog::debug("polling {} too ({} polled trees)", directory, roots);
    }
  }

  // Scans the polled trees when their period is over and reports what changed.
  void poll_if_due(FileChanges& out) {
    if (polled_.empty() || std::chrono::steady_clock::now() < next_poll_) return;
    std::vector<std::string> roots;
    for (const auto& [root, snapshot] : polled_) roots.push_back(root);
    for (const auto& root : roots) {
      Snapshot now;
      if (identity_of(root)) scan_directory(root, now);
      std::lock_guard<std::mutex> lock(directories_mutex_);
      auto it = polled_.find(root);
      if (it == polled_.end()) continue;
      diff_snapshots(it->second, now, out);
      it->second = std::move(now);
    }
    next_poll_ = std::chrono::steady_clock::now() + options_.poll_period;
  }

  // Drops the watches and polled trees at or below `directory`.
  void forget_tree(const std::string& directory) {
    std::lock_guard<std::mutex> lock(directories_mutex_);
    for (auto it = directories_.begin(); it != directories_.end();) {
      if (is_inside(it->second.path, directory)) {
        ::inotify_rm_watch(fd_, it->first);
        it = directories_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = polled_.begin(); it != polled_.end();) {
      it = is_inside(it->first, directory) ? polled_.erase(it) : std::next(it);
    }
  }

  // Follows the folder by path: when its path names another directory than
  // the one watched (or none), every watch is dropped, the directory now at
  // the path is watched, and everything counts as changed.
  void follow_folder(FileChanges& out) {
    const std::optional<Identity> now = identity_of(folder_);
    {
      std::lock_guard<std::mutex> lock(directories_mutex_);
      if (now == folder_identity_) return;
    }
    begin_read();  // a consumer must not vouch for anything until it has applied this
    forget_tree(folder_);
    {
      std::lock_guard<std::mutex> lock(directories_mutex_);
      folder_identity_ = now;
      ++refollows_;
    }
    out.overflow = true;
    if (!now) {
      spdlog::warn("the data folder {} is gone; watching its path for a directory to come back", folder_);
      return;
    }
    try {
      watch_tree(folder_, nullptr, true);
    } catch (const std::exception& error) {
      poll_tree(folder_, nullptr, error.what());
    }
    spdlog::info("the data folder {} is another directory now: watching the new one", folder_);
  }

  // A watched directory below the folder was moved or deleted as itself:
  // its watches name a path it no longer has.
  void directory_went_away(const std::string& directory, FileChanges& out) {
    forget_tree(directory);
    out.changes.push_back({directory, FileEvent::removed, true});
    if (identity_of(directory)) {
      out.changes.push_back({directory, FileEvent::created, true});
      watch_tree(directory, &out, false);
    }
  }

  bool is_followed(const std::string& path) const {
    std::lock_guard<std::mutex> lock(directories_mutex_);
    return std::any_of(directories_.begin(), directories_.end(), [&](const auto& d) { return d.second.path == path; }) ||
           std::any_of(polled_.begin(), polled_.end(), [&](const auto& p) { return is_inside(path, p.first); });
  }

  void handle(const inotify_event& event, FileChanges& out) {
    if (event.mask & IN_Q_OVERFLOW) {
      out.overflow = true;
      return;
    }
    std::string directory;
    {
      std::lock_guard<std::mutex> lock(directories_mutex_);
      auto it = directories_.find(event.wd);
      if (it == directories_.end()) return;
      directory = it->second.path;
      if ((event.mask & IN_IGNORED) && directory != folder_) {
        directories_.erase(it);
        return;
      }
    }
    if (event.mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_UNMOUNT)) {
      if (directory == folder_) {
        follow_folder(out);
      } else if (event.mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
        directory_went_away(directory, out);
      }
      return;
    }
    const std::string path = event.len > 0 ? join_path(directory, event.name) : directory;
    const bool is_directory = (event.mask & IN_ISDIR) != 0;
    if (event.mask & (IN_CREATE | IN_MOVED_TO)) {
      out.changes.push_back({path, FileEvent::created, is_directory});
      if (is_directory) watch_tree(path, &out, false);
    }
    if (event.mask & IN_MODIFY) out.changes.push_back({path, FileEvent::written, is_directory});
    if (event.mask & IN_CLOSE_WRITE) out.changes.push_back({path, FileEvent::write_closed, is_directory});
    if (event.mask & IN_ATTRIB) {
      out.changes.push_back({path, FileEvent::attributes, is_directory});
      // A directory that could not be watched (unreadable) may be readable now.
      if (is_directory && event.len > 0 && !is_followed(path)) watch_tree(path, &out, false);
    }
    if (event.mask & (IN_DELETE | IN_MOVED_FROM)) {
      out.changes.push_back({path, FileEvent::removed, is_directory});
      if (is_directory) forget_tree(path);
    }
  }

  std::string folder_;
  InotifyOptions options_;
  int fd_ = -1;
  int wake_ = -1;
  struct WatchedDirectory {
    std::string path;  // absolute
    bool local = false;  // not on a network filesystem
  };
  // Guards what other threads read (reports_changes_in, health); the wait()
  // thread alone changes it.
  mutable std::mutex directories_mutex_;
  std::map<int, WatchedDirectory> directories_;  // by watch descriptor
  std::map<std::string, Snapshot> polled_;       // trees inotify could not watch, by their top directory
  std::optional<Identity> folder_identity_;      // of the directory watched at the folder's path; none: gone
  std::uint64_t refollows_ = 0;
  std::chrono::steady_clock::time_point next_poll_;
  bool limit_logged_ = false;
};

// ---- polling -------------------------------------------------------------------

class PollingWatcher final : public Watcher {
 public:
  PollingWatcher(std::string folder, std::chrono::milliseconds period)
      : folder_(std::move(folder)), period_(std::max(period, std::chrono::milliseconds(1))) {
    scan_directory(folder_, snapshot_);
    next_scan_ = std::chrono::steady_clock::now() + period_;
  }

  std::string kind() const override { return "polling"; }

  WatcherHealth health() const override {
    WatcherHealth health;
    health.kind = kind();
    health.poll_period = period_;
    return health;
  }

  void interrupt() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      interrupted_ = true;
    }
    wake_.notify_all();
  }

  FileChanges wait(std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (std::chrono::steady_clock::now() >= next_scan_) {
        Snapshot now;
        scan_directory(folder_, now);
        FileChanges changes;
        diff_snapshots(snapshot_, now, changes);
        snapshot_ = std::move(now);
        next_scan_ = std::chrono::steady_clock::now() + period_;
        if (!changes.empty()) return changes;
      }
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_until(lock, std::min(deadline, next_scan_), [&] { return interrupted_; });
      if (interrupted_) {
        interrupted_ = false;
        return {};
      }
      if (std::chrono::steady_clock::now() >= deadline && std::chrono::steady_clock::now() < next_scan_) return {};
    }
  }

 private:
  const std::string folder_;
  const std::chrono::milliseconds period_;
  Snapshot snapshot_;
  std::chrono::steady_clock::time_point next_scan_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool interrupted_ = false;
};

}  // namespace

std::unique_ptr<Watcher> make_inotify_watcher(const std::string& folder, InotifyOptions options) {
  return std::make_unique<InotifyWatcher>(folder, options);
}

std::unique_ptr<Watcher> make_polling_watcher(const std::string& folder, std::chrono::milliseconds period) {
  return std::make_unique<PollingWatcher>(folder, period);
}

std::unique_ptr<Watcher> make_watcher(const std::string& folder, std::chrono::milliseconds polling_period) {
  InotifyOptions options;
  options.poll_period = polling_period;
  if (const char* limit = std::getenv("QUANTEM_WATCH_LIMIT"); limit && *limit) {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(limit, &end, 10);
    if (end && *end == '\0') {
      options.watch_limit = static_cast<std::size_t>(value);
    } else {
      spdlog::warn("QUANTEM_WATCH_LIMIT={} is not a number of watches; ignored", limit);
    }
  }
  try {
    return make_inotify_watcher(folder, options);
  } catch (const std::exception& error) {
    spdlog::warn("{}; watching {} by polling every {} ms instead", error.what(), folder, polling_period.count());
    return make_polling_watcher(folder, polling_period);
  }
}

// ---- fake ----------------------------------------------------------------------

FileChanges FakeWatcher::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return !pending_.empty() || interrupted_; });
  interrupted_ = false;
  if (!pending_.empty()) begin_read();
  FileChanges out = std::move(pending_);
  pending_ = FileChanges{};
  ++waits_;
  return out;
}

void FakeWatcher::interrupt() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    interrupted_ = true;
  }
  changed_.notify_all();
}

void FakeWatcher::push(const std::string& path, FileEvent event, bool is_directory) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.changes.push_back({path, event, is_directory});
  }
  changed_.notify_all();
}

void FakeWatcher::push_overflow() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.overflow = true;
  }
  changed_.notify_all();
}

bool FakeWatcher::reports_changes_in(const std::string&) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reports_every_change_;
}

bool FakeWatcher::reports_every_change() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reports_every_change_;
}

bool FakeWatcher::has_unread_changes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !pending_.empty();
}

void FakeWatcher::set_reports_every_change(bool value) {
  std::lock_guard<std::mutex> lock(mutex_);
  reports_every_change_ = value;
}

std::size_t FakeWatcher::waits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waits_;
}

}  // namespace quantem::catalog
