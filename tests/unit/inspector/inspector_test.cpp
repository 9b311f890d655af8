// The supervisor against the real `quantem-gpu inspect-worker`: answers equal
// to in-process inspection, the known libhdf5 crashes and a worker that
// abort()s or hangs reported with the inspector's reason, remembered until the
// master changes, the worker restarted, RLIMIT_AS applied.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "acquisition_equality.hpp"
#include "catalog_fixtures.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/catalog.hpp"
#include "quantem/core/error.hpp"
#include "quantem/catalog/master_metadata.hpp"
#include "quantem/catalog/shard_storage.hpp"
#include "quantem/inspector/inspector.hpp"
#include "quantem/inspector/wire.hpp"
#include "quantem/synth/synth.hpp"
#include "test_support.hpp"

namespace quantem::inspector {
namespace {

namespace fs = std::filesystem;

class InspectorProcess : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    for (const char* prefix : {"first", "second"}) {
      synth::SynthOptions options;
      options.output_dir = dir_->path();
      options.prefix = prefix;
      options.scan_rows = 3;
      options.scan_cols = 3;
      options.detector_rows = 8;
      options.detector_cols = 8;
      options.frames_per_shard = 5;
      options.threads = 1;
      synth::write_acquisition(options);
    }
    fs::create_directories(dir_->path() + "/malformed");
    test::run_python_script("malformed_masters.py", dir_->path() + "/malformed");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!fs::exists(test::quantem_binary())) GTEST_SKIP() << "quantem-gpu not built: " << test::quantem_binary();
    ::unsetenv("QUANTEM_TEST_INSPECTOR_ABORT_ON");
    ::unsetenv("QUANTEM_TEST_INSPECTOR_HANG_ON");
  }
  void TearDown() override {
    ::unsetenv("QUANTEM_TEST_INSPECTOR_ABORT_ON");
    ::unsetenv("QUANTEM_TEST_INSPECTOR_HANG_ON");
  }
  static InspectorOptions options() {
    InspectorOptions options;
    options.executable = test::quantem_binary();
    options.restart_interval = std::chrono::milliseconds(10);
    return options;
  }
  static std::string master(const std::string& stem) { return dir_->file(stem + "_master.h5"); }
  static std::vector<std::string> known_crashes() {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(test::source_dir() + "/tests/fuzz/known-crashes/inspect_master")) {
      files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    return files;
  }
  static test::TempDir* dir_;
};

test::TempDir* InspectorProcess::dir_ = nullptr;

// Makes the master's signature change (new ctime and mtime) without changing its bytes.
void touch_later(const std::string& path) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), nullptr, 0), 0);
}

TEST_F(InspectorProcess, AnswersEqualInProcessInspection) {
  Inspector inspector(options());
  std::vector<std::string> masters = {master("first"), master("second")};
  for (const char* name : {"truncated_superblock", "bad_superblock", "link_to_garbage", "link_to_folder",
                           "link_to_fifo", "link_to_itself", "soft_link_cycle", "external_cycle", "huge_dims",
                           "huge_scan_attr", "deep_groups", "zero_detector", "valid"}) {
    masters.push_back(dir_->path() + "/malformed/" + name + "_master.h5");
  }
  for (const auto& path : masters) {
    SCOPED_TRACE(path);
    const auto worker = inspector.inspect(path);
    test::expect_same_acquisition(worker, catalog::inspect_master(path));
    EXPECT_NE(worker.status.reason, stopped_reason(worker.master_path));
  }
  EXPECT_TRUE(inspector.inspect(master("first")).status.loadable);
  EXPECT_EQ(inspector.worker_starts(), 1u);  // one long-lived worker
  EXPECT_EQ(inspector.worker_failures(), 0u);
}

