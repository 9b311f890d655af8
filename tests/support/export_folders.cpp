#include "export_folders.hpp"

#include <fcntl.h>
#include <spawn.h>

#include <algorithm>
#include <filesystem>
#include <thread>

extern char** environ;

namespace quantem::test {

namespace fs = std::filesystem;

std::vector<std::string> folder_entries(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool nothing_finished_looking(const std::string& folder) {
  for (const auto& name : folder_entries(folder)) {
    if (name[0] != '.') return false;
  }
  return true;
}

bool wait_for_partial_data(const std::string& folder, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(folder, error)) {
      if (entry.path().filename().string()[0] != '.' || !entry.is_directory()) continue;
      for (const auto& inner : fs::directory_iterator(entry.path(), error)) {
        if (inner.path().filename().string().find("_data_") != std::string::npos) return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

pid_t spawn_quietly(const std::string& binary, const std::vector<std::string>& arguments,
                    const std::vector<std::string>& extra_env) {
  std::vector<std::string> args = {binary};
  args.insert(args.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  env_strings.insert(env_strings.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

}  // namespace quantem::test
