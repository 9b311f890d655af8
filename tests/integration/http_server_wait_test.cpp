// HttpServer with requests that wait (HttpResponse::later), driven directly
// with a handler whose waits end only when the test says so: waiting requests
// never hold the workers (another request is answered while twenty wait on
// two workers), a full waiting queue is a 503, a request still waiting at the
// end of the shutdown grace is answered 503 with retry-after, a request that
// announces a body is screened before its body is read, and a request in
// absolute-form is for the host its target names. Nothing here is timed: each
// assertion is about the order of events.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/server/http_server.hpp"
#include "raw_http.hpp"

namespace qt = quantem::test;
using quantem::server::HttpRequest;
using quantem::server::HttpResponse;
using quantem::server::HttpServer;
using quantem::server::HttpServerOptions;
using quantem::server::HttpService;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// A gate the waiting requests block on until the test opens it.
class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    ++waiting_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
    --waiting_;
  }
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  bool wait_for_waiters(int count) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(20), [&] { return waiting_ >= count; });
  }
  bool is_open() {
    std::lock_guard<std::mutex> lock(mutex_);
    return open_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int waiting_ = 0;
  bool open_ = false;
};

// /wait answers later, after the gate opens; /host echoes the Host it sees;
// everything else answers at once. The screen refuses /refused.
struct WaitingServer {
  explicit WaitingServer(HttpServerOptions options) {
    HttpService service;
    service.handle = [this](const HttpRequest& request) {
      if (request.path == "/wait") {
        HttpResponse deferred;
        deferred.later = [this] {
          gate.wait();
          return HttpResponse::json(200, {{"waited", true}});
        };
        return deferred;
      }
      if (request.path == "/host") return HttpResponse::json(200, {{"host", request.header("host").value_or("")}});
      return HttpResponse::json(200, {{"live", true}});
    };
    service.screen = [](const HttpRequest& request) -> std::optional<HttpResponse> {
      if (request.path == "/refused") return HttpResponse::detail(403, "screened");
      return std::nullopt;
    };
    server = std::make_unique<HttpServer>(std::move(service), options);
    port = server->bind("127.0.0.1", 0);
    thread = std::thread([this] { server->run(); });
  }
  ~WaitingServer() {
    gate.open();
    server->stop();
    thread.join();
  }

  Gate gate;
  std::unique_ptr<HttpServer> server;
  int port = 0;
  std::thread thread;
};

HttpServerOptions two_workers() {
  HttpServerOptions options;
  options.threads = 2;
  return options;
}

std::vector<int> send_waiting_requests(int port, int count) {
  std::vector<int> sockets;
  for (int i = 0; i < count; ++i) {
    const int fd = qt::connect_tcp(port);
    EXPECT_GE(fd, 0);
    EXPECT_TRUE(qt::send_all(fd, qt::request_text("GET", "/wait")));
    sockets.push_back(fd);
  }
  return sockets;
}

}  // namespace

TEST(HttpServerWait, TwentyWaitingRequestsLeaveTheTwoWorkersFreeForOtherRequests) {
  WaitingServer server(two_workers());
  const auto waiting = send_waiting_requests(server.port, 20);
  ASSERT_TRUE(server.gate.wait_for_waiters(20)) << "the waiting requests did not all start waiting";
  // Every waiting request is parked and the gate is closed: this one is
  // answered only if a worker is free.
  const auto live = qt::exchange_tcp(server.port, qt::request_text("GET", "/live"));
  ASSERT_TRUE(live) << "a request was not answered while others waited";
  EXPECT_EQ(live->status, 200);
  EXPECT_FALSE(server.gate.is_open());
  server.gate.open();
  for (int fd : waiting) {
    const auto response = qt::read_response(fd);
    ASSERT_TRUE(response);
    EXPECT_EQ(response->status, 200);
    EXPECT_EQ(response->body, R"({"waited":true})");
    ::close(fd);
  }
}

