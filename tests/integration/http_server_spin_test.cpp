// The HTTP threads' busy-wait window (HttpServerOptions::spin_wait,
// `serve --http-spin-us`): with it off, short or long, keep-alive requests
// are answered in order; and a worker busy-waiting for a job never strands a
// second one: requests that arrive together run together on separate
// workers (submit() wakes a sleeping worker unless a busy-waiting one is
// there for every queued job).
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "quantem/server/http_server.hpp"
#include "raw_http.hpp"

namespace qt = quantem::test;
using quantem::server::HttpRequest;
using quantem::server::HttpResponse;
using quantem::server::HttpServer;
using quantem::server::HttpServerOptions;
using Clock = std::chrono::steady_clock;

namespace {

// A handler that sleeps the query's "ms=NNN" and counts the calls running at once.
struct SleepingServer {
  SleepingServer(std::chrono::microseconds spin, int threads) {
    HttpServerOptions options;
    options.threads = threads;
    options.spin_wait = spin;
    server = std::make_unique<HttpServer>(
        [this](const HttpRequest& request) {
          const int now = ++running;
          int seen = most_at_once.load();
          while (now > seen && !most_at_once.compare_exchange_weak(seen, now)) {
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(request.query.substr(3))));
          --running;
          return HttpResponse::json(200, {{"slept", request.query}});
        },
        options);
    port = server->bind("127.0.0.1", 0);
    thread = std::thread([this] { server->run(); });
  }
  ~SleepingServer() {
    server->stop();
    thread.join();
  }
  std::unique_ptr<HttpServer> server;
  std::atomic<int> running{0};
  std::atomic<int> most_at_once{0};
  int port = 0;
  std::thread thread;
};

class HttpServerSpin : public ::testing::TestWithParam<int> {};

TEST_P(HttpServerSpin, KeepAliveRequestsAreAnsweredInOrder) {
  SleepingServer server(std::chrono::microseconds(GetParam()), 2);
  const int fd = qt::connect_tcp(server.port);
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 20; ++i) {
    const std::string query = "ms=" + std::to_string(i % 3);
    ASSERT_TRUE(qt::send_all(fd, qt::request_text("GET", "/x?" + query)));
    const auto response = qt::read_response(fd);
    ASSERT_TRUE(response.has_value()) << "request " << i;
    EXPECT_EQ(response->status, 200);
    EXPECT_NE(response->body.find(query), std::string::npos) << response->body;
  }
  ::close(fd);
}

TEST_P(HttpServerSpin, RequestsArrivingTogetherRunTogether) {
  SleepingServer server(std::chrono::microseconds(GetParam()), 4);
  // One quick request first, so that a worker has just finished a job and,
  // with a window, is busy-waiting when the others arrive.
  ASSERT_TRUE(qt::exchange_tcp(server.port, qt::request_text("GET", "/x?ms=0")).has_value());
  constexpr int kTogether = 3;
  const auto start = Clock::now();
  std::vector<std::future<int>> answers;
  for (int i = 0; i < kTogether; ++i) {
    answers.push_back(std::async(std::launch::async, [&server] {
      const auto response = qt::exchange_tcp(server.port, qt::request_text("GET", "/x?ms=400"));
      return response ? response->status : 0;
    }));
  }
  for (auto& answer : answers) EXPECT_EQ(answer.get(), 200);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // Run one after another they would take 1.2 s.
  EXPECT_EQ(server.most_at_once.load(), kTogether);
  EXPECT_LT(seconds, 1.0);
}

// Off, the default (1 ms), and a window longer than the requests' spacing.
INSTANTIATE_TEST_SUITE_P(Windows, HttpServerSpin, ::testing::Values(0, 1000, 200000),
                         [](const ::testing::TestParamInfo<int>& window) { return "spin_us_" + std::to_string(window.param); });

}  // namespace