TEST_F(InspectorProcess, KnownLibhdf5CrashesAreReportedRememberedAndRetriedWhenChanged) {
  const auto crashes = known_crashes();
  ASSERT_FALSE(crashes.empty());
  Inspector inspector(options());
  for (const auto& original : crashes) {
    SCOPED_TRACE(original);
    const std::string copy = dir_->file(fs::path(original).filename().string());
    fs::copy_file(original, copy, fs::copy_options::overwrite_existing);
    const auto failures = inspector.worker_failures();
    const auto crashed = inspector.inspect(copy);
    EXPECT_FALSE(crashed.status.loadable);
    EXPECT_EQ(crashed.status.reason, stopped_reason(copy));
    EXPECT_EQ(crashed.status.reason,
              "master file is not readable HDF5: " + copy + " (the inspector stopped on this file)");
    EXPECT_FALSE(crashed.status.action.empty());
    ASSERT_EQ(crashed.signature.size(), 1u);
    EXPECT_EQ(crashed.signature.front().size_bytes, static_cast<std::int64_t>(fs::file_size(copy)));
    EXPECT_EQ(inspector.worker_failures(), failures + 2);  // condemned on its second crash
    EXPECT_EQ(inspector.worker_pid(), 0);

    // The next master gets a new worker.
    const auto starts = inspector.worker_starts();
    EXPECT_TRUE(inspector.inspect(master("first")).status.loadable);
    EXPECT_EQ(inspector.worker_starts(), starts + 1);

    // Asked again: the remembered answer, no worker involved.
    const auto again = inspector.inspect(copy);
    test::expect_same_acquisition(again, crashed);
    EXPECT_EQ(inspector.worker_failures(), failures + 2);
    EXPECT_EQ(inspector.worker_starts(), starts + 1);

    // Changed: inspected again (and it still crashes libhdf5, twice).
    touch_later(copy);
    EXPECT_EQ(inspector.inspect(copy).status.reason, stopped_reason(copy));
    EXPECT_EQ(inspector.worker_failures(), failures + 4);
    fs::remove(copy);
  }
}

TEST_F(InspectorProcess, AbortingWorkerIsRestartedAndTheMasterRemembered) {
  ::setenv("QUANTEM_TEST_INSPECTOR_ABORT_ON", "second_master.h5", 1);
  Inspector inspector(options());
  EXPECT_TRUE(inspector.inspect(master("first")).status.loadable);
  const pid_t first_worker = inspector.worker_pid();
  ASSERT_GT(first_worker, 0);
  const auto aborted = inspector.inspect(master("second"));
  EXPECT_EQ(aborted.status.reason, stopped_reason(master("second")));
  EXPECT_EQ(inspector.worker_failures(), 2u);  // tried on a fresh worker once more, then condemned
  EXPECT_EQ(::kill(first_worker, 0), -1);  // reaped: no zombie left behind

  EXPECT_TRUE(inspector.inspect(master("first")).status.loadable);
  EXPECT_EQ(inspector.worker_starts(), 3u);
  EXPECT_EQ(inspector.inspect(master("second")).status.reason, stopped_reason(master("second")));
  EXPECT_EQ(inspector.worker_failures(), 2u);  // remembered: not sent again
  EXPECT_EQ(inspector.remembered_failures(), 1u);

  // Once the file changes it is tried again. The running worker still has
  // the hook and crashes: one strike, and the fresh worker (started without
  // the hook) answers, so the master is not condemned.
  ::unsetenv("QUANTEM_TEST_INSPECTOR_ABORT_ON");
  touch_later(master("second"));
  const auto fresh = inspector.inspect(master("second"));
  EXPECT_TRUE(fresh.status.loadable) << fresh.status.reason;
  EXPECT_EQ(inspector.worker_failures(), 3u);
  EXPECT_EQ(inspector.remembered_failures(), 0u);
}

TEST_F(InspectorProcess, ACondemnedMasterIsTriedAgainWhenForgotten) {
  ::setenv("QUANTEM_TEST_INSPECTOR_ABORT_ON", "second_master.h5", 1);
  Inspector inspector(options());
  EXPECT_EQ(inspector.inspect(master("second")).status.reason, stopped_reason(master("second")));
  EXPECT_EQ(inspector.worker_failures(), 2u);
  EXPECT_FALSE(inspector.forget_failure(master("first")));
  EXPECT_TRUE(inspector.forget_failure(master("second")));
  EXPECT_EQ(inspector.remembered_failures(), 0u);
  EXPECT_EQ(inspector.inspect(master("second")).status.reason, stopped_reason(master("second")));
  EXPECT_EQ(inspector.worker_failures(), 4u);  // asked the workers again
  inspector.forget_failures();
  EXPECT_EQ(inspector.remembered_failures(), 0u);
}

TEST_F(InspectorProcess, ACrashInOneParallelWorkerMarksOnlyItsFile) {
  ::setenv("QUANTEM_TEST_INSPECTOR_ABORT_ON", "second_master.h5", 1);
  InspectorOptions pool = options();
  pool.workers = 3;
  Inspector inspector(pool);
  std::vector<std::thread> threads;
  std::vector<catalog::Acquisition> results(9);
  for (std::size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = inspector.inspect(master(i % 3 == 1 ? "second" : "first")); });
  }
  for (auto& thread : threads) thread.join();
  for (std::size_t i = 0; i < results.size(); ++i) {
    SCOPED_TRACE(i);
    if (i % 3 == 1) {
      EXPECT_EQ(results[i].status.reason, stopped_reason(master("second")));
    } else {
      EXPECT_TRUE(results[i].status.loadable) << results[i].status.reason;
    }
  }
  EXPECT_EQ(inspector.remembered_failures(), 1u);
  EXPECT_LE(inspector.worker_pids().size(), 3u);
  EXPECT_GE(inspector.worker_failures(), 2u);  // several threads may have met it before it was condemned
}

