// The data-folder watchers (inotify, polling, fake) and the catalog service's
// watch turns: prompt re-walks, files being written, listeners, cookies.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "quantem/catalog/watcher.hpp"
#include "quantem/core/error.hpp"
#include "quantem/server/catalog_service.hpp"
#include "server_fixtures.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::catalog;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

bool has(const FileChanges& seen, const std::string& path, FileEvent event) {
  return std::any_of(seen.changes.begin(), seen.changes.end(),
                     [&](const FileChange& c) { return c.path == path && c.event == event; });
}

// Takes turns (bounded) until every expected (path, event) was reported.
bool wait_for_events(Watcher& watcher, const std::vector<std::pair<std::string, FileEvent>>& expected,
                     FileChanges* all = nullptr) {
  FileChanges seen;
  for (int turn = 0; turn < 200; ++turn) {
    const FileChanges got = watcher.wait(50ms);
    seen.changes.insert(seen.changes.end(), got.changes.begin(), got.changes.end());
    seen.overflow = seen.overflow || got.overflow;
    const bool complete = std::all_of(expected.begin(), expected.end(),
                                      [&](const auto& e) { return has(seen, e.first, e.second); });
    if (complete) {
      if (all) *all = seen;
      return true;
    }
  }
  if (all) *all = seen;
  return false;
}

std::string describe(const FileChanges& seen) {
  std::string text;
  for (const auto& c : seen.changes) text += c.path + " " + file_event_name(c.event) + "\n";
  return text;
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

std::size_t event_count(const nlohmann::ordered_json& doc) { return doc["pending"].size() + doc["history"].size(); }

}  // namespace

// ---- watchers --------------------------------------------------------------------

TEST(InotifyWatcher, ReportsCreatedWrittenClosedAndRemovedFiles) {
  test::TempDir dir;
  auto watcher = make_inotify_watcher(dir.path());
  EXPECT_EQ(watcher->kind(), "inotify");
  const std::string path = dir.file("a_data_000001.h5");
  write_file(path, "frames");
  FileChanges seen;
  EXPECT_TRUE(wait_for_events(*watcher, {{path, FileEvent::created}, {path, FileEvent::written}, {path, FileEvent::write_closed}},
                              &seen))
      << describe(seen);
  ::chmod(path.c_str(), 0640);
  EXPECT_TRUE(wait_for_events(*watcher, {{path, FileEvent::attributes}}, &seen)) << describe(seen);
  fs::remove(path);
  EXPECT_TRUE(wait_for_events(*watcher, {{path, FileEvent::removed}}, &seen)) << describe(seen);
}

TEST(InotifyWatcher, WatchesNewDirectoriesAndReportsWhatTheyAlreadyHold) {
  test::TempDir dir;
  auto watcher = make_inotify_watcher(dir.path());
  fs::create_directories(dir.file("session/deeper"));
  write_file(dir.file("session/deeper/early_master.h5"), "x");  // may land before the new directory is watched
  FileChanges seen;
  EXPECT_TRUE(wait_for_events(*watcher, {{dir.file("session"), FileEvent::created},
                                         {dir.file("session/deeper/early_master.h5"), FileEvent::created}},
                              &seen))
      << describe(seen);
  const std::string later = dir.file("session/deeper/later_data_000001.h5");
  write_file(later, "y");
  EXPECT_TRUE(wait_for_events(*watcher, {{later, FileEvent::write_closed}}, &seen)) << describe(seen);
  // A directory moved away is no longer watched under its old name.
  fs::rename(dir.file("session"), dir.file("_moved"));
  EXPECT_TRUE(wait_for_events(*watcher, {{dir.file("session"), FileEvent::removed}, {dir.file("_moved"), FileEvent::created}},
                              &seen))
      << describe(seen);
  write_file(dir.file("_moved/deeper/after_move.h5"), "z");
  EXPECT_TRUE(wait_for_events(*watcher, {{dir.file("_moved/deeper/after_move.h5"), FileEvent::write_closed}}, &seen))
      << describe(seen);
}

TEST(InotifyWatcher, InterruptEndsAWait) {
  test::TempDir dir;
  auto watcher = make_inotify_watcher(dir.path());
  auto waiting = std::async(std::launch::async, [&] { return watcher->wait(std::chrono::minutes(5)).empty(); });
  std::this_thread::sleep_for(20ms);
  watcher->interrupt();
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(waiting.get());
}

