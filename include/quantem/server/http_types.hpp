#pragma once
// The HTTP request and response as the service sees them: plain values, no
// socket library. src/server/http_server.cpp (the only file that includes
// Boost.Asio/Beast) converts to and from these.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/protocol/shared_bytes.hpp"

namespace quantem::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // percent-decoded path, without the query
  std::string query;   // raw text after '?', not decoded
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case

  // First value of a header (name in lower case).
  std::optional<std::string> header(std::string_view lower_case_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type;  // sent as `content-type`
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;
  // When set, the body sent instead of `body`: bytes shared with a cache
  // (the encoded-image cache) or owned by an image, written to the socket
  // without a copy.
  protocol::SharedBytes shared_body;

  // When set, this is not the answer yet: the request has to wait (for a
  // load). The HTTP server calls `later` on one of its waiting threads, so
  // that waiting never holds the workers that answer health, catalog and
  // resident data (docs/decisions/0017), and sends what it returns; a
  // caller without such threads calls it in place. Everything else in this
  // response is ignored.
  std::function<HttpResponse()> later;

  // The bytes that go out: the shared body when set, else `body`.
  std::string_view sent_body() const { return shared_body ? shared_body.view() : std::string_view(body); }

  // A compact JSON body (separators "," and ":"), content-type application/json.
  static HttpResponse json(int status, const nlohmann::ordered_json& document);
  // {"detail": "<text>"} with the given status.
  static HttpResponse detail(int status, const std::string& text);
  void set_header(const std::string& lower_case_name, const std::string& value);
  std::optional<std::string> header(std::string_view lower_case_name) const;
};

// What an HttpServer serves.
struct HttpService {
  // Answers a complete request (may return a response with `later`).
  std::function<HttpResponse(const HttpRequest&)> handle;
  // Optional. Called before a request's body is read, with its request line
  // and headers: a response refuses the request there (the body is never
  // read), nullopt lets it through.
  std::function<std::optional<HttpResponse>(const HttpRequest&)> screen;
};

}  // namespace quantem::server
