#include "quantem/server/catalog_service.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <future>
#include <set>
#include <unordered_set>

#include <spdlog/spdlog.h>
#include <zlib.h>

#include "quantem/core/clock.hpp"
#include "quantem/catalog/catalog_cache.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/text.hpp"
#include "quantem/protocol/documents.hpp"

namespace quantem::server {

namespace {

constexpr const char* kCookiePrefix = ".quantem-cookie-";

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `path` relative to the data folder `root` ("." for the folder itself).
std::string relative_to_folder(const std::string& root, const std::string& path) {
  if (path == root) return ".";
  if (path.size() > root.size() && path.compare(0, root.size(), root) == 0 && path[root.size()] == '/') {
    return path.substr(root.size() + 1);
  }
  return path;
}

}  // namespace

CatalogServiceOptions watching_catalog_options(std::chrono::milliseconds polling_period) {
  CatalogServiceOptions options;
  options.make_watcher = [polling_period](const std::string& folder) {
    return catalog::make_watcher(folder, polling_period);
  };
  options.watch_thread = true;
  return options;
}

CatalogService::CatalogService(std::string data_folder, CatalogServiceOptions options)
    : data_folder_(std::move(data_folder)), options_(options) {
  if (!options_.make_watcher) return;
  if (options_.watch_thread && options_.watch_after_first_build) {
    watch_thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "quantem-watch");
      if (start_watching_after_first_build()) watch_loop();
    });
    return;
  }
  watcher_owner_ = options_.make_watcher(data_folder_);
  watcher_.store(watcher_owner_.get(), std::memory_order_release);
  if (watcher()) spdlog::info("watching {} ({})", data_folder_, watcher()->kind());
  if (watcher() && options_.watch_thread) {
    watch_thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "quantem-watch");
      watch_loop();
    });
  }
}

void CatalogService::watch_loop() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_ || watching_stopped_) return;
    }
    try {
      watch_turn(options_.watch_turn_timeout);
    } catch (const std::exception& error) {
      spdlog::warn("watching {}: {}", data_folder_, error.what());
      std::this_thread::sleep_for(options_.watch_turn_timeout);
    }
  }
}

bool CatalogService::start_watching_after_first_build() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    build_done_.wait(lock, [&] { return build_attempts_ > 0 || stopping_ || watching_stopped_; });
    if (stopping_ || watching_stopped_) return false;
  }
  const auto started = std::chrono::steady_clock::now();
  std::unique_ptr<catalog::Watcher> made;
  try {
    made = options_.make_watcher(data_folder_);
  } catch (const std::exception& error) {
    spdlog::error("cannot watch {}: {}; changes are found by re-walks and stat() only", data_folder_, error.what());
    watching_unavailable_ = true;
    return false;
  }
  if (!made) {
    watching_unavailable_ = true;
    return false;
  }
  TurnResult turn;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || watching_stopped_) return false;
    watcher_owner_ = std::move(made);
    watcher_.store(watcher_owner_.get(), std::memory_order_release);
    // What changed before the watches existed is unknown: no build so far is vouched for.
    ++change_turns_;
    unchanged_since_stat_.clear();
    poll_all_dirty_ = true;
    turn.change.overflow = true;
    turn.change.masters = masters_named_locked({}, true);
    turn.listeners = listeners_;
  }
  spdlog::info("watching {} ({}, set up in {:.3f} s)", data_folder_, watcher()->kind(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  rewalk_after_change();  // masters that appeared before the watches
  tell_listeners(turn);
  return true;
}

CatalogService::~CatalogService() {
  stop_watching();
  std::thread walker;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    walker = std::move(walker_);
  }
  if (walker.joinable()) walker.join();
  wait_for_cache_write();
}

void CatalogService::stop_watching() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    watching_stopped_ = true;
    listeners_.clear();
  }
  cookie_seen_.notify_all();
  build_done_.notify_all();  // a watch thread waiting for the first build
  if (watcher()) watcher()->interrupt();
  if (watch_thread_.joinable()) watch_thread_.join();
}

std::string CatalogService::watcher_kind() const { return watcher() ? watcher()->kind() : std::string(); }

void CatalogService::on_sources_changed(std::function<void(const SourceChange&)> listener) {
  std::lock_guard<std::mutex> lock(mutex_);
  listeners_.push_back(std::move(listener));
}

std::size_t CatalogService::watch_turn(std::chrono::milliseconds timeout) {
  if (!watcher()) return 0;
  std::lock_guard<std::mutex> turn_lock(turn_mutex_);
  // A turn that fails after the watcher began reading may have lost changes:
  // every verified inspection is forgotten (resolves stat() again).
  struct ForgetUnlessApplied {
    CatalogService& service;
    bool applied = false;
    ~ForgetUnlessApplied() {
      if (applied) return;
      std::lock_guard<std::mutex> lock(service.mutex_);
      service.unchanged_since_stat_.clear();
      ++service.change_turns_;
    }
  } guard{*this};
  const catalog::FileChanges seen = watcher()->wait(timeout);
  const std::uint64_t reads = watcher()->reads_begun();  // every read of this wait() has begun
  TurnResult turn;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!seen.empty()) turn = apply_changes_locked(seen);
    reads_applied_ = reads;
    guard.applied = true;
  }
  if (seen.empty()) return 0;
  cookie_seen_.notify_all();
  if (turn.walk) rewalk_after_change(turn.change.overflow ? nullptr : &turn.change.files);
  if (!turn.change.files.empty() || turn.change.overflow) tell_listeners(turn);
  return seen.changes.size();
}

// What one turn saw: files being written, the masters named, the vouches to
// forget, whether to re-walk.
CatalogService::TurnResult CatalogService::apply_changes_locked(const catalog::FileChanges& seen) {
  TurnResult turn;
  turn.change.overflow = seen.overflow;
  turn.walk = seen.overflow;
  const std::set<std::string> files = note_file_events_locked(seen, turn);
  turn.change.masters = masters_named_locked(files, turn.change.overflow);
  turn.listeners = listeners_;
  forget_vouches_named_locked(files, turn.change.overflow);
  note_poll_changes_locked(seen, turn.change);
  if (!files.empty() || seen.overflow) ++change_turns_;
  return turn;
}

