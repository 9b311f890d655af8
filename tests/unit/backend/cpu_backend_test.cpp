// The CPU backend loading real files: acquisitions written by h5py with the
// official bitshuffle filter (and one by `synth`), compared value for value
// with what h5py + numpy read back; corrupt chunks, cancellation, accounting.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/error.hpp"
#include "quantem/plan/plan.hpp"
#include "quantem/synth/synth.hpp"
#include "cpu_load_fixture.hpp"
#include "test_support.hpp"

namespace quantem::backend {
namespace {

using test::TempDir;

using test_fixture::cpu_backend;
using test_fixture::read_u64;
using test_fixture::write_fixture;

// A small synth acquisition `<prefix>_master.h5` in `dir`, written by 2 threads.
synth::SynthOptions synth_options(const TempDir& dir, const std::string& prefix, std::uint64_t scan_rows,
                                  std::uint64_t scan_cols, std::uint64_t detector_rows, std::uint64_t detector_cols,
                                  std::uint64_t frames_per_shard) {
  synth::SynthOptions options;
  options.output_dir = dir.path();
  options.prefix = prefix;
  options.scan_rows = scan_rows;
  options.scan_cols = scan_cols;
  options.detector_rows = detector_rows;
  options.detector_cols = detector_cols;
  options.frames_per_shard = frames_per_shard;
  options.threads = 2;
  return options;
}

// Every frame of the resident at the full plan equals the reference counts.
void expect_frames_equal(Resident& resident, const catalog::Acquisition& acquisition,
                         const std::vector<std::uint64_t>& expected) {
  const plan::PlanGeometry g = plan::resolve_plan({}, acquisition.scan_rows, acquisition.scan_cols,
                                                  acquisition.detector_rows, acquisition.detector_cols);
  const std::uint64_t pixels = g.detector_pixels();
  ASSERT_EQ(expected.size(), g.positions() * pixels);
  for (std::uint64_t row = 0; row < g.scan_rows; ++row) {
    for (std::uint64_t col = 0; col < g.scan_cols; ++col) {
      const std::uint64_t first = (row * g.scan_cols + col) * pixels;
      const std::vector<std::uint64_t> want(expected.begin() + static_cast<std::ptrdiff_t>(first),
                                            expected.begin() + static_cast<std::ptrdiff_t>(first + pixels));
      ASSERT_EQ(resident.frame(g, row, col), want) << "frame at scan (" << row << ", " << col << ")";
    }
  }
}

std::string error_text(const std::function<void()>& call, ErrorKind expected_kind) {
  try {
    call();
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), expected_kind) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "no quantem::Error thrown";
  return {};
}

TEST(CpuBackend, ReportsVirtualDevicesWithTheirBudgets) {
  const auto backend = cpu_backend(2, 3);
  EXPECT_EQ(backend->name(), "cpu");
  const std::vector<DeviceInfo> devices = backend->devices();
  ASSERT_EQ(devices.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(devices[static_cast<std::size_t>(i)].index, i);
    EXPECT_EQ(devices[static_cast<std::size_t>(i)].budget_bytes, std::uint64_t{1} << 30);
    EXPECT_EQ(devices[static_cast<std::size_t>(i)].name, "CPU virtual device " + std::to_string(i));
  }
  EXPECT_TRUE(backend->free_bytes(2).has_value());
  error_text([&] { backend->free_bytes(3); }, ErrorKind::bad_request);
  CpuBackendOptions defaults;
  defaults.virtual_devices = 2;
  const auto automatic = make_cpu_backend(defaults);
  EXPECT_GT(automatic->devices()[0].budget_bytes, 0u);
  EXPECT_LE(automatic->devices()[0].budget_bytes * 2, automatic->devices()[0].total_memory_bytes);
}

TEST(CpuBackend, LoadsShardedBitshuffleFilesExactlyWithMaskedPixelsZeroed) {
  TempDir dir;
  // 63 frames in two shards (40 + 23, the boundary inside a frame group), two
  // frames stored unfiltered, three masked pixels holding large counts.
  const catalog::Acquisition acquisition =
      write_fixture(dir, "sharded",
                    "--scan 9x7 --det 10x9 --shard-frames 40,23 --mask '1,1;2,3;9,8' --masked-value 60000 "
                    "--raw-frames 5,40");
  ASSERT_EQ(acquisition.shards.size(), 2u);
  ASSERT_EQ(acquisition.masked_pixel_count, 3u);
  for (const unsigned threads : {1u, 2u}) {
    const auto backend = cpu_backend(threads);
    const LoadEstimate estimate = backend->estimate_load(acquisition);
    LoadProgress progress;
    const auto resident = backend->load(acquisition, 0, progress);
    EXPECT_EQ(resident->resident_dtype(), DType::uint16);
    EXPECT_EQ(resident->device_index(), 0);
    EXPECT_EQ(progress.stage.load(), LoadStage::done);
    EXPECT_GT(progress.bytes_total.load(), 0u);
    EXPECT_EQ(progress.bytes_done.load(), progress.bytes_total.load());
    EXPECT_EQ(estimate.resident_bytes, resident->resident_bytes());
    // The read staging is sized by what this small file's batches can hold
    // (one frame group of small chunks), not 4 MiB per thread.
    EXPECT_GT(estimate.transition_peak_bytes, estimate.resident_bytes);
    EXPECT_LT(estimate.transition_peak_bytes, estimate.resident_bytes + threads * (std::uint64_t{4} << 20));
    expect_frames_equal(*resident, acquisition, read_u64(dir.file("sharded_expected.u64")));
  }
}

TEST(CpuBackend, LoadsPlainLz4ShardsAndInlineUncompressedMasters) {
  TempDir dir;
  const catalog::Acquisition lz4 = write_fixture(dir, "lz4", "--filter lz4 --scan 5x8 --det 9x7 --mask '4,4'");
  ASSERT_EQ(lz4.chunk_format.filter, codec::ChunkFilter::lz4);
  LoadProgress lz4_progress;
  expect_frames_equal(*cpu_backend(2)->load(lz4, 0, lz4_progress), lz4, read_u64(dir.file("lz4_expected.u64")));
  const catalog::Acquisition inline_master =
      write_fixture(dir, "inline", "--inline --scan 6x7 --det 8x5 --mask '0,4;7,0' --masked-value 999");
  ASSERT_EQ(inline_master.chunk_format.filter, codec::ChunkFilter::none);
  LoadProgress inline_progress;
  expect_frames_equal(*cpu_backend(2)->load(inline_master, 0, inline_progress), inline_master,
                      read_u64(dir.file("inline_expected.u64")));
}

TEST(CpuBackend, Uint8SourcesStayEightBit) {
  TempDir dir;
  const catalog::Acquisition acquisition = write_fixture(dir, "small", "--dtype uint8 --scan 4x5 --det 6x6 --mask '0,0'");
  LoadProgress progress;
  const auto resident = cpu_backend(2)->load(acquisition, 0, progress);
  EXPECT_EQ(resident->resident_dtype(), DType::uint8);
  expect_frames_equal(*resident, acquisition, read_u64(dir.file("small_expected.u64")));
}

TEST(CpuBackend, Uint32CountsAbove16BitsStayExactIn32BitCodes) {
  TempDir dir;
  const catalog::Acquisition acquisition =
      write_fixture(dir, "wide", "--dtype uint32 --scan 5x7 --det 7x5 --hot 100000 --mask '3,3' --masked-value 7");
  const auto backend = cpu_backend(2);
  // Admitted: the 16-bit first pass. The 32-bit pass grows the reservation
  // (after the first is freed) by exactly what it adds.
  const LoadEstimate estimate = backend->estimate_load(acquisition);
  EXPECT_LT(estimate.resident_bytes, estimate.transition_peak_bytes);
  EXPECT_GT(estimate.max_transition_peak_bytes, estimate.transition_peak_bytes);
  LoadProgress progress;
  LocalLoadReservation reservation(0, estimate.transition_peak_bytes);
  const auto resident = backend->load(acquisition, 0, progress, reservation);
  EXPECT_EQ(resident->resident_dtype(), DType::uint32);
  EXPECT_EQ(resident->encoding(), "grouped32-u32");
  EXPECT_GT(resident->resident_bytes(), estimate.resident_bytes);  // learned while loading
  EXPECT_EQ(reservation.grow_calls(), 1u);
  EXPECT_EQ(reservation.largest_reserved_bytes(), estimate.max_transition_peak_bytes);
  EXPECT_GE(reservation.reserved_bytes(), resident->resident_bytes());  // staging handed back, the resident covered
  const std::vector<std::uint64_t> expected = read_u64(dir.file("wide_expected.u64"));
  EXPECT_EQ(*std::max_element(expected.begin(), expected.end()), 100000u);
  expect_frames_equal(*resident, acquisition, expected);
}

TEST(CpuBackend, Uint32WhoseLargeCountsAreMaskedIsNarrowedTo16Bits) {
  TempDir dir;
  const catalog::Acquisition acquisition =
      write_fixture(dir, "narrow", "--dtype uint32 --scan 6x6 --det 8x7 --mask '2,2;5,6' --masked-value 200000");
  const auto backend = cpu_backend(2);
  LoadProgress progress;
  LocalLoadReservation reservation(0, backend->estimate_load(acquisition).transition_peak_bytes);
  const auto resident = backend->load(acquisition, 0, progress, reservation);
  EXPECT_EQ(resident->resident_dtype(), DType::uint16);
  EXPECT_EQ(resident->encoding(), "grouped32-u16");
  EXPECT_EQ(resident->resident_bytes(), backend->estimate_load(acquisition).resident_bytes);  // the first pass
  EXPECT_EQ(reservation.grow_calls(), 0u);
  expect_frames_equal(*resident, acquisition, read_u64(dir.file("narrow_expected.u64")));
}

TEST(CpuBackend, LoadsASynthesizedAcquisitionAsH5pyReadsIt) {
  TempDir dir;
  // Three shards, boundaries inside frame groups.
  const synth::SynthReport report = synth::write_acquisition(synth_options(dir, "synth", 12, 10, 24, 20, 50));
  const catalog::Acquisition acquisition = catalog::inspect_master(report.master_path);
  ASSERT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  ASSERT_GT(acquisition.masked_pixel_count, 0u);
  test::run_python_script("products_load_fixture.py", "read " + report.master_path + " " + dir.file("expected.u64") + " --scan 12x10");
  LoadProgress progress;
  const auto resident = cpu_backend(2)->load(acquisition, 0, progress);
  EXPECT_EQ(progress.bytes_total.load(), report.stored_bytes);
  expect_frames_equal(*resident, acquisition, read_u64(dir.file("expected.u64")));
}

// The frame index is kept between loads (Backend::prepare_load, as the
// residency calls it before admission): loads of unchanged files reuse it,
// files written again are indexed again, and an inspection older than the
// files is refused rather than read with an index of other files.
TEST(CpuBackend, KeptFrameIndexesNeverOutliveTheirFiles) {
  TempDir dir;
  auto write = [&](std::uint64_t seed, std::uint64_t frames_per_shard) {
    synth::SynthOptions options = synth_options(dir, "kept", 8, 9, 12, 10, frames_per_shard);
    options.seed = seed;
    const synth::SynthReport report = synth::write_acquisition(options);
    test::run_python_script("products_load_fixture.py", "read " + report.master_path + " " +
                                                            dir.file("expected_" + std::to_string(seed) + ".u64") +
                                                            " --scan 8x9");
    const catalog::Acquisition acquisition = catalog::inspect_master(report.master_path);
    EXPECT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
    return acquisition;
  };
  const auto backend = cpu_backend(2);
  const catalog::Acquisition first = write(1, 30);
  const std::vector<std::uint64_t> first_expected = read_u64(dir.file("expected_1.u64"));
  backend->prepare_load(first);
  for (int load = 0; load < 2; ++load) {  // the index built before the load, then kept
    LoadProgress progress;
    expect_frames_equal(*backend->load(first, 0, progress), first, first_expected);
  }
  // Written again: other counts, other shard boundaries, so other chunk offsets.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a new mtime even on coarse clocks
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().extension() == ".h5") std::filesystem::remove(entry.path());
  }
  const catalog::Acquisition second = write(2, 25);
  ASSERT_NE(second.signature, first.signature);
  backend->prepare_load(second);
  LoadProgress progress;
  expect_frames_equal(*backend->load(second, 0, progress), second, read_u64(dir.file("expected_2.u64")));
  // The first inspection describes files that are gone: refused, typed.
  LoadProgress stale_progress;
  try {
    (void)backend->load(first, 0, stale_progress);
    FAIL() << "a load from a stale inspection succeeded";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::conflict) << error.what();
  }
}