TEST_F(InspectorProcess, OneHungRequestLeavesTheOtherWorkersFreeAndShutdownEndsIt) {
  ::setenv("QUANTEM_TEST_INSPECTOR_HANG_ON", "second_master.h5", 1);
  InspectorOptions pool = options();
  pool.workers = 2;
  pool.deadline = std::chrono::seconds(60);
  Inspector inspector(pool);
  std::optional<ErrorKind> ended_with;
  std::thread hung([&] {
    try {
      (void)inspector.inspect(master("second"));
    } catch (const Error& e) {
      ended_with = e.kind();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(inspector.inspect(master("first")).status.loadable);  // the other worker
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  const auto stopping = std::chrono::steady_clock::now();
  inspector.shutdown();
  hung.join();
  EXPECT_LT(std::chrono::steady_clock::now() - stopping, std::chrono::seconds(2));
  EXPECT_EQ(ended_with, ErrorKind::unavailable);
  EXPECT_EQ(inspector.remembered_failures(), 0u);  // the shutdown says nothing about the file
  EXPECT_TRUE(inspector.worker_pids().empty());
  EXPECT_THROW((void)inspector.inspect(master("first")), Error);
}

TEST_F(InspectorProcess, MissedDeadlineKillsTheWorker) {
  ::setenv("QUANTEM_TEST_INSPECTOR_HANG_ON", "second_master.h5", 1);
  InspectorOptions hurried = options();
  hurried.deadline = std::chrono::milliseconds(300);
  Inspector inspector(hurried);
  const auto started = std::chrono::steady_clock::now();
  const auto hung = inspector.inspect(master("second"));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));  // generous
  EXPECT_EQ(hung.status.reason, stopped_reason(master("second")));
  EXPECT_EQ(inspector.worker_pid(), 0);
  EXPECT_TRUE(inspector.inspect(master("first")).status.loadable);
}

TEST_F(InspectorProcess, WorkerRunsWithTheAddressSpaceLimit) {
  InspectorOptions limited = options();
  limited.address_space_limit_bytes = std::uint64_t{3} << 30;
  Inspector inspector(limited);
  ASSERT_TRUE(inspector.inspect(master("first")).status.loadable);
  std::ifstream limits("/proc/" + std::to_string(inspector.worker_pid()) + "/limits");
  std::string line;
  bool found = false;
  while (std::getline(limits, line)) {
    if (line.rfind("Max address space", 0) != 0) continue;
    found = true;
    EXPECT_NE(line.find(std::to_string(std::uint64_t{3} << 30)), std::string::npos) << line;
  }
  EXPECT_TRUE(found);
}

TEST_F(InspectorProcess, AWorkerThatCannotStartIsUnavailableNotRemembered) {
  for (const std::string& executable : {std::string("/nonexistent/quantem-gpu"), std::string("/bin/true")}) {
    SCOPED_TRACE(executable);
    InspectorOptions broken = options();
    broken.executable = executable;
    broken.deadline = std::chrono::milliseconds(500);
    Inspector inspector(broken);
    try {
      (void)inspector.inspect(master("first"));
      ADD_FAILURE() << "inspected without a worker";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::unavailable) << e.what();
    }
    EXPECT_EQ(inspector.remembered_failures(), 0u);
    EXPECT_EQ(inspector.worker_starts(), 3u);
  }
}

TEST_F(InspectorProcess, CatalogThroughTheWorkerEqualsInProcess) {
  const std::string root = dir_->file("tree");
  fs::create_directories(root + "/session");
  for (const char* stem : {"first", "second"}) {
    for (const auto& entry : fs::directory_iterator(dir_->path())) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(stem, 0) == 0 && entry.is_regular_file()) fs::copy_file(entry.path(), root + "/session/" + name);
    }
  }
  Inspector inspector(options());
  const auto isolated = catalog::build_catalog(root, inspector.inspect_function());
  EXPECT_EQ(catalog::sessions_document(isolated).dump(), catalog::sessions_document(catalog::build_catalog(root)).dump());
  ASSERT_EQ(isolated.sessions.size(), 1u);
  EXPECT_EQ(isolated.sessions[0].files.size(), 2u);
}

