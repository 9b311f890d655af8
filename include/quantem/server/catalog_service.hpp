#pragma once
// The daemon's view of the data folder (docs/protocol.md, 'Masters, sessions and readiness'):
//  - the catalog, built on first use and cached; `refresh` rebuilds it and
//    concurrent rebuilds are coalesced (a caller that waited for a running
//    rebuild gets its result);
//  - the acquisitions poll: the remembered master list returned at once, a
//    background re-walk when the last walk is older than the re-walk interval,
//    and inspections reused until a file of their signature changes. Each
//    master's event is rendered once per inspection; while the watcher
//    vouches for the whole folder (reports_every_change, nothing unapplied,
//    nothing being written) a poll stat()s only the masters a change named
//    (a file of their signature, a directory above them) and returns the
//    kept document when none was named and the master list is the same;
//    every master is stat()ed at least every acquisitions_recheck_interval;
//  - resolution of (session, file) to a fresh inspection: only catalogued
//    masters, no path escapes, an unknown name triggers at most one
//    (coalesced) rebuild per interval, and a master whose files changed since
//    its inspection is inspected again before it is used. Whether they
//    changed is known without a stat() per file when the watcher reports
//    every change in the directories of the master's signature (inotify on a
//    local filesystem, see catalog/watcher.hpp) and has nothing unapplied:
//    the master was stat()ed once and nothing has named its files since.
//    Otherwise (no watcher, polling, a network filesystem, events in flight,
//    files being written) every resolve re-stats the signature;
//  - watching (optional, catalog/watcher.hpp): each turn of watch_turn() takes
//    what the watcher saw, re-walks at once when a master or directory
//    appeared or vanished, remembers files being written (a file whose last
//    write was seen less than write_quiet_period ago and that its writer has
//    not closed since makes every acquisition that names it "writing": not
//    ready, never served), and tells
//    listeners which files and masters changed (the serve command drops the
//    residents and cached images built from them). Before refusing a request
//    because a file is being written, the service makes sure the watcher has
//    caught up with a cookie file (a created-and-deleted ".quantem-cookie-*"
//    in the data folder, bounded wait).
//  - the data folder's availability: when the folder cannot be opened
//    (renamed away, removed, EACCES), the catalog is stale: the last good
//    catalog keeps being served (a rebuild would only see an empty folder),
//    the sessions document carries "stale": true, "stale_reason" and
//    "stale_since" (added fields; absent while the folder is fine, so the
//    reference's document is unchanged), /api/health/ready answers 503 with
//    the reason, and the problem is logged once (and once when it ends).
//    A folder that never existed still gives the reference's empty catalog,
//    marked stale the same way.
//  - freshness (docs/protocol.md "Freshness"): the watcher follows the data
//    folder by path (catalog/watcher.hpp) and a resolve trusts the watcher's
//    word that nothing changed for at most identity_recheck_interval after
//    its last stat() of the signature: a change inotify cannot see (the
//    folder's path swapped before the watcher's next look, an ancestor
//    renamed, a write through a hard link elsewhere) is found by the next
//    stat, at most that long after it happened.
//  - refreshes (`sessions?refresh=true`): one build at a time. A refresh
//    shares the build in flight, or within refresh_interval of the last
//    build's end reuses that build, when the watcher vouches that nothing
//    under the folder changed since that build began; otherwise it waits for
//    the build in flight and for the end of the interval, then builds
//    (shared with everyone who asks meanwhile). No refresh answers from
//    before a change made before it arrived.
//  - directories the walk cannot list (a session folder with mode 000) are
//    kept in health(): the sessions document, /api/health/ready and /metrics
//    report them.
//  - builds reuse what is known: the first from the catalog cache file
//    (catalog/catalog_cache.hpp), later ones (refresh) from the current
//    catalog; an entry is reused only while its master and every file of its
//    signature stat the same, everything else is inspected on
//    options.inspect_threads threads. A refresh first lets the inspector try
//    condemned masters again. After each build the cache file is rewritten
//    (on a background thread; masters the inspector condemned are not kept).
//    Each build logs how many masters it reused and inspected;
//  - while the first build runs, a sessions request that asks for it
//    (partial) gets the catalog of what is known so far with
//    "complete": false instead of waiting;
//  - the sessions and acquisitions documents as sent (DocumentBody): compact
//    JSON with an entity tag and a gzip form; the sessions body is kept until
//    the catalog or its staleness changes (a refresh that builds the same
//    catalog keeps the previous one), so an unchanged poll costs a
//    comparison; the acquisitions body is kept as described above.
// Thread-safe. Waits for a running rebuild are bounded.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/catalog.hpp"
#include "quantem/catalog/watcher.hpp"

