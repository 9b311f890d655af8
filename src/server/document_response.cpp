#include "quantem/server/document_response.hpp"

#include <cctype>
#include <cstdlib>

#include "quantem/server/browse_service.hpp"

namespace quantem::server {

namespace {

// Bodies below this are sent as they are: compressing them saves no round trip.
constexpr std::size_t kSmallestCompressedBody = 1400;

std::string lower_trimmed(std::string text) {
  std::size_t first = 0, last = text.size();
  while (first < last && std::isspace(static_cast<unsigned char>(text[first]))) ++first;
  while (last > first && std::isspace(static_cast<unsigned char>(text[last - 1]))) --last;
  text = text.substr(first, last - first);
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace

bool accepts_gzip(const std::string& accept_encoding) {
  std::size_t position = 0;
  while (position <= accept_encoding.size()) {
    std::size_t comma = accept_encoding.find(',', position);
    if (comma == std::string::npos) comma = accept_encoding.size();
    const std::string item = accept_encoding.substr(position, comma - position);
    position = comma + 1;
    const std::size_t semicolon = item.find(';');
    const std::string coding = lower_trimmed(item.substr(0, semicolon));
    if (coding != "gzip" && coding != "x-gzip" && coding != "*") continue;
    double q = 1.0;
    if (semicolon != std::string::npos) {
      const std::string parameter = lower_trimmed(item.substr(semicolon + 1));
      if (parameter.rfind("q=", 0) == 0) q = std::strtod(parameter.c_str() + 2, nullptr);
    }
    if (q > 0) return true;
  }
  return false;
}

HttpResponse document_response(const HttpRequest& request, const DocumentBody& body) {
  HttpResponse response;
  response.set_header("etag", body.etag());
  response.set_header("cache-control", "no-cache");
  response.set_header("vary", "accept-encoding");
  if (const auto condition = request.header("if-none-match"); condition && if_none_match_names(*condition, body.etag())) {
    response.status = 304;
    return response;
  }
  response.status = 200;
  response.content_type = "application/json";
  const auto encodings = request.header("accept-encoding");
  if (encodings && body.json()->size() >= kSmallestCompressedBody && accepts_gzip(*encodings)) {
    response.set_header("content-encoding", "gzip");
    response.shared_body = protocol::SharedBytes::of(body.gzip());
  } else {
    response.shared_body = protocol::SharedBytes::of(body.json());
  }
  return response;
}

}  // namespace quantem::server
