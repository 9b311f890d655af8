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
#include <chrono>
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

  void push(const std::string& path, FileEvent event, bool is_directory = false);
  void push_overflow();
  std::size_t waits() const;  // how many wait() calls returned (turns taken)

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  FileChanges pending_;
  bool interrupted_ = false;
  std::size_t waits_ = 0;
};

}  // namespace quantem::catalog
