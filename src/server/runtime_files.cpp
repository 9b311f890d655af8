#include "quantem/server/runtime_files.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include <spdlog/spdlog.h>

namespace quantem::server {

namespace {

// The pid of a name `server-<pid>.json`, else nullopt.
std::optional<pid_t> runtime_file_pid(const std::string& name) {
  const std::string prefix = "server-", suffix = ".json";
  if (name.size() <= prefix.size() + suffix.size()) return std::nullopt;
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return std::nullopt;
  const long value = std::strtol(digits.c_str(), nullptr, 10);
  if (value <= 0) return std::nullopt;
  return static_cast<pid_t>(value);
}

struct RuntimeEntry {
  pid_t pid;
  std::filesystem::path path;
};

std::vector<RuntimeEntry> runtime_entries(const std::string& directory) {
  std::vector<RuntimeEntry> entries;
  std::error_code error;
  for (std::filesystem::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    if (const auto pid = runtime_file_pid(it->path().filename().string())) entries.push_back({*pid, it->path()});
  }
  std::sort(entries.begin(), entries.end(), [](const RuntimeEntry& a, const RuntimeEntry& b) { return a.pid < b.pid; });
  return entries;
}

}  // namespace

std::string configured_runtime_directory() {
  if (const char* dir = std::getenv("QUANTEM_GPU_RUNTIME_DIR"); dir && *dir) return dir;
  if (const char* dir = std::getenv("XDG_RUNTIME_DIR"); dir && *dir) return std::string(dir) + "/quantem-gpu";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.local/share/quantem-gpu/runtime";
  return "/tmp/quantem-gpu-" + std::to_string(getuid());
}

namespace {

// A shared folder like /tmp (others may write, the sticky bit set): the
// daemon keeps its files in a private subfolder of it.
bool is_shared_sticky_folder(const struct stat& status) {
  return S_ISDIR(status.st_mode) && (status.st_mode & S_ISVTX) && (status.st_mode & (S_IWGRP | S_IWOTH));
}

std::string octal_mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// Why an existing folder cannot hold the runtime files (empty: it can).
std::string unsafe_folder_reason(const std::string& directory, const struct stat& status) {
  if (!S_ISDIR(status.st_mode)) return directory + " is not a folder";
  if (status.st_uid != ::geteuid()) {
    return directory + " belongs to user " + std::to_string(status.st_uid) + ", not to this user (" +
           std::to_string(::geteuid()) + ")";
  }
  if ((status.st_mode & (S_IWGRP | S_IWOTH)) && !(status.st_mode & S_ISVTX)) {
    return directory + " (mode " + octal_mode(status.st_mode) +
           ") may be written by other users, and without the sticky bit they could replace the runtime files";
  }
  return {};
}

}  // namespace

std::string runtime_directory() {
  const std::string configured = configured_runtime_directory();
  struct stat status {};
  if (::stat(configured.c_str(), &status) == 0 && is_shared_sticky_folder(status)) {
    return configured + "/quantem-gpu-" + std::to_string(::geteuid());
  }
  return configured;
}

std::string prepare_runtime_directory(const std::string& directory) {
  struct stat status {};
  if (::lstat(directory.c_str(), &status) != 0) {
    if (errno != ENOENT) return "cannot use the runtime folder " + directory + ": " + std::strerror(errno);
    std::error_code error;
    const std::filesystem::path path(directory);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), error);
    if (error) return "cannot create the runtime folder " + directory + ": " + error.message();
    // Created here, so private from the start: mkdir's mode, never a chmod.
    if (::mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST) {
      return "cannot create the runtime folder " + directory + ": " + std::strerror(errno);
    }
    if (::lstat(directory.c_str(), &status) != 0) {
      return "cannot use the runtime folder " + directory + ": " + std::strerror(errno);
    }
  }
  if (S_ISLNK(status.st_mode) && ::stat(directory.c_str(), &status) != 0) {
    return "cannot use the runtime folder " + directory + ": " + std::strerror(errno);
  }
  if (const std::string reason = unsafe_folder_reason(directory, status); !reason.empty()) {
    return "refusing the runtime folder: " + reason +
           "; point $QUANTEM_GPU_RUNTIME_DIR at a folder of your own (it is created with mode 0700 when missing)";
  }
  return {};
}

bool is_live_daemon(pid_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // The pid may have been reused by another program since the daemon died.
  // The executable's name (" (deleted)" appended once a reinstall replaced
  // it), else the command name (a symlink's name), else trust kill().
  const std::string proc = "/proc/" + std::to_string(pid);
  std::error_code error;
  const auto executable = std::filesystem::read_symlink(proc + "/exe", error);
  if (!error) return executable.filename().string().rfind("quantem-gpu", 0) == 0;
  std::ifstream comm(proc + "/comm");
  std::string name;
  if (!std::getline(comm, name)) return true;
  return name == "quantem-gpu";
}

std::vector<nlohmann::ordered_json> live_runtime_files(const std::string& directory) {
  std::vector<nlohmann::ordered_json> documents;
  for (const auto& entry : runtime_entries(directory)) {
    if (!is_live_daemon(entry.pid)) continue;
    std::ifstream in(entry.path);
    auto document = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (document.is_object()) documents.push_back(std::move(document));
  }
  return documents;
}

std::vector<std::string> remove_stale_runtime_files(const std::string& directory, pid_t own_pid) {
  std::vector<std::string> removed;
  for (const auto& entry : runtime_entries(directory)) {
    if (entry.pid == own_pid || is_live_daemon(entry.pid)) continue;
    std::error_code error;
    if (std::filesystem::remove(entry.path, error)) {
      spdlog::info("removed the runtime file of daemon {}, which is no longer running: {}", entry.pid,
                   entry.path.string());
      removed.push_back(entry.path.string());
    } else if (error) {
      spdlog::warn("cannot remove the stale runtime file {}: {}", entry.path.string(), error.message());
    }
  }
  return removed;
}

}  // namespace quantem::server
