// The request path seen from a client, on the CPU backend and small synth
// acquisitions: server-timing on every response, stage histograms in
// /metrics, entity tags and 304 on the array routes (no residency work), and
// image-cache hits that make the acquisition resident and active.
#include <gtest/gtest.h>

#include <regex>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/server/browse_service.hpp"
#include "server_fixtures.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::server;
using json = nlohmann::json;

namespace {

class BrowseTimingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_synth(dir.file("sess"), "alpha", 3, 4, 1);
    test::write_synth(dir.file("sess"), "beta", 5, 6, 2);
    backend = backend::make_cpu_backend(backend::CpuBackendOptions{1, 1ull << 30, 1});
    residency = std::make_unique<residency::ResidencyManager>(*backend, residency::ResidencyOptions{});
    catalog = std::make_unique<CatalogService>(dir.path());
    BrowseConfig config;
    config.implementation_revision = "rev-test";
    service = std::make_unique<BrowseService>(config, *backend, *residency, *catalog, metrics);
  }

  HttpResponse get(const std::string& target, const std::vector<std::pair<std::string, std::string>>& headers = {},
                   const std::string& method = "GET") {
    HttpRequest request;
    request.method = method;
    const auto question = target.find('?');
    request.path = target.substr(0, question);
    if (question != std::string::npos) request.query = target.substr(question + 1);
    request.headers.emplace_back("host", "127.0.0.1:8780");
    for (const auto& header : headers) request.headers.push_back(header);
    return service->handle(request);
  }

  std::string state(const std::string& file) {
    return json::parse(get("/api/browse/residency?session=sess&file=" + file).body)["state"];
  }
  std::uint64_t resident_bytes(const std::string& file) {
    return json::parse(get("/api/browse/residency?session=sess&file=" + file).body)["resident_bytes"];
  }
  std::uint64_t active_bytes() {
    std::uint64_t total = 0;
    for (const auto& usage : residency->device_usage()) total += usage.active_resident_bytes;
    return total;
  }

  test::TempDir dir;
  std::unique_ptr<backend::Backend> backend;
  Metrics metrics;
  std::unique_ptr<residency::ResidencyManager> residency;
  std::unique_ptr<CatalogService> catalog;
  std::unique_ptr<BrowseService> service;
};

const std::vector<std::string> kArrayTargets = {
    "/api/browse/realspace?session=sess&file=alpha_master.h5&mode=ADF&inner=0.5&outer=2",
    "/api/browse/realspace-shape?session=sess&file=alpha_master.h5&shape=annulus&cx=4&cy=4&inner=1&outer=3",
    "/api/browse/cbed?session=sess&file=alpha_master.h5&sx=1&sy=2&ensure_resident=true",
    "/api/browse/cbed-region?session=sess&file=alpha_master.h5&cx=1&cy=1&radius=1&ensure_resident=true",
};

}  // namespace

TEST(ServerTiming, HeaderUsesTheStandardSyntax) {
  RequestTiming timing;
  timing.lap("resolve");
  timing.lap("compute");
  timing.lap("resolve");  // charged to the same stage
  timing.set_cache("hit");
  ASSERT_EQ(timing.stages().size(), 2u);
  const std::string header = timing.header();
  EXPECT_TRUE(std::regex_match(header, std::regex(R"(resolve;dur=\d+\.\d{3}, compute;dur=\d+\.\d{3}, total;dur=\d+\.\d{3}, cache;desc=hit)")))
      << header;
}

TEST(ServerTiming, IfNoneMatchListsWeakTagsAndStar) {
  const std::string tag = "\"0123456789abcdef01234567\"";
  EXPECT_TRUE(if_none_match_names(tag, tag));
  EXPECT_TRUE(if_none_match_names("\"x\", " + tag, tag));
  EXPECT_TRUE(if_none_match_names("W/" + tag, tag));
  EXPECT_TRUE(if_none_match_names("*", tag));
  EXPECT_FALSE(if_none_match_names("\"x\"", tag));
  EXPECT_FALSE(if_none_match_names("", tag));
  EXPECT_FALSE(if_none_match_names("0123456789abcdef01234567", tag));  // unquoted: not the tag
}

