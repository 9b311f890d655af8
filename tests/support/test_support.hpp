#pragma once
// Helpers shared by every test: temporary folders, the Python reference
// (h5py + the official bitshuffle filter + numpy), real data paths.
#include <cstdint>
#include <string>
#include <vector>

namespace quantem::test {

// Environment set by CMake (quantem_add_test).
std::string python();          // interpreter with h5py/hdf5plugin/numpy
std::string real_data_dir();   // ../shared/data/real ("" when absent)
bool real_data_available();    // the real detector files were found at configure time

// Skips the current test, with a message, when the real detector files are absent.
#define QUANTEM_SKIP_WITHOUT_REAL_DATA()                                                        \
  do {                                                                                          \
    if (!::quantem::test::real_data_available())                                                \
      GTEST_SKIP() << "real detector files (shared/data/real) not found; set QUANTEM_REAL_DATA_DIR"; \
  } while (0)
std::string source_dir();      // repository root
std::string quantem_binary();  // path of the built quantem-gpu

// A fresh temporary directory removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs a shell command; returns its exit status and captured stdout.
struct CommandResult {
  int status = -1;
  std::string output;
};
CommandResult run_command(const std::string& command);

// Runs tests/support/python/<script> with arguments through the reference
// interpreter; fails the current test (ADD_FAILURE) on a non-zero exit.
CommandResult run_python_script(const std::string& script, const std::string& arguments);

std::vector<std::uint8_t> read_file(const std::string& path);
void write_file(const std::string& path, const std::vector<std::uint8_t>& bytes);
bool file_exists(const std::string& path);

}  // namespace quantem::test
