#include "export_files.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include <spdlog/spdlog.h>

#include "quantem/core/error.hpp"
#include "quantem/export/export.hpp"

namespace quantem::exporter {

const char* const kIncompleteSuffix = ".incomplete-export";
const char* const kFreeBytesTestVariable = "QUANTEM_EXPORT_FREE_BYTES_FOR_TESTING";

namespace detail {
namespace fs = std::filesystem;

namespace {

constexpr const char* kLockName = ".export-lock";
constexpr std::time_t kLocklessGraceSeconds = 60;

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

}  // namespace

IncompleteFolder::IncompleteFolder(const std::string& output_folder, const std::string& name) {
  check_output_folder(output_folder);
  const fs::path folder = fs::absolute(output_folder).lexically_normal();
  final_path_ = (folder / name).string();
  path_ = (folder / ("." + name + kIncompleteSuffix)).string();
  lock_path_ = path_ + "/" + kLockName;
  if (::access(final_path_.c_str(), F_OK) == 0) {
    throw conflict("the export " + final_path_ + " already exists; an export never overwrites anything");
  }
  if (::mkdir(path_.c_str(), 0755) != 0) {
    if (errno != EEXIST) throw IoError("cannot create " + path_ + ": " + errno_text(errno));
    if (!is_abandoned(path_)) throw conflict("an export of " + name + " into " + folder.string() + " is running");
    remove_tree(path_);
    if (::mkdir(path_.c_str(), 0755) != 0) throw IoError("cannot create " + path_ + ": " + errno_text(errno));
  }
  lock_fd_ = ::open(lock_path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (lock_fd_ >= 0) ::close(lock_fd_);
    lock_fd_ = -1;
    remove_tree(path_);
    throw IoError("cannot lock " + lock_path_ + ": " + errno_text(error));
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
  const std::string lock_path = incomplete_folder + "/" + kLockName;
  const int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    // No lock file: a writer between mkdir and its lock (a moment), or one
    // that died there. Only an old folder is taken for abandoned.
    struct stat info {};
    if (::stat(incomplete_folder.c_str(), &info) != 0) return false;
    return std::time(nullptr) - info.st_mtime > kLocklessGraceSeconds;
  }
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

}  // namespace detail

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
    std::error_code type_error;
    if (!entry.is_directory(type_error) || !detail::is_abandoned(entry.path().string())) continue;
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