TEST_F(BrowseTimingTest, EveryResponseCarriesServerTimingAndMetricsHaveTheStages) {
  for (const std::string target : {"/api/browse/capabilities", "/api/browse/nothing",
                                   "/api/browse/realspace?session=sess&file=alpha_master.h5&mode=bf"}) {
    const auto response = get(target);
    const auto timing = response.header("server-timing");
    ASSERT_TRUE(timing) << target;
    EXPECT_NE(timing->find("total;dur="), std::string::npos) << *timing;
  }
  const std::string bf = "/api/browse/realspace?session=sess&file=alpha_master.h5&mode=BF";
  auto response = get(bf);
  ASSERT_EQ(response.status, 200) << response.body;
  const std::string miss = *response.header("server-timing");
  for (const char* stage : {"parse;dur=", "resolve;dur=", "acquire;dur=", "compute;dur=", "encode;dur=", "cache;desc=miss"})
    EXPECT_NE(miss.find(stage), std::string::npos) << stage << " in " << miss;
  response = get(bf);
  EXPECT_NE(response.header("server-timing")->find("cache;desc=hit"), std::string::npos);

  const std::string text = get("/metrics").body;
  for (const char* line : {
           "# TYPE quantem_request_stage_seconds histogram",
           "quantem_request_stage_seconds_bucket{route=\"/api/browse/realspace\",stage=\"compute\",le=\"+Inf\"} 1",
           "quantem_request_stage_seconds_count{route=\"/api/browse/realspace\",stage=\"encode\"} 2",
           "quantem_request_stage_seconds_sum{route=\"/api/browse/realspace\",stage=\"resolve\"} ",
           "quantem_request_stage_seconds_bucket{route=\"/api/browse/realspace\",stage=\"parse\",le=\"0.001\"} "}) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
}

TEST_F(BrowseTimingTest, ArrayRoutesAnswerAMatchingIfNoneMatchWith304AndNoResidencyWork) {
  std::vector<std::string> tags;
  for (const auto& target : kArrayTargets) {
    const auto first = get(target);
    ASSERT_EQ(first.status, 200) << target << " " << first.body;
    const auto tag = first.header("etag");
    ASSERT_TRUE(tag) << target;
    EXPECT_TRUE(std::regex_match(*tag, std::regex(R"("[0-9a-f]{24}")"))) << *tag;
    EXPECT_EQ(get(target).header("etag"), tag) << target;  // stable
    tags.push_back(*tag);
  }
  std::sort(tags.begin(), tags.end());
  EXPECT_EQ(std::unique(tags.begin(), tags.end()), tags.end());  // a tag per route and parameters

  // Parameters, format and names are part of the tag.
  const auto base = get(kArrayTargets[0]);
  EXPECT_NE(get(kArrayTargets[0] + "0000001").header("etag"), base.header("etag"));  // outer=2 -> 20000001
  EXPECT_NE(get("/api/browse/realspace?session=sess&file=alpha_master.h5&mode=ADF&inner=0.5000001&outer=2").header("etag"),
            base.header("etag"));
  EXPECT_NE(get(kArrayTargets[0] + "&format=npy").header("etag"), base.header("etag"));

  // Evicted: a conditional request still answers 304 and loads nothing.
  ASSERT_EQ(get("/api/browse/resident?session=sess&file=alpha_master.h5", {}, "DELETE").status, 200);
  ASSERT_EQ(state("alpha_master.h5"), "absent");
  for (const auto& target : kArrayTargets) {
    const std::string tag = *get(target).header("etag");
    ASSERT_EQ(get("/api/browse/resident?session=sess&file=alpha_master.h5", {}, "DELETE").status, 200);
    for (const std::string& condition : {tag, "\"nope\", W/" + tag, std::string("*")}) {
      const auto response = get(target, {{"if-none-match", condition}});
      EXPECT_EQ(response.status, 304) << target << " " << condition;
      EXPECT_TRUE(response.body.empty());
      EXPECT_EQ(response.header("etag"), tag);
      EXPECT_NE(response.header("server-timing")->find("cache;desc=not-modified"), std::string::npos);
      EXPECT_EQ(response.header("server-timing")->find("acquire"), std::string::npos);
    }
    EXPECT_EQ(state("alpha_master.h5"), "absent") << target;  // residency untouched
    const auto other = get(target, {{"if-none-match", "\"0123456789abcdef01234567\""}});
    EXPECT_EQ(other.status, 200) << target;
    EXPECT_EQ(other.header("etag"), tag);
  }
  // A rewritten source changes every tag.
  const std::string before = *get(kArrayTargets[0]).header("etag");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  test::write_synth(dir.file("sess"), "alpha", 3, 4, 7);
  const auto after = get(kArrayTargets[0], {{"if-none-match", before}});
  EXPECT_EQ(after.status, 200);
  EXPECT_NE(after.header("etag"), before);
}