namespace quantem::server {

struct CatalogServiceOptions {
  std::chrono::milliseconds rewalk_interval{std::chrono::seconds(10)};
  // How one master is inspected: in this process by default; the daemon
  // passes its crash-isolated inspector (inspector/inspector.hpp).
  catalog::InspectFunction inspect = catalog::inspect_master;
  // How a catalog is built: empty means catalog::build_catalog with `inspect`
  // (tests substitute a builder they can hold).
  std::function<catalog::Catalog(const std::string&)> build;
  std::chrono::milliseconds unknown_name_rebuild_interval{std::chrono::seconds(5)};
  std::chrono::milliseconds rebuild_wait_limit{std::chrono::minutes(10)};

  // Watching: make_watcher builds the watcher (nullptr: no watching); with
  // watch_thread a thread takes turns of watch_turn(watch_turn_timeout),
  // otherwise the caller (a test) steps them.
  std::function<std::unique_ptr<catalog::Watcher>(const std::string& folder)> make_watcher;
  bool watch_thread = false;
  // With watch_thread: the watch thread sets the watcher up once the first
  // build has ended instead of the constructor (a folder of tens of thousands
  // of directories takes as many watches, which would delay readiness). Until
  // then health() reports the watcher "starting" and nothing is vouched for
  // by it; when it starts, everything is treated as changed once (a re-walk,
  // the listeners told of an overflow, no refresh reuses an earlier build).
  bool watch_after_first_build = false;
  std::chrono::milliseconds watch_turn_timeout{500};
  std::chrono::milliseconds write_quiet_period{std::chrono::seconds(2)};
  std::chrono::milliseconds cookie_wait_limit{std::chrono::seconds(2)};
  // How long a resolve may trust the watcher instead of a stat() of the signature.
  std::chrono::milliseconds identity_recheck_interval{250};
  // The least time from the end of one refresh build to the start of the next (sessions?refresh=true).
  std::chrono::milliseconds refresh_interval{std::chrono::seconds(1)};
  // The acquisitions poll stat()s every master's files at least this often;
  // in between, while the watcher vouches, only the masters a change named.
  std::chrono::milliseconds acquisitions_recheck_interval{std::chrono::seconds(10)};

  // The catalog cache file (catalog::default_catalog_cache_path for the
  // daemon); empty: no cache.
  std::string cache_path;
  std::size_t inspect_threads = 1;  // a build's parallel inspections
  // The inspector's memory of condemned masters: a refresh forgets all of
  // them, a resolve of a condemned master (a load asked for) forgets that one
  // (at most once per condemned_retry_interval per master). Empty: nothing to forget.
  std::function<void()> forget_inspection_failures;
  std::function<bool(const std::string& master_path)> forget_inspection_failure;
  // Whether an inspection is the inspector's condemnation (never kept in the cache file).
  std::function<bool(const catalog::Acquisition&)> condemned;
  std::chrono::milliseconds condemned_retry_interval{std::chrono::seconds(5)};
};

// What the catalog cannot see well, for /api/health/ready, /metrics and the sessions document.
struct CatalogHealth {
  std::vector<catalog::UnreadableDirectory> unreadable;  // below the data folder (its own state is `stale`)
  std::optional<catalog::WatcherHealth> watcher;          // none without a watcher
};

// A catalog document as sent: compact JSON, its entity tag (quoted) and, made
// on first use, its gzip form.
class DocumentBody {
 public:
  explicit DocumentBody(std::string json);
  const std::shared_ptr<const std::string>& json() const { return json_; }
  const std::string& etag() const { return etag_; }
  std::shared_ptr<const std::string> gzip() const;  // thread-safe; made once

 private:
  std::shared_ptr<const std::string> json_;
  std::string etag_;
  mutable std::mutex gzip_mutex_;
  mutable std::shared_ptr<const std::string> gzip_;
};

// gzip (RFC 1952) of `bytes`. Throws quantem::Error (internal) when zlib fails.
std::string gzip_compress(std::string_view bytes, int level);

// What one watch turn saw, for listeners.
struct SourceChange {
  std::vector<std::string> files;    // changed files and directories, absolute, each once
  std::vector<std::string> masters;  // known masters whose signature names one of them (or that changed)
  bool overflow = false;             // events were lost: any source may have changed
};

// The daemon's watching: inotify (else polling every polling_period) on a thread.
CatalogServiceOptions watching_catalog_options(std::chrono::milliseconds polling_period = std::chrono::seconds(1));

class CatalogService {
 public:
  explicit CatalogService(std::string data_folder, CatalogServiceOptions options = {});
  ~CatalogService();
  CatalogService(const CatalogService&) = delete;
  CatalogService& operator=(const CatalogService&) = delete;

