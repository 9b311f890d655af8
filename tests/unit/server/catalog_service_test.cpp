#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <thread>

#include "quantem/core/error.hpp"
#include "quantem/server/catalog_service.hpp"
#include "server_fixtures.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::server;
namespace fs = std::filesystem;

namespace {

std::string failure(const std::function<void()>& fn, ErrorKind* kind = nullptr) {
  try {
    fn();
  } catch (const Error& error) {
    if (kind) *kind = error.kind();
    return error.what();
  }
  return "no error";
}

std::size_t event_count(const nlohmann::ordered_json& doc) { return doc["pending"].size() + doc["history"].size(); }

}  // namespace

TEST(CatalogService, ResolveFollowsTheReferenceRulesAndOnlyServesCatalogedMasters) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  CatalogService service(dir.path());
  const auto acquisition = service.resolve("sess", "alpha_master.h5");
  EXPECT_EQ(acquisition.master_path, dir.file("sess/alpha_master.h5"));
  EXPECT_TRUE(acquisition.status.loadable) << acquisition.status.reason;

  ErrorKind kind{};
  EXPECT_EQ(failure([&] { service.resolve("sess", ""); }, &kind), "file must be one master filename");
  EXPECT_EQ(kind, ErrorKind::bad_request);
  EXPECT_EQ(failure([&] { service.resolve("sess", "../x"); }), "file must be one master filename");
  EXPECT_EQ(failure([&] { service.resolve("sess", "."); }), "file must be one master filename");
  EXPECT_EQ(failure([&] { service.resolve("sess", ".."); }, &kind), "master not found: ..");
  EXPECT_EQ(kind, ErrorKind::not_found);
  EXPECT_EQ(failure([&] { service.resolve("nope", "alpha_master.h5"); }, &kind), "unknown session: nope");
  EXPECT_EQ(kind, ErrorKind::not_found);
  // A regular file that is not a catalogued master (a data shard) is refused.
  EXPECT_EQ(failure([&] { service.resolve("sess", "alpha_data_000001.h5"); }), "master not found: alpha_data_000001.h5");
}

TEST(CatalogService, UnknownNamesRebuildAtMostOncePerInterval) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  CatalogServiceOptions slow;
  slow.unknown_name_rebuild_interval = std::chrono::hours(1);
  CatalogService service(dir.path(), slow);
  service.catalog(false);
  EXPECT_EQ(service.builds(), 1u);
  for (int i = 0; i < 5; ++i) failure([&] { service.resolve("nope", "x_master.h5"); });
  EXPECT_EQ(service.builds(), 1u);  // no rebuild storm

  CatalogServiceOptions eager;
  eager.unknown_name_rebuild_interval = std::chrono::milliseconds(0);
  CatalogService rebuilding(dir.path(), eager);
  rebuilding.catalog(false);
  test::write_synth(dir.file("later"), "beta");
  EXPECT_EQ(rebuilding.resolve("later", "beta_master.h5").name, "beta_master.h5");  // found through one rebuild
  EXPECT_EQ(rebuilding.builds(), 2u);
}