// Cookies seen, files being written, the changed files (each once); a master
// or directory that appeared or vanished asks for a re-walk.
std::set<std::string> CatalogService::note_file_events_locked(const catalog::FileChanges& seen, TurnResult& turn) {
  const auto now = std::chrono::steady_clock::now();
  std::set<std::string> files;
  for (const auto& seen_change : seen.changes) {
    const std::string name = base_name(seen_change.path);
    if (name.rfind(kCookiePrefix, 0) == 0) {
      if (seen_change.event == catalog::FileEvent::created) cookies_seen_.push_back(seen_change.path);
      continue;
    }
    if (files.insert(seen_change.path).second) turn.change.files.push_back(seen_change.path);
    switch (seen_change.event) {
      case catalog::FileEvent::written: writing_[seen_change.path] = now; break;
      case catalog::FileEvent::write_closed:
      case catalog::FileEvent::removed: writing_.erase(seen_change.path); break;
      case catalog::FileEvent::created:
      case catalog::FileEvent::attributes: break;
    }
    const bool master_appeared_or_vanished =
        ends_with(name, "_master.h5") &&
        (seen_change.event == catalog::FileEvent::created || seen_change.event == catalog::FileEvent::removed);
    if (seen_change.is_directory || master_appeared_or_vanished) turn.walk = true;
  }
  for (auto it = writing_.begin(); it != writing_.end();) {
    it = now - it->second >= options_.write_quiet_period ? writing_.erase(it) : std::next(it);
  }
  return files;
}

// Known masters whose signature names one of `files` (or that are one).
std::vector<std::string> CatalogService::masters_named_locked(const std::set<std::string>& files, bool everything) const {
  std::set<std::string> masters;
  auto collect = [&](const std::map<std::string, catalog::Acquisition>& known) {
    for (const auto& [master, inspection] : known) {
      const bool named = everything || files.count(master) ||
                         std::any_of(inspection.signature.begin(), inspection.signature.end(),
                                     [&](const catalog::SignatureEntry& entry) { return files.count(entry.path) > 0; });
      if (named) masters.insert(master);
    }
  };
  for (const auto& [master, polled] : inspections_) {
    const auto& signature = polled.acquisition.signature;
    const bool named = everything || files.count(master) ||
                       std::any_of(signature.begin(), signature.end(),
                                   [&](const catalog::SignatureEntry& entry) { return files.count(entry.path) > 0; });
    if (named) masters.insert(master);
  }
  collect(fresh_);
  for (const auto& master : masters_) {
    if (files.count(master)) masters.insert(master);
  }
  return {masters.begin(), masters.end()};
}

// Resolves stat() again what this turn names: a file of the signature, the
// master, or a directory above one (moved or removed as a whole).
void CatalogService::forget_vouches_named_locked(const std::set<std::string>& files, bool everything) {
  auto names = [&](const std::string& path) {
    if (files.count(path)) return true;
    for (auto slash = path.find_last_of('/'); slash != std::string::npos && slash > 0;
         slash = path.find_last_of('/', slash - 1)) {
      if (files.count(path.substr(0, slash))) return true;
    }
    return false;
  };
  for (auto it = unchanged_since_stat_.begin(); it != unchanged_since_stat_.end();) {
    const auto& signature = it->second.acquisition->signature;
    const bool named = everything || names(it->first) ||
                       std::any_of(signature.begin(), signature.end(),
                                   [&](const catalog::SignatureEntry& entry) { return names(entry.path); });
    it = named ? unchanged_since_stat_.erase(it) : std::next(it);
  }
}

namespace {

constexpr std::size_t kMaxPathsWalkedAlone = 256;

// Component-wise order of absolute paths below one root (discover_masters'
// order): '/' sorts before every other byte.
bool component_order(const std::string& a, const std::string& b) {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    const auto rank = [](char c) { return c == '/' ? 0 : static_cast<int>(static_cast<unsigned char>(c)) + 1; };
    return rank(x) < rank(y);
  });
}

bool is_below_or_is(const std::string& path, const std::string& directory) {
  return path == directory || (path.size() > directory.size() && path.compare(0, directory.size(), directory) == 0 &&
                               path[directory.size()] == '/');
}

}  // namespace

// Only what the changed paths name is walked again: each path's masters are
// forgotten, then a directory there is walked and a master there listed.
// nullopt where only a whole walk is exact (the folder itself named, a hidden
// or non-ASCII path, too many paths).
std::optional<CatalogService::Walk> CatalogService::walk_changed_paths(const std::vector<std::string>& changed) const {
  const std::string root = catalog::absolute_folder(data_folder_);
  if (changed.size() > kMaxPathsWalkedAlone) return std::nullopt;
  Walk walk;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!walked_) return std::nullopt;
    walk.masters = masters_;
    walk.unreadable = unreadable_;
  }
  for (const auto& path : changed) {
    if (path.size() <= root.size() + 1 || path.compare(0, root.size() + 1, root + "/") != 0) return std::nullopt;
    const std::string relative = path.substr(root.size() + 1);
    if (std::any_of(relative.begin(), relative.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
      return std::nullopt;  // the whole walk decides what is valid UTF-8
    }
    bool hidden = false;
    for (std::size_t start = 0; start < relative.size();) {
      if (relative[start] == '.' || relative[start] == '_') hidden = true;
      const auto slash = relative.find('/', start);
      start = slash == std::string::npos ? relative.size() : slash + 1;
    }
    if (hidden) continue;  // the walk skips it
    const auto below = [&](const std::string& p) { return is_below_or_is(p, path); };
    walk.masters.erase(std::remove_if(walk.masters.begin(), walk.masters.end(), below), walk.masters.end());
    walk.unreadable.erase(std::remove_if(walk.unreadable.begin(), walk.unreadable.end(),
                                         [&](const catalog::UnreadableDirectory& d) { return below(d.path); }),
                          walk.unreadable.end());
    struct stat info {};
    if (::lstat(path.c_str(), &info) != 0) continue;  // gone
    if (ends_with(path, "_master.h5")) walk.masters.push_back(path);  // a directory so named too, as the walk lists it
    if (S_ISDIR(info.st_mode)) {
      for (auto& master : catalog::discover_masters(path, &walk.unreadable)) walk.masters.push_back(std::move(master));
    }
  }
  std::sort(walk.masters.begin(), walk.masters.end(), component_order);
  walk.masters.erase(std::unique(walk.masters.begin(), walk.masters.end()), walk.masters.end());
  return walk;
}