TEST_F(BrowseTimingTest, AnImageCacheHitWithEnsureResidentMakesTheAcquisitionResidentAndActive) {
  const std::string alpha = "/api/browse/realspace?session=sess&file=alpha_master.h5&mode=BF";
  const std::string beta = "/api/browse/realspace?session=sess&file=beta_master.h5&mode=BF";
  ASSERT_EQ(get(alpha).status, 200);
  const std::uint64_t alpha_bytes = resident_bytes("alpha_master.h5");
  ASSERT_EQ(get(beta).status, 200);
  const std::uint64_t beta_bytes = resident_bytes("beta_master.h5");
  ASSERT_NE(alpha_bytes, beta_bytes);
  EXPECT_EQ(active_bytes(), beta_bytes);  // the last realspace product is the active one

  ASSERT_EQ(get("/api/browse/resident?session=sess&file=alpha_master.h5", {}, "DELETE").status, 200);
  // A hit without ensure_resident: the cached image, nothing loaded, nothing changes.
  auto response = get(alpha);
  ASSERT_EQ(response.status, 200);
  EXPECT_NE(response.header("server-timing")->find("cache;desc=hit"), std::string::npos);
  EXPECT_EQ(state("alpha_master.h5"), "absent");
  EXPECT_EQ(active_bytes(), beta_bytes);
  // With ensure_resident: resident and active, as the reference.
  response = get(alpha + "&ensure_resident=true");
  ASSERT_EQ(response.status, 200);
  EXPECT_NE(response.header("server-timing")->find("cache;desc=hit"), std::string::npos);
  EXPECT_EQ(state("alpha_master.h5"), "resident");
  EXPECT_EQ(active_bytes(), alpha_bytes);
}

TEST_F(BrowseTimingTest, ImageCacheHitsServeTheSameBytesAndHeadersAsTheMiss) {
  const std::string raw = "/api/browse/realspace?session=sess&file=beta_master.h5&mode=ADF&inner=0.5&outer=2";
  const auto miss = get(raw);
  ASSERT_EQ(miss.status, 200);
  ASSERT_NE(miss.header("server-timing")->find("cache;desc=miss"), std::string::npos);
  const auto hit = get(raw);
  ASSERT_NE(hit.header("server-timing")->find("cache;desc=hit"), std::string::npos);
  EXPECT_EQ(hit.sent_body(), miss.sent_body());
  for (const char* name : {"x-width", "x-height", "x-dtype", "x-value-divisor", "cache-control", "etag", "x-quantem-provenance"})
    EXPECT_EQ(hit.header(name), miss.header(name)) << name;
  EXPECT_EQ(hit.content_type, "application/octet-stream");
  const auto npy = get(raw + "&format=npy");  // a hit of the same image, as .npy
  EXPECT_NE(npy.header("server-timing")->find("cache;desc=hit"), std::string::npos);
  EXPECT_EQ(npy.content_type, "application/x-npy");
  ASSERT_GT(npy.sent_body().size(), miss.sent_body().size());
  EXPECT_EQ(npy.sent_body().substr(npy.sent_body().size() - miss.sent_body().size()), miss.sent_body());
  EXPECT_EQ(npy.body.substr(0, 6), "\x93NUMPY");
  // The provenance names what the request asked for.
  const auto provenance = json::parse(*hit.header("x-quantem-provenance"));
  EXPECT_EQ(provenance["file"], "beta_master.h5");
}