TEST(CatalogService, ConcurrentRefreshesAreCoalesced) {
  test::TempDir dir;
  std::mutex mutex;
  std::condition_variable changed;
  bool release = false;
  std::atomic<int> builds_started{0};
  CatalogServiceOptions options;
  options.build = [&](const std::string& folder) {
    ++builds_started;
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return release; });
    return catalog::build_catalog(folder);
  };
  CatalogService service(dir.path(), options);
  std::shared_ptr<const catalog::Catalog> first, second;
  std::thread a([&] { first = service.catalog(true); });
  for (int i = 0; i < 5000 && builds_started == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread b([&] { second = service.catalog(true); });
  for (int i = 0; i < 5000 && service.callers_waiting_for_build() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(service.callers_waiting_for_build(), 1u);  // b shares a's build
  {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
  changed.notify_all();
  a.join();
  b.join();
  EXPECT_EQ(builds_started.load(), 1);
  EXPECT_EQ(service.builds(), 1u);
  EXPECT_EQ(first, second);
}

TEST(CatalogService, ARewrittenMasterIsInspectedAgainBeforeUse) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha", 3, 4, 1);
  CatalogService service(dir.path());
  const auto before = service.resolve("sess", "alpha_master.h5");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  test::write_synth(dir.file("sess"), "alpha", 2, 5, 2);  // same names, new shape
  const auto after = service.resolve("sess", "alpha_master.h5");
  EXPECT_NE(after.signature, before.signature);
  EXPECT_EQ(after.scan_rows, 2u);
  EXPECT_EQ(after.scan_cols, 5u);
  EXPECT_EQ(service.builds(), 1u);  // a re-inspection, not a rebuild
}

TEST(CatalogService, AcquisitionsPollReturnsTheRememberedListAndRewalksInTheBackground) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  CatalogServiceOptions options;
  options.rewalk_interval = std::chrono::milliseconds(100);
  CatalogService service(dir.path(), options);
  const auto first = service.acquisitions_document();
  EXPECT_EQ(event_count(first), 1u);
  test::write_synth(dir.file("sess2"), "beta");
  EXPECT_EQ(event_count(service.acquisitions_document()), 1u);  // remembered list, returned at once
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    seen = event_count(service.acquisitions_document()) == 2;
  }
  EXPECT_TRUE(seen) << "the background re-walk never found the new master";
  EXPECT_NE(service.acquisitions_document()["ready_token"], first["ready_token"]);
}

TEST(CatalogService, PendingMasterBecomesReadyWhenItsShardArrives) {
  test::TempDir dir;
  test::write_synth(dir.file("sess"), "alpha");
  const std::string shard = dir.file("sess/alpha_data_000001.h5");
  fs::rename(shard, dir.file("elsewhere.h5"));
  CatalogService service(dir.path());
  auto doc = service.acquisitions_document();
  ASSERT_EQ(doc["pending"].size(), 1u);
  EXPECT_EQ(doc["pending"][0]["kind"], "writing");
  EXPECT_EQ(doc["pending"][0]["chunks_seen"], 0);
  EXPECT_EQ(doc["pending"][0]["chunks_expected"], 1);
  const auto pending_token = doc["ready_token"];
  fs::rename(dir.file("elsewhere.h5"), shard);
  doc = service.acquisitions_document();
  ASSERT_EQ(doc["history"].size(), 1u);
  EXPECT_EQ(doc["history"][0]["chunks_seen"], 1);
  EXPECT_NE(doc["ready_token"], pending_token);
  // Unchanged files: the same token.
  EXPECT_EQ(service.acquisitions_document()["ready_token"], doc["ready_token"]);
}

TEST(CatalogService, AFolderThatGoesAwayKeepsTheLastGoodCatalogMarkedStale) {
  test::TempDir dir;
  test::write_synth(dir.file("root/sess"), "alpha");
  CatalogService service(dir.file("root"));
  ASSERT_EQ(service.sessions_document(false)["sessions"].size(), 1u);
  EXPECT_FALSE(service.stale_reason());
  EXPECT_FALSE(service.sessions_document(false).contains("stale"));

  fs::rename(dir.file("root"), dir.file("away"));
  const auto stale = service.sessions_document(true);
  EXPECT_EQ(stale["sessions"].size(), 1u);
  EXPECT_EQ(stale["stale"], true);
  ASSERT_TRUE(service.stale_reason());
  EXPECT_NE(service.stale_reason()->find("No such file or directory"), std::string::npos);
  EXPECT_EQ(service.builds(), 1u);  // no rebuild of an empty folder

  fs::rename(dir.file("away"), dir.file("root"));
  EXPECT_FALSE(service.check_data_folder());
  const auto back = service.sessions_document(true);
  EXPECT_FALSE(back.contains("stale"));
  EXPECT_EQ(back["sessions"].size(), 1u);
  EXPECT_EQ(service.builds(), 2u);
}
