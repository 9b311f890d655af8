// HttpServer::stop() with requests in flight, driven directly with a handler
// that takes as long as the test says (the daemon's handlers finish too fast
// to be caught mid-request): a request already read finishes within the
// grace and is answered with `connection: close`; one that outlasts the grace
// is cut off and stop() returns near the grace; connections waiting for a
// request are closed at once.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "quantem/server/http_server.hpp"
#include "raw_http.hpp"
#include "sleeping_handler_server.hpp"

namespace qt = quantem::test;
using quantem::server::HttpServerOptions;
using Clock = std::chrono::steady_clock;

namespace {

// Two workers; requests already read may finish for `grace` after stop().
struct SlowServer : qt::SleepingHandlerServer {
  explicit SlowServer(std::chrono::milliseconds grace) : SleepingHandlerServer(options(grace)) {}
  static HttpServerOptions options(std::chrono::milliseconds grace) {
    HttpServerOptions options;
    options.threads = 2;
    options.shutdown_grace = grace;
    return options;
  }
};

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void wait_for_started(const SlowServer& server, int count) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (server.started < count && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GE(server.started.load(), count);
}

}  // namespace

TEST(HttpServerStop, ARequestInFlightFinishesWithinTheGraceAndIsAnsweredWithConnectionClose) {
  SlowServer server(std::chrono::milliseconds(3000));
  const int busy = qt::connect_tcp(server.port);
  ASSERT_TRUE(qt::send_all(busy, qt::request_text("GET", "/slow?ms=500")));
  const int idle = qt::connect_tcp(server.port);
  wait_for_started(server, 1);
  const auto start = Clock::now();
  server.server->stop();
  const double stopped_after = seconds_since(start);
  const auto response = qt::read_response(busy);
  ASSERT_TRUE(response) << "the request in flight was cut off";
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, R"({"slept":"ms=500"})");
  EXPECT_EQ(response->header("connection"), "close");
  EXPECT_TRUE(qt::closed_within(busy, 1000));
  EXPECT_TRUE(qt::closed_within(idle, 100));  // the idle connection is closed too
  EXPECT_LT(stopped_after, 2.5);  // returned when the request was done, before the 3 s grace
  // No new connection is accepted after stop().
  EXPECT_LT(qt::connect_tcp(server.port), 0);
  ::close(busy);
  ::close(idle);
}

TEST(HttpServerStop, ARequestOutlastingTheGraceIsCutOffAndStopReturnsNearTheGrace) {
  SlowServer server(std::chrono::milliseconds(500));
  const int busy = qt::connect_tcp(server.port);
  ASSERT_TRUE(qt::send_all(busy, qt::request_text("GET", "/slow?ms=3000")));
  wait_for_started(server, 1);
  const auto start = Clock::now();
  server.server->stop();
  const double stopped_after = seconds_since(start);
  EXPECT_GE(stopped_after, 0.4);
  EXPECT_LT(stopped_after, 1.5);
  EXPECT_TRUE(qt::closed_within(busy, 1000)) << "the connection outlived the grace";
  ::close(busy);
}
