// The only translation unit of the daemon that includes httplib.h.
#include "quantem/server/http_server.hpp"

#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <spdlog/spdlog.h>

#include "quantem/core/error.hpp"

namespace quantem::server {

namespace {

void reuse_address_only(socket_t sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
}

std::string lower(const std::string& text) {
  std::string out = text;
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Why binding host:port failed, found by trying the same bind ourselves.
std::string bind_failure_reason(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* results = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &results); rc != 0) return gai_strerror(rc);
  std::string reason = "unknown error";
  for (addrinfo* info = results; info; info = info->ai_next) {
    const int sock = ::socket(info->ai_family, info->ai_socktype, info->ai_protocol);
    if (sock < 0) {
      reason = std::strerror(errno);
      continue;
    }
    reuse_address_only(sock);
    if (::bind(sock, info->ai_addr, info->ai_addrlen) != 0) {
      reason = std::strerror(errno);
    } else if (::listen(sock, 1) != 0) {
      reason = std::strerror(errno);
    } else {
      reason = "the address became available again; retry";
    }
    ::close(sock);
    break;
  }
  freeaddrinfo(results);
  return reason;
}

const char* status_text(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 416: return "Range Not Satisfiable";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

HttpResponse guard_response(int status, const std::string& detail) { return HttpResponse::detail(status, detail); }

void write_response(const HttpResponse& from, httplib::Response& to) {
  to.status = from.status;
  for (const auto& [name, value] : from.headers) to.set_header(name, value);
  if (!from.content_type.empty()) to.set_header("content-type", from.content_type);
  to.body = from.body;
}

}  // namespace

struct HttpServer::Impl {
  Handler handler;
  HttpServerOptions options;
  httplib::Server server;
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> running{false};
  bool bound = false;
};

HttpServer::HttpServer(Handler handler, HttpServerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->handler = std::move(handler);
  impl_->options = options;
  auto& server = impl_->server;
  const int threads = std::max(1, options.threads);
  server.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  server.set_socket_options(reuse_address_only);
  server.set_payload_max_length(options.max_body_bytes);
  server.set_keep_alive_max_count(100);
  server.set_keep_alive_timeout(5);
  // Responses go out as headers then body: without TCP_NODELAY, Nagle holds
  // the body until the client's delayed ACK (~40 ms per keep-alive request).
  server.set_tcp_nodelay(true);

  auto adapter = [this](const httplib::Request& req, httplib::Response& res) {
    HttpRequest request;
    request.method = req.method;
    request.path = req.path;
    const auto question = req.target.find('?');
    if (question != std::string::npos) request.query = req.target.substr(question + 1);
    for (const auto& [name, value] : req.headers) request.headers.emplace_back(lower(name), value);
    HttpResponse response;
    try {
      response = impl_->handler(request);
    } catch (...) {
      // The handler is noexcept by contract; this only guards the adapter.
      response.status = 500;
      response.content_type = "text/plain; charset=utf-8";
      response.body = "Internal Server Error";
    }
    write_response(response, res);
  };

  const std::size_t max_body = options.max_body_bytes;
  server.set_pre_routing_handler([max_body, adapter](const httplib::Request& req, httplib::Response& res) {
    // Runs before cpp-httplib reads a body (0.11.4 caveats): refuse what it
    // would mishandle, and answer every body-less request right here (no
    // route takes a body; cpp-httplib would otherwise wait for the body of a
    // POST that has no Content-Length and answer 400).
    std::optional<HttpResponse> refusal;
    const bool has_length = req.has_header("Content-Length");
    const auto length = has_length ? std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) : 0ULL;
    if (req.has_header("Transfer-Encoding")) {
      refusal = guard_response(411, "chunked request bodies are not accepted; send Content-Length");
    } else if (req.has_header("Content-Encoding")) {
      refusal = guard_response(415, "compressed request bodies are not accepted");
    } else if (length > max_body) {
      refusal = guard_response(413, "request body too large");
    } else if (req.has_header("Range") && req.get_header_value("Range").find(',') != std::string::npos) {
      refusal = guard_response(416, "multiple byte ranges are not supported");
    }
    if (refusal) {
      refusal->set_header("connection", "close");
      write_response(*refusal, res);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (length > 0) return httplib::Server::HandlerResponse::Unhandled;  // read the (ignored) body, then route
    adapter(req, res);
    return httplib::Server::HandlerResponse::Handled;
  });
  server.Get(".*", adapter);
  server.Post(".*", adapter);
  server.Put(".*", adapter);
  server.Patch(".*", adapter);
  server.Delete(".*", adapter);
  server.Options(".*", adapter);

  server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    res.status = 500;
    res.set_header("content-type", "text/plain; charset=utf-8");
    res.body = "Internal Server Error";
  });
  // Errors cpp-httplib produces itself (malformed request line, URI too long, ...).
  server.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    write_response(HttpResponse::detail(res.status, status_text(res.status)), res);
    return httplib::Server::HandlerResponse::Handled;
  }));
  server.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    // The path only: a query may carry a token.
    spdlog::debug("{} {} -> {} ({} bytes)", req.method, req.path, res.status, res.body.size());
  });
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind(const std::string& host, int port) {
  auto& server = impl_->server;
  int bound_port = port;
  bool ok = false;
  if (port == 0) {
    bound_port = server.bind_to_any_port(host);
    ok = bound_port > 0;
  } else {
    ok = server.bind_to_port(host, port);
  }
  if (!ok) {
    throw unavailable("cannot listen on " + host + ":" + std::to_string(port) + ": " + bind_failure_reason(host, port));
  }
  impl_->bound = true;
  return bound_port;
}

void HttpServer::run() {
  if (!impl_->bound) throw internal_error("HttpServer::run() before bind()");
  // `running` is set before `stop_requested` is read, and stop() sets
  // `stop_requested` before it reads `running`: one of them sees the other.
  impl_->running = true;
  if (!impl_->stop_requested) impl_->server.listen_after_bind();
  impl_->running = false;
}

void HttpServer::stop() {
  impl_->stop_requested = true;
  // cpp-httplib ignores stop() until listen has started: retry briefly while
  // run() is starting up.
  for (int attempt = 0; attempt < 200; ++attempt) {
    if (impl_->server.is_running()) {
      impl_->server.stop();
      return;
    }
    if (!impl_->running) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace quantem::server
