// The request path of the real daemon (CPU backend) as a client sees it:
// server-timing on every response, the stage histograms in /metrics, and a
// conditional request answered 304 without a body and without residency work.
#include <unistd.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>

#include <nlohmann/json.hpp>

#include "daemon.hpp"
#include "raw_http.hpp"

using quantem::test::Daemon;
using json = nlohmann::json;

namespace {

// total;dur=<ms> of a server-timing header, or -1.
double total_ms(const std::string& server_timing) {
  std::smatch match;
  if (!std::regex_search(server_timing, match, std::regex(R"(total;dur=([0-9.]+))"))) return -1;
  return std::stod(match[1]);
}

}  // namespace

TEST(ServeRequestPath, ConditionalRequestsAre304WithoutBodyOrResidencyWorkAndEveryResponseIsTimed) {
  quantem::test::TempDir root;
  const auto synth = quantem::test::run_quantem(
      {"synth", root.file("data/sess"), "--prefix", "a", "--scan", "6x8", "--detector", "16x16", "--threads", "1"});
  ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  auto daemon = Daemon::start(root.file("data"));
  ASSERT_NE(daemon, nullptr);
  const std::string source = "session=sess&file=a_master.h5";
  const std::string bf = "/api/browse/realspace?" + source + "&mode=BF&inner=0&outer=1";

  auto client = daemon->client();  // one keep-alive connection, like a viewer
  client->set_keep_alive(true);
  const httplib::Headers host{{"Host", "127.0.0.1:" + std::to_string(daemon->port())}};
  auto first = client->Get(bf, host);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200);
  const std::string etag = first->get_header_value("etag");
  ASSERT_FALSE(etag.empty());
  EXPECT_NE(first->get_header_value("server-timing").find("cache;desc=miss"), std::string::npos);
  for (const std::string& target : {std::string("/api/browse/capabilities"), std::string("/api/browse/nothing"), bf}) {
    auto response = client->Get(target, host);
    ASSERT_TRUE(response);
    EXPECT_GT(total_ms(response->get_header_value("server-timing")), 0) << target;
  }

  // Evicted, then asked conditionally: 304 at once, still not resident.
  ASSERT_EQ(daemon->request("DELETE", "/api/browse/resident?" + source)->status, 200);
  // A raw keep-alive connection: cpp-httplib 0.11.4's client waits for a body
  // after a 304 that (as RFC 9110 requires) carries no content-length.
  const int conditional = quantem::test::connect_tcp(daemon->port());
  ASSERT_GE(conditional, 0);
  std::vector<double> server_ms;
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(quantem::test::send_all(
        conditional, quantem::test::request_text("GET", bf, "127.0.0.1:" + std::to_string(daemon->port()),
                                                 "If-None-Match: " + etag + "\r\n")));
    const auto response = quantem::test::read_response(conditional);
    ASSERT_TRUE(response);
    ASSERT_EQ(response->status, 304);
    EXPECT_TRUE(response->body.empty());
    EXPECT_EQ(response->header("content-length"), "");
    EXPECT_EQ(response->header("etag"), etag);
    const std::string timing = response->header("server-timing");
    EXPECT_NE(timing.find("cache;desc=not-modified"), std::string::npos) << timing;
    server_ms.push_back(total_ms(timing));
  }
  std::sort(server_ms.begin(), server_ms.end());
  // The bound for a 304 (0.2 ms in the daemon); the median, so one descheduled
  // request on a busy machine does not decide it.
  EXPECT_LE(server_ms[server_ms.size() / 2], 0.2) << "median 304 time in the daemon, ms";
  EXPECT_EQ(json::parse(daemon->get("/api/browse/residency?" + source)->body)["state"], "absent");

  const std::string metrics = daemon->get("/metrics")->body;
  EXPECT_NE(metrics.find("quantem_request_stage_seconds_count{route=\"/api/browse/realspace\",stage=\"resolve\"} 42"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("quantem_request_stage_seconds_bucket{route=\"/api/browse/realspace\",stage=\"compute\",le=\"+Inf\"} 1"),
            std::string::npos);
  client.reset();  // close the keep-alive connections before stopping
  ::close(conditional);
  EXPECT_EQ(daemon->stop(), 0);
}
