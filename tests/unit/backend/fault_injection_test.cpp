// Fault injection on the CPU load path, through the residency manager the
// daemon uses: a shard truncated, deleted, rewritten in place (same bytes or
// other bytes) while a load reads it, and a read error (EIO), injected by the
// shard reader's test hook (set_shard_read_hook_for_testing) before the third
// read of the first shard. Each must end in a typed error, leave nothing of
// the load resident (state failed, residency accounting and CPU code bytes
// back to what the other acquisition holds), keep serving the acquisition
// that was already resident, and load cleanly again once the files are whole.
// A corrupt chunk at rest is cpu_backend_test's
// ACorruptChunkFailsWithATypedErrorNamingFrameAndFileAndFreesEverything.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/backend/shard_reader.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/error.hpp"
#include "quantem/plan/plan.hpp"
#include "quantem/residency/residency_manager.hpp"
#include "quantem/synth/synth.hpp"
#include "test_support.hpp"

namespace quantem::backend {
namespace {

using test::TempDir;
using Frames = std::vector<std::vector<std::uint64_t>>;

// 256 frames in three shards (100, 100, 56): one CPU thread reads them in
// order, at least one read per 32-frame group, so the third read of the first
// shard comes while most of the acquisition is still unread.
catalog::Acquisition write_acquisition(const std::string& directory, const std::string& prefix, std::uint64_t seed) {
  synth::SynthOptions options;
  options.output_dir = directory;
  options.prefix = prefix;
  options.scan_rows = 16;
  options.scan_cols = 16;
  options.detector_rows = 16;
  options.detector_cols = 16;
  options.frames_per_shard = 100;
  options.threads = 1;
  options.seed = seed;
  synth::write_acquisition(options);
  catalog::Acquisition acquisition = catalog::inspect_master(directory + "/" + prefix + "_master.h5");
  EXPECT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  EXPECT_EQ(acquisition.shards.size(), 3u);
  return acquisition;
}

Frames all_frames(Resident& resident, const catalog::Acquisition& acquisition) {
  const plan::PlanGeometry geometry = plan::resolve_plan({}, acquisition.scan_rows, acquisition.scan_cols,
                                                         acquisition.detector_rows, acquisition.detector_cols);
  Frames frames;
  for (std::uint64_t row = 0; row < geometry.scan_rows; ++row) {
    for (std::uint64_t col = 0; col < geometry.scan_cols; ++col) frames.push_back(resident.frame(geometry, row, col));
  }
  return frames;
}

// Installs a hook that runs `fault` on the third read of `shard_path` (and
// passes every other read through); removed when the test's scope ends.
class FaultOnThirdRead {
 public:
  FaultOnThirdRead(std::string shard_path, std::function<int(const std::string&)> fault)
      : shard_path_(std::move(shard_path)), fault_(std::move(fault)) {
    set_shard_read_hook_for_testing([this](const std::string& path, std::uint64_t, std::uint64_t) {
      if (path != shard_path_ || ++reads_ != 3) return 0;
      fired_ = true;
      return fault_(path);
    });
  }
  ~FaultOnThirdRead() { set_shard_read_hook_for_testing(nullptr); }
  bool fired() const { return fired_; }

 private:
  std::string shard_path_;
  std::function<int(const std::string&)> fault_;
  std::atomic<int> reads_{0};
  std::atomic<bool> fired_{false};
};

std::vector<std::uint8_t> read_whole(const std::string& path) { return test::read_file(path); }

void overwrite_in_place(const std::string& path, const std::vector<std::uint8_t>& bytes, std::size_t from) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, bytes.data() + from, bytes.size() - from, static_cast<off_t>(from)),
            static_cast<ssize_t>(bytes.size() - from));
  ::close(fd);
}

class FaultInjection : public ::testing::Test {
 protected:
  void SetUp() override {
    CpuBackendOptions options;
    options.threads = 1;
    options.virtual_devices = 1;
    options.budget_bytes_per_device = std::uint64_t{1} << 30;
    backend_ = make_cpu_backend(options);
    manager_ = std::make_unique<residency::ResidencyManager>(*backend_, residency::ResidencyOptions{});

    // The untouched reference of the faulted acquisition (synth is byte-identical for a seed).
    const catalog::Acquisition reference = write_acquisition(reference_dir_.path(), "a", 1);
    expected_a_ = all_frames(*manager_->acquire(reference), reference);
    manager_->evict(reference);

    // Another acquisition, resident before the fault; it must stay served.
    other_ = write_acquisition(other_dir_.path(), "b", 2);
    const residency::ResidentLease other = manager_->acquire(other_);
    expected_other_ = all_frames(*other, other_);
    other_bytes_ = other->resident_bytes();
    code_bytes_with_other_ = cpu_code_bytes_in_use();

    faulted_ = write_acquisition(dir_.path(), "a", 1);
    first_shard_ = faulted_.shards.at(0).file_path;
  }

  void TearDown() override {
    manager_.reset();
    EXPECT_EQ(cpu_code_bytes_in_use(), code_bytes_before_);
  }