TEST(InotifyWatcher, FollowsTheFolderByPathWhenItIsSwappedForACopy) {
  test::TempDir dir;
  const std::string folder = dir.file("data");
  fs::create_directories(folder + "/sess");
  write_file(folder + "/sess/a_data_000001.h5", "old");
  auto watcher = make_inotify_watcher(folder);
  ASSERT_TRUE(watcher->reports_every_change());
  // mv data data.old && cp -a data.old data
  fs::rename(folder, dir.file("data.old"));
  fs::copy(dir.file("data.old"), folder, fs::copy_options::recursive);
  FileChanges seen;
  for (int turn = 0; turn < 100 && !seen.overflow; ++turn) seen.overflow = watcher->wait(20ms).overflow;
  EXPECT_TRUE(seen.overflow);  // everything may have changed
  EXPECT_GE(watcher->health().refollows, 1u);
  EXPECT_TRUE(watcher->health().folder_present);
  EXPECT_TRUE(watcher->reports_changes_in(folder + "/sess"));  // the new directory at the path
  // A rewrite inside the new folder is reported; one inside the old is not.
  write_file(dir.file("data.old/sess/a_data_000001.h5"), "old, again");
  write_file(folder + "/sess/a_data_000001.h5", "new");
  EXPECT_TRUE(wait_for_events(*watcher, {{folder + "/sess/a_data_000001.h5", FileEvent::write_closed}}, &seen))
      << describe(seen);
  EXPECT_FALSE(std::any_of(seen.changes.begin(), seen.changes.end(),
                           [](const FileChange& c) { return c.path.find("data.old") != std::string::npos; }));
}

TEST(InotifyWatcher, AFolderThatGoesAwayAndComesBackIsWatchedAgain) {
  test::TempDir dir;
  const std::string folder = dir.file("data");
  fs::create_directories(folder);
  auto watcher = make_inotify_watcher(folder);
  fs::rename(folder, dir.file("away"));
  FileChanges seen;
  for (int turn = 0; turn < 100 && !seen.overflow; ++turn) seen.overflow = watcher->wait(20ms).overflow;
  EXPECT_TRUE(seen.overflow);
  EXPECT_FALSE(watcher->health().folder_present);
  EXPECT_FALSE(watcher->reports_every_change());
  EXPECT_FALSE(watcher->reports_changes_in(folder));
  fs::create_directories(folder + "/sess");  // another directory at the path
  seen = {};
  for (int turn = 0; turn < 100 && !seen.overflow; ++turn) seen.overflow = watcher->wait(20ms).overflow;
  EXPECT_TRUE(seen.overflow);
  EXPECT_TRUE(watcher->health().folder_present);
  write_file(folder + "/sess/b_master.h5", "x");
  EXPECT_TRUE(wait_for_events(*watcher, {{folder + "/sess/b_master.h5", FileEvent::write_closed}}, &seen))
      << describe(seen);
}

TEST(InotifyWatcher, BeyondTheWatchLimitItPollsTheRestAndKeepsReporting) {
  test::TempDir dir;
  fs::create_directories(dir.file("one"));
  fs::create_directories(dir.file("two/deeper"));
  InotifyOptions options;
  options.watch_limit = 2;  // the folder and one of its directories
  options.poll_period = 20ms;
  auto watcher = make_inotify_watcher(dir.path(), options);
  const WatcherHealth health = watcher->health();
  EXPECT_EQ(health.watched_directories, 2u);
  EXPECT_EQ(health.polled_directories, 2u);  // the other directory and the one below it
  EXPECT_EQ(health.poll_period, 20ms);
  EXPECT_FALSE(watcher->reports_every_change());
  const std::string polled = watcher->reports_changes_in(dir.file("one")) ? "two" : "one";
  EXPECT_FALSE(watcher->reports_changes_in(dir.file(polled)));
  // New files and directories in polled directories are reported by the scans.
  const std::string file = dir.file(polled + "/new_master.h5");
  write_file(file, "x");
  fs::create_directories(dir.file("three"));  // beyond the limit: polled too
  FileChanges seen;
  EXPECT_TRUE(wait_for_events(*watcher, {{file, FileEvent::created}, {dir.file("three"), FileEvent::created}}, &seen))
      << describe(seen);
  write_file(dir.file("three/late_master.h5"), "y");
  EXPECT_TRUE(wait_for_events(*watcher, {{dir.file("three/late_master.h5"), FileEvent::created}}, &seen))
      << describe(seen);
  write_file(file, "rewritten, longer");
  EXPECT_TRUE(wait_for_events(*watcher, {{file, FileEvent::written}}, &seen)) << describe(seen);
  EXPECT_EQ(watcher->health().watched_directories, 2u);
}

