#pragma once
// What the CPU backend's load tests share: acquisitions written by h5py with
// the official bitshuffle filter (tests/support/python/products_load_fixture.py,
// which also writes the expected counts), and a CPU backend with a fixed budget.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "test_support.hpp"

namespace quantem::backend::test_fixture {

// A file of little-endian uint64 values (the fixture's expected counts).
inline std::vector<std::uint64_t> read_u64(const std::string& path) {
  const std::vector<std::uint8_t> bytes = test::read_file(path);
  std::vector<std::uint64_t> values(bytes.size() / 8);
  std::memcpy(values.data(), bytes.data(), values.size() * 8);  // little-endian host
  return values;
}

// `<stem>_master.h5` and its shards in `dir`, written by the fixture script with `options`; inspected.
inline catalog::Acquisition write_fixture(const test::TempDir& dir, const std::string& stem,
                                          const std::string& options) {
  test::run_python_script("products_load_fixture.py", "write " + dir.path() + " " + stem + " " + options);
  catalog::Acquisition acquisition = catalog::inspect_master(dir.file(stem + "_master.h5"));
  EXPECT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  return acquisition;
}

inline std::unique_ptr<Backend> cpu_backend(unsigned threads, int devices = 1) {
  CpuBackendOptions options;
  options.threads = threads;
  options.virtual_devices = devices;
  options.budget_bytes_per_device = std::uint64_t{1} << 30;
  return make_cpu_backend(options);
}

}  // namespace quantem::backend::test_fixture
