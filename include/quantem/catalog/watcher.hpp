#pragma once
// Watching a data folder for new, growing, rewritten and vanished files.
//
// A Watcher reports what changed under one folder since its previous wait().
// Three implementations behind one interface:
//  - inotify: a watch on every directory of the tree (new directories are
//    watched as they appear and their files reported as created); it sees
//    writes (IN_MODIFY) and the writer closing the file (IN_CLOSE_WRITE);
//  - polling: stats every file of the tree once per period and reports the
//    differences (size, mtime, ctime, inode, appearance); it cannot see a
//    close, so "being written" ends with a quiet period instead;
//  - FakeWatcher: changes pushed by a test, returned by the next wait(), so a
//    test steps the consumer's loop one turn at a time.
// Watchers never throw from wait() for files that vanish; an overflow (events
// lost, the root replaced) is reported as `overflow`: treat everything as changed.
//
// Following the folder by path: inotify watches inodes, so a data folder
// renamed away (`mv D D.old && cp -a D.old D`) would leave every watch on the
// old directory. The inotify watcher stats the folder's path at every wait()
// and on IN_MOVE_SELF / IN_DELETE_SELF / IN_IGNORED / IN_UNMOUNT of the root;
// when the path names another directory (device, inode) or none, it drops
// every watch, watches the directory now at the path (if any) and reports an
// overflow. A watched directory below the root that is moved or deleted as
// itself is forgotten and, when a directory is at its path again, watched anew.
//
// More directories than inotify watches (ENOSPC, or the watch limit of the
// options, which tests set low): the directories that cannot be watched are
// polled, each with everything below it, every poll_period (their changes
// come from wait() like the others, at most a period late); the first time
// this happens it is logged once as a warning, and health() counts them.
//
// Relying on a watcher instead of stat()ing (CatalogService's resolve): a
// caller may skip its own stat of a file only when reports_changes_in() holds
// for the file's directory, nothing is queued (has_unread_changes() false)
// and every read begun (reads_begun()) has been applied by the consumer. A
// change made before the caller's check is then either queued, being read, or
// already applied. inotify qualifies for directories it watches on local
// filesystems; it does not see writes through an mmap or through a hard link
// in an unwatched directory, nor writes by other hosts (network filesystems
// report false). Polling never qualifies (it sees a change a period late),
// nor do directories polled beyond the watch limit. For what inotify cannot
// see, CatalogService also trusts a watcher for a bounded time only
// (CatalogServiceOptions::identity_recheck_interval).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace quantem::catalog {

enum class FileEvent {
  created,       // a file or directory appeared (created, moved in)
  written,       // its content changed (a writer may still be writing)
  write_closed,  // a writer closed it after writing (inotify only)
  attributes,    // metadata changed (touch, chmod)
  removed,       // deleted or moved away
};
const char* file_event_name(FileEvent event) noexcept;

struct FileChange {
  std::string path;  // absolute
  FileEvent event = FileEvent::written;
  bool is_directory = false;
};

struct FileChanges {
  std::vector<FileChange> changes;  // in the order seen; a path may repeat
  bool overflow = false;
  bool empty() const { return changes.empty() && !overflow; }
};

// What a watcher can see, for /api/health/ready and /metrics.
struct WatcherHealth {
  std::string kind;                    // "inotify", "polling", "fake"; the catalog service adds "starting"
  std::size_t watched_directories = 0;  // with an inotify watch
  std::size_t polled_directories = 0;   // inotify could not watch them (the watch limit): polled
  std::chrono::milliseconds poll_period{0};  // how often polled directories (or everything, polling) are scanned
  bool folder_present = true;           // the data folder's path names a directory now
  std::uint64_t refollows = 0;          // times the folder's path was found to name another directory (or none)
};

class Watcher {
 public:
  virtual ~Watcher() = default;
  virtual std::string kind() const = 0;  // "inotify", "polling", "fake"
  // Waits up to `timeout` for changes under the folder and returns them; an
  // empty result after the timeout or an interrupt().
  virtual FileChanges wait(std::chrono::milliseconds timeout) = 0;
  // Makes a wait() in progress (or the next one) return at once. Thread-safe.
  virtual void interrupt() = 0;

  // Whether every change to a file directly inside `directory` (absolute, as
  // the watcher names it) is reported by a later wait(). Thread-safe.
  virtual bool reports_changes_in(const std::string& directory) const {
    (void)directory;
    return false;
  }
  // Whether every change anywhere under the folder is reported by a later
  // wait() (inotify watching every directory, all local, the folder's path
  // followed). Thread-safe.
  virtual bool reports_every_change() const { return false; }
  virtual WatcherHealth health() const {
    WatcherHealth health;
    health.kind = kind();
    return health;
  }
  // Whether changes may be waiting that no wait() has started to read (one
  // poll() for inotify). Thread-safe; true when unsure.
  virtual bool has_unread_changes() const { return true; }
  // Counts the reads of changes that wait() has begun; incremented before a
  // read starts, so a consumer that records the count after applying a
  // wait()'s result knows when nothing is in flight. Thread-safe.
  std::uint64_t reads_begun() const { return reads_begun_.load(); }

 protected:
  void begin_read() { reads_begun_.fetch_add(1); }

 private:
  std::atomic<std::uint64_t> reads_begun_{0};
};

struct InotifyOptions {
  // How often directories that inotify cannot watch are scanned.
  std::chrono::milliseconds poll_period{std::chrono::seconds(1)};
  // At most this many inotify watches (0: as many as the kernel gives; the
  // daemon reads QUANTEM_WATCH_LIMIT so that tests can reach the limit
  // without changing fs.inotify.max_user_watches).
  std::size_t watch_limit = 0;
};

// inotify on every directory under `folder` (symlinked directories are not
// followed), polling the directories it cannot watch. Throws IoError when
// inotify cannot be used at all (no kernel support, the folder itself cannot
// be watched).
std::unique_ptr<Watcher> make_inotify_watcher(const std::string& folder, InotifyOptions options = {});

// Stats the tree once per `period`. Never throws.
std::unique_ptr<Watcher> make_polling_watcher(const std::string& folder, std::chrono::milliseconds period);

// inotify (directories it cannot watch polled every polling_period, the watch
// limit from QUANTEM_WATCH_LIMIT when set), or polling (logged) when inotify
// cannot be used.
std::unique_ptr<Watcher> make_watcher(const std::string& folder, std::chrono::milliseconds polling_period);

// For tests: push changes, then the consumer's next wait() returns them.
class FakeWatcher : public Watcher {
 public:
  std::string kind() const override { return "fake"; }
  FileChanges wait(std::chrono::milliseconds timeout) override;
  void interrupt() override;
  bool reports_changes_in(const std::string& directory) const override;
  bool has_unread_changes() const override;
  bool reports_every_change() const override;
  // Makes reports_changes_in() and reports_every_change() answer true (a test
  // that pushes every change it makes).
  void set_reports_every_change(bool value);

  void push(const std::string& path, FileEvent event, bool is_directory = false);
  void push_overflow();
  std::size_t waits() const;  // how many wait() calls returned (turns taken)

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  FileChanges pending_;
  bool interrupted_ = false;
  bool reports_every_change_ = false;
  std::size_t waits_ = 0;
};

}  // namespace quantem::catalog
