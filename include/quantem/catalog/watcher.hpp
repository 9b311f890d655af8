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
// Relying on a watcher instead of stat()ing (CatalogService's resolve): a
// caller may skip its own stat of a file only when reports_changes_in() holds
// for the file's directory, nothing is queued (has_unread_changes() false)
// and every read begun (reads_begun()) has been applied by the consumer. A
// change made before the caller's check is then either queued, being read, or
// already applied. inotify qualifies for directories it watches on local
// filesystems; it does not see writes through an mmap or through a hard link
// in an unwatched directory, nor writes by other hosts (network filesystems
// report false). Polling never qualifies (it sees a change a period late).
#include <atomic>
#include <chrono>
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

// inotify on every directory under `folder` (symlinked directories are not
// followed). Throws IoError when inotify cannot be used (no kernel support,
// the per-user watch limit reached, the folder cannot be watched).
std::unique_ptr<Watcher> make_inotify_watcher(const std::string& folder);

// Stats the tree once per `period`. Never throws.
std::unique_ptr<Watcher> make_polling_watcher(const std::string& folder, std::chrono::milliseconds period);

// inotify, or polling (logged) when inotify cannot be used.
std::unique_ptr<Watcher> make_watcher(const std::string& folder, std::chrono::milliseconds polling_period);

// For tests: push changes, then the consumer's next wait() returns them.
class FakeWatcher : public Watcher {
 public:
  std::string kind() const override { return "fake"; }
  FileChanges wait(std::chrono::milliseconds timeout) override;
  void interrupt() override;
  bool reports_changes_in(const std::string& directory) const override;
  bool has_unread_changes() const override;
  // Makes reports_changes_in() answer true for every directory (a test that
  // pushes every change it makes).
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