TEST(CpuBackend, ACorruptChunkFailsWithATypedErrorNamingFrameAndFileAndFreesEverything) {
  TempDir dir;
  const catalog::Acquisition acquisition =
      write_fixture(dir, "corrupt", "--scan 24x24 --det 32x32 --no-expected");
  const std::string shard = dir.file("corrupt_data_000001.h5");
  test::run_python_script("products_load_fixture.py", "corrupt " + shard + " 500");
  const catalog::Acquisition inspected = catalog::inspect_master(acquisition.master_path);
  ASSERT_TRUE(inspected.status.loadable) << inspected.status.reason;
  const auto backend = cpu_backend(1);
  const std::uint64_t bytes_before = cpu_code_bytes_in_use();
  LoadProgress progress;
  try {
    backend->load(inspected, 0, progress);
    FAIL() << "a corrupt chunk loaded";
  } catch (const CorruptChunk& error) {
    EXPECT_EQ(error.kind(), ErrorKind::corrupt_data);
    const std::string message = error.what();
    EXPECT_NE(message.find("frame 500 "), std::string::npos) << message;
    EXPECT_NE(message.find(shard), std::string::npos) << message;
  }
  EXPECT_EQ(progress.stage.load(), LoadStage::failed);
  EXPECT_EQ(cpu_code_bytes_in_use(), bytes_before);
  // The backend keeps working.
  TempDir other;
  const catalog::Acquisition good = write_fixture(other, "good", "--scan 3x3 --det 4x4");
  LoadProgress good_progress;
  expect_frames_equal(*backend->load(good, 0, good_progress), good, read_u64(other.file("good_expected.u64")));
}