  const std::string& data_folder() const { return data_folder_; }

  // The cached catalog; built when absent or when refresh is true.
  std::shared_ptr<const catalog::Catalog> catalog(bool refresh);
  bool built() const;
  std::uint64_t builds() const;  // completed builds (tests and metrics)
  std::uint64_t callers_waiting_for_build() const;  // callers sharing a running build
  std::uint64_t inspections_made() const { return inspections_made_; }  // re-inspections outside builds (tests)

  std::uint64_t refreshes_reused() const { return refreshes_reused_; }  // refreshes answered without a build

  CatalogHealth health() const;
  // Adds what health() found to /api/health/ready's document: "watcher" (always
  // with a watcher), "unreadable_folders" and "warnings" (when there are any).
  void add_health_fields(nlohmann::ordered_json& document) const;
  // Prometheus lines: quantem_catalog_unreadable_folders, quantem_watch_directories,
  // quantem_watch_polled_directories, quantem_watch_folder_refollows_total.
  std::string metrics_text() const;
  // The sessions document: the cached catalog, or with `refresh` a refresh
  // (coalesced and rate-limited, see above). Adds "unreadable_folders" when
  // a directory cannot be listed. partial: while the first build runs, the
  // catalog known so far with "complete": false (see above) instead of
  // waiting for it. sessions_body: the same document as sent.
  nlohmann::ordered_json sessions_document(bool refresh, bool partial = false);
  std::shared_ptr<const DocumentBody> sessions_body(bool refresh, bool partial = false);
  // Masters the builds reused (from the cache or the previous catalog) and inspected, summed over builds.
  std::uint64_t masters_reused() const { return masters_reused_; }
  std::uint64_t masters_inspected() const { return masters_inspected_; }
  // Waits for the cache file write of the last build (tests).
  void wait_for_cache_write();

  // Opens the data folder; returns why it cannot be read (and marks the
  // catalog stale, logging the change), nullopt when it can.
  std::optional<std::string> check_data_folder();
  // The reason of the last check_data_folder(), nullopt when not stale.
  std::optional<std::string> stale_reason() const;
  nlohmann::ordered_json acquisitions_document();
  std::shared_ptr<const DocumentBody> acquisitions_body();

  // (session, file) -> the master's current inspection. Throws quantem::Error:
  //   bad_request "file must be one master filename"
  //   not_found   "unknown session: <session>" / "master not found: <file>"
  // A master whose files are being written resolves as not loadable with the
  // reason "source files are being written: <names>".
  catalog::Acquisition resolve(const std::string& session, const std::string& file);
  // The same, shared (no copy of the signature per request).
  std::shared_ptr<const catalog::Acquisition> resolve_shared(const std::string& session, const std::string& file);
  // Resolves that stat()ed the signature (tests: the watcher path skips it).
  std::uint64_t signature_restats() const { return signature_restats_; }

  // One turn of the watch loop: waits up to `timeout` for the watcher, applies
  // what it saw and calls the listeners. Returns the number of changes seen
  // (0 without a watcher). Called by the watch thread, or by tests.
  std::size_t watch_turn(std::chrono::milliseconds timeout);
  void on_sources_changed(std::function<void(const SourceChange&)> listener);
  std::string watcher_kind() const;  // "inotify", "polling", "fake", or "" when not watching
  // Stops the watch thread (idempotent; the destructor calls it). Listeners
  // are not called after it returns.
  void stop_watching();

