#pragma once
// An HttpServer on 127.0.0.1 (an ephemeral port), run on its own thread, whose
// handler sleeps the query's "ms=NNN" milliseconds and answers {"slept":
// "ms=NNN"}: for tests of the server itself (stop with requests in flight, the
// busy-wait window), since the daemon's handlers finish too fast to be caught
// mid-request. Counts the calls started, running, and the most at once.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "quantem/server/http_server.hpp"

namespace quantem::test {

struct SleepingHandlerServer {
  explicit SleepingHandlerServer(server::HttpServerOptions options) {
    server = std::make_unique<server::HttpServer>(
        [this](const server::HttpRequest& request) {
          ++started;
          const int now = ++running;
          int seen = most_at_once.load();
          while (now > seen && !most_at_once.compare_exchange_weak(seen, now)) {
          }
          const std::string query = request.query;  // "ms=NNN"
          std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(query.substr(3))));
          --running;
          return server::HttpResponse::json(200, {{"slept", query}});
        },
        options);
    port = server->bind("127.0.0.1", 0);
    thread = std::thread([this] { server->run(); });
  }
  ~SleepingHandlerServer() {
    server->stop();
    thread.join();
  }
  SleepingHandlerServer(const SleepingHandlerServer&) = delete;
  SleepingHandlerServer& operator=(const SleepingHandlerServer&) = delete;

  std::unique_ptr<server::HttpServer> server;
  std::atomic<int> started{0};
  std::atomic<int> running{0};
  std::atomic<int> most_at_once{0};
  int port = 0;
  std::thread thread;
};

}  // namespace quantem::test
