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
#include <cstring>
#include <map>
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

// ---- inotify -------------------------------------------------------------------

class InotifyWatcher final : public Watcher {
 public:
  explicit InotifyWatcher(std::string folder) : folder_(std::move(folder)) {
    while (folder_.size() > 1 && folder_.back() == '/') folder_.pop_back();
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ < 0) throw IoError(std::string("inotify is not available: ") + std::strerror(errno));
    wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_ < 0) {
      const int error = errno;
      ::close(fd_);
      throw IoError(std::string("eventfd failed: ") + std::strerror(error));
    }
    try {
      watch_tree(folder_, nullptr, true);
    } catch (...) {
      ::close(fd_);
      ::close(wake_);
      throw;
    }
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
    for (const auto& [wd, watched] : directories_) {
      if (watched.path == directory) return watched.local;
    }
    return false;
  }

  bool has_unread_changes() const override {
    pollfd fds[1] = {{fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 1, 0);
    return ready != 0;  // readable, or an error: unsure
  }

  FileChanges wait(std::chrono::milliseconds timeout) override {
    FileChanges out;
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, static_cast<int>(std::min<std::int64_t>(timeout.count(), 1 << 30)));
    if (ready <= 0) return out;  // timeout or EINTR
    if (fds[1].revents & POLLIN) {
      std::uint64_t count = 0;
      [[maybe_unused]] const ssize_t got = ::read(wake_, &count, sizeof count);
      return out;
    }
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
    return out;
  }

 private:
  static constexpr std::uint32_t kMask = IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB | IN_DELETE |
                                         IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR |
                                         IN_EXCL_UNLINK;

  // Watches `directory` and every real directory below it; when `out` is set,
  // reports what is already inside as created (it appeared before its watch).
  void watch_tree(const std::string& directory, FileChanges* out, bool is_root) {
    const int wd = ::inotify_add_watch(fd_, directory.c_str(), kMask);
    if (wd < 0) {
      const int error = errno;
      if (error == ENOSPC || error == ENOMEM || is_root) {
        throw IoError("cannot watch " + directory + " with inotify: " + std::strerror(error) +
                      (error == ENOSPC ? " (raise fs.inotify.max_user_watches)" : ""));
      }
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

  void forget_tree(const std::string& directory) {
    std::lock_guard<std::mutex> lock(directories_mutex_);
    for (auto it = directories_.begin(); it != directories_.end();) {
      const std::string& path = it->second.path;
      const bool inside = path == directory || (path.size() > directory.size() &&
                                                path.compare(0, directory.size(), directory) == 0 &&
                                                path[directory.size()] == '/');
      if (inside) {
        ::inotify_rm_watch(fd_, it->first);
        it = directories_.erase(it);
      } else {
        ++it;
      }
    }
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
      if (event.mask & IN_IGNORED) {
        directories_.erase(it);
        return;
      }
      directory = it->second.path;
    }
    if (event.mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
      if (directory == folder_) out.overflow = true;  // the root itself went away
      return;
    }
    const std::string path = event.len > 0 ? join_path(directory, event.name) : directory;
    const bool is_directory = (event.mask & IN_ISDIR) != 0;
    if (event.mask & (IN_CREATE | IN_MOVED_TO)) {
      out.changes.push_back({path, FileEvent::created, is_directory});
      if (is_directory) {
        try {
          watch_tree(path, &out, false);
        } catch (const std::exception& error) {
          spdlog::warn("{}; changes below it are seen only by the periodic re-walk", error.what());
          out.overflow = true;
        }
      }
    }
    if (event.mask & IN_MODIFY) out.changes.push_back({path, FileEvent::written, is_directory});
    if (event.mask & IN_CLOSE_WRITE) out.changes.push_back({path, FileEvent::write_closed, is_directory});
    if (event.mask & IN_ATTRIB) out.changes.push_back({path, FileEvent::attributes, is_directory});
    if (event.mask & (IN_DELETE | IN_MOVED_FROM)) {
      out.changes.push_back({path, FileEvent::removed, is_directory});
      if (is_directory) forget_tree(path);
    }
  }

  std::string folder_;
  int fd_ = -1;
  int wake_ = -1;
  struct WatchedDirectory {
    std::string path;  // absolute
    bool local = false;  // not on a network filesystem
  };
  mutable std::mutex directories_mutex_;  // reports_changes_in() reads from other threads
  std::map<int, WatchedDirectory> directories_;  // by watch descriptor
};

// ---- polling -------------------------------------------------------------------

class PollingWatcher final : public Watcher {
 public:
  PollingWatcher(std::string folder, std::chrono::milliseconds period)
      : folder_(std::move(folder)), period_(std::max(period, std::chrono::milliseconds(1))) {
    snapshot_ = scan();
    next_scan_ = std::chrono::steady_clock::now() + period_;
  }

  std::string kind() const override { return "polling"; }

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
        FileChanges changes = diff(scan());
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
  struct FileState {
    bool is_directory = false;
    std::int64_t size = 0;
    std::int64_t mtime_ns = 0;
    std::int64_t ctime_ns = 0;
    std::uint64_t inode = 0;
    std::uint64_t device = 0;
  };
  using Snapshot = std::map<std::string, FileState>;

  Snapshot scan() const {
    Snapshot snapshot;
    scan_directory(folder_, snapshot, 0);
    return snapshot;
  }

  static void scan_directory(const std::string& directory, Snapshot& snapshot, int depth) {
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

  FileChanges diff(Snapshot now) {
    FileChanges out;
    for (const auto& [path, state] : now) {
      auto before = snapshot_.find(path);
      if (before == snapshot_.end()) {
        out.changes.push_back({path, FileEvent::created, state.is_directory});
        continue;
      }
      if (state.is_directory) continue;  // a directory's own times change with its entries
      const FileState& old = before->second;
      if (state.size != old.size || state.mtime_ns != old.mtime_ns || state.inode != old.inode ||
          state.device != old.device) {
        out.changes.push_back({path, FileEvent::written, false});
      } else if (state.ctime_ns != old.ctime_ns) {
        out.changes.push_back({path, FileEvent::attributes, false});
      }
    }
    for (const auto& [path, state] : snapshot_) {
      if (!now.count(path)) out.changes.push_back({path, FileEvent::removed, state.is_directory});
    }
    snapshot_ = std::move(now);
    return out;
  }

  const std::string folder_;
  const std::chrono::milliseconds period_;
  Snapshot snapshot_;
  std::chrono::steady_clock::time_point next_scan_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool interrupted_ = false;
};

}  // namespace

std::unique_ptr<Watcher> make_inotify_watcher(const std::string& folder) {
  return std::make_unique<InotifyWatcher>(folder);
}

std::unique_ptr<Watcher> make_polling_watcher(const std::string& folder, std::chrono::milliseconds period) {
  return std::make_unique<PollingWatcher>(folder, period);
}

std::unique_ptr<Watcher> make_watcher(const std::string& folder, std::chrono::milliseconds polling_period) {
  try {
    return make_inotify_watcher(folder);
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
