#include "unix_socket_file.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "quantem/core/error.hpp"

namespace quantem::server::unix_socket {

namespace {

std::string system_reason(int error_number) { return std::strerror(error_number); }

std::string parent_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// connect() to the socket at `path`: true when something accepts, false when
// refused (nobody listens); throws for anything else.
bool someone_listens(const std::string& path) {
  const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) throw unavailable("cannot probe the unix socket " + path + ": " + system_reason(errno));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int rc = ::connect(probe, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  const int error_number = errno;
  ::close(probe);
  if (rc == 0) return true;
  if (error_number == ECONNREFUSED || error_number == ENOENT) return false;
  throw unavailable("cannot probe the unix socket " + path + ": " + system_reason(error_number));
}

}  // namespace

void check_length(const std::string& path) {
  if (path.empty()) throw bad_request("the unix socket path is empty");
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    throw bad_request("the unix socket path " + path + " is too long (" + std::to_string(path.size()) +
                           " bytes; at most " + std::to_string(sizeof(sockaddr_un::sun_path) - 1) + ")");
  }
}

void prepare_directory(const std::string& path) {
  const std::string directory = parent_of(path);
  std::string prefix = directory.front() == '/' ? "" : ".";
  std::size_t start = 0;
  while (start <= directory.size()) {
    const auto slash = directory.find('/', start);
    const std::string component = directory.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    start = slash == std::string::npos ? directory.size() + 1 : slash + 1;
    if (component.empty() || component == ".") continue;
    prefix += "/" + component;
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      throw unavailable("cannot create the directory " + prefix + " for the unix socket: " + system_reason(errno));
    }
  }
  struct stat info {};
  if (::stat(directory.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    throw unavailable("the unix socket's directory " + directory + " is not a directory");
  }
}

void remove_stale(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return;
    throw unavailable("cannot inspect " + path + ": " + system_reason(errno));
  }
  if (!S_ISSOCK(info.st_mode)) throw unavailable(path + " exists and is not a socket; refusing to replace it");
  if (someone_listens(path)) throw unavailable("another daemon already listens on the unix socket " + path);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    throw unavailable("cannot remove the stale unix socket " + path + ": " + system_reason(errno));
  }
}

std::string temporary_path_for(const std::string& path) {
  return parent_of(path) + "/.quantem-" + std::to_string(::getpid());
}

FileIdentity publish(const std::string& temporary, const std::string& path) {
  struct Cleanup {
    const std::string& file;
    ~Cleanup() { ::unlink(file.c_str()); }
  } cleanup{temporary};
  if (::chmod(temporary.c_str(), 0600) != 0) throw unavailable("cannot chmod " + temporary + ": " + system_reason(errno));
  if (::link(temporary.c_str(), path.c_str()) != 0) {
    if (errno != EEXIST) throw unavailable("cannot create the unix socket " + path + ": " + system_reason(errno));
    remove_stale(path);  // throws for a live daemon
    if (::link(temporary.c_str(), path.c_str()) != 0) {
      throw unavailable("cannot create the unix socket " + path + ": " + system_reason(errno));
    }
  }
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) throw unavailable("cannot inspect " + path + ": " + system_reason(errno));
  return {info.st_dev, info.st_ino};
}

void remove_if_ours(const std::string& path, const FileIdentity& identity) noexcept {
  struct stat info {};
  if (::lstat(path.c_str(), &info) == 0 && info.st_dev == identity.device && info.st_ino == identity.inode) {
    ::unlink(path.c_str());
  }
}

}  // namespace quantem::server::unix_socket
