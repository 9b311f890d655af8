// GET /api/browse/metadata without sockets, read in-process through a
// counting reader: the document, the answer kept per signature (a changed
// sidecar is read again), 304 on If-None-Match, and the typed errors.
#include <sys/time.h>

#include <gtest/gtest.h>

#include <atomic>

#include "fake_backend.hpp"
#include "quantem/core/error.hpp"
#include "quantem/server/browse_service.hpp"
#include "quantem/server/metadata_route.hpp"
#include "server_fixtures.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::server;
using json = nlohmann::json;

namespace {

class MetadataRoutes : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_synth(dir.file("sess"), "alpha", 3, 4);
    residency = std::make_unique<residency::ResidencyManager>(backend, residency::ResidencyOptions{});
    CatalogServiceOptions options;
    options.make_watcher = [](const std::string&) { return std::make_unique<catalog::FakeWatcher>(); };
    catalog = std::make_unique<CatalogService>(dir.path(), options);
    service = std::make_unique<BrowseService>(BrowseConfig{}, backend, *residency, *catalog, metrics);
    route = std::make_unique<MetadataRoute>(*catalog, [this](const std::string& master) {
      if (fail_with) throw Error(*fail_with, "the reader failed");
      return catalog::read_master_metadata(master);
    });
    route->add_to(*service);
  }

  HttpResponse get(const std::string& query, const std::string& if_none_match = "") {
    HttpRequest request;
    request.method = "GET";
    request.path = "/api/browse/metadata";
    request.query = query;
    request.headers.emplace_back("host", "localhost:8780");
    if (!if_none_match.empty()) request.headers.emplace_back("if-none-match", if_none_match);
    return service->handle(request);
  }

  const std::string source = "session=sess&file=alpha_master.h5";
  test::TempDir dir;
  test::FakeBackend backend{{1000}};
  Metrics metrics;
  std::unique_ptr<residency::ResidencyManager> residency;
  std::unique_ptr<CatalogService> catalog;
  std::unique_ptr<BrowseService> service;
  std::unique_ptr<MetadataRoute> route;
  std::optional<ErrorKind> fail_with;
};

}  // namespace

TEST_F(MetadataRoutes, AnswersTheFieldsAndEntries) {
  const HttpResponse response = get(source);
  ASSERT_EQ(response.status, 200) << response.sent_body();
  EXPECT_EQ(response.content_type, "application/json");
  const json doc = json::parse(response.sent_body());
  EXPECT_EQ(doc["session"], "sess");
  EXPECT_EQ(doc["file"], "alpha_master.h5");
  EXPECT_EQ(doc["sidecar"], "alpha.h5");
  EXPECT_EQ(doc["fields"]["high_tension"]["value"], 300000.0);
  EXPECT_EQ(doc["fields"]["high_tension"]["unit"], "V");
  EXPECT_EQ(doc["fields"]["high_tension"]["label"], "high tension");
  EXPECT_EQ(doc["fields"]["detector"]["value"], "Dectris ARINA CZT");
  EXPECT_FALSE(doc["fields"]["detector"].contains("unit"));
  EXPECT_FALSE(doc["fields"].contains("detector_distance"));
  EXPECT_FALSE(doc["entries"].empty());
  EXPECT_EQ(doc["entries_truncated"], false);
  EXPECT_EQ(doc["limits"]["text_bytes"], catalog::kMaxMetadataTextBytes);
}

TEST_F(MetadataRoutes, KeptPerSignatureAndReadAgainWhenTheSidecarChanges) {
  const HttpResponse first = get(source);
  ASSERT_EQ(first.status, 200);
  const auto etag = first.header("etag");
  ASSERT_TRUE(etag);
  EXPECT_EQ(get(source).sent_body(), first.sent_body());
  EXPECT_EQ(route->reads(), 1u);
  const HttpResponse unchanged = get(source, *etag);
  EXPECT_EQ(unchanged.status, 304);
  EXPECT_TRUE(unchanged.sent_body().empty());
  // The sidecar is not part of the catalog's signature, but of the answer's.
  const std::string sidecar = dir.file("sess/alpha.h5");
  const timeval times[2] = {{1000000000, 0}, {1000000000, 0}};
  ASSERT_EQ(::utimes(sidecar.c_str(), times), 0);
  const HttpResponse changed = get(source, *etag);
  EXPECT_EQ(changed.status, 200);
  EXPECT_NE(changed.header("etag"), etag);
  EXPECT_EQ(route->reads(), 2u);
}

TEST_F(MetadataRoutes, TypedErrors) {
  EXPECT_EQ(get("session=sess&file=missing_master.h5").status, 404);
  EXPECT_EQ(get("session=nowhere&file=alpha_master.h5").status, 404);
  EXPECT_EQ(get("session=sess").status, 422);
  EXPECT_EQ(get("session=sess&file=../alpha_master.h5").status, 400);
  fail_with = ErrorKind::corrupt_data;
  EXPECT_EQ(get(source).status, 422);
  fail_with = ErrorKind::unavailable;
  const HttpResponse unavailable = get(source);
  EXPECT_EQ(unavailable.status, 503);
  EXPECT_EQ(unavailable.header("retry-after"), "1");
  fail_with.reset();
  EXPECT_EQ(get(source).status, 200);
  EXPECT_EQ(route->reads(), 1u);  // failures are not kept
}
