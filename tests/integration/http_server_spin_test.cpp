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
#include "sleeping_handler_server.hpp"

namespace qt = quantem::test;
using quantem::server::HttpServerOptions;
using Clock = std::chrono::steady_clock;

namespace {

HttpServerOptions options_with(std::chrono::microseconds spin, int threads) {
  HttpServerOptions options;
  options.threads = threads;
  options.spin_wait = spin;
  return options;
}

class HttpServerSpin : public ::testing::TestWithParam<int> {};

TEST_P(HttpServerSpin, KeepAliveRequestsAreAnsweredInOrder) {
  qt::SleepingHandlerServer server(options_with(std::chrono::microseconds(GetParam()), 2));
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
  qt::SleepingHandlerServer server(options_with(std::chrono::microseconds(GetParam()), 4));
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
