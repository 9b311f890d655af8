#include "test_support.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <sys/wait.h>

namespace quantem::test {

namespace {
std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::string(value) : fallback;
}
}  // namespace

std::string python() { return env_or("QUANTEM_PYTHON", "/usr/bin/python3"); }
std::string real_data_dir() { return env_or("QUANTEM_REAL_DATA_DIR", ""); }
bool real_data_available() {
  const auto dir = real_data_dir();
  return !dir.empty() && std::filesystem::exists(dir + "/arina");
}
std::string source_dir() { return env_or("QUANTEM_SOURCE_DIR", "."); }
std::string quantem_binary() { return env_or("QUANTEM_BINARY", "quantem-gpu"); }

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "quantem-test-XXXXXX").string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer{};
  std::size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

CommandResult run_python_script(const std::string& script, const std::string& arguments) {
  const std::string command = python() + " " + source_dir() + "/tests/support/python/" + script + " " + arguments;
  auto result = run_command(command);
  if (result.status != 0) ADD_FAILURE() << "python reference failed (" << result.status << "): " << command << "\n" << result.output;
  return result;
}

std::vector<std::uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

bool file_exists(const std::string& path) { return std::filesystem::exists(path); }

}  // namespace quantem::test