void CatalogService::rewalk_after_change(const std::vector<std::string>* changed) {
  try {
    std::optional<Walk> part;
    if (changed) part = walk_changed_paths(*changed);
    Walk walk = part ? std::move(*part) : walk_folder();
    std::lock_guard<std::mutex> lock(mutex_);
    set_masters_locked(std::move(walk));
  } catch (const std::exception& error) {
    spdlog::warn("re-walking {} after a change failed: {}", data_folder_, error.what());
  }
}

void CatalogService::tell_listeners(const TurnResult& turn) {
  for (const auto& listener : turn.listeners) {
    try {
      listener(turn.change);
    } catch (const std::exception& error) {
      spdlog::warn("a source-change listener failed: {}", error.what());
    }
  }
}

bool CatalogService::catch_up_with_watcher() {
  if (!watcher() || !options_.watch_thread) return false;
  std::string cookie;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cookie = data_folder_ + "/" + kCookiePrefix + std::to_string(::getpid()) + "-" + std::to_string(++cookies_made_);
  }
  const int fd = ::open(cookie.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return false;  // a read-only data folder: decide with what the watcher has seen
  ::close(fd);
  bool seen = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    seen = cookie_seen_.wait_for(lock, options_.cookie_wait_limit, [&] {
      return watching_stopped_ || std::find(cookies_seen_.begin(), cookies_seen_.end(), cookie) != cookies_seen_.end();
    });
    cookies_seen_.erase(std::remove(cookies_seen_.begin(), cookies_seen_.end(), cookie), cookies_seen_.end());
  }
  ::unlink(cookie.c_str());
  return seen;
}

std::vector<std::string> CatalogService::files_being_written_locked(const catalog::Acquisition& acquisition) const {
  std::vector<std::string> busy;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& file : acquisition.signature) {
    auto it = writing_.find(file.path);
    if (it != writing_.end() && now - it->second < options_.write_quiet_period) busy.push_back(file.path);
  }
  return busy;
}

void CatalogService::mark_files_being_written(std::vector<catalog::Acquisition>& acquisitions) {
  if (!watcher()) return;
  auto any_busy = [&] {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::any_of(acquisitions.begin(), acquisitions.end(),
                       [&](const catalog::Acquisition& a) { return !files_being_written_locked(a).empty(); });
  };
  if (!any_busy()) return;
  // The watcher may be a few events behind (a writer that has just closed the
  // file): catch up once before refusing anything.
  if (catch_up_with_watcher() && !any_busy()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& acquisition : acquisitions) {
    const auto busy = files_being_written_locked(acquisition);
    if (busy.empty()) continue;
    std::string names;
    for (const auto& path : busy) names += (names.empty() ? "" : ", ") + base_name(path);
    acquisition.status.loadable = false;
    acquisition.status.reason = "source files are being written: " + names;
    acquisition.status.action = "Wait for the writer to finish the acquisition, then poll again.";
  }
}

bool CatalogService::built() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return catalog_ != nullptr;
}

std::uint64_t CatalogService::callers_waiting_for_build() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_;
}

std::uint64_t CatalogService::builds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return builds_;
}

CatalogService::Walk CatalogService::walk_folder() const {
  Walk walk;
  walk.masters = catalog::discover_masters(data_folder_, &walk.unreadable, std::max<std::size_t>(1, options_.inspect_threads));
  drop_data_folder(walk);
  return walk;
}

void CatalogService::drop_data_folder(Walk& walk) const {
  // The folder itself is reported as `stale` (check_data_folder).
  const std::string root = catalog::absolute_folder(data_folder_);
  walk.unreadable.erase(std::remove_if(walk.unreadable.begin(), walk.unreadable.end(),
                                       [&](const catalog::UnreadableDirectory& d) { return d.path == root; }),
                        walk.unreadable.end());
}

