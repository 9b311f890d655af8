#pragma once
// The file side of a Unix-socket listener (POSIX only; the socket itself is
// Boost.Asio's, in http_server.cpp): the private directory, stale sockets of
// dead daemons, an atomic 0600 publish, and removal of exactly our file.
#include <sys/types.h>

#include <string>

namespace quantem::server::unix_socket {

// Throws quantem::Error(bad_request) when `path` does not fit a
// sockaddr_un (at most 107 bytes).
void check_length(const std::string& path);

// Creates every missing directory above `path` with mode 0700 (existing ones
// are left as they are). Throws quantem::Error(unavailable).
void prepare_directory(const std::string& path);

// Nothing at `path`: returns. A socket nobody accepts on (connect() refused:
// its daemon died) is removed. A socket that accepts, or a file that is not a
// socket, is refused: quantem::Error(unavailable) naming the reason.
void remove_stale(const std::string& path);

// A short name in the same directory for binding before publishing.
std::string temporary_path_for(const std::string& path);

struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
};

// Gives the socket file at `temporary` mode 0600 and links it to `path`
// (never replacing a file there: a stale socket is removed first and the link
// retried once), then removes `temporary`. Returns the published file's
// identity. Throws quantem::Error(unavailable); `temporary` is removed either way.
FileIdentity publish(const std::string& temporary, const std::string& path);

// Removes `path` only if it is still the file we published (a later daemon may
// have replaced it). Never throws.
void remove_if_ours(const std::string& path, const FileIdentity& identity) noexcept;

}  // namespace quantem::server::unix_socket
