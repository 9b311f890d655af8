#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "fake_backend.hpp"
#include "quantem/server/browse_service.hpp"
#include "server_fixtures.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::server;
using json = nlohmann::json;

namespace {

class BrowseServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_synth(dir.file("sess"), "alpha", 3, 4);
    backend.set_default_estimate(100, 100);
  }

  BrowseService& service(AuthMode mode = AuthMode::none) {
    if (!service_) {
      residency = std::make_unique<residency::ResidencyManager>(backend, residency::ResidencyOptions{});
      catalog = std::make_unique<CatalogService>(dir.path());
      BrowseConfig config;
      config.implementation_revision = "rev-test";
      config.access.mode = mode;
      config.access.token = "tok";
      service_ = std::make_unique<BrowseService>(config, backend, *residency, *catalog, metrics);
    }
    return *service_;
  }

  HttpResponse get(const std::string& target, const std::string& method = "GET", const std::string& host = "localhost:8780",
                   const std::string& authorization = "") {
    HttpRequest request;
    request.method = method;
    const auto question = target.find('?');
    request.path = target.substr(0, question);
    if (question != std::string::npos) request.query = target.substr(question + 1);
    if (!host.empty()) request.headers.emplace_back("host", host);
    if (!authorization.empty()) request.headers.emplace_back("authorization", authorization);
    HttpResponse response = service().handle(request);
    if (response.shared_body) response.body = std::string(response.sent_body());  // the catalog documents
    return response;
  }

  static std::string detail(const HttpResponse& response) { return json::parse(response.body)["detail"]; }

  test::TempDir dir;
  test::FakeBackend backend{{1000, 2000}};
  Metrics metrics;
  std::unique_ptr<residency::ResidencyManager> residency;
  std::unique_ptr<CatalogService> catalog;
  std::unique_ptr<BrowseService> service_;
};

}  // namespace

TEST_F(BrowseServiceTest, CapabilitiesDescribeTheBackendAndEveryDevice) {
  const auto response = get("/api/browse/capabilities");
  ASSERT_EQ(response.status, 200);
  EXPECT_EQ(response.content_type, "application/json");
  const auto doc = json::parse(response.body);
  EXPECT_EQ(doc["protocol"], "quantem-gpu-browse");
  EXPECT_EQ(doc["backend"], "fake");
  EXPECT_EQ(doc["browse_gpus"], json::array({0, 1}));
  EXPECT_EQ(doc["cache_budget_bytes"], 2000);
  EXPECT_EQ(doc["cache_fraction"], 0.5);  // byte budgets: budget over device memory (the fake's memory is twice its budget)
  EXPECT_EQ(doc["aggregate_cache_budget_bytes"], 3000);
  EXPECT_EQ(doc["devices"][1]["available_resident_bytes"], 2000);
  EXPECT_EQ(doc["features"]["multi_gpu_residency"], true);
  EXPECT_EQ(doc["implementation_revision"], "rev-test");
  EXPECT_EQ(doc["data_folders"], json::array({dir.path()}));
}

TEST_F(BrowseServiceTest, UnknownPathsMethodsAndTrailingSlashes) {
  auto response = get("/api/browse/nothing");
  EXPECT_EQ(response.status, 404);
  EXPECT_EQ(response.body, R"({"detail":"Not Found"})");
  response = get("/api/browse/capabilities", "POST");
  EXPECT_EQ(response.status, 405);
  EXPECT_EQ(response.body, R"({"detail":"Method Not Allowed"})");
  EXPECT_EQ(response.header("allow"), "GET");
  EXPECT_EQ(get("/api/browse/capabilities", "HEAD").status, 405);
  EXPECT_EQ(get("/api/browse/load?session=sess&file=alpha_master.h5", "GET").status, 405);
  response = get("/api/browse/sessions/?refresh=true");
  EXPECT_EQ(response.status, 307);
  EXPECT_EQ(response.header("location"), "http://localhost:8780/api/browse/sessions?refresh=true");
}

TEST_F(BrowseServiceTest, ForeignHostIsForbiddenEverywhere) {
  for (const char* path : {"/api/browse/capabilities", "/api/health/live", "/nothing"}) {
    const auto response = get(path, "GET", "attacker.example:8780");
    EXPECT_EQ(response.status, 403) << path;
    EXPECT_EQ(detail(response), kForeignHostMessage);
  }
  EXPECT_EQ(get("/api/browse/capabilities", "GET", "").status, 403);
  EXPECT_EQ(get("/api/browse/capabilities", "GET", "127.0.0.1:1").status, 200);
  EXPECT_EQ(get("/api/browse/capabilities", "GET", "[::1]:8780").status, 200);
}