void CatalogService::set_masters_locked(Walk walk) {
  if (walk.masters != masters_) ++masters_generation_;
  masters_ = std::move(walk.masters);
  // Said once when a folder becomes unreadable, once when it is readable again.
  auto listed = [](const std::vector<catalog::UnreadableDirectory>& list, const std::string& path) {
    return std::any_of(list.begin(), list.end(), [&](const catalog::UnreadableDirectory& d) { return d.path == path; });
  };
  for (const auto& directory : walk.unreadable) {
    if (!listed(unreadable_, directory.path)) {
      spdlog::warn("catalog: cannot list {}: {}; its acquisitions are not listed until it can be read",
                   directory.path, directory.reason);
    }
  }
  for (const auto& directory : unreadable_) {
    if (!listed(walk.unreadable, directory.path)) spdlog::info("catalog: {} can be listed again", directory.path);
  }
  unreadable_ = std::move(walk.unreadable);
  walked_ = true;
  last_walk_ = std::chrono::steady_clock::now();
  // Forget inspections of masters that disappeared (a set: a folder holds tens of thousands).
  const std::unordered_set<std::string> present(masters_.begin(), masters_.end());
  for (auto it = inspections_.begin(); it != inspections_.end();) {
    if (present.count(it->first) == 0) {
      it = inspections_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<std::string> CatalogService::check_data_folder() {
  std::optional<std::string> problem;
  if (DIR* directory = ::opendir(data_folder_.c_str())) {
    ::closedir(directory);
  } else {
    problem = "the data folder " + data_folder_ + " cannot be read: " + std::strerror(errno);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (problem && !stale_reason_) {
    const std::size_t sessions = catalog_ ? catalog_->sessions.size() : 0;
    spdlog::error("{}; serving the last good catalog ({} sessions), marked stale, until it can be read again", *problem,
                  sessions);
    stale_since_ = utc_timestamp_now();
  } else if (!problem && stale_reason_) {
    spdlog::info("the data folder {} can be read again", data_folder_);
  }
  stale_reason_ = problem;
  return problem;
}

std::optional<std::string> CatalogService::stale_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stale_reason_;
}

std::shared_ptr<const catalog::Catalog> CatalogService::run_build(Walk& walk, catalog::BuildCounts& counts,
                                                                   std::optional<std::string>& error) {
  std::shared_ptr<const catalog::Catalog> built;
  try {
    const auto started = std::chrono::steady_clock::now();
    if (options_.build) {
      built = std::make_shared<const catalog::Catalog>(options_.build(data_folder_));
      walk = walk_folder();
    } else {
      built = std::make_shared<const catalog::Catalog>(build_now(counts, walk));
    }
    std::size_t files = 0;
    for (const auto& session : built->sessions) files += session.files.size();
    masters_reused_ += counts.reused;
    masters_inspected_ += counts.inspected;
    spdlog::info("catalog of {}: {} sessions, {} masters ({} reused, {} inspected) in {:.3f} s", data_folder_,
                 built->sessions.size(), files, counts.reused, counts.inspected,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  } catch (const std::exception& e) {
    error = e.what();
    spdlog::error("building the catalog of {} failed: {}", data_folder_, e.what());
  }
  return built;
}

void CatalogService::publish_locked(const std::shared_ptr<const catalog::Catalog>& built, Walk walk,
                                    std::uint64_t change_turns_at_start) {
  catalog_ = built;
  ++builds_;
  build_error_.reset();
  last_build_ = std::chrono::steady_clock::now();
  change_turns_at_build_start_ = change_turns_at_start;
  fresh_.clear();
  catalog_has_condemned_ = false;
  for (const auto& session : built->sessions)
    for (const auto& acquisition : session.files) catalog_has_condemned_ = catalog_has_condemned_ || is_condemned(acquisition);
  unchanged_since_stat_.clear();
  set_masters_locked(std::move(walk));
  for (const auto& session : built->sessions) {
    for (const auto& acquisition : session.files) {
      Polled& polled = inspections_[acquisition.master_path];
      if (same_inspection(polled.acquisition, acquisition)) continue;  // and what the poll rendered from it
      polled = Polled{acquisition, {}, {}};
    }
  }
}

std::shared_ptr<const catalog::Catalog> CatalogService::catalog(bool refresh) {
  if (refresh || !built()) {
    // A folder that went away would rebuild as empty: keep the last good catalog.
    if (check_data_folder()) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (catalog_) return catalog_;
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (!refresh && catalog_) return catalog_;
  if (building_) {
    // Coalesce: wait for the running build and share its result.
    const std::uint64_t attempt = build_attempts_;
    ++waiting_;
    const bool finished = build_done_.wait_for(lock, options_.rebuild_wait_limit, [&] { return build_attempts_ != attempt; });
    --waiting_;
    if (!finished) {
      throw unavailable("the catalog of " + data_folder_ + " is still being built; retry shortly");
    }
    if (catalog_) return catalog_;
    throw Error(ErrorKind::io, "building the catalog failed: " + build_error_.value_or("unknown error"));
  }
  building_ = true;
  const std::uint64_t change_turns_at_start = change_turns_;
  change_turns_at_running_build_start_ = change_turns_at_start;
  lock.unlock();

  Walk walk;
  std::optional<std::string> error;
  catalog::BuildCounts counts;
  const std::shared_ptr<const catalog::Catalog> built = run_build(walk, counts, error);

  lock.lock();
  building_ = false;
  partial_.reset();
  ++build_attempts_;
  if (built) {
    // A build that found what the current catalog holds keeps it: its sessions body and entity tag stay.
    const bool same = catalog_ && same_catalog(*catalog_, *built);
    publish_locked(same ? catalog_ : built, std::move(walk), change_turns_at_start);
  } else {
    build_error_ = error;
    last_build_ = std::chrono::steady_clock::now();
  }
  build_done_.notify_all();
  if (built && !options_.build) {
    lock.unlock();
    save_cache(built, counts.inspected);
    lock.lock();
  }
  if (!built) {
    if (catalog_) return catalog_;  // keep serving the previous catalog
    throw Error(ErrorKind::io, "building the catalog failed: " + error.value_or("unknown error"));
  }
  return catalog_;
}

nlohmann::ordered_json CatalogService::sessions_document(bool refresh, bool partial) {
  if (partial && !refresh) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!catalog_ && building_) {
      partial_wanted_ = true;  // the build reports its progress from now on
      const auto known = partial_;
      lock.unlock();
      catalog::Catalog empty;
      empty.data_folder = catalog::absolute_folder(data_folder_);
      auto document = catalog::sessions_document(known ? *known : empty);
      document["complete"] = false;
      return document;
    }
  }
  auto document = catalog::sessions_document(*(refresh ? refreshed_catalog() : catalog(false)));
  if (const auto reason = check_data_folder()) {
    std::lock_guard<std::mutex> lock(mutex_);
    document["stale"] = true;
    document["stale_reason"] = *reason;
    document["stale_since"] = stale_since_;
  }
  const std::string root = catalog::absolute_folder(data_folder_);
  nlohmann::ordered_json unreadable = nlohmann::ordered_json::array();
  for (const auto& directory : health().unreadable) {
    unreadable.push_back({{"path", relative_to_folder(root, directory.path)}, {"reason", directory.reason}});
  }
  if (!unreadable.empty()) document["unreadable_folders"] = std::move(unreadable);
  return document;
}

bool CatalogService::nothing_changed_since_locked(std::uint64_t change_turns) const {
  if (!watcher() || !watcher()->reports_every_change()) return false;
  // Order as in watched_unchanged(): nothing queued, nothing read but unapplied, no change applied.
  if (watcher()->has_unread_changes() || watcher()->reads_begun() != reads_applied_) return false;
  return change_turns_ == change_turns;
}

std::shared_ptr<const catalog::Catalog> CatalogService::refreshed_catalog() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      if (building_) {
        // Shared when it began after every change; otherwise its end is awaited and a later build answers.
        if (nothing_changed_since_locked(change_turns_at_running_build_start_)) break;
        const std::uint64_t attempt = build_attempts_;
        if (!build_done_.wait_for(lock, options_.rebuild_wait_limit, [&] { return build_attempts_ != attempt; })) {
          throw unavailable("the catalog of " + data_folder_ + " is still being built; retry shortly");
        }
        continue;
      }
      if (!catalog_) break;
      const auto since = std::chrono::steady_clock::now() - last_build_;
      if (since >= options_.refresh_interval) break;
      // A condemned master is tried again by every refresh (the inspector's
      // strike rule), so such a catalog is never reused.
      if (!catalog_has_condemned_ && nothing_changed_since_locked(change_turns_at_build_start_)) {
        ++refreshes_reused_;
        return catalog_;
      }
      // Rate limit: wait for the end of the interval, or for a build that
      // someone starts meanwhile (it began after this caller arrived).
      const std::uint64_t attempt = build_attempts_;
      build_done_.wait_for(lock, options_.refresh_interval - since, [&] { return build_attempts_ != attempt; });
      if (build_attempts_ != attempt && catalog_) {
        ++refreshes_reused_;
        return catalog_;
      }
    }
  }
  return catalog(true);
}