TEST(CpuBackend, CancellationStopsTheLoadAndFreesEverything) {
  TempDir dir;
  const catalog::Acquisition acquisition = write_fixture(dir, "cancel", "--scan 64x64 --det 32x32 --no-expected");
  const auto backend = cpu_backend(1);
  const std::uint64_t bytes_before = cpu_code_bytes_in_use();
  {
    LoadProgress progress;
    progress.cancel_requested = true;
    error_text([&] { backend->load(acquisition, 0, progress); }, ErrorKind::unavailable);
    EXPECT_EQ(progress.stage.load(), LoadStage::cancelled);
    EXPECT_EQ(progress.bytes_done.load(), 0u);
  }
  // Cancel while it runs: a watcher asks as soon as the first bytes are done.
  // The load has 128 frame groups to go; a rare run that finishes first is retried.
  bool cancelled_midway = false;
  for (int attempt = 0; attempt < 5 && !cancelled_midway; ++attempt) {
    LoadProgress progress;
    std::thread watcher([&] {
      const auto finished = [&] {
        const LoadStage stage = progress.stage.load();
        return stage == LoadStage::failed || stage == LoadStage::done || stage == LoadStage::cancelled;
      };
      while (progress.bytes_done.load() == 0 && !finished()) {
        std::this_thread::yield();
      }
      progress.cancel_requested = true;
    });
    try {
      backend->load(acquisition, 0, progress);
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::unavailable) << error.what();
      EXPECT_EQ(progress.stage.load(), LoadStage::cancelled);
      EXPECT_LT(progress.bytes_done.load(), progress.bytes_total.load());
      cancelled_midway = true;
    }
    watcher.join();
    EXPECT_EQ(cpu_code_bytes_in_use(), bytes_before);
  }
  EXPECT_TRUE(cancelled_midway);
}