TEST(PollingWatcher, ReportsTheDifferencesBetweenScans) {
  test::TempDir dir;
  const std::string path = dir.file("a_data_000001.h5");
  write_file(path, "v1");
  auto watcher = make_polling_watcher(dir.path(), 5ms);
  EXPECT_EQ(watcher->kind(), "polling");
  const std::string added = dir.file("b_master.h5");
  write_file(added, "new");
  FileChanges seen;
  EXPECT_TRUE(wait_for_events(*watcher, {{added, FileEvent::created}}, &seen)) << describe(seen);
  EXPECT_FALSE(has(seen, path, FileEvent::created));  // what existed at start is not news
  write_file(path, "version 2");
  EXPECT_TRUE(wait_for_events(*watcher, {{path, FileEvent::written}}, &seen)) << describe(seen);
  ::chmod(path.c_str(), 0600);
  EXPECT_TRUE(wait_for_events(*watcher, {{path, FileEvent::attributes}}, &seen)) << describe(seen);
  fs::remove(added);
  EXPECT_TRUE(wait_for_events(*watcher, {{added, FileEvent::removed}}, &seen)) << describe(seen);
  watcher->interrupt();
  EXPECT_TRUE(watcher->wait(std::chrono::minutes(5)).empty());  // returns at once
}

TEST(Watcher, FallsBackToPollingWhenInotifyCannotWatchTheFolder) {
  test::TempDir dir;
  EXPECT_THROW(make_inotify_watcher(dir.file("missing")), Error);
  EXPECT_EQ(make_watcher(dir.file("missing"), 10ms)->kind(), "polling");
  EXPECT_EQ(make_watcher(dir.path(), 10ms)->kind(), "inotify");
}

TEST(FakeWatcher, ReturnsPushedChangesOneTurnAtATime) {
  FakeWatcher watcher;
  EXPECT_TRUE(watcher.wait(0ms).empty());
  watcher.push("/d/a_master.h5", FileEvent::created);
  watcher.push("/d/a_data_000001.h5", FileEvent::written);
  const FileChanges turn = watcher.wait(0ms);
  ASSERT_EQ(turn.changes.size(), 2u);
  EXPECT_EQ(turn.changes[1].event, FileEvent::written);
  EXPECT_TRUE(watcher.wait(0ms).empty());
  watcher.push_overflow();
  EXPECT_TRUE(watcher.wait(0ms).overflow);
  EXPECT_EQ(watcher.waits(), 4u);
}

// ---- the catalog service's watch turns ------------------------------------------------

namespace {

struct WatchedCatalog {
  explicit WatchedCatalog(const std::string& folder, std::chrono::milliseconds quiet = std::chrono::hours(1)) {
    server::CatalogServiceOptions options;
    options.rewalk_interval = std::chrono::hours(1);  // only the watcher finds new masters here
    options.write_quiet_period = quiet;
    options.identity_recheck_interval = std::chrono::hours(1);  // vouches do not expire unless a test says so
    options.make_watcher = [this](const std::string&) {
      auto fake = std::make_unique<FakeWatcher>();
      watcher = fake.get();
      return fake;
    };
    service = std::make_unique<server::CatalogService>(folder, options);
  }
  FakeWatcher* watcher = nullptr;
  std::unique_ptr<server::CatalogService> service;
};

}  // namespace

TEST(CatalogWatch, ANewMasterAppearsAtTheNextTurn) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  WatchedCatalog watched(dir.path());
  auto& service = *watched.service;
  EXPECT_EQ(service.watcher_kind(), "fake");
  EXPECT_EQ(event_count(service.acquisitions_document()), 1u);
  test::write_synth(dir.file("sess2"), "beta");
  EXPECT_EQ(event_count(service.acquisitions_document()), 1u);  // nothing seen yet
  watched.watcher->push(dir.file("sess2"), FileEvent::created, true);
  EXPECT_EQ(service.watch_turn(0ms), 1u);
  EXPECT_EQ(event_count(service.acquisitions_document()), 2u);
  EXPECT_EQ(service.watch_turn(0ms), 0u);  // an idle turn
}