// build_frame_index with each shard's libhdf5 facts read in the worker equals
// the in-process build for every storage kind: v1 B-tree, fixed array, single
// chunk, implicit, contiguous, an inline master, user blocks, and the
// extensible array (chunks listed by H5Dget_chunk_info in the worker).
TEST_F(InspectorProcess, FrameIndexThroughTheWorkerEqualsInProcess) {
  test::TempDir fixtures;
  const std::vector<std::pair<std::string, std::string>> kinds = {
      {"btree", "--shard-frames 300,200 --ntrigger 500 --dtype uint16"},
      {"fixed", "--shard-frames 1500 --libver latest"},
      {"single", "--shard-frames 1 --libver latest"},
      {"implicit", "--shard-frames 7 --libver latest --filter none --alloc-early"},
      {"ext", "--shard-frames 300 --libver latest --unlimited --userblock 512"},
      {"contig", "--shard-frames 5 --filter contiguous"},
      {"inl", "--shard-frames inline:3,2 --ntrigger 5 --dtype uint32"}};
  std::vector<std::string> specs;
  for (const auto& [stem, spec] : kinds) specs.push_back(fixtures.path() + " " + stem + " " + spec);
  test::make_acquisitions(fixtures, specs);
  Inspector inspector(options());
  for (const auto& [stem, spec] : kinds) {
    SCOPED_TRACE(stem);
    const auto acquisition = inspector.inspect(fixtures.file(stem + "_master.h5"));
    ASSERT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
    const auto isolated = catalog::build_frame_index(acquisition, inspector.shard_storage_function());
    const auto in_process = catalog::build_frame_index(acquisition, catalog::read_shard_storage);
    EXPECT_EQ(isolated.shard_paths, in_process.shard_paths);
    EXPECT_EQ(isolated.stored_bytes_total, in_process.stored_bytes_total);
    ASSERT_EQ(isolated.frames.size(), in_process.frames.size());
    for (std::size_t i = 0; i < isolated.frames.size(); ++i) {
      EXPECT_EQ(isolated.frames[i].shard, in_process.frames[i].shard);
      EXPECT_EQ(isolated.frames[i].file_offset, in_process.frames[i].file_offset);
      EXPECT_EQ(isolated.frames[i].stored_bytes, in_process.frames[i].stored_bytes);
      EXPECT_EQ(isolated.frames[i].filter_mask, in_process.frames[i].filter_mask);
    }
  }
  EXPECT_EQ(inspector.worker_starts(), 1u);
  EXPECT_EQ(inspector.worker_failures(), 0u);
}

TEST_F(InspectorProcess, ShardStorageErrorsKeepTheirKind) {
  Inspector inspector(options());
  try {
    (void)inspector.shard_storage(dir_->file("no_such_data.h5"), "/entry/data/data");
    ADD_FAILURE() << "read a missing file";
  } catch (const ProtocolError& e) {
    ADD_FAILURE() << e.what();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::io) << e.what();
  }
  EXPECT_EQ(inspector.worker_failures(), 0u);  // an answer, not a failure
  ::setenv("QUANTEM_TEST_INSPECTOR_ABORT_ON", "first_data_000001.h5", 1);
  Inspector aborting(options());
  try {
    (void)aborting.shard_storage(dir_->file("first_data_000001.h5"), "/entry/data/data");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::corrupt_data) << e.what();
    EXPECT_NE(std::string(e.what()).find("the inspector stopped while reading the storage of"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(aborting.worker_failures(), 1u);
  EXPECT_EQ(aborting.remembered_failures(), 0u);
}

TEST_F(InspectorProcess, MetadataThroughTheWorkerEqualsInProcessAndCrashesAreTyped) {
  Inspector inspector(options());
  const catalog::MasterMetadata in_process = catalog::read_master_metadata(master("first"));
  const catalog::MasterMetadata through_worker = inspector.master_metadata(master("first"));
  EXPECT_EQ(through_worker.master_path, in_process.master_path);
  EXPECT_EQ(through_worker.sidecar_name, "first.h5");
  EXPECT_EQ(through_worker.fields, in_process.fields);
  EXPECT_EQ(through_worker.entries, in_process.entries);
  EXPECT_FALSE(through_worker.fields.empty());
  try {
    (void)inspector.master_metadata(dir_->file("absent_master.h5"));
    ADD_FAILURE() << "read a missing master";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::not_found) << e.what();
  }
  EXPECT_EQ(inspector.worker_failures(), 0u);

  ::setenv("QUANTEM_TEST_INSPECTOR_ABORT_ON", "second_master.h5", 1);
  Inspector aborting(options());
  try {
    (void)aborting.master_metadata(master("second"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::corrupt_data) << e.what();
    EXPECT_NE(std::string(e.what()).find("the inspector stopped while reading the metadata of"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(aborting.worker_failures(), 1u);
  EXPECT_EQ(aborting.remembered_failures(), 0u);  // asked for, not condemned
  EXPECT_EQ(aborting.master_metadata(master("first")).fields, in_process.fields);  // a fresh worker answers
}

}  // namespace
}  // namespace quantem::inspector
