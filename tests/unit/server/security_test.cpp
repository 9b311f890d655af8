#include <gtest/gtest.h>

#include "quantem/core/error.hpp"
#include "quantem/server/security.hpp"

using namespace quantem::server;

TEST(HostCheck, AcceptsLoopbackNamesWithAnyPort) {
  for (const char* host : {"localhost", "localhost:8780", "LOCALHOST:1", "127.0.0.1", "127.0.0.1:8765", "127.1.2.3:80",
                           "[::1]", "[::1]:8780", "[0:0:0:0:0:0:0:1]:9"}) {
    EXPECT_TRUE(is_loopback_host_header(host)) << host;
  }
}

TEST(HostCheck, RejectsEverythingElse) {
  for (const char* host : {"", "evil.com", "evil.com:8780", "localhost.evil.com", "10.0.0.1", "128.0.0.1:80",
                           "[::2]:80", "[::1", "::1", "localhost:", "localhost:80x", "127.0.0.1:8780:1", "0.0.0.0",
                           "localhost.", "[::1]x"}) {
    EXPECT_FALSE(is_loopback_host_header(host)) << host;
  }
}

TEST(BindAddress, OnlyLoopbackIsLoopback) {
  EXPECT_TRUE(is_loopback_address("127.0.0.1"));
  EXPECT_TRUE(is_loopback_address("127.9.9.9"));
  EXPECT_TRUE(is_loopback_address("::1"));
  EXPECT_TRUE(is_loopback_address("localhost"));
  EXPECT_FALSE(is_loopback_address("0.0.0.0"));
  EXPECT_FALSE(is_loopback_address("::"));
  EXPECT_FALSE(is_loopback_address("192.168.1.2"));
  EXPECT_FALSE(is_loopback_address("example.org"));
}

TEST(Token, ConstantTimeEqualityIsEquality) {
  EXPECT_TRUE(constant_time_equals("abc", "abc"));
  EXPECT_FALSE(constant_time_equals("abc", "abd"));
  EXPECT_FALSE(constant_time_equals("abc", "abcd"));
  EXPECT_TRUE(constant_time_equals("", ""));
}

TEST(Token, AuthorizationSchemesAreBearerAndToken) {
  EXPECT_EQ(authorization_token("Bearer abc"), "abc");
  EXPECT_EQ(authorization_token("bearer abc"), "abc");
  EXPECT_EQ(authorization_token("token abc"), "abc");
  EXPECT_EQ(authorization_token("Token  abc "), "abc");
  EXPECT_FALSE(authorization_token("Basic abc").has_value());
  EXPECT_FALSE(authorization_token("Bearer").has_value());
  EXPECT_FALSE(authorization_token("Bearer ").has_value());
}

namespace {
HttpRequest request_with(const std::string& host, const std::string& authorization = "") {
  HttpRequest request;
  request.method = "GET";
  request.path = "/api/browse/capabilities";
  if (!host.empty()) request.headers.emplace_back("host", host);
  if (!authorization.empty()) request.headers.emplace_back("authorization", authorization);
  return request;
}
quantem::ErrorKind refusal(const AccessPolicy& policy, const HttpRequest& request, const std::string& query = "",
                           bool exempt = false) {
  try {
    policy.check(request, quantem::protocol::parse_query_string(query), exempt);
  } catch (const quantem::Error& error) {
    return error.kind();
  }
  return quantem::ErrorKind::internal;  // "no refusal"
}
}  // namespace

TEST(AccessPolicy, ForeignOrMissingHostIsForbidden) {
  AccessPolicy open;
  EXPECT_EQ(refusal(open, request_with("evil.com")), quantem::ErrorKind::forbidden);
  EXPECT_EQ(refusal(open, request_with("")), quantem::ErrorKind::forbidden);
  EXPECT_EQ(refusal(open, request_with("localhost:8780")), quantem::ErrorKind::internal);
}

TEST(AccessPolicy, TokenModeAcceptsHeaderOrQueryAndExemptsHealth) {
  AccessPolicy policy;
  policy.mode = AuthMode::token;
  policy.token = "s3cret";
  EXPECT_EQ(refusal(policy, request_with("localhost")), quantem::ErrorKind::forbidden);
  EXPECT_EQ(refusal(policy, request_with("localhost", "Bearer wrong")), quantem::ErrorKind::forbidden);
  EXPECT_EQ(refusal(policy, request_with("localhost", "Bearer s3cret")), quantem::ErrorKind::internal);
  EXPECT_EQ(refusal(policy, request_with("localhost", "token s3cret")), quantem::ErrorKind::internal);
  EXPECT_EQ(refusal(policy, request_with("localhost"), "token=s3cret"), quantem::ErrorKind::internal);
  EXPECT_EQ(refusal(policy, request_with("localhost"), "token=s3cre"), quantem::ErrorKind::forbidden);
  EXPECT_EQ(refusal(policy, request_with("localhost"), "", true), quantem::ErrorKind::internal);
  // The Host check applies even to exempt routes and valid tokens.
  EXPECT_EQ(refusal(policy, request_with("evil.com", "Bearer s3cret"), "", true), quantem::ErrorKind::forbidden);
}

TEST(TokenRules, ShortOrUnprintableTokensAreRefused) {
  EXPECT_NE(token_refusal("x").find("too short (1 characters; at least 16"), std::string::npos);
  EXPECT_NE(token_refusal("0123456789abcde").find("too short"), std::string::npos);
  EXPECT_EQ(token_refusal("0123456789abcdef"), "");
  EXPECT_NE(token_refusal("0123456789 abcdef").find("printable ASCII without spaces"), std::string::npos);
  EXPECT_NE(token_refusal("0123456789abcdef\n").find("printable"), std::string::npos);
}

TEST(TokenRules, TokenFilesArePrivateLikeSshKeys) {
  EXPECT_EQ(token_file_refusal("/t", 1000, 0100600, 1000), "");
  EXPECT_EQ(token_file_refusal("/t", 1000, 0100400, 1000), "");
  EXPECT_NE(token_file_refusal("/t", 1000, 0100644, 1000).find("permissions 0644 for the token file /t are too open"),
            std::string::npos);
  EXPECT_NE(token_file_refusal("/t", 1000, 0100620, 1000).find("too open"), std::string::npos);
  EXPECT_NE(token_file_refusal("/t", 0, 0100600, 1000).find("belongs to another user"), std::string::npos);
}
