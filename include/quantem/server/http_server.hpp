#pragma once
// The HTTP/1.1 server: Boost.Beast over Boost.Asio behind a small interface
// (decision 0008). This header includes neither; src/server/http_server.cpp is
// the only translation unit of the daemon that does.
//
// Thread model: `io_threads` threads run every accept, read and write
// asynchronously, so idle, slow and keep-alive connections cost no worker; a
// complete request is handed to a fixed pool of `threads` workers that call
// the handler (handlers block on compute) and the response is written back
// asynchronously. A request that has to wait (the handler returned
// HttpResponse::later: a load) waits on a separate pool of `waiting_threads`
// (at most `max_waiting_requests` queued beyond them, then 503), so waiting
// never holds the workers that answer health, catalog and resident data
// (docs/decisions/0017).
//
// Limits, each answered with {"detail": ...} and `connection: close`:
//   - request line + headers not complete within `header_timeout` of the
//     connection becoming ready for a request (accept, or the previous
//     response written): the connection is closed (no answer; this is also
//     the keep-alive idle timeout);
//   - request line + headers above `max_header_bytes`, or more than
//     `max_header_fields` fields: 431;
//   - two Host fields, or none in HTTP/1.1: 400 (RFC 9112, section 3.2);
//   - a body above `max_body_bytes`: 413; chunked bodies: 411; compressed: 415;
//   - malformed requests: 400.
// A request that announces a body is first shown to HttpService::screen
// (the Host and token checks): a refusal is sent before any of the body is
// read. Bodies are read and dropped (no route takes one): a connection holds
// no more of one than its read buffer.
// A request in absolute-form ("GET http://host/path") is for the host its
// target names (RFC 9112 section 3.2.2): that authority replaces the Host
// header the handler sees.
// Range and If-Range are ignored: every response is the full representation
// (200), never 206 or 416 (docs/protocol.md).
// Responses always carry content-length; the handler's body is moved into the
// response, never copied. `connection: close` from the client (or HTTP/1.0
// without keep-alive) or from the handler closes after the response.
//
// Socket options: SO_REUSEADDR only — never SO_REUSEPORT, so a second daemon on
// the same address and port fails to bind; TCP_NODELAY on accepted sockets.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "quantem/server/http_types.hpp"

namespace quantem::server {

struct HttpServerOptions {
  int threads = 16;    // handler workers
  int io_threads = 1;  // threads running the sockets (no handler ever runs on them)
  // How long a thread busy-waits before it sleeps: an I/O thread while a
  // response is being computed, a worker after it finished a request. A
  // sleeping core (a halted vCPU in a VM above all) takes tens to hundreds of
  // microseconds to wake; a viewer's next request or the response being
  // computed usually arrives well within this window (docs/benchmarks.md).
  // 0: always sleep.
  std::chrono::microseconds spin_wait{1000};
  int socket_send_buffer_bytes = 4 << 20;  // SO_SNDBUF of accepted TCP connections (0: the kernel's default)
  std::size_t max_body_bytes = 1 << 20;
  std::size_t max_header_bytes = 64 << 10;  // request line + header fields
  std::size_t max_header_fields = 128;
  std::chrono::milliseconds header_timeout{5000};   // whole request line + headers (and body), not per read
  std::chrono::milliseconds write_timeout{60000};   // one whole response
  std::chrono::milliseconds shutdown_grace{2000};   // stop(): in-flight requests may finish this long
  // Threads that run HttpResponse::later (requests waiting for loads), and
  // how many more such requests may queue for them (beyond one per thread)
  // before a 503.
  int waiting_threads = 32;
  std::size_t max_waiting_requests = 1024;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpServer(Handler handler, HttpServerOptions options);
  HttpServer(HttpService service, HttpServerOptions options);
  // Calls stop() and waits for handler calls still running.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0: an ephemeral port) and returns the bound port.
  // Throws quantem::Error(unavailable) naming the address and the system's
  // reason ("Address already in use", ...).
  int bind(const std::string& host, int port);

  // Listens on a Unix stream socket at `path` instead of (or besides) TCP.
  // The socket file gets mode 0600; a missing parent directory is created with
  // mode 0700. A socket file left by a dead daemon (connect() refused) is
  // replaced; a live one, or a path that is not a socket, is refused with
  // quantem::Error(unavailable). The file is removed by stop().
  void bind_unix(const std::string& path);

  // Serves until stop(). Call after bind() or bind_unix(), from one thread.
  void run();

  // Thread-safe, idempotent, also before run() has started. Stops accepting
  // at once and closes connections waiting for a request; requests already
  // read (being handled, waiting or written) may finish for `shutdown_grace`,
  // with `connection: close`; those still in flight then are answered 503
  // `the daemon is shutting down; retry` with `retry-after: 1` (half a second
  // is given to write these); then every connection is closed and run()
  // returns. Returns when that is done (at most about `shutdown_grace` + 0.5 s).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace quantem::server
