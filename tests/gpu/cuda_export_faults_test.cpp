// The export's faults on the CUDA resident (the device encoder, decision
// 0023): a cancelled export, a source rewritten while it runs, a chunk write
// that fails as a full disk fails, no room at the start, and a process killed
// mid-write all leave nothing that looks finished; the same faults on the CPU
// resident are in tests/unit/export and tests/integration. The sources are
// written by synth (no Python on the GPU machines).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cuda_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/error.hpp"
#include "quantem/export/export.hpp"
#include "quantem/synth/synth.hpp"
#include "export_folders.hpp"
#include "test_support.hpp"

namespace quantem::exporter {
namespace {

namespace fs = std::filesystem;
using test::folder_entries;
using test::nothing_finished_looking;
using test::TempDir;
using test::wait_for_partial_data;

constexpr const char* kDelayVariable = "QUANTEM_EXPORT_BATCH_DELAY_MS_FOR_TESTING";
constexpr const char* kBatchPositionsVariable = "QUANTEM_EXPORT_BATCH_POSITIONS_FOR_TESTING";

std::string write_source(const TempDir& dir) {
  synth::SynthOptions options;
  options.output_dir = dir.path();
  options.prefix = "src";
  options.scan_rows = 24;
  options.scan_cols = 16;
  options.detector_rows = 64;
  options.detector_cols = 64;
  options.threads = 2;
  return synth::write_acquisition(options).master_path;
}

class CudaExportFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
    source_ = catalog::inspect_master(write_source(dir_));
    ASSERT_TRUE(source_.status.loadable) << source_.status.reason;
    backend::CudaBackendOptions options;
    options.device_indices = {0};
    backend_ = backend::make_cuda_backend(options);
    backend::LoadProgress progress;
    resident_ = backend_->load(source_, 0, progress);
    out_ = dir_.file("out");
    fs::create_directory(out_);
    request_.output_folder = out_;
    request_.threads = 2;
    request_.implementation_revision = "test-revision";
    ::setenv(kBatchPositionsVariable, "16", 1);  // one plan row a batch: 24 batches
  }
  void TearDown() override {
    ::unsetenv(kDelayVariable);
    ::unsetenv(kBatchPositionsVariable);
    ::unsetenv("QUANTEM_EXPORT_FREE_BYTES_FOR_TESTING");
  }

  // Runs the export; the error kind (nullopt on success) and its text.
  std::optional<ErrorKind> run(std::string* message = nullptr) {
    try {
      const ExportLayout layout = plan_export(source_, request_);
      report_ = export_plan(*resident_, source_, layout, request_, progress_);
      return std::nullopt;
    } catch (const Error& e) {
      if (message) *message = e.what();
      return e.kind();
    }
  }

  TempDir dir_;
  catalog::Acquisition source_;
  std::unique_ptr<backend::Backend> backend_;
  std::shared_ptr<backend::Resident> resident_;
  std::string out_;
  ExportRequest request_;
  ExportProgress progress_;
  ExportReport report_;
};

TEST_F(CudaExportFaults, TheExportIsEncodedOnTheDeviceInSeveralBatches) {
  ASSERT_EQ(run(), std::nullopt);
  EXPECT_EQ(report_.encoder, "device");
  EXPECT_EQ(report_.frames, 24u * 16u);
  EXPECT_EQ(folder_entries(out_).size(), 1u);
}

TEST_F(CudaExportFaults, ACancelledExportLeavesNothing) {
  ::setenv(kDelayVariable, "20", 1);
  std::thread canceller([&] {
    while (progress_.frames_done.load() < 32) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    progress_.cancel_requested = true;
  });
  std::string message;
  EXPECT_EQ(run(&message), ErrorKind::unavailable);
  canceller.join();
  EXPECT_NE(message.find("cancelled"), std::string::npos) << message;
  EXPECT_EQ(progress_.stage.load(), ExportStage::cancelled);
  EXPECT_LT(progress_.frames_done.load(), 24u * 16u);
  EXPECT_TRUE(folder_entries(out_).empty());
}