 private:
  std::shared_ptr<const catalog::Catalog> rebuild_for_unknown_name();
  // A refresh: reuses, waits for or starts a build (see above).
  std::shared_ptr<const catalog::Catalog> refreshed_catalog();
  // The watcher vouches that nothing under the folder changed since change_turns_ was `change_turns`.
  bool nothing_changed_since_locked(std::uint64_t change_turns) const;
  struct Walk {
    std::vector<std::string> masters;
    std::vector<catalog::UnreadableDirectory> unreadable;
  };
  Walk walk_folder() const;
  void drop_data_folder(Walk& walk) const;  // the data folder itself is reported as stale, not unreadable
  void set_masters_locked(Walk walk);
  // One build: kept inspections reused, the rest inspected; progress published to partial_.
  catalog::Catalog build_now(catalog::BuildCounts& counts, Walk& walk);
  // One build (logged, errors kept in `error`), then its results made current.
  std::shared_ptr<const catalog::Catalog> run_build(Walk& walk, catalog::BuildCounts& counts,
                                                    std::optional<std::string>& error);
  void publish_locked(const std::shared_ptr<const catalog::Catalog>& built, Walk walk, std::uint64_t change_turns_at_start);
  std::map<std::string, catalog::Acquisition> kept_inspections();
  void save_cache(std::shared_ptr<const catalog::Catalog> built, std::size_t inspected);
  bool is_condemned(const catalog::Acquisition& acquisition) const {
    return options_.condemned && options_.condemned(acquisition);
  }
  // Lets the inspector try a condemned master again (rate-limited per master); true when it will.
  bool retry_condemned(const catalog::Acquisition& acquisition);
  void background_walk();
  // The steps of watch_turn().
  struct TurnResult {
    SourceChange change;
    bool walk = false;
    std::vector<std::function<void(const SourceChange&)>> listeners;
  };
  TurnResult apply_changes_locked(const catalog::FileChanges& seen);
  std::set<std::string> note_file_events_locked(const catalog::FileChanges& seen, TurnResult& turn);
  std::vector<std::string> masters_named_locked(const std::set<std::string>& files, bool everything) const;
  void forget_vouches_named_locked(const std::set<std::string>& files, bool everything);
  // A walk after a turn: of the changed paths alone where that is exact (`changed`), else of the whole folder.
  void rewalk_after_change(const std::vector<std::string>* changed = nullptr);
  std::optional<Walk> walk_changed_paths(const std::vector<std::string>& changed) const;
  static void tell_listeners(const TurnResult& turn);
  // Marks the acquisition not ready when one of its files is being written.
  void mark_files_being_written(std::vector<catalog::Acquisition>& acquisitions);
  std::vector<std::string> files_being_written_locked(const catalog::Acquisition& acquisition) const;
  bool catch_up_with_watcher();  // cookie round trip through the watch thread; false when impossible
  // A verified inspection of `master` that the watcher vouches for, or nullptr.
  std::shared_ptr<const catalog::Acquisition> watched_unchanged(const std::string& master);
  bool watcher_reports_every_file_of(const catalog::Acquisition& acquisition) const;
  // The acquisitions poll (see above): what it checks again, each master's event as rendered.
  struct PollPlan {
    bool check_all = true;
    std::set<std::string> dirty;              // masters a change named
    std::set<std::string> dirty_directories;  // directories created, moved or removed
    std::vector<std::string> masters;
    std::uint64_t masters_generation = 0;
    bool names(const std::string& master) const;
  };
  struct PollEntry {
    bool ready = false;
    std::string event;  // protocol::acquisition_event, compact
    std::string token;  // its part of the ready_token's input (ready ones)
    bool busy = false;  // marked as being written at this poll
  };
  // The same master path, stem, signature and status: inspections of the same files.
  static bool same_inspection(const catalog::Acquisition& a, const catalog::Acquisition& b);
  static bool same_catalog(const catalog::Catalog& a, const catalog::Catalog& b);
  void note_poll_changes_locked(const catalog::FileChanges& seen, const SourceChange& change);
  void start_walks_for_poll(std::unique_lock<std::mutex>& lock);
  bool watcher_vouches_for_poll_locked() const;
  std::vector<PollEntry> poll_entries(const PollPlan& plan);
  static PollEntry render_poll_entry(const catalog::Acquisition& acquisition);
  static std::string poll_document_text(const std::vector<PollEntry>& entries);
  // The watcher once it is set up (it only goes from null to set, and lives until the destructor).
  catalog::Watcher* watcher() const { return watcher_.load(std::memory_order_acquire); }
  void watch_loop();
  // watch_after_first_build: waits for the first build, sets the watcher up and treats everything as changed once.
  bool start_watching_after_first_build();