TEST_F(BrowseServiceTest, TokenModeGuardsEverythingButHealth) {
  service(AuthMode::token);
  EXPECT_EQ(get("/api/browse/capabilities").status, 403);
  EXPECT_EQ(get("/api/browse/capabilities", "GET", "localhost", "Bearer tok").status, 200);
  EXPECT_EQ(get("/api/browse/capabilities?token=tok").status, 200);
  EXPECT_EQ(get("/metrics").status, 403);
  EXPECT_EQ(get("/api/health/live").status, 200);
}

TEST_F(BrowseServiceTest, ReadinessFollowsTheServeCommand) {
  auto response = get("/api/health/ready");
  EXPECT_EQ(response.status, 503);
  EXPECT_EQ(response.header("retry-after"), "1");
  EXPECT_EQ(json::parse(response.body)["ready"], false);
  service().set_ready(true);
  response = get("/api/health/ready");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, R"({"live":true,"ready":true})");
  EXPECT_EQ(get("/api/health/live").body, R"({"live":true})");
}

TEST_F(BrowseServiceTest, ParametersAreValidatedBeforeTheSourceIsResolved) {
  auto response = get("/api/browse/realspace?session=nope&file=x_master.h5&mode=bf");
  EXPECT_EQ(response.status, 400);
  EXPECT_EQ(detail(response), "unknown virtual-image mode: 'bf'");
  response = get("/api/browse/cbed-region?session=nope&file=x&reduce=median");
  EXPECT_EQ(detail(response), "scan ROI reduction must be mean, sum, or max");
  response = get("/api/browse/realspace-shape?session=nope&file=x&cx=nan&outer=1");
  EXPECT_EQ(detail(response), "detector center and radii must be finite");
  response = get("/api/browse/cbed?session=nope&file=x&sx=abc");
  EXPECT_EQ(response.status, 422);
  EXPECT_EQ(response.body,
            R"({"detail":[{"type":"int_parsing","loc":["query","sx"],"msg":"Input should be a valid integer, unable to parse string as an integer","input":"abc"}]})");
  EXPECT_TRUE(backend.loads().empty());
}

TEST_F(BrowseServiceTest, ResolutionAndPlanErrorsUseTheReferenceTexts) {
  auto response = get("/api/browse/cbed?session=nope&file=alpha_master.h5");
  EXPECT_EQ(response.status, 404);
  EXPECT_EQ(detail(response), "unknown session: nope");
  response = get("/api/browse/cbed?session=sess&file=../alpha_master.h5");
  EXPECT_EQ(response.status, 400);
  EXPECT_EQ(detail(response), "file must be one master filename");
  response = get("/api/browse/realspace?session=sess&file=alpha_master.h5&row_start=0&row_stop=4&column_start=0&column_stop=4");
  EXPECT_EQ(response.status, 400);
  EXPECT_EQ(detail(response), "scan crop exceeds the source scan shape");
  response = get("/api/browse/realspace?session=sess&file=alpha_master.h5&row_start=1&row_stop=2");
  EXPECT_EQ(detail(response), "scan crop requires row_start, row_stop, column_start, and column_stop");
  EXPECT_EQ(get("/api/browse/realspace?session=sess&file=alpha_master.h5&scan_bin=5").status, 400);
  EXPECT_EQ(get("/api/browse/realspace?session=sess&file=alpha_master.h5&det_bin=9").status, 400);
  response = get("/api/browse/cbed-region?session=sess&file=alpha_master.h5&cx=50&cy=50&radius=1");
  EXPECT_EQ(detail(response), "scan ROI does not include any scan positions");
  EXPECT_TRUE(backend.loads().empty());
}

TEST_F(BrowseServiceTest, SourcesThatAreNotReadyAreAConflictWithTheirReason) {
  std::filesystem::remove(dir.file("sess/alpha_data_000001.h5"));
  const auto response = get("/api/browse/realspace?session=sess&file=alpha_master.h5");
  EXPECT_EQ(response.status, 409);
  EXPECT_EQ(detail(response), "linked detector file is missing: " + dir.file("sess/alpha_data_000001.h5"));
  EXPECT_EQ(get("/api/browse/load?session=sess&file=alpha_master.h5", "POST").status, 409);
  EXPECT_TRUE(backend.loads().empty());
}