  // The faulted load failed with `kind`, and left nothing behind. Its entry
  // stays as a remembered failure while the files are as inspected; when they
  // changed, the next look-up drops it (absent).
  void expect_failed_cleanly(const std::function<void()>& load, ErrorKind kind, const std::string& message_part,
                             residency::ResidencyState state_after = residency::ResidencyState::failed) {
    try {
      load();
      ADD_FAILURE() << "the faulted load was served";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), kind) << error.what();
      EXPECT_NE(std::string(error.what()).find(message_part), std::string::npos) << error.what();
    }
    EXPECT_EQ(manager_->status(faulted_).state, state_after);
    EXPECT_FALSE(manager_->find(faulted_));
    const auto usage = manager_->device_usage();
    ASSERT_EQ(usage.size(), 1u);
    EXPECT_EQ(usage[0].resident_bytes, other_bytes_);  // only the other acquisition
    EXPECT_EQ(usage[0].resident_entries, 1u);
    EXPECT_EQ(cpu_code_bytes_in_use(), code_bytes_with_other_);  // the failed load's memory is returned
    // The other acquisition is still served, with its values.
    const residency::ResidentLease other = manager_->find(other_);
    ASSERT_TRUE(other);
    EXPECT_EQ(all_frames(*other, other_), expected_other_);
  }

  // Writes the faulted acquisition again and loads it from a fresh inspection.
  void expect_clean_reload() {
    faulted_ = write_acquisition(dir_.path(), "a", 1);
    const residency::ResidentLease lease = manager_->acquire(faulted_);
    ASSERT_TRUE(lease);
    EXPECT_EQ(all_frames(*lease, faulted_), expected_a_);
    EXPECT_EQ(manager_->status(faulted_).state, residency::ResidencyState::resident);
  }

  std::uint64_t code_bytes_before_ = cpu_code_bytes_in_use();
  TempDir reference_dir_, other_dir_, dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<residency::ResidencyManager> manager_;
  catalog::Acquisition other_, faulted_;
  Frames expected_a_, expected_other_;
  std::uint64_t other_bytes_ = 0;
  std::uint64_t code_bytes_with_other_ = 0;
  std::string first_shard_;
};

TEST_F(FaultInjection, AShardTruncatedDuringTheLoadFailsAsCorruptData) {
  {
    FaultOnThirdRead fault(first_shard_, [](const std::string& path) {
      std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
      return 0;
    });
    expect_failed_cleanly([&] { manager_->acquire(faulted_); }, ErrorKind::corrupt_data, first_shard_);
    EXPECT_TRUE(fault.fired());
  }
  expect_clean_reload();
}

TEST_F(FaultInjection, AShardDeletedDuringTheLoadIsNeverServed) {
  // The open descriptor still reads the unlinked file to the end: the load
  // completes, and the signature check after it refuses the resident.
  {
    FaultOnThirdRead fault(first_shard_, [](const std::string& path) {
      std::filesystem::remove(path);
      return 0;
    });
    expect_failed_cleanly([&] { manager_->acquire(faulted_); }, ErrorKind::conflict, "changed while",
                          residency::ResidencyState::absent);
    EXPECT_TRUE(fault.fired());
  }
  expect_clean_reload();
}

TEST_F(FaultInjection, AShardRewrittenInPlaceWithTheSameBytesIsNeverServed) {
  // Identical content, new mtime/ctime: nothing to decode wrongly, and still
  // a resident read across a write is not served.
  {
    FaultOnThirdRead fault(first_shard_, [](const std::string& path) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a later timestamp on coarse clocks
      overwrite_in_place(path, read_whole(path), 0);
      return 0;
    });
    expect_failed_cleanly([&] { manager_->acquire(faulted_); }, ErrorKind::conflict, "changed while",
                          residency::ResidencyState::absent);
    EXPECT_TRUE(fault.fired());
  }
  expect_clean_reload();
}

TEST_F(FaultInjection, AShardRewrittenWithOtherBytesFailsAsCorruptData) {
  {
    FaultOnThirdRead fault(first_shard_, [](const std::string& path) {
      std::vector<std::uint8_t> bytes = read_whole(path);
      std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2), bytes.end(), std::uint8_t{0x5a});
      overwrite_in_place(path, bytes, bytes.size() / 2);
      return 0;
    });
    expect_failed_cleanly([&] { manager_->acquire(faulted_); }, ErrorKind::corrupt_data, "does not decode");
    EXPECT_TRUE(fault.fired());
  }
  expect_clean_reload();
}

TEST_F(FaultInjection, AReadErrorFailsWithAnIoErrorAndAnExplicitLoadRetriesIt) {
  {
    FaultOnThirdRead fault(first_shard_, [](const std::string&) { return EIO; });
    expect_failed_cleanly([&] { manager_->acquire(faulted_); }, ErrorKind::io, first_shard_);
    EXPECT_TRUE(fault.fired());
  }
  // The files did not change: acquire reports the remembered failure, an
  // explicit load (POST /load) retries it and the acquisition loads whole.
  expect_failed_cleanly([&] { manager_->acquire(faulted_); }, ErrorKind::io, "Input/output error");
  manager_->request_load(faulted_);
  const residency::ResidentLease lease = manager_->acquire(faulted_);
  ASSERT_TRUE(lease);
  EXPECT_EQ(all_frames(*lease, faulted_), expected_a_);
}

}  // namespace
}  // namespace quantem::backend