TEST(CatalogWatch, ATurnWalksOnlyThePathsItNamesAndListsWhatAWholeWalkLists) {
  test::TempDir dir;
  test::write_synth(dir.file("b"), "one");
  test::write_synth(dir.file("a-c"), "two");
  WatchedCatalog watched(dir.path());
  auto& service = *watched.service;
  auto paths = [](const nlohmann::ordered_json& doc) {
    std::vector<std::string> found;
    for (const auto* list : {&doc["pending"], &doc["history"]})
      for (const auto& event : *list) found.push_back(event["path"].get<std::string>());
    std::sort(found.begin(), found.end());
    return found;
  };
  auto in_order = [](const nlohmann::ordered_json& doc) {
    std::vector<std::string> found;
    for (const auto& event : doc["history"]) found.push_back(event["path"].get<std::string>());
    return found;
  };
  EXPECT_EQ(event_count(service.acquisitions_document()), 2u);
  test::write_synth(dir.file("a/b"), "three");          // a new folder tree
  test::write_synth(dir.file("b"), "four");             // a new master beside one
  test::write_synth(dir.file("_hidden"), "five");       // never listed
  fs::remove_all(dir.file("a-c"));                      // a session folder removed
  watched.watcher->push(dir.file("a"), FileEvent::created, true);
  watched.watcher->push(dir.file("b/four_master.h5"), FileEvent::created);
  watched.watcher->push(dir.file("_hidden"), FileEvent::created, true);
  watched.watcher->push(dir.file("a-c"), FileEvent::removed, true);
  service.watch_turn(0ms);
  const auto incremental = service.acquisitions_document();
  // The same masters, in the same order, as a service that walks the whole folder.
  server::CatalogService fresh(dir.path());
  const auto whole = fresh.acquisitions_document();
  EXPECT_EQ(paths(incremental), paths(whole));
  EXPECT_EQ(in_order(incremental), in_order(whole));
  EXPECT_EQ(event_count(incremental), 3u);
  EXPECT_EQ(incremental["history"][0]["path"], dir.file("a/b/three_master.h5"));
}

TEST(CatalogWatch, AVouchedPollChecksOnlyTheMastersAChangeNamed) {
  test::TempDir dir;
  test::write_synth(dir.file("s1"), "alpha");
  test::write_synth(dir.file("s2"), "beta");
  WatchedCatalog watched(dir.path());
  auto& service = *watched.service;
  watched.watcher->set_reports_every_change(true);
  const auto first = service.acquisitions_body();
  EXPECT_EQ(service.inspections_made(), 2u);
  EXPECT_EQ(service.acquisitions_body(), first);  // the kept document itself
  // A change the watcher does not report is not looked for by a vouched poll...
  const std::string alpha = dir.file("s1/alpha_master.h5"), beta = dir.file("s2/beta_master.h5");
  fs::last_write_time(alpha, fs::last_write_time(alpha) + 1s);
  fs::last_write_time(beta, fs::last_write_time(beta) + 1s);
  EXPECT_EQ(service.acquisitions_body(), first);
  EXPECT_EQ(service.inspections_made(), 2u);
  // ...one it reports re-inspects exactly the master it names.
  watched.watcher->push(alpha, FileEvent::attributes);
  EXPECT_EQ(service.watch_turn(0ms), 1u);
  const auto second = service.acquisitions_body();
  EXPECT_NE(second->etag(), first->etag());
  EXPECT_EQ(service.inspections_made(), 3u);
  // A directory event names every master below it.
  watched.watcher->push(dir.file("s2"), FileEvent::attributes, true);
  EXPECT_EQ(service.watch_turn(0ms), 1u);
  service.acquisitions_body();
  EXPECT_EQ(service.inspections_made(), 4u);
  // Without the watcher's word, every master's files are stat()ed at every poll.
  fs::last_write_time(beta, fs::last_write_time(beta) + 1s);
  watched.watcher->set_reports_every_change(false);
  const auto third = service.acquisitions_body();
  EXPECT_EQ(service.inspections_made(), 5u);
  EXPECT_EQ(service.acquisitions_document()["history"].size(), 2u);
  EXPECT_EQ(*service.acquisitions_body()->json(), *third->json());
}

