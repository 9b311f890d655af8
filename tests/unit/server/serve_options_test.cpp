#include <gtest/gtest.h>

#include <cstdlib>

#include "quantem/core/version.hpp"
#include "quantem/server/serve_options.hpp"

using namespace quantem::server;

namespace {
std::string usage_error(const ServeOptions& options) {
  try {
    validate_serve_options(options);
  } catch (const ServeUsageError& error) {
    return error.what();
  }
  return "accepted";
}
ServeOptions cpu_options() {
  ServeOptions options;
  options.data_folder = "/data";
  options.backend = "cpu";
  return options;
}
}  // namespace

TEST(ServeOptions, ReferenceValidationMessages) {
  auto options = cpu_options();
  options.gpu = -1;
  EXPECT_EQ(usage_error(options), "--gpu must be zero or greater");
  options = cpu_options();
  options.gpus = "0,nope";
  EXPECT_EQ(usage_error(options), "--gpus must be 'auto' or comma-separated CUDA indices");
  options.gpus = "0,";
  EXPECT_EQ(usage_error(options), "--gpus must be 'auto' or comma-separated CUDA indices");
  options.gpus = "Auto";
  EXPECT_EQ(usage_error(options), "--gpus must be 'auto' or comma-separated CUDA indices");
  options.gpus = "1,-2";
  EXPECT_EQ(usage_error(options), "--gpus must contain CUDA indices zero or greater");
  for (long long port : {0LL, -1LL, 65536LL}) {
    options = cpu_options();
    options.port = port;
    EXPECT_EQ(usage_error(options), "--port must be between 1 and 65535") << port;
  }
}

