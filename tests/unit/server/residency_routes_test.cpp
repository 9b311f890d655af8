// The residency routes (docs/protocol.md, '3. Routes') without sockets: load progress and
// stage while loading, cancelling a load with DELETE, capacity freed, a
// remembered failure, and sources being written refused before any residency
// work.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "fake_backend.hpp"
#include "quantem/server/browse_service.hpp"
#include "server_fixtures.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::server;
using json = nlohmann::json;

namespace {

class ResidencyRoutes : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_synth(dir.file("sess"), "alpha", 3, 4);
    backend.set_default_estimate(100, 150);
    residency = std::make_unique<residency::ResidencyManager>(backend, residency::ResidencyOptions{});
    CatalogServiceOptions options;
    options.make_watcher = [this](const std::string&) {
      auto fake = std::make_unique<catalog::FakeWatcher>();
      watcher = fake.get();
      return fake;
    };
    catalog = std::make_unique<CatalogService>(dir.path(), options);
    BrowseConfig config;
    config.implementation_revision = "rev-test";
    service = std::make_unique<BrowseService>(config, backend, *residency, *catalog, metrics);
    master = dir.file("sess/alpha_master.h5");
  }

  HttpResponse call(const std::string& method, const std::string& target) {
    HttpRequest request;
    request.method = method;
    const auto question = target.find('?');
    request.path = target.substr(0, question);
    if (question != std::string::npos) request.query = target.substr(question + 1);
    request.headers.emplace_back("host", "localhost:8780");
    return service->handle(request);
  }
  json residency_doc() { return json::parse(call("GET", "/api/browse/residency?" + source).body); }
  std::uint64_t resident_bytes_on_devices() {
    std::uint64_t total = 0;
    const json capabilities = json::parse(call("GET", "/api/browse/capabilities").body);
    for (const auto& device : capabilities["devices"]) total += device["resident_bytes"].get<std::uint64_t>();
    return total;
  }
  bool eventually(const std::function<bool()>& condition) {
    for (int i = 0; i < 5000; ++i) {
      if (condition()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  const std::string source = "session=sess&file=alpha_master.h5";
  test::TempDir dir;
  test::FakeBackend backend{{1000, 1000}};
  Metrics metrics;
  std::unique_ptr<residency::ResidencyManager> residency;
  catalog::FakeWatcher* watcher = nullptr;
  std::unique_ptr<CatalogService> catalog;
  std::unique_ptr<BrowseService> service;
  std::string master;
};

}  // namespace

TEST_F(ResidencyRoutes, ALoadReportsProgressAndDeleteCancelsIt) {
  backend.hold(master);
  const auto accepted = call("POST", "/api/browse/load?" + source);
  EXPECT_EQ(accepted.status, 202);
  EXPECT_EQ(json::parse(accepted.body)["state"], "loading");
  EXPECT_EQ(resident_bytes_on_devices(), 150u);  // the reserved transition peak
  ASSERT_TRUE(backend.wait_loads(1));
  ASSERT_TRUE(eventually([&] { return residency_doc()["stage"] == "reading"; }));
  const auto loading = residency_doc();
  EXPECT_EQ(loading["state"], "loading");
  EXPECT_EQ(loading["device"], 0);
  EXPECT_EQ(loading["bytes_done"], 0);
  EXPECT_EQ(loading["bytes_total"], 100);
  EXPECT_EQ(loading["resident_bytes"], 0);
  EXPECT_EQ(loading["reserved_bytes"], 150);  // the admitted transition peak
  EXPECT_EQ(loading["failure_reason"], nullptr);

  const auto deleted = call("DELETE", "/api/browse/resident?" + source);
  EXPECT_EQ(deleted.status, 200);
  EXPECT_EQ(json::parse(deleted.body)["evicted"], true);
  EXPECT_EQ(json::parse(deleted.body)["state"], "absent");
  EXPECT_TRUE(eventually([&] { return resident_bytes_on_devices() == 0; }));  // the backend gave the attempt back
  EXPECT_EQ(backend.alive_bytes(0), 0u);
  backend.release(master);

  EXPECT_EQ(call("POST", "/api/browse/load?" + source).status, 202);
  ASSERT_TRUE(eventually([&] { return residency_doc()["state"] == "resident"; }));
  const auto resident = residency_doc();
  EXPECT_EQ(resident["resident_bytes"], 100);
  EXPECT_EQ(resident["reserved_bytes"], 100);
  EXPECT_EQ(resident["bytes_done"], 100);
  EXPECT_EQ(resident["stage"], "done");
  EXPECT_EQ(resident["encoding"], "fake");
  EXPECT_EQ(resident_bytes_on_devices(), 100u);
}

TEST_F(ResidencyRoutes, AFailedLoadShowsItsReasonUntilLoadIsPostedAgain) {
  backend.fail(master, CorruptChunk("frame 2 of alpha_data_000001.h5 does not decode"), 1);
  EXPECT_EQ(call("POST", "/api/browse/load?" + source).status, 202);
  ASSERT_TRUE(eventually([&] { return residency_doc()["state"] == "failed"; }));
  EXPECT_EQ(residency_doc()["failure_reason"], "frame 2 of alpha_data_000001.h5 does not decode");
  EXPECT_EQ(call("GET", "/api/browse/realspace?" + source).status, 422);  // remembered: no reload storm
  EXPECT_EQ(backend.loads().size(), 1u);
  EXPECT_EQ(call("POST", "/api/browse/load?" + source).status, 202);  // an explicit load retries
  EXPECT_TRUE(eventually([&] { return residency_doc()["state"] == "resident"; }));
}

TEST_F(ResidencyRoutes, SourcesBeingWrittenAreRefusedBeforeAnyResidencyWork) {
  ASSERT_NE(watcher, nullptr);
  watcher->push(dir.file("sess/alpha_data_000001.h5"), catalog::FileEvent::written);
  catalog->watch_turn(std::chrono::milliseconds(0));
  for (const std::string target : {"/api/browse/realspace?", "/api/browse/cbed?"}) {
    const auto refused = call("GET", target + source);
    EXPECT_EQ(refused.status, 409) << target;
    EXPECT_EQ(json::parse(refused.body)["detail"], "source files are being written: alpha_data_000001.h5");
  }
  EXPECT_EQ(call("POST", "/api/browse/load?" + source).status, 409);
  const auto doc = residency_doc();
  EXPECT_EQ(doc["loadable"], false);
  EXPECT_EQ(doc["reason"], "source files are being written: alpha_data_000001.h5");
  EXPECT_TRUE(backend.loads().empty());
  watcher->push(dir.file("sess/alpha_data_000001.h5"), catalog::FileEvent::write_closed);
  catalog->watch_turn(std::chrono::milliseconds(0));
  EXPECT_EQ(call("POST", "/api/browse/load?" + source).status, 202);  // closed: loadable again
}