TEST(CatalogWatch, AShardBeingWrittenIsNeverServedUntilItsWriterCloses) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  const std::string shard = dir.file("sess/alpha_data_000001.h5");
  WatchedCatalog watched(dir.path());
  auto& service = *watched.service;
  ASSERT_TRUE(service.resolve("sess", "alpha_master.h5").status.loadable);
  const auto ready_token = service.acquisitions_document()["ready_token"];

  watched.watcher->push(shard, FileEvent::written);
  service.watch_turn(0ms);
  const auto writing = service.resolve("sess", "alpha_master.h5");
  EXPECT_FALSE(writing.status.loadable);
  EXPECT_EQ(writing.status.reason, "source files are being written: alpha_data_000001.h5");
  auto doc = service.acquisitions_document();
  ASSERT_EQ(doc["pending"].size(), 1u);
  EXPECT_EQ(doc["pending"][0]["kind"], "writing");
  EXPECT_NE(doc["ready_token"], ready_token);

  watched.watcher->push(shard, FileEvent::write_closed);
  service.watch_turn(0ms);
  EXPECT_TRUE(service.resolve("sess", "alpha_master.h5").status.loadable);
  doc = service.acquisitions_document();
  EXPECT_EQ(doc["history"].size(), 1u);
  EXPECT_EQ(doc["ready_token"], ready_token);
}

TEST(CatalogWatch, WritingEndsAfterTheQuietPeriodWithoutAClose) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  WatchedCatalog watched(dir.path(), 30ms);
  auto& service = *watched.service;
  service.resolve("sess", "alpha_master.h5");
  watched.watcher->push(dir.file("sess/alpha_data_000001.h5"), FileEvent::written);  // polling sees no closes
  service.watch_turn(0ms);
  std::this_thread::sleep_for(40ms);
  EXPECT_TRUE(service.resolve("sess", "alpha_master.h5").status.loadable);
}

TEST(CatalogWatch, ListenersHearTheChangedFilesAndTheirMasters) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  test::write_synth(dir.file("sess"), "beta");
  WatchedCatalog watched(dir.path());
  auto& service = *watched.service;
  service.acquisitions_document();  // inspections known
  std::vector<server::SourceChange> heard;
  service.on_sources_changed([&](const server::SourceChange& change) { heard.push_back(change); });
  const std::string shard = dir.file("sess/alpha_data_000001.h5");
  watched.watcher->push(shard, FileEvent::written);
  watched.watcher->push(shard, FileEvent::write_closed);
  service.watch_turn(0ms);
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_EQ(heard[0].files, std::vector<std::string>({shard}));
  EXPECT_EQ(heard[0].masters, std::vector<std::string>({dir.file("sess/alpha_master.h5")}));
  EXPECT_FALSE(heard[0].overflow);

  watched.watcher->push_overflow();
  service.watch_turn(0ms);
  ASSERT_EQ(heard.size(), 2u);
  EXPECT_TRUE(heard[1].overflow);
  EXPECT_EQ(heard[1].masters.size(), 2u);  // everything may have changed

  watched.watcher->push(dir.file(".quantem-cookie-1-1"), FileEvent::created);  // cookies are not changes
  service.watch_turn(0ms);
  EXPECT_EQ(heard.size(), 2u);
}

TEST(CatalogWatch, TheRealWatcherCatchesUpBeforeRefusingAFileJustClosed) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  const std::string shard = dir.file("sess/alpha_data_000001.h5");
  auto options = server::watching_catalog_options(10ms);
  options.write_quiet_period = std::chrono::hours(1);
  server::CatalogService service(dir.path(), options);
  ASSERT_EQ(service.watcher_kind(), "inotify");
  ASSERT_TRUE(service.resolve("sess", "alpha_master.h5").status.loadable);

  const int fd = ::open(shard.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "tail", 4), 4);  // a writer appends and keeps the file open
  catalog::Acquisition busy;
  for (int i = 0; i < 500; ++i) {  // the watch thread sees the write soon
    busy = service.resolve("sess", "alpha_master.h5");
    if (!busy.status.loadable) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_FALSE(busy.status.loadable);
  EXPECT_EQ(busy.status.reason, "source files are being written: alpha_data_000001.h5");
  ::close(fd);
  // Right after the close, with the watch thread perhaps not yet through its
  // events: the cookie round trip makes the answer exact.
  EXPECT_TRUE(service.resolve("sess", "alpha_master.h5").status.loadable);
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename().string().rfind(".quantem-cookie-", 0), std::string::npos) << entry.path();
  }
}