TEST_F(BrowseServiceTest, SelectedDiffractionWithoutEnsureResidentNeedsAResident) {
  auto response = get("/api/browse/cbed?session=sess&file=alpha_master.h5&sx=1&sy=2");
  EXPECT_EQ(response.status, 409);
  EXPECT_EQ(detail(response), kNotResidentMessage);
  response = get("/api/browse/cbed-region?session=sess&file=alpha_master.h5&cx=1&cy=1");
  EXPECT_EQ(detail(response), kNotResidentMessage);
  EXPECT_TRUE(backend.loads().empty());
}

TEST_F(BrowseServiceTest, AdmissionRefusesBeforeLoading) {
  backend.set_default_estimate(4096, 4096);
  const auto response = get("/api/browse/realspace?session=sess&file=alpha_master.h5");
  EXPECT_EQ(response.status, 413);
  EXPECT_EQ(detail(response),
            "Requested exact load needs a 4.0 KB transition peak but the largest per-GPU data-cache budget is 2.0 KB. "
            "Crop the scan region or increase scan/detector binning.");
  EXPECT_TRUE(backend.loads().empty());
}

TEST_F(BrowseServiceTest, LoadResidencyAndEvictRoutes) {
  const std::string source = "session=sess&file=alpha_master.h5";
  auto response = get("/api/browse/residency?" + source);
  ASSERT_EQ(response.status, 200);
  EXPECT_EQ(json::parse(response.body)["state"], "absent");

  response = get("/api/browse/load?" + source, "POST");
  EXPECT_TRUE(response.status == 202 || response.status == 200) << response.status;
  EXPECT_EQ(response.header("location"), "/api/browse/residency?" + source);
  std::string state;
  for (int i = 0; i < 1000 && state != "resident"; ++i) {
    state = json::parse(get("/api/browse/residency?" + source).body)["state"];
    if (state != "resident") std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(state, "resident");
  const auto doc = json::parse(get("/api/browse/residency?" + source).body);
  EXPECT_EQ(doc["device"], 1);  // equal entry counts: the device with more room
  EXPECT_EQ(doc["resident_bytes"], 100);
  EXPECT_EQ(doc["path"], dir.file("sess/alpha_master.h5"));
  EXPECT_EQ(get("/api/browse/load?" + source, "POST").status, 200);  // already resident

  response = get("/api/browse/resident?" + source, "DELETE");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(json::parse(response.body)["evicted"], true);
  EXPECT_EQ(json::parse(get("/api/browse/residency?" + source).body)["state"], "absent");
  EXPECT_EQ(json::parse(get("/api/browse/resident?" + source, "DELETE").body)["evicted"], false);
  EXPECT_EQ(get("/api/browse/residency?session=sess").status, 422);
}

TEST_F(BrowseServiceTest, MetricsCountRequests) {
  get("/api/browse/capabilities");
  get("/api/browse/nothing");
  const auto response = get("/metrics");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.content_type.rfind("text/plain; version=0.0.4", 0), 0u);
  EXPECT_NE(response.body.find("quantem_http_requests_total{route=\"/api/browse/capabilities\",code=\"200\"} 1"),
            std::string::npos)
      << response.body;
  EXPECT_NE(response.body.find("quantem_http_requests_total{route=\"other\",code=\"404\"} 1"), std::string::npos);
  EXPECT_NE(response.body.find("quantem_resident_bytes{device=\"1\"} 0"), std::string::npos);
  for (const char* counter : {"quantem_idle_releases_total 0", "quantem_reservation_growths_total 0",
                              "quantem_reservation_growth_refusals_total 0"}) {
    EXPECT_NE(response.body.find(counter), std::string::npos) << counter;
  }
}

TEST_F(BrowseServiceTest, SessionsAndAcquisitionsDocuments) {
  auto response = get("/api/browse/sessions");
  ASSERT_EQ(response.status, 200);
  auto doc = json::parse(response.body);
  ASSERT_EQ(doc["sessions"].size(), 1u);
  EXPECT_EQ(doc["sessions"][0]["path"], "sess");
  EXPECT_EQ(doc["sessions"][0]["files"][0]["shape"], json::array({3, 4, 8, 8}));
  EXPECT_EQ(get("/api/browse/sessions?refresh=maybe").status, 422);
  test::write_synth(dir.file("sess2"), "beta");
  EXPECT_EQ(json::parse(get("/api/browse/sessions").body)["sessions"].size(), 1u);  // cached
  EXPECT_EQ(json::parse(get("/api/browse/sessions?refresh=1").body)["sessions"].size(), 2u);
  doc = json::parse(get("/api/browse/acquisitions").body);
  EXPECT_EQ(doc["history"].size(), 2u);
  EXPECT_EQ(doc["ready_token"].get<std::string>().size(), 24u);
}
