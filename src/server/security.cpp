#include "quantem/server/security.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>
#include <cstdio>
#include <string>
#include <cstring>

#include "quantem/core/error.hpp"
#include "quantem/core/text.hpp"

namespace quantem::server {

const char* const kForeignHostMessage =
    "The Host header does not name a loopback address; quantem-gpu only answers localhost, 127.0.0.1 or [::1].";
const char* const kTokenRequiredMessage =
    "This daemon requires a token: send 'Authorization: Bearer <token>' or '?token=<token>'.";

namespace {

bool all_digits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text)
    if (c < '0' || c > '9') return false;
  return true;
}

bool is_loopback_ipv4(const std::string& text) {
  in_addr address{};
  if (inet_pton(AF_INET, text.c_str(), &address) != 1) return false;
  return (ntohl(address.s_addr) >> 24) == 127;
}

bool is_loopback_ipv6(const std::string& text) {
  in6_addr address{};
  if (inet_pton(AF_INET6, text.c_str(), &address) != 1) return false;
  return IN6_IS_ADDR_LOOPBACK(&address);
}

}  // namespace

bool is_loopback_host_header(std::string_view host) {
  if (host.empty()) return false;
  std::string name;
  if (host.front() == '[') {
    const auto close = host.find(']');
    if (close == std::string_view::npos) return false;
    const std::string_view rest = host.substr(close + 1);
    if (!rest.empty() && !(rest.front() == ':' && all_digits(rest.substr(1)))) return false;
    return is_loopback_ipv6(std::string(host.substr(1, close - 1)));
  }
  const auto colon = host.rfind(':');
  if (colon != std::string_view::npos) {
    if (!all_digits(host.substr(colon + 1))) return false;
    name = to_lower(host.substr(0, colon));
  } else {
    name = to_lower(host);
  }
  return name == "localhost" || is_loopback_ipv4(name);
}

bool is_loopback_address(std::string_view address) {
  const std::string text = to_lower(address);
  return text == "localhost" || is_loopback_ipv4(text) || is_loopback_ipv6(text);
}

bool constant_time_equals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  volatile unsigned char difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) difference = difference | static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

std::optional<std::string> authorization_token(std::string_view header_value) {
  const auto space = header_value.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::string scheme = to_lower(header_value.substr(0, space));
  if (scheme != "bearer" && scheme != "token") return std::nullopt;
  std::string_view credentials = header_value.substr(space + 1);
  while (!credentials.empty() && credentials.front() == ' ') credentials.remove_prefix(1);
  while (!credentials.empty() && (credentials.back() == ' ' || credentials.back() == '\t')) credentials.remove_suffix(1);
  if (credentials.empty()) return std::nullopt;
  return std::string(credentials);
}

std::string token_refusal(std::string_view token) {
  if (token.size() < kMinimumTokenLength) {
    return "the token is too short (" + std::to_string(token.size()) + " characters; at least " +
           std::to_string(kMinimumTokenLength) + " are required): use a long random token, e.g. `openssl rand -hex 32`";
  }
  for (const char c : token) {
    if (c <= ' ' || c > '~') return "the token must be printable ASCII without spaces";
  }
  return {};
}

std::string token_file_refusal(const std::string& path, unsigned owner, unsigned mode, unsigned current_user) {
  if (owner != current_user) {
    return "the token file " + path + " belongs to another user (uid " + std::to_string(owner) +
           "); it must be yours and private (chmod 600)";
  }
  if ((mode & 077U) != 0) {
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", mode & 07777U);
    return std::string("permissions ") + octal + " for the token file " + path +
           " are too open: it must not be accessible by others. Run: chmod 600 " + path;
  }
  return {};
}

void AccessPolicy::check(const HttpRequest& request, const protocol::QueryParams& query, bool token_exempt) const {
  const auto host = request.header("host");
  if (!host || !is_loopback_host_header(*host)) throw Error(ErrorKind::forbidden, kForeignHostMessage);
  if (mode == AuthMode::none || token_exempt) return;
  bool accepted = false;
  if (const auto authorization = request.header("authorization")) {
    if (const auto given = authorization_token(*authorization)) accepted = constant_time_equals(*given, token);
  }
  if (!accepted) {
    if (const auto given = query.last("token")) accepted = constant_time_equals(*given, token);
  }
  if (!accepted) throw Error(ErrorKind::forbidden, kTokenRequiredMessage);
}

}  // namespace quantem::server