TEST(CatalogWatch, APollReusesInspectionsUntilAFileOfTheirSignatureChanges) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  server::CatalogService service(dir.path());
  const auto first = service.acquisitions_document();
  const std::uint64_t inspected = service.inspections_made();
  EXPECT_EQ(inspected, 1u);
  EXPECT_EQ(service.acquisitions_document()["ready_token"], first["ready_token"]);
  EXPECT_EQ(service.inspections_made(), inspected);  // unchanged: no re-inspection, the same token
  const std::string master = dir.file("sess/alpha_master.h5");
  const auto later = fs::last_write_time(master) + std::chrono::seconds(1);
  fs::last_write_time(master, later);  // touch the master
  const auto touched = service.acquisitions_document();
  EXPECT_EQ(service.inspections_made(), inspected + 1);  // exactly one re-inspection
  EXPECT_NE(touched["ready_token"], first["ready_token"]);
  service.acquisitions_document();
  EXPECT_EQ(service.inspections_made(), inspected + 1);
}

// ---- resolving without a stat() per file when the watcher vouches -------------------

TEST(CatalogWatch, AMasterTheWatcherVouchesForIsNotStatAgainUntilAChangeNamesIt) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha", 3, 4, 1);
  WatchedCatalog watched(dir.path());
  auto& service = *watched.service;
  watched.watcher->set_reports_every_change(true);
  const auto first = service.resolve("sess", "alpha_master.h5");
  EXPECT_EQ(service.signature_restats(), 1u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(service.resolve("sess", "alpha_master.h5").signature, first.signature);
  EXPECT_EQ(service.signature_restats(), 1u);  // vouched for: no stat() per request

  // Rewritten, and the watcher has the events but no turn has read them (the
  // kernel queue): the next resolve stats and sees the new files.
  std::this_thread::sleep_for(20ms);
  test::write_synth(dir.file("sess"), "alpha", 2, 5, 2);
  watched.watcher->push(dir.file("sess/alpha_data_000001.h5"), FileEvent::written);
  const auto rewritten = service.resolve("sess", "alpha_master.h5");
  EXPECT_NE(rewritten.signature, first.signature);
  EXPECT_EQ(rewritten.scan_rows, 2u);
  EXPECT_EQ(rewritten.scan_cols, 5u);
  EXPECT_EQ(service.signature_restats(), 2u);
  watched.watcher->push(dir.file("sess/alpha_data_000001.h5"), FileEvent::write_closed);
  service.watch_turn(0ms);  // applied: one stat() verifies the new state, then none
  EXPECT_EQ(service.resolve("sess", "alpha_master.h5").signature, rewritten.signature);
  EXPECT_EQ(service.resolve("sess", "alpha_master.h5").signature, rewritten.signature);
  EXPECT_EQ(service.signature_restats(), 3u);

  // A change the turn applied, to the master itself or to a directory above.
  for (const auto& [path, is_directory] :
       std::vector<std::pair<std::string, bool>>{{dir.file("sess/alpha_master.h5"), false}, {dir.file("sess"), true}}) {
    const auto before = service.signature_restats();
    watched.watcher->push(path, FileEvent::attributes, is_directory);
    service.watch_turn(0ms);
    service.resolve("sess", "alpha_master.h5");
    EXPECT_EQ(service.signature_restats(), before + 1) << path;
    service.resolve("sess", "alpha_master.h5");
    EXPECT_EQ(service.signature_restats(), before + 1) << path;
  }
  // Lost events: everything is stat()ed again.
  const auto before = service.signature_restats();
  watched.watcher->push_overflow();
  service.watch_turn(0ms);
  service.resolve("sess", "alpha_master.h5");
  EXPECT_EQ(service.signature_restats(), before + 1);
}

TEST(CatalogWatch, TheWatchersWordIsTrustedOnlyForTheRecheckInterval) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha", 3, 4, 1);
  server::CatalogServiceOptions options;
  options.identity_recheck_interval = 100ms;
  FakeWatcher* fake = nullptr;
  options.make_watcher = [&](const std::string&) {
    auto made = std::make_unique<FakeWatcher>();
    fake = made.get();
    return made;
  };
  server::CatalogService service(dir.path(), options);
  fake->set_reports_every_change(true);
  const auto first = service.resolve("sess", "alpha_master.h5");
  service.resolve("sess", "alpha_master.h5");
  const auto vouched = service.signature_restats();
  // A rewrite the watcher never reports (a swapped folder before the watcher
  // looks, a hard link elsewhere): found by the stat once the interval is over.
  std::this_thread::sleep_for(20ms);
  test::write_synth(dir.file("sess"), "alpha", 2, 5, 2);
  std::this_thread::sleep_for(150ms);
  const auto later = service.resolve("sess", "alpha_master.h5");
  EXPECT_EQ(service.signature_restats(), vouched + 1);
  EXPECT_NE(later.signature, first.signature);
  EXPECT_EQ(later.scan_rows, 2u);
}