TEST_F(BrowseTimingTest, ImageBodiesAreSentWithoutACopyOrComeFromTheBodyPool) {
  BrowseConfig config;
  config.implementation_revision = "rev-test";
  config.image_cache_entries = 1;  // the second image evicts the first
  service = std::make_unique<BrowseService>(config, *backend, *residency, *catalog, metrics);
  const std::string adf = "/api/browse/realspace?session=sess&file=beta_master.h5&mode=ADF&outer=2&inner=";

  // A realspace image's narrowed counts are the wire's bytes: the image's own
  // values go out and into the cache, no pool buffer is written.
  std::string first_bytes;
  {
    const auto first = get(adf + "0.5");
    ASSERT_EQ(first.status, 200);
    ASSERT_TRUE(first.shared_body);
    EXPECT_TRUE(first.body.empty());
    first_bytes = std::string(first.sent_body());
    const auto hit = get(adf + "0.5");
    ASSERT_NE(hit.header("server-timing")->find("cache;desc=hit"), std::string::npos);
    EXPECT_EQ(hit.shared_body.data, first.shared_body.data);  // the cached bytes themselves
  }
  EXPECT_EQ(service->body_pool_stats().allocated, 0u);
  EXPECT_EQ(service->body_pool_stats().free_buffers, 0u);
  ASSERT_EQ(get(adf + "0.6").status, 200);
  const auto first_again = get(adf + "0.5");  // evicted: computed again, the same bytes
  ASSERT_NE(first_again.header("server-timing")->find("cache;desc=miss"), std::string::npos);
  EXPECT_EQ(first_again.sent_body(), first_bytes);
  EXPECT_EQ(service->body_pool_stats().allocated, 0u);

  // A diffraction pattern's and a region's counts come narrowed (frame_u32,
  // region_reduce_u32): sent from their own values. As .npy (a header before
  // the values) a region is written into a recycled body, which returns to
  // the pool once the response is gone and serves the next.
  for (const char* narrowed : {"/api/browse/cbed?session=sess&file=beta_master.h5&sx=1&sy=1&ensure_resident=true",
                               "/api/browse/cbed-region?session=sess&file=beta_master.h5&shape=circle&reduce=sum&"
                               "radius=1&cy=1&cx=1&ensure_resident=true"}) {
    const auto pattern = get(narrowed);
    ASSERT_EQ(pattern.status, 200) << narrowed;
    ASSERT_TRUE(pattern.shared_body) << narrowed;
    EXPECT_EQ(service->body_pool_stats().allocated, 0u) << narrowed;
  }
  const std::string region =
      "/api/browse/cbed-region?session=sess&file=beta_master.h5&shape=circle&reduce=sum&radius=1&cy=1&ensure_resident=true&"
      "format=npy&cx=";
  const char* first_memory = nullptr;
  {
    const auto pattern = get(region + "1");
    ASSERT_EQ(pattern.status, 200);
    ASSERT_TRUE(pattern.shared_body);
    first_memory = pattern.shared_body.data;
    EXPECT_EQ(service->body_pool_stats().free_buffers, 0u);
  }
  EXPECT_EQ(service->body_pool_stats().free_buffers, 1u);
  const auto second = get(region + "2");
  ASSERT_EQ(second.status, 200);
  EXPECT_EQ(second.shared_body.data, first_memory);  // written into the first pattern's buffer
  EXPECT_EQ(service->body_pool_stats().reused, 1u);

  // Uncached routes: the body is shared from the pool and returns once the response is gone.
  const auto before = service->body_pool_stats();
  for (const auto& target : kArrayTargets) {
    {
      const auto response = get(target);
      ASSERT_EQ(response.status, 200) << target;
      ASSERT_TRUE(response.shared_body) << target;
      EXPECT_TRUE(response.body.empty()) << target;
      EXPECT_EQ(response.sent_body().size(), std::stoull(*response.header("x-width")) *
                                                 std::stoull(*response.header("x-height")) * 4)
          << target;
    }
    const auto npy = get(target + "&format=npy");
    ASSERT_EQ(npy.status, 200) << target;
    EXPECT_EQ(npy.sent_body().substr(0, 6), "\x93NUMPY") << target;
  }
  const auto after = service->body_pool_stats();
  EXPECT_GT(after.free_buffers, before.free_buffers);
  EXPECT_GT(after.reused, before.reused);
}