CatalogHealth CatalogService::health() const {
  CatalogHealth health;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    health.unreadable = unreadable_;
  }
  if (const catalog::Watcher* watching = watcher()) {
    health.watcher = watching->health();
  } else if (options_.make_watcher && options_.watch_thread && options_.watch_after_first_build &&
             !watching_unavailable_) {
    catalog::WatcherHealth starting;  // set up after the first build
    starting.kind = "starting";
    health.watcher = starting;
  }
  return health;
}

void CatalogService::add_health_fields(nlohmann::ordered_json& document) const {
  const CatalogHealth now = health();
  const std::string root = catalog::absolute_folder(data_folder_);
  std::vector<std::string> warnings;
  if (now.watcher) {
    const auto& w = *now.watcher;
    document["watcher"] = {{"kind", w.kind},
                           {"watched_directories", w.watched_directories},
                           {"polled_directories", w.polled_directories},
                           {"poll_interval_ms", w.poll_period.count()}};
    if (w.kind == "polling") {
      warnings.push_back("the data folder is polled every " + std::to_string(w.poll_period.count()) +
                         " ms: inotify cannot watch it (see the log)");
    } else if (w.polled_directories > 0) {
      warnings.push_back(std::to_string(w.polled_directories) + " directories are polled every " +
                         std::to_string(w.poll_period.count()) +
                         " ms: inotify cannot watch them (raise fs.inotify.max_user_watches)");
    }
  }
  if (!now.unreadable.empty()) {
    nlohmann::ordered_json folders = nlohmann::ordered_json::array();
    for (const auto& directory : now.unreadable) {
      const std::string path = relative_to_folder(root, directory.path);
      folders.push_back({{"path", path}, {"reason", directory.reason}});
      warnings.push_back("the folder " + path + " cannot be read (" + directory.reason + "): its acquisitions are not listed");
    }
    document["unreadable_folders"] = std::move(folders);
  }
  if (!warnings.empty()) document["warnings"] = warnings;
}

std::string CatalogService::metrics_text() const {
  const CatalogHealth now = health();
  std::string text =
      "# HELP quantem_catalog_unreadable_folders Folders below the data folder that the last walk could not list.\n"
      "# TYPE quantem_catalog_unreadable_folders gauge\n"
      "quantem_catalog_unreadable_folders " + std::to_string(now.unreadable.size()) + "\n";
  if (!now.watcher) return text;
  const auto& w = *now.watcher;
  text += "# HELP quantem_watch_directories Directories of the data folder watched with inotify.\n"
          "# TYPE quantem_watch_directories gauge\n"
          "quantem_watch_directories " + std::to_string(w.watched_directories) + "\n" +
          "# HELP quantem_watch_polled_directories Directories polled because inotify cannot watch them.\n"
          "# TYPE quantem_watch_polled_directories gauge\n"
          "quantem_watch_polled_directories " + std::to_string(w.polled_directories) + "\n" +
          "# HELP quantem_watch_folder_refollows_total Times the data folder's path was found to name another "
          "directory (or none) and was watched anew.\n"
          "# TYPE quantem_watch_folder_refollows_total counter\n"
          "quantem_watch_folder_refollows_total " + std::to_string(w.refollows) + "\n";
  return text;
}

std::shared_ptr<const DocumentBody> CatalogService::sessions_body(bool refresh, bool partial) {
  if (partial && !refresh) {
    // What is known so far changes with every progress report: not kept.
    std::unique_lock<std::mutex> lock(mutex_);
    if (!catalog_ && building_) {
      lock.unlock();
      return std::make_shared<const DocumentBody>(sessions_document(false, true).dump());
    }
  }
  const auto current = refresh ? refreshed_catalog() : catalog(false);
  const auto stale = check_data_folder();
  const CatalogHealth now = health();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (now.unreadable.empty() && sessions_body_ && sessions_body_catalog_ == current &&
        sessions_body_stale_ == stale) {
      return sessions_body_;
    }
  }
  // Kept until the catalog or its staleness changes: an unchanged poll costs a comparison.
  std::string text = catalog::sessions_document_text(*current);
  if (stale || !now.unreadable.empty()) {
    nlohmann::ordered_json added;
    if (stale) {
      std::lock_guard<std::mutex> lock(mutex_);
      added["stale"] = true;
      added["stale_reason"] = *stale;
      added["stale_since"] = stale_since_;
    }
    if (!now.unreadable.empty()) {
      const std::string root = catalog::absolute_folder(data_folder_);
      nlohmann::ordered_json folders = nlohmann::ordered_json::array();
      for (const auto& directory : now.unreadable) {
        folders.push_back({{"path", relative_to_folder(root, directory.path)}, {"reason", directory.reason}});
      }
      added["unreadable_folders"] = std::move(folders);
    }
    // The added keys follow "complete", as sessions_document() orders them.
    const std::string members = added.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    text.pop_back();
    text += "," + members.substr(1);
  }
  auto body = std::make_shared<const DocumentBody>(std::move(text));
  if (!now.unreadable.empty()) return body;  // rare: not kept, the folders' state is read at every poll
  std::lock_guard<std::mutex> lock(mutex_);
  sessions_body_catalog_ = current;
  sessions_body_stale_ = stale;
  sessions_body_ = body;
  return body;
}

