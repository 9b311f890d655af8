#pragma once
// Fixture helpers for the catalog tests: acquisitions written by the h5py
// reference script tests/support/python/catalog_fixtures.py.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "quantem/catalog/acquisition.hpp"
#include "test_support.hpp"

namespace quantem::test {

// Runs `catalog_fixtures.py acquisition <line>` for every line, in one
// interpreter start. Paths in the lines are relative to `directory`.
inline void make_acquisitions(const TempDir& directory, const std::vector<std::string>& lines) {
  std::string spec;
  for (const auto& line : lines) spec += line + "\n";
  const std::string spec_path = directory.file(".fixtures.txt");
  write_file(spec_path, std::vector<std::uint8_t>(spec.begin(), spec.end()));
  run_python_script("catalog_fixtures.py", "batch " + spec_path);
  run_command("rm -f '" + spec_path + "'");
}

// One acquisition `<stem>` written into `directory` with the script's
// options, inspected; a test fails (and goes on) when it is not loadable.
inline catalog::Acquisition make_loadable(const TempDir& directory, const std::string& stem,
                                          const std::string& options) {
  make_acquisitions(directory, {directory.path() + " " + stem + " " + options});
  catalog::Acquisition acquisition = catalog::inspect_master(directory.file(stem + "_master.h5"));
  EXPECT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  return acquisition;
}

inline std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) {
    if (c == '\'') quoted += "'\\''";
    else quoted += c;
  }
  return quoted + "'";
}

}  // namespace quantem::test
