#pragma once
// A raw HTTP/1.1 client over TCP or Unix-domain sockets (no client library):
// for requests a library would not send (duplicate Host, partial requests,
// half-close) and for the Unix socket, which Debian's cpp-httplib 0.11.4
// cannot reach.
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace quantem::test {

struct RawResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names as sent
  std::string body;

  // The first value of a header, names compared case-insensitively; "" when absent.
  std::string header(const std::string& name) const;
  int header_count(const std::string& name) const;
};

// Connected sockets (blocking); -1 on failure.
int connect_tcp(int port);
int connect_unix(const std::string& path);

bool send_all(int fd, const std::string& data);

// One response (status line, headers, a content-length body, none for a
// HEAD request); nullopt when the connection closes or timeout_ms passes
// first. Bytes after the response stay in the socket (pipelining).
std::optional<RawResponse> read_response(int fd, int timeout_ms = 10000, bool head_request = false);

// True when the peer closed (EOF or reset) within timeout_ms, reading and
// discarding anything before.
bool closed_within(int fd, int timeout_ms);

// "METHOD target HTTP/1.1\r\nHost: host\r\n<extra>\r\n" (extra: full lines).
std::string request_text(const std::string& method, const std::string& target, const std::string& host = "127.0.0.1",
                         const std::string& extra_lines = "");

// A fresh connection, one request, one response, closed.
std::optional<RawResponse> exchange(int fd, const std::string& request, bool half_close_after_sending = false);
std::optional<RawResponse> exchange_tcp(int port, const std::string& request, bool half_close_after_sending = false);
std::optional<RawResponse> exchange_unix(const std::string& path, const std::string& request);

}  // namespace quantem::test