TEST(CatalogWatch, RefreshesShareOneBuildAndReuseItWhileNothingChanged) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  WatchedCatalog watched(dir.path());
  auto& service = *watched.service;
  watched.watcher->set_reports_every_change(true);
  service.sessions_document(false);
  ASSERT_EQ(service.builds(), 1u);
  // Nothing changed since the build began (the watcher vouches): reused.
  for (int i = 0; i < 5; ++i) service.sessions_document(true);
  EXPECT_EQ(service.builds(), 1u);
  EXPECT_EQ(service.refreshes_reused(), 5u);
  // A change: the next refresh builds (after the rate limit's interval) and sees it.
  test::write_synth(dir.file("sess"), "beta");
  watched.watcher->push(dir.file("sess/beta_master.h5"), FileEvent::created);
  service.watch_turn(0ms);
  std::vector<std::thread> callers;
  std::vector<std::size_t> files(8);
  for (std::size_t i = 0; i < files.size(); ++i) {
    callers.emplace_back([&, i] { files[i] = service.sessions_document(true)["sessions"][0]["files"].size(); });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(service.builds(), 2u);  // eight concurrent refreshes, one build
  for (const auto count : files) EXPECT_EQ(count, 2u);
}

TEST(CatalogWatch, RefreshesWithoutAWatcherThatVouchesAreRateLimited) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  server::CatalogServiceOptions options;
  options.refresh_interval = 300ms;
  server::CatalogService service(dir.path(), options);  // no watcher: every refresh must look at the disk
  service.sessions_document(false);
  test::write_synth(dir.file("sess"), "beta");
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(service.sessions_document(true)["sessions"][0]["files"].size(), 2u);  // never an old answer
  }
  const auto elapsed = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(service.builds(), 4u);
  EXPECT_GE(elapsed, 2 * 300ms);  // one build per interval at most (a lower bound, never flaky)
}

TEST(CatalogWatch, WithoutAWatcherThatSeesEveryChangeEveryResolveStats) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  WatchedCatalog watched(dir.path());  // the fake reports nothing by default (like polling)
  auto& service = *watched.service;
  for (int i = 0; i < 3; ++i) service.resolve("sess", "alpha_master.h5");
  EXPECT_EQ(service.signature_restats(), 3u);
  server::CatalogService unwatched(dir.path());
  for (int i = 0; i < 3; ++i) unwatched.resolve("sess", "alpha_master.h5");
  EXPECT_EQ(unwatched.signature_restats(), 3u);
}

TEST(CatalogWatch, WithInotifyARewrittenFileIsNeverResolvedStaleEvenBeforeATurnReadsItsEvents) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha", 3, 4, 1);
  // The real inotify watcher, turns stepped here: the events of a rewrite
  // stay in the kernel queue until the test takes a turn.
  server::CatalogServiceOptions options;
  options.make_watcher = [](const std::string& folder) { return catalog::make_inotify_watcher(folder); };
  server::CatalogService service(dir.path(), options);
  ASSERT_EQ(service.watcher_kind(), "inotify");
  auto previous = service.resolve("sess", "alpha_master.h5");
  for (std::uint64_t round = 0; round < 3; ++round) {
    while (service.watch_turn(0ms) > 0) {
    }
    service.resolve("sess", "alpha_master.h5");  // verified by one stat()...
    const auto restats = service.signature_restats();
    service.resolve("sess", "alpha_master.h5");  // ...then vouched for
    EXPECT_EQ(service.signature_restats(), restats) << "round " << round;
    std::this_thread::sleep_for(20ms);  // a distinct mtime
    test::write_synth(dir.file("sess"), "alpha", 2 + round, 5, 2 + round);  // same names, new shape
    const auto now = service.resolve("sess", "alpha_master.h5");  // no turn taken yet
    EXPECT_NE(now.signature, previous.signature) << "round " << round;
    EXPECT_EQ(now.scan_rows, 2 + round);
    previous = now;
  }
}