TEST(CpuBackend, AGrowthThatIsRefusedFailsTheLoadWith413AndFreesEverything) {
  TempDir dir;
  const catalog::Acquisition acquisition =
      write_fixture(dir, "refusedwide", "--dtype uint32 --scan 5x7 --det 7x5 --hot 100000 --no-expected");
  const auto backend = cpu_backend(2);
  const LoadEstimate estimate = backend->estimate_load(acquisition);
  const std::uint64_t bytes_before = cpu_code_bytes_in_use();
  LoadProgress progress;
  // One byte short of the 32-bit pass.
  LocalLoadReservation reservation(0, estimate.transition_peak_bytes, estimate.max_transition_peak_bytes - 1);
  const std::string text =
      error_text([&] { backend->load(acquisition, 0, progress, reservation); }, ErrorKind::payload_too_large);
  EXPECT_NE(text.find("limited to"), std::string::npos) << text;
  EXPECT_EQ(progress.stage.load(), LoadStage::failed);
  EXPECT_EQ(reservation.reserved_bytes(), estimate.transition_peak_bytes);  // unchanged by the refusal
  EXPECT_EQ(cpu_code_bytes_in_use(), bytes_before);
}

TEST(CpuBackend, DeviceBudgetFromAFractionOfMemoryIsSharedByTheVirtualDevices) {
  CpuBackendOptions options;
  options.virtual_devices = 3;
  options.budget_fraction = 0.5;
  const auto backend = make_cpu_backend(options);
  for (const DeviceInfo& device : backend->devices()) {
    EXPECT_EQ(device.budget_bytes, static_cast<std::uint64_t>(static_cast<double>(device.total_memory_bytes) * 0.5) / 3);
    EXPECT_EQ(device.budget_fraction, 0.5);
  }
  options.budget_fraction = 1.5;
  error_text([&] { make_cpu_backend(options); }, ErrorKind::bad_request);
  options.budget_fraction = 0.8;
  options.budget_bytes_per_device = 1000;
  EXPECT_EQ(make_cpu_backend(options)->devices()[2].budget_bytes, 1000u);
  EXPECT_EQ(make_cpu_backend(options)->devices()[2].budget_fraction, 0.0);
}

TEST(CpuBackend, RefusesUnknownDevicesAndSourcesThatAreNotReady) {
  TempDir dir;
  catalog::Acquisition acquisition = write_fixture(dir, "refused", "--scan 2x2 --det 4x4");
  const auto backend = cpu_backend(2, 2);
  LoadProgress progress;
  error_text([&] { backend->load(acquisition, 2, progress); }, ErrorKind::bad_request);
  acquisition.status.loadable = false;
  acquisition.status.reason = "stored frame count is 3; expected 4 from master metadata ntrigger=4, nimages=1";
  EXPECT_EQ(error_text([&] { backend->load(acquisition, 1, progress); }, ErrorKind::conflict), acquisition.status.reason);
  catalog::Acquisition unknown_shape = acquisition;
  unknown_shape.scan_rows = 0;
  error_text([&] { backend->estimate_load(unknown_shape); }, ErrorKind::unprocessable);
}

}  // namespace
}  // namespace quantem::backend