std::map<std::string, catalog::Acquisition> CatalogService::kept_inspections() {
  std::map<std::string, catalog::Acquisition> kept;
  bool read_file = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (catalog_) {
      // The newest inspection of each master: re-inspections since the build,
      // then the acquisitions poll's, then the catalog's (each copied once).
      kept = fresh_;
      for (const auto& [path, polled] : inspections_) kept.try_emplace(path, polled.acquisition);
      for (const auto& session : catalog_->sessions)
        for (const auto& acquisition : session.files) kept.try_emplace(acquisition.master_path, acquisition);
      return kept;
    }
    read_file = !cache_file_read_ && !options_.cache_path.empty();
    cache_file_read_ = true;
  }
  if (!read_file) return kept;
  const auto read_started = std::chrono::steady_clock::now();
  auto contents = catalog::read_catalog_cache(options_.cache_path, catalog::absolute_folder(data_folder_));
  spdlog::debug("catalog cache read in {:.3f} s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - read_started).count());
  if (contents.problem.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    cache_file_masters_.clear();
    for (const auto& [path, acquisition] : contents.entries) cache_file_masters_.insert(path);
    cache_file_inspections_made_ = inspections_made_;
  }
  if (!contents.problem.empty()) {
    spdlog::warn("catalog cache {} ignored (it is replaced after this build): {}", options_.cache_path,
                 contents.problem);
  } else if (contents.entries.empty()) {
    spdlog::info("catalog cache {}: none yet (written after this build)", options_.cache_path);
  } else {
    spdlog::info("catalog cache {}: {} masters known", options_.cache_path, contents.entries.size());
  }
  return std::move(contents.entries);
}

catalog::Catalog CatalogService::build_now(catalog::BuildCounts& counts, Walk& walk) {
  if (options_.forget_inspection_failures) options_.forget_inspection_failures();
  // The cache file is read while the folder is walked: both take long for a large folder.
  auto reading = std::async(std::launch::async, [this] { return kept_inspections(); });
  std::map<std::string, catalog::Acquisition> kept;
  std::once_flag read_once;
  catalog::BuildOptions build;
  build.threads = std::max<std::size_t>(1, options_.inspect_threads);
  build.reuse = [&](const std::string& master) -> std::optional<catalog::Acquisition> {
    std::call_once(read_once, [&] { kept = reading.get(); });
    auto it = kept.find(master);
    if (it == kept.end() || is_condemned(it->second) || !catalog::signature_unchanged(it->second.signature)) {
      return std::nullopt;
    }
    return std::move(it->second);
  };
  build.progress_wanted = [this] { return partial_wanted_.load(); };
  build.progress = [this](const catalog::Catalog& partial) {
    auto known = std::make_shared<const catalog::Catalog>(partial);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!catalog_) partial_ = std::move(known);
  };
  catalog::Catalog built = catalog::build_catalog(data_folder_, options_.inspect, build, &counts, &walk.masters,
                                                  &walk.unreadable);
  drop_data_folder(walk);
  return built;
}

void CatalogService::save_cache(std::shared_ptr<const catalog::Catalog> built, std::size_t inspected) {
  if (options_.cache_path.empty()) return;
  std::set<std::string> masters;
  for (const auto& session : built->sessions)
    for (const auto& acquisition : session.files)
      if (!is_condemned(acquisition)) masters.insert(acquisition.master_path);
  const std::uint64_t made = inspections_made_;
  {
    // Nothing inspected by this build or since the file was written, the same masters: the file is current.
    std::lock_guard<std::mutex> lock(mutex_);
    if (inspected == 0 && made == cache_file_inspections_made_ && masters == cache_file_masters_) return;
  }
  std::lock_guard<std::mutex> writer(cache_writer_mutex_);
  if (cache_writer_.joinable()) cache_writer_.join();
  cache_writer_ = std::thread([this, built = std::move(built), masters = std::move(masters), made]() mutable {
    pthread_setname_np(pthread_self(), "quantem-cache");
    std::vector<const catalog::Acquisition*> kept;
    for (const auto& session : built->sessions)
      for (const auto& acquisition : session.files)
        if (!is_condemned(acquisition)) kept.push_back(&acquisition);
    try {
      const auto started = std::chrono::steady_clock::now();
      catalog::write_catalog_cache(options_.cache_path, built->data_folder, kept);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        cache_file_masters_ = std::move(masters);
        cache_file_inspections_made_ = made;
      }
      spdlog::debug("catalog cache {} written ({} masters) in {:.3f} s", options_.cache_path, kept.size(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    } catch (const std::exception& error) {
      spdlog::warn("the catalog cache was not written (the next start inspects every master): {}", error.what());
    }
  });
}

void CatalogService::wait_for_cache_write() {
  std::lock_guard<std::mutex> writer(cache_writer_mutex_);
  if (cache_writer_.joinable()) cache_writer_.join();
}

bool CatalogService::retry_condemned(const catalog::Acquisition& acquisition) {
  if (!options_.forget_inspection_failure || !is_condemned(acquisition)) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    auto [it, inserted] = condemned_retries_.try_emplace(acquisition.master_path, now);
    if (!inserted && now - it->second < options_.condemned_retry_interval) return false;
    it->second = now;
  }
  return options_.forget_inspection_failure(acquisition.master_path);
}

std::shared_ptr<const catalog::Catalog> CatalogService::rebuild_for_unknown_name() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool recent = std::chrono::steady_clock::now() - last_build_ < options_.unknown_name_rebuild_interval;
    if (recent && !building_ && catalog_) return catalog_;
  }
  return catalog(true);
}

std::shared_ptr<const catalog::Acquisition> CatalogService::watched_unchanged(const std::string& master) {
  if (!watcher()) return nullptr;
  // Order matters (catalog/watcher.hpp): nothing queued, then nothing read but
  // unapplied, then the verified inspection (dropped by the turn that applied
  // a change to it).
  if (watcher()->has_unread_changes()) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  if (watcher()->reads_begun() != reads_applied_ || !writing_.empty()) return nullptr;
  auto it = unchanged_since_stat_.find(master);
  if (it == unchanged_since_stat_.end()) return nullptr;
  // Bounded trust: what inotify cannot see is found by the next stat().
  if (std::chrono::steady_clock::now() - it->second.verified > options_.identity_recheck_interval) return nullptr;
  return it->second.acquisition;
}

bool CatalogService::watcher_reports_every_file_of(const catalog::Acquisition& acquisition) const {
  auto directory_of = [](const std::string& path) {
    const auto slash = path.find_last_of('/');
    return slash == std::string::npos || slash == 0 ? std::string("/") : path.substr(0, slash);
  };
  if (!watcher()->reports_changes_in(directory_of(acquisition.master_path))) return false;
  std::set<std::string> directories;
  for (const auto& entry : acquisition.signature) directories.insert(directory_of(entry.path));
  return std::all_of(directories.begin(), directories.end(),
                     [&](const std::string& directory) { return watcher()->reports_changes_in(directory); });
}