TEST_F(CudaExportFaults, ASourceChangedDuringTheExportFailsAndLeavesNothing) {
  ::setenv(kDelayVariable, "10", 1);
  std::thread toucher([&] {
    while (progress_.frames_done.load() < 32) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    struct utimbuf times {1000000000, 1000000000};
    ::utime(source_.master_path.c_str(), &times);
  });
  std::string message;
  EXPECT_EQ(run(&message), ErrorKind::conflict);
  toucher.join();
  EXPECT_NE(message.find("changed during the export"), std::string::npos) << message;
  EXPECT_TRUE(folder_entries(out_).empty());
}

TEST_F(CudaExportFaults, NotEnoughSpaceIsRefusedBeforeWriting) {
  ::setenv("QUANTEM_EXPORT_FREE_BYTES_FOR_TESTING", "4096", 1);
  std::string message;
  EXPECT_EQ(run(&message), ErrorKind::payload_too_large);
  EXPECT_NE(message.find("not enough free space"), std::string::npos) << message;
  EXPECT_TRUE(folder_entries(out_).empty());
}

// A chunk write that fails (past RLIMIT_FSIZE: EFBIG, as a full disk the
// free-space check did not foresee fails with ENOSPC).
TEST_F(CudaExportFaults, AChunkWriteThatFailsFailsTheExportAndLeavesNothing) {
  rlimit previous{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &previous), 0);
  const auto previous_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = previous;
  small.rlim_cur = 96 << 10;  // the files' first metadata fits, the chunks do not
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  const std::optional<ErrorKind> kind = run(&message);
  ::setrlimit(RLIMIT_FSIZE, &previous);
  ::signal(SIGXFSZ, previous_handler);
  ASSERT_EQ(kind, ErrorKind::payload_too_large) << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  EXPECT_EQ(progress_.stage.load(), ExportStage::failed);
  EXPECT_TRUE(folder_entries(out_).empty());
}

// The CLI beside this test binary (the bundle), or QUANTEM_BINARY.
std::string cli_binary() {
  if (const char* named = std::getenv("QUANTEM_BINARY")) return named;
  return (fs::read_symlink("/proc/self/exe").parent_path() / "quantem-gpu").string();
}

pid_t spawn_cli(const std::vector<std::string>& arguments, const std::vector<std::string>& extra_env) {
  const pid_t pid = test::spawn_quietly(cli_binary(), arguments, extra_env);
  EXPECT_GT(pid, 0);
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

TEST_F(CudaExportFaults, ACliKilledMidWriteLeavesNothingFinishedAndTheNextExportCleansUp) {
  if (!fs::exists(cli_binary())) GTEST_SKIP() << "no quantem-gpu beside the test: " << cli_binary();
  const std::vector<std::string> export_args = {"export", source_.master_path, out_, "--backend", "cuda",
                                                "--gpu", "0", "--no-progress"};
  const pid_t killed = spawn_cli(export_args, {std::string(kDelayVariable) + "=300",
                                               std::string(kBatchPositionsVariable) + "=16"});
  ASSERT_TRUE(wait_for_partial_data(out_, std::chrono::seconds(60)));
  ::kill(killed, SIGKILL);
  EXPECT_EQ(wait_exit(killed), -SIGKILL);
  EXPECT_TRUE(nothing_finished_looking(out_));
  ASSERT_EQ(folder_entries(out_).size(), 1u);

  // The next export removes the dead writer's folder and finishes.
  EXPECT_EQ(wait_exit(spawn_cli(export_args, {})), 0);
  const auto names = folder_entries(out_);
  ASSERT_EQ(names.size(), 1u);
  EXPECT_NE(names[0][0], '.');

  // Ctrl-C mid-write cancels: exit status 1, nothing left.
  const std::string second = dir_.file("second");
  fs::create_directory(second);
  std::vector<std::string> second_args = export_args;
  second_args[2] = second;
  const pid_t interrupted = spawn_cli(second_args, {std::string(kDelayVariable) + "=300",
                                                    std::string(kBatchPositionsVariable) + "=16"});
  ASSERT_TRUE(wait_for_partial_data(second, std::chrono::seconds(60)));
  ::kill(interrupted, SIGINT);
  EXPECT_EQ(wait_exit(interrupted), 1);
  EXPECT_TRUE(folder_entries(second).empty());
}

}  // namespace
}  // namespace quantem::exporter