TEST(HttpServerWait, AFullWaitingQueueIsA503WithRetryAfter) {
  HttpServerOptions options = two_workers();
  options.waiting_threads = 1;
  options.max_waiting_requests = 1;
  WaitingServer server(options);
  // One waits on the waiting thread, one is queued behind it, four are refused.
  const auto sockets = send_waiting_requests(server.port, 6);
  ASSERT_TRUE(server.gate.wait_for_waiters(1));
  int refused = 0;
  std::vector<int> pending;
  for (int fd : sockets) {
    // The gate is closed: only a refusal can be answered now.
    const auto response = qt::read_response(fd, 3000);
    if (!response) {
      pending.push_back(fd);
      continue;
    }
    ++refused;
    EXPECT_EQ(response->status, 503);
    EXPECT_EQ(response->header("retry-after"), "1");
    EXPECT_NE(json::parse(response->body)["detail"].get<std::string>().find("waiting"), std::string::npos);
    ::close(fd);
  }
  EXPECT_EQ(refused, 4);
  ASSERT_EQ(pending.size(), 2u);
  server.gate.open();
  for (int fd : pending) {
    const auto response = qt::read_response(fd);
    ASSERT_TRUE(response);
    EXPECT_EQ(response->status, 200);
    ::close(fd);
  }
}

TEST(HttpServerWait, ARequestStillWaitingWhenTheGraceEndsIsAnswered503NotCutOff) {
  HttpServerOptions options = two_workers();
  options.shutdown_grace = std::chrono::milliseconds(300);
  WaitingServer server(options);
  const auto waiting = send_waiting_requests(server.port, 3);
  ASSERT_TRUE(server.gate.wait_for_waiters(3));
  server.server->stop();  // the gate is still closed: the waits outlast the grace
  for (int fd : waiting) {
    const auto response = qt::read_response(fd);
    ASSERT_TRUE(response) << "a waiting request was cut off without an answer";
    EXPECT_EQ(response->status, 503);
    EXPECT_EQ(response->header("retry-after"), "1");
    EXPECT_EQ(response->header("connection"), "close");
    EXPECT_EQ(json::parse(response->body)["detail"], "the daemon is shutting down; retry");
    EXPECT_TRUE(qt::closed_within(fd, 1000));
    ::close(fd);
  }
}

TEST(HttpServerWait, ARefusedRequestIsAnsweredBeforeItsBodyIsSent) {
  WaitingServer server(two_workers());
  const int fd = qt::connect_tcp(server.port);
  ASSERT_TRUE(qt::send_all(fd, qt::request_text("POST", "/refused", "127.0.0.1", "Content-Length: 1000000\r\n")));
  // Not one byte of the announced body is sent: the answer can only come from the screen.
  const auto response = qt::read_response(fd);
  ASSERT_TRUE(response) << "the screen did not answer before the body";
  EXPECT_EQ(response->status, 403);
  EXPECT_EQ(response->body, R"({"detail":"screened"})");
  EXPECT_EQ(response->header("connection"), "close");
  ::close(fd);
  // A request the screen lets through has its body read (and dropped) before it is answered.
  const std::string body(1 << 20, 'x');
  const auto accepted = qt::exchange_tcp(
      server.port, qt::request_text("POST", "/live", "127.0.0.1", "Content-Length: " + std::to_string(body.size()) + "\r\n") +
                       body);
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->status, 200);
}

TEST(HttpServerWait, AnAbsoluteFormTargetNamesTheHostTheHandlerSees) {
  WaitingServer server(two_workers());
  const auto other = qt::exchange_tcp(server.port, qt::request_text("GET", "http://other.example:8780/host?x=1"));
  ASSERT_TRUE(other);
  EXPECT_EQ(json::parse(other->body)["host"], "other.example:8780");
  const auto upper = qt::exchange_tcp(server.port, qt::request_text("GET", "HTTP://Other.Example/host"));
  ASSERT_TRUE(upper);
  EXPECT_EQ(json::parse(upper->body)["host"], "Other.Example");
  const auto origin = qt::exchange_tcp(server.port, qt::request_text("GET", "/host"));
  ASSERT_TRUE(origin);
  EXPECT_EQ(json::parse(origin->body)["host"], "127.0.0.1");
}
