#pragma once
// Request guards (docs/protocol.md, '6. Security'): DNS-rebinding protection through the Host
// header, the opt-in token, and the loopback rule for bind addresses.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "quantem/protocol/query.hpp"
#include "quantem/server/http_types.hpp"

namespace quantem::server {

// True for `localhost`, any 127.0.0.0/8 literal, or `[::1]` (any spelling of
// the IPv6 loopback), each with or without `:port`. Case-insensitive. A
// missing or empty Host is not loopback.
bool is_loopback_host_header(std::string_view host);

// True for a bind address that only loopback clients can reach:
// "localhost", 127.0.0.0/8, ::1.
bool is_loopback_address(std::string_view address);

// Compares in time that depends only on the lengths.
bool constant_time_equals(std::string_view a, std::string_view b) noexcept;

// The credentials of `Authorization: Bearer <t>` or `Authorization: token <t>`
// (scheme case-insensitive), else nullopt.
std::optional<std::string> authorization_token(std::string_view header_value);

// Token rules (--auth token), checked at start; each returns the refusal text
// (the daemon prints it and exits 1), empty when acceptable.
//  - a token has at least kMinimumTokenLength characters, all printable ASCII
//    without spaces (it travels in a header and a query parameter);
//  - a token file, like an ssh private key, belongs to the user running the
//    daemon and is not readable or writable by group or others ("chmod 600").
constexpr std::size_t kMinimumTokenLength = 16;
std::string token_refusal(std::string_view token);
// `path` is only used in the message; `owner` and `mode` come from fstat of the open file.
std::string token_file_refusal(const std::string& path, unsigned owner, unsigned mode, unsigned current_user);

enum class AuthMode { none, token };

struct AccessPolicy {
  AuthMode mode = AuthMode::none;
  std::string token;  // when mode == token

  // Throws quantem::Error(forbidden) when the Host header is not loopback, or
  // (token mode, unless the route is exempt) when no valid token is given in
  // the Authorization header or the `token` query parameter.
  void check(const HttpRequest& request, const protocol::QueryParams& query, bool token_exempt) const;
};

extern const char* const kForeignHostMessage;
extern const char* const kTokenRequiredMessage;

}  // namespace quantem::server
