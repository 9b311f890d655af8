#include "raw_http.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

namespace quantem::test {

namespace {

// Reads what is available within the remaining time; 0: closed, -1: timeout or error.
ssize_t receive_some(int fd, char* buffer, std::size_t size, std::chrono::steady_clock::time_point deadline) {
  // What is already there first, without a poll.
  const ssize_t ready = ::recv(fd, buffer, size, MSG_DONTWAIT);
  if (ready > 0 || ready == 0) return ready;
  if (errno == ECONNRESET) return 0;
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return -1;
  pollfd wait{fd, POLLIN, 0};
  if (::poll(&wait, 1, static_cast<int>(left.count())) <= 0) return -1;
  const ssize_t n = ::recv(fd, buffer, size, 0);
  if (n < 0 && errno == ECONNRESET) return 0;
  return n;
}

}  // namespace

std::string RawResponse::header(const std::string& name) const {
  for (const auto& [key, value] : headers)
    if (strcasecmp(key.c_str(), name.c_str()) == 0) return value;
  return {};
}

int RawResponse::header_count(const std::string& name) const {
  int count = 0;
  for (const auto& [key, value] : headers)
    if (strcasecmp(key.c_str(), name.c_str()) == 0) ++count;
  return count;
}

int connect_tcp(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int connect_unix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) {
    ::close(fd);
    return -1;
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& data) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

std::optional<RawResponse> read_response(int fd, int timeout_ms, bool head_request) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  // Peek until the head is complete, then take exactly the head and the body:
  // pipelined responses after this one stay in the socket. The peek buffer is
  // kept per thread (a response head is small), the body is received in place:
  // a benchmark's client costs no more than a viewer's would.
  thread_local std::string peeked(64 * 1024, '\0');
  std::size_t header_end = std::string::npos;
  std::size_t available = 0;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd wait{fd, POLLIN, 0};
    if (::poll(&wait, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
    const ssize_t n = ::recv(fd, peeked.data(), peeked.size(), MSG_PEEK);
    if (n <= 0) return std::nullopt;
    header_end = std::string_view(peeked.data(), static_cast<std::size_t>(n)).find("\r\n\r\n");
    if (header_end != std::string::npos) break;
    if (static_cast<std::size_t>(n) == peeked.size()) return std::nullopt;  // a head larger than any we send
    if (static_cast<std::size_t>(n) == available) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    available = static_cast<std::size_t>(n);
  }
  std::string data(header_end + 4, '\0');
  if (::recv(fd, data.data(), data.size(), MSG_WAITALL) != static_cast<ssize_t>(data.size())) return std::nullopt;
  RawResponse response;
  const std::string head = data.substr(0, header_end);
  std::size_t line_end = head.find("\r\n");
  const std::string status_line = head.substr(0, line_end);
  if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12) return std::nullopt;
  response.status = std::atoi(status_line.c_str() + 9);
  while (line_end != std::string::npos) {
    const std::size_t start = line_end + 2;
    line_end = head.find("\r\n", start);
    const std::string line = head.substr(start, line_end == std::string::npos ? std::string::npos : line_end - start);
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(value.begin());
    response.headers.emplace_back(line.substr(0, colon), value);
  }
  const std::string length_text = response.header("content-length");
  const std::size_t length = head_request || length_text.empty() ? 0 : std::strtoull(length_text.c_str(), nullptr, 10);
  response.body.resize(length);
  std::size_t received = 0;
  while (received < length) {
    const ssize_t n = receive_some(fd, response.body.data() + received, length - received, deadline);
    if (n <= 0) return std::nullopt;
    received += static_cast<std::size_t>(n);
  }
  return response;
}

bool closed_within(int fd, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buffer[4096];
  while (true) {
    const ssize_t n = receive_some(fd, buffer, sizeof buffer, deadline);
    if (n == 0) return true;
    if (n < 0) return false;
  }
}

std::string request_text(const std::string& method, const std::string& target, const std::string& host,
                         const std::string& extra_lines) {
  return method + " " + target + " HTTP/1.1\r\nHost: " + host + "\r\n" + extra_lines + "\r\n";
}

std::optional<RawResponse> exchange(int fd, const std::string& request, bool half_close_after_sending) {
  if (fd < 0) return std::nullopt;
  std::optional<RawResponse> response;
  if (send_all(fd, request)) {
    if (half_close_after_sending) ::shutdown(fd, SHUT_WR);
    response = read_response(fd);
  }
  ::close(fd);
  return response;
}

std::optional<RawResponse> exchange_tcp(int port, const std::string& request, bool half_close_after_sending) {
  return exchange(connect_tcp(port), request, half_close_after_sending);
}

std::optional<RawResponse> exchange_unix(const std::string& path, const std::string& request) {
  return exchange(connect_unix(path), request);
}

}  // namespace quantem::test
