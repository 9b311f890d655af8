#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "fake_backend.hpp"
#include "quantem/server/browse_service.hpp"
#include "quantem/viewer/assets.hpp"
#include "server_fixtures.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::server;

namespace {

// The viewer's routes through BrowseService: served without a token, under
// the Host rule, with validators; the API itself still wants the token.
class ViewerRoutesTest : public ::testing::Test {
 protected:
  void SetUp() override { test::write_synth(dir.file("sess"), "alpha", 3, 4); }

  BrowseService& service(AuthMode mode) {
    if (!service_) {
      residency = std::make_unique<residency::ResidencyManager>(backend, residency::ResidencyOptions{});
      catalog = std::make_unique<CatalogService>(dir.path());
      BrowseConfig config;
      config.access.mode = mode;
      config.access.token = "tok";
      service_ = std::make_unique<BrowseService>(config, backend, *residency, *catalog, metrics);
    }
    return *service_;
  }

  HttpResponse get(const std::string& path, AuthMode mode = AuthMode::none, const std::string& host = "localhost:8780",
                   const std::string& if_none_match = "", const std::string& method = "GET") {
    HttpRequest request;
    request.method = method;
    request.path = path;
    if (!host.empty()) request.headers.emplace_back("host", host);
    if (!if_none_match.empty()) request.headers.emplace_back("if-none-match", if_none_match);
    return service(mode).handle(request);
  }

  test::TempDir dir;
  test::FakeBackend backend{{1000, 2000}};
  Metrics metrics;
  std::unique_ptr<residency::ResidencyManager> residency;
  std::unique_ptr<CatalogService> catalog;
  std::unique_ptr<BrowseService> service_;
};

TEST(ViewerAssets, EmbedsThePageAndItsModulesWithContentTypes) {
  const auto* page = viewer::find_asset("/");
  ASSERT_NE(page, nullptr);
  EXPECT_EQ(page->content_type, "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("<script type=\"module\" src=\"/viewer/main.js\">"), std::string_view::npos);
  for (const char* module : {"/viewer/main.js", "/viewer/api.js", "/viewer/imaging.js", "/viewer/colormaps.js"}) {
    const auto* asset = viewer::find_asset(module);
    ASSERT_NE(asset, nullptr) << module;
    EXPECT_EQ(asset->content_type, "text/javascript; charset=utf-8") << module;
    EXPECT_FALSE(asset->body.empty()) << module;
  }
  ASSERT_NE(viewer::find_asset("/viewer/viewer.css"), nullptr);
  EXPECT_EQ(viewer::find_asset("/viewer/viewer.css")->content_type, "text/css; charset=utf-8");
  EXPECT_EQ(viewer::find_asset("/index.html"), nullptr);
  EXPECT_EQ(viewer::find_asset("/viewer/"), nullptr);
}

TEST(ViewerAssets, EtagsAreQuotedAndDifferBetweenFiles) {
  const auto& page = *viewer::find_asset("/");
  const auto& script = *viewer::find_asset("/viewer/main.js");
  EXPECT_EQ(page.etag.front(), '"');
  EXPECT_EQ(page.etag.back(), '"');
  EXPECT_EQ(page.etag.size(), 22u);
  EXPECT_NE(page.etag, script.etag);
}

TEST(ViewerAssets, IfNoneMatchComparesListsWeaklyAndStar) {
  EXPECT_TRUE(viewer::etag_matches("\"abc\"", "\"abc\""));
  EXPECT_TRUE(viewer::etag_matches("W/\"abc\"", "\"abc\""));
  EXPECT_TRUE(viewer::etag_matches("\"x\", \"abc\"", "\"abc\""));
  EXPECT_TRUE(viewer::etag_matches(" * ", "\"abc\""));
  EXPECT_FALSE(viewer::etag_matches("\"abcd\"", "\"abc\""));
  EXPECT_FALSE(viewer::etag_matches("abc", "\"abc\""));
  EXPECT_FALSE(viewer::etag_matches("", "\"abc\""));
}

TEST_F(ViewerRoutesTest, PageIsServedWithoutTokenInTokenMode) {
  const auto page = get("/", AuthMode::token);
  ASSERT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(page.header("cache-control"), "no-cache");
  EXPECT_EQ(page.header("etag"), std::string(viewer::find_asset("/")->etag));
  EXPECT_NE(page.header("content-security-policy")->find("connect-src 'self'"), std::string::npos);
  EXPECT_EQ(page.body, std::string(viewer::find_asset("/")->body));
  EXPECT_EQ(get("/viewer/main.js", AuthMode::token).status, 200);
  // The data still needs the token.
  EXPECT_EQ(get("/api/browse/sessions", AuthMode::token).status, 403);
}

TEST_F(ViewerRoutesTest, ForeignHostIsRefused) {
  EXPECT_EQ(get("/", AuthMode::none, "attacker.example").status, 403);
  EXPECT_EQ(get("/viewer/main.js", AuthMode::none, "").status, 403);
}

TEST_F(ViewerRoutesTest, CurrentEtagAnswersNotModifiedWithoutBody) {
  const std::string etag(viewer::find_asset("/viewer/api.js")->etag);
  const auto response = get("/viewer/api.js", AuthMode::none, "localhost", etag);
  EXPECT_EQ(response.status, 304);
  EXPECT_TRUE(response.body.empty());
  EXPECT_EQ(response.header("etag"), etag);
  EXPECT_EQ(get("/viewer/api.js", AuthMode::none, "localhost", "\"stale\"").status, 200);
}

TEST_F(ViewerRoutesTest, UnknownAssetIsNotFoundAndOtherMethodsAreRefused) {
  EXPECT_EQ(get("/viewer/missing.js").status, 404);
  EXPECT_EQ(get("/", AuthMode::none, "localhost", "", "POST").status, 405);
}

}  // namespace