TEST(ServeOptions, GpuListsFollowPythonInt) {
  EXPECT_EQ(parse_gpu_list("0,1"), (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_gpu_list(" 2 , +1,2,1_0"), (std::vector<int>{2, 1, 10}));
  EXPECT_THROW(parse_gpu_list("1.0"), ServeUsageError);
  EXPECT_THROW(parse_gpu_list("_1"), ServeUsageError);
  EXPECT_THROW(parse_gpu_list(""), ServeUsageError);
}

TEST(ServeOptions, ByteSizesAcceptSuffixes) {
  EXPECT_EQ(parse_byte_size("1048576"), 1048576u);
  EXPECT_EQ(parse_byte_size("64MiB"), 64ull << 20);
  EXPECT_EQ(parse_byte_size("2GB"), 2000000000ull);
  EXPECT_EQ(parse_byte_size("1.5GiB"), 1610612736ull);
  EXPECT_EQ(parse_byte_size("512 kib"), 524288ull);
  EXPECT_EQ(parse_byte_size("3K"), 3072ull);
  EXPECT_EQ(parse_byte_size("10B"), 10ull);
  for (const char* bad : {"", "abc", "12XB", "-5", "1.2.3GB", "GiB"}) EXPECT_FALSE(parse_byte_size(bad).has_value()) << bad;
}

TEST(ServeOptions, DeviceBudgetsAreBytesOrAFractionOfDeviceMemory) {
  const auto bytes = parse_device_budget("52.2GB");
  ASSERT_TRUE(bytes);
  EXPECT_EQ(bytes->bytes, 52200000000ull);
  EXPECT_EQ(bytes->fraction, 0.0);
  EXPECT_EQ(parse_device_budget("1073741824")->bytes, 1073741824ull);
  EXPECT_EQ(parse_device_budget("2048.0")->bytes, 2048ull);  // a unitless decimal above 1 is bytes
  EXPECT_EQ(parse_device_budget("0.8")->fraction, 0.8);
  EXPECT_EQ(parse_device_budget("0.8")->bytes, 0u);
  EXPECT_EQ(parse_device_budget("1.0")->fraction, 1.0);
  EXPECT_EQ(parse_device_budget(" 55% ")->fraction, 0.55);
  for (const char* bad : {"", "0", "0.0", "0%", "120%", "%", "lots", "-0.5", "0.8.1", "0.5GB%"}) {
    EXPECT_FALSE(parse_device_budget(bad).has_value()) << bad;
  }
}

TEST(ServeOptions, DurationsTakeUnits) {
  EXPECT_EQ(parse_duration("90s"), std::chrono::milliseconds(90000));
  EXPECT_EQ(parse_duration("30m"), std::chrono::milliseconds(30 * 60000));
  EXPECT_EQ(parse_duration("1.5h"), std::chrono::milliseconds(5400000));
  EXPECT_EQ(parse_duration("250ms"), std::chrono::milliseconds(250));
  EXPECT_EQ(parse_duration("45"), std::chrono::milliseconds(45000));
  for (const char* bad : {"", "m", "5d", "-3s", "1.2.3s"}) EXPECT_FALSE(parse_duration(bad).has_value()) << bad;
}

TEST(ServeOptions, DeviceBudgetFractionAndIdleReleaseReachTheSettings) {
  auto options = cpu_options();
  EXPECT_EQ(validate_serve_options(options).idle_release.count(), 0);  // off by default
  EXPECT_EQ(validate_serve_options(options).device_budget_fraction, 0.0);
  options.device_budget = "0.6";
  options.idle_release = "30m";
  const auto settings = validate_serve_options(options);
  EXPECT_EQ(settings.device_budget_fraction, 0.6);
  EXPECT_EQ(settings.device_budget_bytes, 0u);
  EXPECT_EQ(settings.idle_release, std::chrono::minutes(30));
  options.idle_release = "0s";
  EXPECT_NE(usage_error(options).find("--idle-release must be a positive duration"), std::string::npos);
  options.idle_release = "soon";
  EXPECT_NE(usage_error(options).find("--idle-release"), std::string::npos);
  options.idle_release.clear();
  options.device_budget = "150%";
  EXPECT_NE(usage_error(options).find("fraction of device memory such as 0.8"), std::string::npos);
}

TEST(ServeOptions, AdditionsAreValidated) {
  auto options = cpu_options();
  options.backend = "gpu";
  EXPECT_NE(usage_error(options).find("--backend must be cuda or cpu"), std::string::npos);
  options = cpu_options();
  options.device_budget = "lots";
  EXPECT_NE(usage_error(options).find("--device-budget"), std::string::npos);
  options = cpu_options();
  options.host = "0.0.0.0";
  EXPECT_NE(usage_error(options).find("not a loopback address"), std::string::npos);
  options.allow_non_loopback = true;
  EXPECT_TRUE(validate_serve_options(options).non_loopback);
  options = cpu_options();
  options.auth = "password";
  EXPECT_NE(usage_error(options).find("--auth must be none or token"), std::string::npos);
  options = cpu_options();
  options.http_spin_us = -1;
  EXPECT_NE(usage_error(options).find("--http-spin-us must be between 0 and 100000"), std::string::npos);
  options.http_spin_us = 100001;
  EXPECT_NE(usage_error(options).find("--http-spin-us"), std::string::npos);
  options = cpu_options();
  options.port = 0;
  options.port_file = "/tmp/port";
  EXPECT_EQ(validate_serve_options(options).port, 0);
}

TEST(ServeOptions, SettingsCarryEveryChoice) {
  auto options = cpu_options();
  options.gpus = "3,1";
  options.device_budget = "64MiB";
  options.cpu_devices = 2;
  options.cache_entries = 3;
  options.http_spin_us = 250;
  options.implementation_revision = "rev-1";
  options.auth = "token";
  const auto settings = validate_serve_options(options);
  EXPECT_TRUE(settings.cpu_backend);
  EXPECT_EQ(settings.gpu_indices, (std::vector<int>{3, 1}));
  EXPECT_EQ(settings.device_budget_bytes, 64ull << 20);
  EXPECT_EQ(settings.cpu_devices, 2);
  EXPECT_EQ(settings.cache_entries, 3u);
  EXPECT_EQ(settings.http_spin, std::chrono::microseconds(250));
  EXPECT_EQ(settings.implementation_revision, "rev-1");
  EXPECT_TRUE(settings.token_auth);
  EXPECT_EQ(settings.data_folder, "/data");
  EXPECT_EQ(settings.host, "127.0.0.1");
}

TEST(ServeOptions, RevisionFallsBackToEnvironmentThenBuild) {
  ::unsetenv("QUANTEM_GPU_IMPLEMENTATION_REVISION");
  EXPECT_EQ(resolve_implementation_revision(""), quantem::build_git_revision());
  ::setenv("QUANTEM_GPU_IMPLEMENTATION_REVISION", "from-env", 1);
  EXPECT_EQ(resolve_implementation_revision(""), "from-env");
  EXPECT_EQ(resolve_implementation_revision("given"), "given");
  ::unsetenv("QUANTEM_GPU_IMPLEMENTATION_REVISION");
}

// --log-level, else $QUANTEM_GPU_LOG_LEVEL; an unknown level is refused.
TEST(ServeOptions, LogLevelFromTheOptionElseTheEnvironment) {
  ::unsetenv("QUANTEM_GPU_LOG_LEVEL");
  auto options = cpu_options();
  EXPECT_FALSE(validate_serve_options(options).log_level.has_value());
  options.log_level = "DEBUG";
  EXPECT_EQ(validate_serve_options(options).log_level, quantem::logging::Level::debug);
  ::setenv("QUANTEM_GPU_LOG_LEVEL", "error", 1);
  EXPECT_EQ(validate_serve_options(options).log_level, quantem::logging::Level::debug);
  options.log_level.clear();
  EXPECT_EQ(validate_serve_options(options).log_level, quantem::logging::Level::error);
  ::setenv("QUANTEM_GPU_LOG_LEVEL", "loud", 1);
  EXPECT_EQ(usage_error(options), "$QUANTEM_GPU_LOG_LEVEL must be one of trace|debug|info|warn|error, got 'loud'");
  ::unsetenv("QUANTEM_GPU_LOG_LEVEL");
  options.log_level = "chatty";
  EXPECT_EQ(usage_error(options), "--log-level must be one of trace|debug|info|warn|error, got 'chatty'");
}
