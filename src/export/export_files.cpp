#include "export_files.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <spdlog/spdlog.h>

#include "quantem/core/error.hpp"
#include "quantem/core/io.hpp"
#include "quantem/export/export.hpp"

namespace quantem::exporter {

const char* const kIncompleteSuffix = ".incomplete-export";
const char* const kFreeBytesTestVariable = "QUANTEM_EXPORT_FREE_BYTES_FOR_TESTING";

namespace detail {
namespace fs = std::filesystem;

namespace {

constexpr const char* kLockName = ".export-lock";
// The marker's first line: only a folder whose lock file starts with it was
// made by an export, and only such a folder is ever removed.
constexpr const char* kMarkerLine = "quantem-gpu incomplete export\n";

std::string errno_text(int error) { return std::strerror(error); }

void check_output_folder(const std::string& output_folder) {
  struct stat info {};
  if (::stat(output_folder.c_str(), &info) != 0) {
    if (errno == ENOENT) throw not_found("the export folder " + output_folder + " does not exist");
    throw IoError("cannot stat the export folder " + output_folder + ": " + errno_text(errno));
  }
  if (!S_ISDIR(info.st_mode)) throw IoError("the export folder " + output_folder + " is not a folder");
  if (::access(output_folder.c_str(), W_OK | X_OK) != 0) {
    throw IoError("the export folder " + output_folder + " is not writable: " + errno_text(errno));
  }
}

void remove_tree(const std::string& path) noexcept {
  std::error_code error;
  fs::remove_all(path, error);
  if (error) spdlog::warn("export: cannot remove {}: {}", path, error.message());
}

// Who wrote the folder: the marker line, then this process's pid and host.
std::string marker_text() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(kMarkerLine) + "pid " + std::to_string(::getpid()) + "\nhost " + host + "\n";
}

// The marker of `folder` opened read-only, or -1 when `folder` is not a real
// folder (a symlink, a regular file) or holds no marker written by an export.
int open_marker(const std::string& folder) noexcept {
  struct stat folder_info {};
  if (::lstat(folder.c_str(), &folder_info) != 0 || !S_ISDIR(folder_info.st_mode)) return -1;
  const int fd = ::open((folder + "/" + kLockName).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat info {};
  const std::string expected = kMarkerLine;
  std::string head(expected.size(), '\0');
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) ||
      ::pread(fd, head.data(), head.size(), 0) != static_cast<ssize_t>(head.size()) || head != expected) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

bool is_marked_export(const std::string& incomplete_folder) noexcept {
  const int fd = open_marker(incomplete_folder);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

IncompleteFolder::IncompleteFolder(const std::string& output_folder, const std::string& name) {
  check_output_folder(output_folder);
  const fs::path folder = fs::absolute(output_folder).lexically_normal();
  final_path_ = (folder / name).string();
  path_ = (folder / ("." + name + kIncompleteSuffix)).string();
  lock_path_ = path_ + "/" + kLockName;
  struct stat existing {};
  if (::lstat(final_path_.c_str(), &existing) == 0) {  // a dangling symlink too
    throw conflict("the export " + final_path_ + " already exists; an export never overwrites anything");
  }
  if (::mkdir(path_.c_str(), 0755) != 0) {
    if (errno != EEXIST) throw IoError("cannot create " + path_ + ": " + errno_text(errno));
    if (!is_marked_export(path_)) {
      throw conflict(path_ + " exists and was not made by an export; an export never removes what it did not "
                     "write: move it away to export " + name);
    }
    if (!is_abandoned(path_)) throw conflict("an export of " + name + " into " + folder.string() + " is running");
    remove_tree(path_);
    if (::mkdir(path_.c_str(), 0755) != 0) throw IoError("cannot create " + path_ + ": " + errno_text(errno));
  }
  // The marker first: it says who made the folder, and its lock that the writer lives.
  lock_fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0 || !write_all(lock_fd_, marker_text())) {
    const int error = errno;
    if (lock_fd_ >= 0) ::close(lock_fd_);
    lock_fd_ = -1;
    remove_tree(path_);
    throw IoError("cannot write the export's lock " + lock_path_ + ": " + errno_text(error));
  }
}

IncompleteFolder::~IncompleteFolder() {
  if (!committed_) remove_tree(path_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void IncompleteFolder::commit() {
  if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, final_path_.c_str(), RENAME_NOREPLACE) != 0) {
    const int error = errno;
    if (error == EEXIST) {
      throw conflict("the export " + final_path_ + " appeared while writing; an export never overwrites anything");
    }
    throw IoError("cannot rename " + path_ + " to " + final_path_ + ": " + errno_text(error));
  }
  committed_ = true;
  // The lock file goes after the rename (a cleaner never sees a lockless
  // folder of a live writer); the finished folder then holds only the acquisition.
  ::unlink((final_path_ + "/" + kLockName).c_str());
}

std::uint64_t free_bytes(const std::string& folder) {
  if (const char* injected = std::getenv(kFreeBytesTestVariable)) {
    return std::strtoull(injected, nullptr, 10);
  }
  struct statvfs info {};
  if (::statvfs(folder.c_str(), &info) != 0) {
    if (errno == ENOENT) {
      throw conflict("the export's folder " + folder + " was removed while writing; nothing of the export was kept");
    }
    throw IoError("cannot read the free space of " + folder + ": " + errno_text(errno));
  }
  return static_cast<std::uint64_t>(info.f_bavail) * info.f_frsize;
}

std::uint64_t folder_file_bytes(const std::string& folder) noexcept {
  std::uint64_t total = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    std::error_code size_error;
    if (entry.is_regular_file(size_error)) {
      const auto size = entry.file_size(size_error);
      if (!size_error) total += size;
    }
  }
  return total;
}

bool is_abandoned(const std::string& incomplete_folder) noexcept {
  const int fd = open_marker(incomplete_folder);
  if (fd < 0) return false;  // not made by an export, or a writer between mkdir and its marker
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

}  // namespace detail

void check_export_folder(const std::string& folder) {
  struct stat info {};
  if (::stat(folder.c_str(), &info) != 0) {
    throw conflict("the export folder " + folder + " cannot be used: " + std::strerror(errno) +
                   " (the daemon's --export-dir; an operator must restore it)");
  }
  if (!S_ISDIR(info.st_mode)) throw conflict("the export folder " + folder + " is not a folder");
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw conflict("the export folder " + folder + " is not writable: " + std::strerror(errno));
  }
  // access() passes on a file system that turned read-only after an error
  // (ext4's errors=remount-ro): a file of our own, created and removed, tells.
  static std::atomic<unsigned> probes{0};
  const std::string probe = folder + "/.quantem-export-write-check-" + std::to_string(::getpid()) + "-" +
                            std::to_string(probes++);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw conflict("the export folder " + folder + " is not writable: " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

std::size_t remove_abandoned_exports(const std::string& output_folder) noexcept {
  namespace fs = std::filesystem;
  std::size_t removed = 0;
  std::error_code error;
  const std::string suffix = kIncompleteSuffix;
  for (const auto& entry : fs::directory_iterator(output_folder, error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= suffix.size() + 1 || name[0] != '.' ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    // Never through a symlink, never a regular file, never a folder without an export's marker.
    std::error_code type_error;
    if (!entry.is_directory(type_error) || entry.is_symlink(type_error)) continue;
    if (!detail::is_abandoned(entry.path().string())) continue;
    std::error_code remove_error;
    fs::remove_all(entry.path(), remove_error);
    if (remove_error) {
      spdlog::warn("export: cannot remove the abandoned {}: {}", entry.path().string(), remove_error.message());
    } else {
      spdlog::info("export: removed the abandoned incomplete export {}", entry.path().string());
      ++removed;
    }
  }
  return removed;
}

}  // namespace quantem::exporter
