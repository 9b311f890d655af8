#pragma once
// The HTTP adapter: cpp-httplib behind a small interface. This header does not
// include httplib.h; src/server/http_server.cpp is the only translation unit
// of the daemon that does.
//
// Socket options: SO_REUSEADDR only — never SO_REUSEPORT (cpp-httplib's
// default), so a second daemon on the same address and port fails to bind.
// Guards for cpp-httplib 0.11.4 run before a request body is read: chunked or
// compressed request bodies, bodies above 1 MiB and multi-range requests are
// refused.
#include <functional>
#include <memory>
#include <string>

#include "quantem/server/http_types.hpp"

namespace quantem::server {

struct HttpServerOptions {
  int threads = 16;
  std::size_t max_body_bytes = 1 << 20;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpServer(Handler handler, HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0: an ephemeral port) and returns the bound port.
  // Throws quantem::Error(unavailable) naming the address and the system's
  // reason ("Address already in use", ...).
  int bind(const std::string& host, int port);

  // Serves until stop(). Call after bind(), from one thread.
  void run();

  // Stops run() (thread-safe, idempotent, also before run() has started).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace quantem::server
