// BrowseService's seams for the HTTP server and for routes written
// elsewhere: a request that would wait for a load comes back from
// handle_or_defer() unanswered, with nothing loaded, and its `later` loads
// and answers; a resident acquisition is answered at once; screen() runs the
// Host and token checks alone; a route added with add_route() is served
// after the same guards.
#include <gtest/gtest.h>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/server/browse_service.hpp"
#include "server_fixtures.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::server;
using json = nlohmann::json;

namespace {

class BrowseDeferral : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_synth(dir.file("sess"), "alpha", 3, 4, 1);
    backend = backend::make_cpu_backend(backend::CpuBackendOptions{1, 1ull << 30, 1});
  }

  BrowseService& service(AuthMode mode = AuthMode::none) {
    if (!service_) {
      residency = std::make_unique<residency::ResidencyManager>(*backend, residency::ResidencyOptions{});
      catalog = std::make_unique<CatalogService>(dir.path());
      BrowseConfig config;
      config.implementation_revision = "rev-test";
      config.access.mode = mode;
      config.access.token = "tok";
      service_ = std::make_unique<BrowseService>(config, *backend, *residency, *catalog, metrics);
    }
    return *service_;
  }

  static HttpRequest request(const std::string& target, const std::string& method = "GET",
                             const std::string& host = "localhost:8780") {
    HttpRequest r;
    r.method = method;
    const auto question = target.find('?');
    r.path = target.substr(0, question);
    if (question != std::string::npos) r.query = target.substr(question + 1);
    r.headers.emplace_back("host", host);
    return r;
  }

  std::string state() {
    const auto response = service().handle(request("/api/browse/residency?" + std::string(kSource)));
    return json::parse(response.body)["state"];
  }

  static constexpr const char* kSource = "session=sess&file=alpha_master.h5";
  test::TempDir dir;
  std::unique_ptr<backend::Backend> backend;
  Metrics metrics;
  std::unique_ptr<residency::ResidencyManager> residency;
  std::unique_ptr<CatalogService> catalog;
  std::unique_ptr<BrowseService> service_;
};

}  // namespace

TEST_F(BrowseDeferral, ARequestThatWouldWaitForALoadIsDeferredAndItsLaterLoadsAndAnswers) {
  for (const std::string route : {"realspace", "realspace-shape?outer=2&", "cbed?ensure_resident=true&",
                                  "cbed-region?ensure_resident=true&"}) {
    SCOPED_TRACE(route);
    service_.reset();
    residency.reset();
    const std::string separator = route.find('?') == std::string::npos ? "?" : "";
    HttpResponse deferred = service().handle_or_defer(request("/api/browse/" + route + separator + kSource));
    ASSERT_TRUE(deferred.later) << deferred.status << " " << deferred.body;
    EXPECT_EQ(state(), "absent");  // nothing was loaded on the calling thread
    const HttpResponse answer = deferred.later();
    EXPECT_EQ(answer.status, 200) << answer.body;
    EXPECT_FALSE(answer.later);
    EXPECT_NE(answer.header("server-timing")->find("acquire;dur="), std::string::npos);
    EXPECT_TRUE(answer.header("etag"));
    EXPECT_EQ(state(), "resident");
    // Resident now: the same request is answered at once, with the same bytes.
    const HttpResponse again = service().handle_or_defer(request("/api/browse/" + route + separator + kSource));
    EXPECT_FALSE(again.later);
    EXPECT_EQ(again.status, 200);
    EXPECT_EQ(again.sent_body(), answer.sent_body());
  }
}

TEST_F(BrowseDeferral, RefusalsAndAcquisitionsThatNeedNoLoadAreNeverDeferred) {
  // Not resident and no ensure_resident: 409 at once.
  HttpResponse refused = service().handle_or_defer(request(std::string("/api/browse/cbed?") + kSource));
  EXPECT_FALSE(refused.later);
  EXPECT_EQ(refused.status, 409);
  // Parameter errors are found before any wait.
  refused = service().handle_or_defer(request(std::string("/api/browse/realspace?mode=bf&") + kSource));
  EXPECT_FALSE(refused.later);
  EXPECT_EQ(refused.status, 400);
  // handle() answers completely, waiting in place.
  EXPECT_EQ(service().handle(request(std::string("/api/browse/realspace?") + kSource)).status, 200);
  EXPECT_FALSE(service().handle_or_defer(request(std::string("/api/browse/cbed?") + kSource)).later);
  // Metrics count each answer once, deferred or not.
  const std::string text = service().handle(request("/metrics")).body;
  EXPECT_NE(text.find("quantem_http_requests_total{route=\"/api/browse/realspace\",code=\"200\"} 1"),
            std::string::npos)
      << text;
}

TEST_F(BrowseDeferral, ScreenChecksTheHostAndTheTokenAlone) {
  service(AuthMode::token);
  auto refusal = service().screen(request("/api/browse/load", "POST", "attacker.example"));
  ASSERT_TRUE(refusal);
  EXPECT_EQ(refusal->status, 403);
  EXPECT_EQ(json::parse(refusal->body)["detail"], kForeignHostMessage);
  refusal = service().screen(request("/api/browse/load", "POST"));
  ASSERT_TRUE(refusal);
  EXPECT_EQ(json::parse(refusal->body)["detail"], kTokenRequiredMessage);
  EXPECT_FALSE(service().screen(request("/api/browse/load?token=tok", "POST")));
  EXPECT_FALSE(service().screen(request("/api/health/live", "POST")));  // exempt from the token
  EXPECT_FALSE(service().screen(request("/no/such/route?token=tok", "POST")));  // 404 is the handler's
}

TEST_F(BrowseDeferral, ARouteAddedFromOutsideIsServedAfterTheGuards) {
  service(AuthMode::token);
  int calls = 0;
  service().add_route("/api/extra/job", "POST",
                      [&](const HttpRequest&, const protocol::QueryParams& query, RequestTiming&) {
                        ++calls;
                        return HttpResponse::json(202, {{"name", query.last("name").value_or("")}});
                      });
  auto response = service().handle(request("/api/extra/job?name=x&token=tok", "POST"));
  EXPECT_EQ(response.status, 202);
  EXPECT_EQ(response.body, R"({"name":"x"})");
  EXPECT_TRUE(response.header("server-timing"));
  EXPECT_EQ(service().handle(request("/api/extra/job?name=x", "POST")).status, 403);
  EXPECT_EQ(service().handle(request("/api/extra/job?token=tok", "GET")).status, 405);
  EXPECT_EQ(service().handle(request("/api/extra/job?token=tok", "POST", "attacker.example")).status, 403);
  EXPECT_EQ(calls, 1);
}