  const std::string data_folder_;
  const CatalogServiceOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable build_done_;
  std::shared_ptr<const catalog::Catalog> catalog_;
  bool building_ = false;
  bool catalog_has_condemned_ = false;  // the current catalog lists a master the inspector condemned
  std::uint64_t builds_ = 0;
  std::uint64_t build_attempts_ = 0;
  std::uint64_t waiting_ = 0;
  std::optional<std::string> build_error_;
  std::chrono::steady_clock::time_point last_build_{};
  std::uint64_t change_turns_at_build_start_ = 0;  // change_turns_ when the last successful build began
  std::uint64_t change_turns_at_running_build_start_ = 0;  // the same for the build in flight
  bool refresh_pending_ = false;  // a refresh waits for the end of the interval to build
  std::atomic<std::uint64_t> refreshes_reused_{0};
  std::map<std::string, catalog::Acquisition> fresh_;  // re-inspections since the last build
  std::optional<std::string> stale_reason_;  // the data folder cannot be read
  std::string stale_since_;                  // UTC, ISO 8601

  // Acquisitions poll.
  std::vector<std::string> masters_;
  std::vector<catalog::UnreadableDirectory> unreadable_;  // by the last walk
  bool walked_ = false;
  bool walk_in_flight_ = false;
  std::chrono::steady_clock::time_point last_walk_{};
  // Each master's last inspection and, once the poll rendered it, its event.
  struct Polled {
    catalog::Acquisition acquisition;
    std::string event;  // empty: not rendered (or being written)
    std::string token;
  };
  std::map<std::string, Polled> inspections_;
  std::uint64_t masters_generation_ = 0;  // changes with masters_
  static constexpr std::size_t kMaxPollDirtyDirectories = 256;
  std::set<std::string> poll_dirty_;
  std::set<std::string> poll_dirty_directories_;
  bool poll_all_dirty_ = true;
  std::chrono::steady_clock::time_point last_full_poll_check_{};
  std::shared_ptr<const DocumentBody> acquisitions_body_;
  std::uint64_t acquisitions_body_masters_ = 0;  // masters_generation_ it was made from
  bool acquisitions_body_reusable_ = false;        // it lists no master being written
  std::thread walker_;
  bool stopping_ = false;

  // Watching.
  std::atomic<std::uint64_t> inspections_made_{0};
  std::unique_ptr<catalog::Watcher> watcher_owner_;
  std::atomic<catalog::Watcher*> watcher_{nullptr};
  std::atomic<bool> watching_unavailable_{false};  // watch_after_first_build: the watcher could not be made
  std::thread watch_thread_;
  bool watching_stopped_ = false;
  std::mutex turn_mutex_;  // one turn at a time
  std::map<std::string, std::chrono::steady_clock::time_point> writing_;  // file -> last write seen (not closed)
  std::vector<std::function<void(const SourceChange&)>> listeners_;
  // Inspections verified by a stat() with every later change to their files
  // reported by the watcher: dropped by any turn that names one of their
  // files (or a directory above one), by an overflow and by a rebuild.
  // Trusted for identity_recheck_interval after `verified`.
  struct Vouched {
    std::shared_ptr<const catalog::Acquisition> acquisition;
    std::chrono::steady_clock::time_point verified;
  };
  std::map<std::string, Vouched> unchanged_since_stat_;
  std::uint64_t reads_applied_ = 0;  // the watcher's reads_begun() whose changes are applied
  std::uint64_t change_turns_ = 0;   // turns that applied a change or an overflow (a generation)
  std::atomic<std::uint64_t> signature_restats_{0};
  std::uint64_t cookies_made_ = 0;
  std::vector<std::string> cookies_seen_;
  std::condition_variable cookie_seen_;

  // Builds, the cache file and the documents as sent.
  bool cache_file_read_ = false;
  std::shared_ptr<const catalog::Catalog> partial_;  // the first build's progress
  std::atomic<bool> partial_wanted_{false};          // a partial request came during the first build
  std::atomic<std::uint64_t> masters_reused_{0};
  std::atomic<std::uint64_t> masters_inspected_{0};
  // What the cache file holds (masters, and re-inspections made outside
  // builds by then): a build that inspected nothing new leaves it as it is.
  std::set<std::string> cache_file_masters_;
  std::uint64_t cache_file_inspections_made_ = ~std::uint64_t{0};
  std::mutex cache_writer_mutex_;
  std::thread cache_writer_;
  std::shared_ptr<const catalog::Catalog> sessions_body_catalog_;
  std::optional<std::string> sessions_body_stale_;
  std::shared_ptr<const DocumentBody> sessions_body_;
  std::map<std::string, std::chrono::steady_clock::time_point> condemned_retries_;
};

}  // namespace quantem::server