catalog::Acquisition CatalogService::resolve(const std::string& session_id, const std::string& file) {
  return *resolve_shared(session_id, file);
}

std::shared_ptr<const catalog::Acquisition> CatalogService::resolve_shared(const std::string& session_id,
                                                                           const std::string& file) {
  if (file.empty() || file == "." || file.find('/') != std::string::npos || file.find('\0') != std::string::npos) {
    throw bad_request("file must be one master filename");
  }
  auto current = catalog(false);
  const catalog::Session* session = current->find_session(session_id);
  if (!session) {
    current = rebuild_for_unknown_name();
    session = current->find_session(session_id);
    if (!session) throw not_found("unknown session: " + session_id);
  }
  auto find_file = [&](const catalog::Session& s) -> const catalog::Acquisition* {
    for (const auto& acquisition : s.files)
      if (acquisition.name == file) return &acquisition;
    return nullptr;
  };
  const catalog::Acquisition* found = find_file(*session);
  if (!found) {
    current = rebuild_for_unknown_name();
    session = current->find_session(session_id);
    found = session ? find_file(*session) : nullptr;
    if (!found) throw not_found("master not found: " + file);
  }

  if (auto unchanged = watched_unchanged(found->master_path)) return unchanged;

  // Changes applied by the watcher so far; a later one forbids vouching for
  // this stat() below (it may have come after it).
  std::optional<std::uint64_t> reads_before;
  if (watcher() && !watcher()->has_unread_changes()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (watcher()->reads_begun() == reads_applied_) reads_before = reads_applied_;
  }
  catalog::Acquisition acquisition = *found;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto fresh = fresh_.find(acquisition.master_path);
    if (fresh != fresh_.end()) acquisition = fresh->second;
  }
  ++signature_restats_;
  const bool retry = retry_condemned(acquisition);
  if (retry) spdlog::info("{} was condemned by the inspector; trying it again", acquisition.master_path);
  const auto stat_time = std::chrono::steady_clock::now();
  if (retry || catalog::restat_signature(acquisition.signature) != acquisition.signature) {
    if (!retry) spdlog::info("{} changed since its inspection; inspecting it again", acquisition.master_path);
    acquisition = options_.inspect(acquisition.master_path);
    ++inspections_made_;
    std::lock_guard<std::mutex> lock(mutex_);
    fresh_[acquisition.master_path] = acquisition;
  }
  std::vector<catalog::Acquisition> one{std::move(acquisition)};
  mark_files_being_written(one);
  auto resolved = std::make_shared<const catalog::Acquisition>(std::move(one.front()));
  if (reads_before && resolved->status.loadable && watcher_reports_every_file_of(*resolved)) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (watcher()->reads_begun() == *reads_before && reads_applied_ == *reads_before && writing_.empty()) {
      unchanged_since_stat_[resolved->master_path] = Vouched{resolved, stat_time};
    }
  }
  return resolved;
}

void CatalogService::background_walk() {
  Walk walk;
  bool ok = true;
  try {
    walk = walk_folder();
  } catch (const std::exception& e) {
    ok = false;
    spdlog::warn("background discovery of {} failed: {}", data_folder_, e.what());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  walk_in_flight_ = false;
  if (ok) {
    set_masters_locked(std::move(walk));
  } else {
    last_walk_ = std::chrono::steady_clock::now();  // wait a full interval before retrying
  }
}

bool CatalogService::same_catalog(const catalog::Catalog& a, const catalog::Catalog& b) {
  if (a.data_folder != b.data_folder || a.sessions.size() != b.sessions.size() ||
      a.session_directories != b.session_directories) {
    return false;
  }
  for (std::size_t i = 0; i < a.sessions.size(); ++i) {
    const auto &x = a.sessions[i], &y = b.sessions[i];
    if (x.path != y.path || x.directory != y.directory || x.files.size() != y.files.size()) return false;
    for (std::size_t j = 0; j < x.files.size(); ++j) {
      if (!same_inspection(x.files[j], y.files[j])) return false;  // the same files: the same inspection
    }
  }
  return true;
}

bool CatalogService::same_inspection(const catalog::Acquisition& a, const catalog::Acquisition& b) {
  return a.master_path == b.master_path && a.stem == b.stem && a.signature == b.signature &&
         a.status.loadable == b.status.loadable && a.status.reason == b.status.reason &&
         a.status.action == b.status.action;
}

void CatalogService::note_poll_changes_locked(const catalog::FileChanges& seen, const SourceChange& change) {
  if (seen.overflow) poll_all_dirty_ = true;
  poll_dirty_.insert(change.masters.begin(), change.masters.end());
  for (const auto& seen_change : seen.changes) {
    if (!seen_change.is_directory) continue;
    // A directory created, moved or removed as a whole names every master below it.
    if (poll_dirty_directories_.size() >= kMaxPollDirtyDirectories) {
      poll_all_dirty_ = true;
    } else {
      poll_dirty_directories_.insert(seen_change.path);
    }
  }
}

void CatalogService::start_walks_for_poll(std::unique_lock<std::mutex>& lock) {
  if (!walked_) {
    lock.unlock();
    Walk walked = walk_folder();
    lock.lock();
    if (!walked_) set_masters_locked(std::move(walked));
  } else if (!walk_in_flight_ && !stopping_ &&
             std::chrono::steady_clock::now() - last_walk_ >= options_.rewalk_interval) {
    walk_in_flight_ = true;
    if (walker_.joinable()) walker_.join();  // the previous walk has finished (not in flight)
    walker_ = std::thread([this] { background_walk(); });
  }
}

bool CatalogService::watcher_vouches_for_poll_locked() const {
  if (!watcher() || !watcher()->reports_every_change() || !writing_.empty()) return false;
  // Order as in watched_unchanged(): nothing queued, then nothing read but unapplied.
  return !watcher()->has_unread_changes() && watcher()->reads_begun() == reads_applied_;
}

nlohmann::ordered_json CatalogService::acquisitions_document() {
  return nlohmann::ordered_json::parse(*acquisitions_body()->json());
}

std::shared_ptr<const DocumentBody> CatalogService::acquisitions_body() {
  PollPlan plan;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    start_walks_for_poll(lock);
    const auto now = std::chrono::steady_clock::now();
    const bool vouched = watcher_vouches_for_poll_locked() && !poll_all_dirty_ &&
                         now - last_full_poll_check_ < options_.acquisitions_recheck_interval;
    if (vouched && acquisitions_body_ && acquisitions_body_reusable_ && poll_dirty_.empty() &&
        poll_dirty_directories_.empty() && acquisitions_body_masters_ == masters_generation_) {
      return acquisitions_body_;  // nothing named by a change since it was made
    }
    plan.check_all = !vouched;
    if (plan.check_all) last_full_poll_check_ = now;
    plan.dirty.swap(poll_dirty_);
    plan.dirty_directories.swap(poll_dirty_directories_);
    poll_all_dirty_ = false;
    plan.masters_generation = masters_generation_;
    plan.masters = masters_;
  }
  auto entries = poll_entries(plan);
  std::string text = poll_document_text(entries);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!acquisitions_body_ || *acquisitions_body_->json() != text) {
    acquisitions_body_ = std::make_shared<const DocumentBody>(std::move(text));
  }
  acquisitions_body_masters_ = plan.masters_generation;
  // A master being written is checked again at every poll (its writer may stop without an event).
  acquisitions_body_reusable_ =
      std::none_of(entries.begin(), entries.end(), [](const PollEntry& entry) { return entry.busy; });
  return acquisitions_body_;
}

bool CatalogService::PollPlan::names(const std::string& master) const {
  if (check_all || dirty.count(master)) return true;
  return std::any_of(dirty_directories.begin(), dirty_directories.end(), [&](const std::string& directory) {
    return master.size() > directory.size() && master.compare(0, directory.size(), directory) == 0 &&
           master[directory.size()] == '/';
  });
}

// Each master's event: rendered before and not named by a change, or its
// inspection (re-)checked with stat(), inspected again when its files changed.
std::vector<CatalogService::PollEntry> CatalogService::poll_entries(const PollPlan& plan) {
  std::vector<PollEntry> entries(plan.masters.size());
  std::vector<catalog::Acquisition> checked;
  std::vector<std::size_t> checked_at;
  for (std::size_t i = 0; i < plan.masters.size(); ++i) {
    const std::string& path = plan.masters[i];
    std::optional<catalog::Acquisition> known;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = inspections_.find(path);
      if (it != inspections_.end()) {
        if (!plan.names(path) && !it->second.event.empty()) {
          entries[i] = PollEntry{it->second.acquisition.status.loadable, it->second.event, it->second.token};
          continue;
        }
        known = it->second.acquisition;
      }
    }
    if (!known || catalog::restat_signature(known->signature) != known->signature) {
      known = options_.inspect(path);
      ++inspections_made_;
    }
    checked.push_back(std::move(*known));
    checked_at.push_back(i);
  }
  std::vector<catalog::LoadStatus> inspected_status;
  inspected_status.reserve(checked.size());
  for (const auto& acquisition : checked) inspected_status.push_back(acquisition.status);
  mark_files_being_written(checked);
  for (std::size_t k = 0; k < checked.size(); ++k) {
    PollEntry entry = render_poll_entry(checked[k]);
    const bool busy = checked[k].status.reason != inspected_status[k].reason ||
                      checked[k].status.loadable != inspected_status[k].loadable;
    entry.busy = busy;
    entries[checked_at[k]] = entry;
    checked[k].status = std::move(inspected_status[k]);  // kept as inspected
    std::lock_guard<std::mutex> lock(mutex_);
    Polled& polled = inspections_[checked[k].master_path];
    polled.acquisition = std::move(checked[k]);
    // A master being written is rendered again at every poll.
    polled.event = busy ? std::string() : std::move(entry.event);
    polled.token = busy ? std::string() : std::move(entry.token);
  }
  return entries;
}

CatalogService::PollEntry CatalogService::render_poll_entry(const catalog::Acquisition& acquisition) {
  PollEntry entry;
  entry.ready = acquisition.status.loadable;
  entry.event = protocol::acquisition_event(acquisition).dump(-1, ' ', false,
                                                              nlohmann::ordered_json::error_handler_t::replace);
  if (entry.ready) protocol::append_ready_token_input(entry.token, acquisition);
  return entry;
}

// protocol::acquisitions_document's text, from the events rendered one by one.
std::string CatalogService::poll_document_text(const std::vector<PollEntry>& entries) {
  std::string pending, history, token_input;
  std::size_t bytes = 0;
  for (const auto& entry : entries) bytes += entry.event.size() + 1;
  history.reserve(bytes);
  for (const auto& entry : entries) {
    std::string& list = entry.ready ? history : pending;
    if (!list.empty()) list += ',';
    list += entry.event;
    if (entry.ready) token_input += entry.token;
  }
  return "{\"enabled\":true,\"pending\":[" + pending + "],\"in_flight\":[],\"history\":[" + history +
         "],\"ready_token\":\"" + protocol::digest_hex24(token_input) + "\"}";
}

DocumentBody::DocumentBody(std::string json)
    : json_(std::make_shared<const std::string>(std::move(json))),
      etag_("\"" + protocol::digest_hex24(*json_) + "\"") {}

std::shared_ptr<const std::string> DocumentBody::gzip() const {
  std::lock_guard<std::mutex> lock(gzip_mutex_);
  if (!gzip_) gzip_ = std::make_shared<const std::string>(gzip_compress(*json_, 6));
  return gzip_;
}

std::string gzip_compress(std::string_view bytes, int level) {
  z_stream stream{};
  // windowBits 15 + 16: a gzip header and trailer instead of zlib's.
  if (deflateInit2(&stream, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw Error(ErrorKind::internal, "zlib: deflateInit2 failed");
  }
  std::string out(deflateBound(&stream, static_cast<uLong>(bytes.size())), '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  const int result = deflate(&stream, Z_FINISH);
  const auto produced = stream.total_out;
  deflateEnd(&stream);
  if (result != Z_STREAM_END) throw Error(ErrorKind::internal, "zlib: deflate did not finish");
  out.resize(produced);
  return out;
}

}  // namespace quantem::server
