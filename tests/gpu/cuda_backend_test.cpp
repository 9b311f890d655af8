// The CUDA backend on a GPU: files written by h5py + the official bitshuffle
// filter (fixtures from tests/support/python/products_load_fixture.py, with
// h5py's own read-back as the reference), by `synth`, and the real Arina file
// load into an ANS resident whose every product equals the CPU backend's (the
// exact reference); corrupt chunks, cancellation and out-of-memory free every
// device byte; the load's measured peak (cudaMemGetInfo) stays within its
// admitted estimate. Skips with a message on machines without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_support.hpp"
#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/backend/cuda_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/resident_products.hpp"
#include "quantem/plan/plan.hpp"
#include "quantem/synth/synth.hpp"
#include "test_support.hpp"

namespace quantem::backend {
namespace {

using test::TempDir;

// Fixtures written by h5py (products_load_fixture.py): from $QUANTEM_GPU_FIXTURES
// (scripts/device/build-bundle.sh writes them on the CPU machine), else written
// here once through the reference interpreter.
const std::string& fixtures_dir() {
  static TempDir* generated = nullptr;
  static const std::string dir = [] {
    if (const char* env = std::getenv("QUANTEM_GPU_FIXTURES"); env != nullptr && *env != '\0') return std::string(env);
    generated = new TempDir();
    test::run_python_script("products_load_fixture.py", "write " + generated->path() +
                                                            " sharded --scan 9x7 --det 10x9 --shard-frames 40,23 "
                                                            "--mask '1,1;2,3;9,8' --masked-value 60000 --raw-frames 5,40");
    test::run_python_script("products_load_fixture.py",
                            "write " + generated->path() + " lz4 --filter lz4 --scan 5x8 --det 9x7 --mask '4,4'");
    test::run_python_script("products_load_fixture.py", "write " + generated->path() +
                                                            " inline --inline --scan 6x7 --det 8x5 --mask '0,4;7,0' "
                                                            "--masked-value 999");
    test::run_python_script("products_load_fixture.py",
                            "write " + generated->path() + " small --dtype uint8 --scan 4x5 --det 6x6 --mask '0,0'");
    test::run_python_script("products_load_fixture.py", "write " + generated->path() +
                                                            " wide --dtype uint32 --scan 5x7 --det 7x5 --hot 100000 "
                                                            "--mask '3,3' --masked-value 7");
    test::run_python_script("products_load_fixture.py", "write " + generated->path() +
                                                            " narrow --dtype uint32 --scan 6x6 --det 8x7 "
                                                            "--mask '2,2;5,6' --masked-value 200000");
    test::run_python_script("products_load_fixture.py", "write " + generated->path() +
                                                            " blocks --scan 4x6 --det 64x72 --block-elements 1024 "
                                                            "--shard-frames 10,14 --mask '3,5;60,70'");
    test::run_python_script("products_load_fixture.py", "write " + generated->path() +
                                                            " hot --dtype uint32 --scan 4x4 --det 6x6 "
                                                            "--hot 4000000000 --no-expected");
    test::run_python_script("products_load_fixture.py",
                            "write " + generated->path() + " corrupt --scan 24x24 --det 32x32 --no-expected");
    test::run_python_script("products_load_fixture.py",
                            "corrupt " + generated->path() + "/corrupt_data_000001.h5 500");
    return generated->path();
  }();
  return dir;
}

catalog::Acquisition fixture(const std::string& stem) {
  catalog::Acquisition acquisition = catalog::inspect_master(fixtures_dir() + "/" + stem + "_master.h5");
  EXPECT_TRUE(acquisition.status.loadable) << stem << ": " << acquisition.status.reason;
  return acquisition;
}

std::vector<std::uint64_t> expected_counts(const std::string& stem) {
  const std::vector<std::uint8_t> bytes = test::read_file(fixtures_dir() + "/" + stem + "_expected.u64");
  std::vector<std::uint64_t> values(bytes.size() / 8);
  std::memcpy(values.data(), bytes.data(), values.size() * 8);
  return values;
}

CudaLoadTuning small_tuning() {
  CudaLoadTuning tuning;
  tuning.frames_per_group = 16;
  tuning.groups_per_batch = 2;
  tuning.staging_bytes = 64 << 10;
  tuning.sub_batch_frames = 9;
  return tuning;
}

std::unique_ptr<CudaBackend> cuda_backend(const CudaLoadTuning& tuning = {}) {
  CudaBackendOptions options;
  options.device_indices = {0};
  options.read_threads = 4;
  options.tuning = tuning;
  return make_cuda_backend(options);
}

std::unique_ptr<Backend> cpu_backend() {
  CpuBackendOptions options;
  options.threads = 2;
  options.budget_bytes_per_device = std::uint64_t{1} << 30;
  return make_cpu_backend(options);
}

std::shared_ptr<Resident> load(Backend& backend, const catalog::Acquisition& acquisition) {
  LoadProgress progress;
  auto resident = backend.load(acquisition, backend.devices().front().index, progress);
  EXPECT_EQ(progress.stage.load(), LoadStage::done);
  EXPECT_EQ(progress.bytes_done.load(), progress.bytes_total.load());
  return resident;
}

std::uint64_t device_free_bytes() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  return free_bytes;
}

std::vector<std::uint8_t> disk_mask(const plan::PlanGeometry& g, double radius) {
  std::vector<std::uint8_t> mask(g.detector_pixels());
  for (std::uint64_t r = 0; r < g.detector_rows; ++r)
    for (std::uint64_t c = 0; c < g.detector_cols; ++c) {
      const double dr = static_cast<double>(r) + 0.5 - static_cast<double>(g.detector_rows) / 2.0;
      const double dc = static_cast<double>(c) + 0.5 - static_cast<double>(g.detector_cols) / 2.0;
      mask[r * g.detector_cols + c] = dr * dr + dc * dc <= radius * radius ? 1 : 0;
    }
  return mask;
}

// Every primitive of the CUDA resident equals the CPU resident's for several plans.
void expect_same_products(Resident& gpu, Resident& cpu, const std::string& where) {
  const catalog::Acquisition& a = cpu.source();
  std::vector<plan::BrowsePlan> plans(1);
  plan::BrowsePlan cropped;
  cropped.crop = plan::ScanRegion{1, a.scan_rows, 0, std::max<std::uint64_t>(1, a.scan_cols - 1)};
  cropped.scan_bin = 2;
  cropped.detector_bin = 2;
  plans.push_back(cropped);
  plan::BrowsePlan binned;
  binned.scan_bin = 3;
  binned.detector_bin = 3;
  plans.push_back(binned);
  std::mt19937_64 random(7);
  for (const plan::BrowsePlan& browse_plan : plans) {
    const plan::PlanGeometry g =
        plan::resolve_plan(browse_plan, a.scan_rows, a.scan_cols, a.detector_rows, a.detector_cols);
    const std::string at = where + " " + plan::to_string(g);
    EXPECT_EQ(gpu.pattern_sum(g), cpu.pattern_sum(g)) << at;
    std::vector<std::uint8_t> sparse(g.detector_pixels());
    for (auto& m : sparse) m = random() % 5 == 0 ? 1 : 0;
    for (const auto& mask : {disk_mask(g, static_cast<double>(g.detector_rows) / 4.0),
                             std::vector<std::uint8_t>(g.detector_pixels(), 1), sparse}) {
      EXPECT_EQ(gpu.masked_sum(g, mask), cpu.masked_sum(g, mask)) << at;
    }
    const CenterOfMassSums got = gpu.center_of_mass_sums(g);
    const CenterOfMassSums want = cpu.center_of_mass_sums(g);
    EXPECT_EQ(got.total, want.total) << at;
    EXPECT_EQ(got.row_moment, want.row_moment) << at;
    EXPECT_EQ(got.col_moment, want.col_moment) << at;
    for (std::uint64_t row = 0; row < g.scan_rows; ++row)
      for (std::uint64_t col = 0; col < g.scan_cols; ++col)
        ASSERT_EQ(gpu.frame(g, row, col), cpu.frame(g, row, col)) << at << " frame " << row << "," << col;
    std::vector<std::uint64_t> positions = {0, g.positions() - 1, g.positions() / 2};
    std::sort(positions.begin(), positions.end());
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
    for (const auto reduce : {RegionReduce::sum, RegionReduce::max}) {
      EXPECT_EQ(gpu.region_reduce(g, positions, reduce), cpu.region_reduce(g, positions, reduce)) << at;
    }
  }
}

// The CUDA resident's full-plan frames equal h5py's read-back.
void expect_frames(Resident& resident, const std::vector<std::uint64_t>& expected, const std::string& where) {
  const catalog::Acquisition& a = resident.source();
  const plan::PlanGeometry g = plan::resolve_plan({}, a.scan_rows, a.scan_cols, a.detector_rows, a.detector_cols);
  const std::uint64_t pixels = g.detector_pixels();
  ASSERT_EQ(expected.size(), g.positions() * pixels) << where;
  for (std::uint64_t p = 0; p < g.positions(); ++p) {
    const std::vector<std::uint64_t> want(expected.begin() + static_cast<std::ptrdiff_t>(p * pixels),
                                          expected.begin() + static_cast<std::ptrdiff_t>((p + 1) * pixels));
    ASSERT_EQ(resident.frame(g, p / g.scan_cols, p % g.scan_cols), want) << where << " position " << p;
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

catalog::Acquisition synthesize(const TempDir& dir, const std::string& prefix, std::uint64_t scan,
                                std::uint64_t detector, DType dtype, synth::Preset preset,
                                std::uint64_t frames_per_shard = 0) {
  synth::SynthOptions options;
  options.output_dir = dir.path();
  options.prefix = prefix;
  options.scan_rows = scan;
  options.scan_cols = scan + 3;
  options.detector_rows = detector;
  options.detector_cols = detector - 2;
  options.dtype = dtype;
  options.preset = preset;
  options.frames_per_shard = frames_per_shard;
  options.threads = 4;
  const synth::SynthReport report = synth::write_acquisition(options);
  catalog::Acquisition acquisition = catalog::inspect_master(report.master_path);
  EXPECT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  return acquisition;
}

TEST(CudaBackend, ReportsDevicesWithNameMemoryAndBudget) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  const auto backend = make_cuda_backend({});
  EXPECT_EQ(backend->name(), "cuda");
  const std::vector<DeviceInfo> devices = backend->devices();
  ASSERT_EQ(static_cast<int>(devices.size()), cuda_device_count());
  for (const DeviceInfo& device : devices) {
    EXPECT_FALSE(device.name.empty());
    EXPECT_GT(device.total_memory_bytes, 0u);
    EXPECT_EQ(device.budget_bytes, static_cast<std::uint64_t>(static_cast<double>(device.total_memory_bytes) * 0.8));
    const auto free_bytes = backend->free_bytes(device.index);
    ASSERT_TRUE(free_bytes.has_value());
    EXPECT_LE(*free_bytes, device.total_memory_bytes);
  }
  CudaBackendOptions budgeted;
  budgeted.budget_bytes = std::uint64_t{3} << 30;
  EXPECT_EQ(make_cuda_backend(budgeted)->devices().front().budget_bytes, std::uint64_t{3} << 30);
  CudaBackendOptions missing;
  missing.device_indices = {cuda_device_count()};
  const std::string text = error_text([&] { make_cuda_backend(missing); }, ErrorKind::unavailable);
  EXPECT_EQ(text.rfind("CUDA unavailable: ", 0), 0u) << text;
  error_text([&] { backend->free_bytes(cuda_device_count()); }, ErrorKind::bad_request);
}

TEST(CudaBackend, LoadsH5pyFixturesExactlyAsH5pyReadsThemAndLikeTheCpuBackend) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  struct Case {
    std::string stem;
    DType held;
    bool host_decoded;  // chunks the GPU decoder does not take
  };
  // "blocks": bitshuffle blocks of 1024 elements, which the GPU decoder reports
  // as unsupported; the encode worker decodes those chunks on the host.
  const std::vector<Case> cases = {{"sharded", DType::uint16, true}, {"lz4", DType::uint16, true},
                                   {"inline", DType::uint16, true},  {"small", DType::uint8, false},
                                   {"wide", DType::uint32, false},   {"narrow", DType::uint16, false},
                                   {"blocks", DType::uint16, true}};
  const auto cpu = cpu_backend();
  for (const CudaLoadTuning& tuning : {CudaLoadTuning{}, small_tuning()}) {
    const auto gpu = cuda_backend(tuning);
    for (const Case& c : cases) {
      const catalog::Acquisition acquisition = fixture(c.stem);
      const std::string where = c.stem + (tuning.frames_per_group != 0 ? " (small tuning)" : "");
      const auto resident = load(*gpu, acquisition);
      EXPECT_EQ(resident->resident_dtype(), c.held) << where;
      EXPECT_EQ(resident->device_index(), 0);
      EXPECT_EQ(resident->encoding().rfind("ans-", 0), 0u) << resident->encoding();
      EXPECT_EQ(resident->encoding().find("decoded on the host") != std::string::npos, c.host_decoded)
          << where << ": " << resident->encoding();
      const LoadEstimate estimate = gpu->estimate_load(acquisition);
      // estimate.resident_bytes is provisional (the load grows past it); the bound holds.
      EXPECT_LE(resident->resident_bytes(), estimate.max_transition_peak_bytes) << where;
      const CudaLoadReport report = gpu->last_load_report();
      EXPECT_TRUE(report.valid);
      EXPECT_LE(report.allocated_peak_bytes, report.reserved_peak_bytes) << where;
      expect_frames(*resident, expected_counts(c.stem), where);
      expect_same_products(*resident, *load(*cpu, acquisition), where);
    }
  }
}

// Synthesized acquisitions of every dtype and preset the loads and exports are checked on.
struct SynthCase {
  std::string prefix;
  DType dtype;
  synth::Preset preset;
};
std::vector<SynthCase> synthesized_cases() {
  return {{"realistic16", DType::uint16, synth::Preset::realistic},
          {"dense32", DType::uint32, synth::Preset::dense},
          {"sparse8", DType::uint8, synth::Preset::sparse}};
}

TEST(CudaBackend, LoadsSynthesizedAcquisitionsLikeTheCpuBackend) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  TempDir dir;
  const auto cpu = cpu_backend();
  for (const SynthCase& c : synthesized_cases()) {
    // 13 x 16 scan, 40 x 38 detector, three shards whose boundaries fall inside groups.
    const catalog::Acquisition acquisition =
        synthesize(dir, c.prefix, 13, 40, c.dtype, c.preset, /*frames_per_shard=*/90);
    const auto cpu_resident = load(*cpu, acquisition);
    for (const CudaLoadTuning& tuning : {CudaLoadTuning{}, small_tuning()}) {
      const auto gpu = cuda_backend(tuning);
      const auto resident = load(*gpu, acquisition);
      EXPECT_EQ(resident->resident_dtype(), cpu_resident->resident_dtype()) << c.prefix;
      const CudaLoadReport report = gpu->last_load_report();
      EXPECT_EQ(report.host_decoded_chunks, 0u) << c.prefix;
      EXPECT_EQ(resident->encoding().find('('), std::string::npos) << resident->encoding();
      expect_same_products(*resident, *cpu_resident, c.prefix);
    }
  }
}

// The frame and region decoders pick their CTA width per call (512 or 1024
// threads); every width gives the CPU backend's sums, maxima and frames, with
// the decode tables built at load and without (built by every CTA).
TEST(CudaBackend, FramesAndRegionsAgreeAtEveryCtaWidth) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  TempDir dir;
  const auto cpu = cpu_backend();
  // 13 x 16 scan (208 frames over several groups and seek points), 40 x 38 detector.
  const catalog::Acquisition acquisition =
      synthesize(dir, "widths", 13, 40, DType::uint16, synth::Preset::realistic, /*frames_per_shard=*/90);
  const auto cpu_resident = load(*cpu, acquisition);
  for (const bool tables_at_load : {true, false}) {
    for (const int threads : {512, 1024, 0}) {
      CudaLoadTuning tuning = small_tuning();
      tuning.decode_tables_at_load = tables_at_load;
      tuning.accumulate_frames_cta_threads = threads;
      const auto gpu = cuda_backend(tuning);
      const auto resident = load(*gpu, acquisition);
      expect_same_products(*resident, *cpu_resident, std::string(tables_at_load ? "tables at load" : "tables per CTA") +
                                                         ", CTA width " + std::to_string(threads));
    }
  }
}

TEST(CudaBackend, LoadsTheRealArinaAcquisitionLikeTheCpuBackend) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  QUANTEM_SKIP_WITHOUT_REAL_DATA();
  const catalog::Acquisition acquisition =
      catalog::inspect_master(test::real_data_dir() + "/arina/rsciio_test_00/test_00_master.h5");
  ASSERT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  const auto resident = load(*cuda_backend(), acquisition);
  EXPECT_EQ(resident->resident_dtype(), DType::uint16);  // uint32 counts that all fit 16 bits
  expect_same_products(*resident, *load(*cpu_backend(), acquisition), "test_00");
}

TEST(CudaBackend, ACorruptChunkFailsNamingFrameAndFileAndFreesEverything) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  const catalog::Acquisition acquisition = fixture("corrupt");
  for (const CudaLoadTuning& tuning : {CudaLoadTuning{}, small_tuning()}) {
    const auto backend = cuda_backend(tuning);
    const std::uint64_t held_before = cuda_resident_bytes_in_use();
    LoadProgress progress;
    try {
      backend->load(acquisition, 0, progress);
      FAIL() << "a corrupt chunk loaded";
    } catch (const CorruptChunk& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("frame 500 "), std::string::npos) << message;
      EXPECT_NE(message.find("corrupt_data_000001.h5"), std::string::npos) << message;
    }
    EXPECT_EQ(progress.stage.load(), LoadStage::failed);
    EXPECT_EQ(cuda_resident_bytes_in_use(), held_before);
    // The backend keeps working.
    expect_frames(*load(*backend, fixture("small")), expected_counts("small"), "after corrupt");
  }
}

TEST(CudaBackend, CancellationStopsTheLoadAndFreesEverything) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  TempDir dir;
  const catalog::Acquisition acquisition = synthesize(dir, "cancel", 40, 34, DType::uint16, synth::Preset::realistic);
  const auto backend = cuda_backend(small_tuning());
  const std::uint64_t held_before = cuda_resident_bytes_in_use();
  {
    LoadProgress progress;
    progress.cancel_requested = true;
    error_text([&] { backend->load(acquisition, 0, progress); }, ErrorKind::unavailable);
    EXPECT_EQ(progress.stage.load(), LoadStage::cancelled);
  }
  bool cancelled_midway = false;
  for (int attempt = 0; attempt < 5 && !cancelled_midway; ++attempt) {
    LoadProgress progress;
    std::thread watcher([&] {
      const auto finished = [&] {
        const LoadStage stage = progress.stage.load();
        return stage == LoadStage::failed || stage == LoadStage::done || stage == LoadStage::cancelled;
      };
      while (progress.bytes_done.load() == 0 && !finished()) std::this_thread::yield();
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
    EXPECT_EQ(cuda_resident_bytes_in_use(), held_before);
  }
  EXPECT_TRUE(cancelled_midway);
}

TEST(CudaBackend, TheMeasuredLoadPeakStaysWithinTheReservation) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  TempDir dir;
  const catalog::Acquisition acquisition = synthesize(dir, "peak", 48, 64, DType::uint16, synth::Preset::realistic);
  CudaLoadTuning tuning;
  tuning.frames_per_group = 256;
  tuning.groups_per_batch = 2;
  tuning.staging_bytes = 1 << 20;
  tuning.sub_batch_frames = 100;
  for (const CudaLoadTuning& t : {CudaLoadTuning{}, tuning}) {
    const auto backend = cuda_backend(t);
    load(*backend, acquisition);  // warm-up: the runtime loads its kernels lazily on first use
    const LoadEstimate estimate = backend->estimate_load(acquisition);
    const std::uint64_t free_before = device_free_bytes();
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> least_free{free_before};
    std::thread sampler([&] {
      cudaSetDevice(0);
      while (!stop.load()) {
        std::size_t free_bytes = 0;
        std::size_t total_bytes = 0;
        if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && free_bytes < least_free.load()) {
          least_free = free_bytes;
        }
      }
    });
    // Admission reserves the estimate; the load grows it before allocating past it.
    LocalLoadReservation reservation(0, estimate.transition_peak_bytes);
    LoadProgress progress;
    std::shared_ptr<Resident> resident = backend->load(acquisition, 0, progress, reservation);
    stop = true;
    sampler.join();
    const std::uint64_t sampled_peak = free_before - std::min(free_before, least_free.load());
    const CudaLoadReport report = backend->last_load_report();
    EXPECT_LE(sampled_peak, reservation.largest_reserved_bytes());
    EXPECT_LE(report.measured_peak_bytes, reservation.largest_reserved_bytes());
    EXPECT_LE(report.allocated_peak_bytes, reservation.largest_reserved_bytes());
    EXPECT_GT(report.allocated_peak_bytes, resident->resident_bytes());
    EXPECT_LE(reservation.largest_reserved_bytes(), estimate.max_transition_peak_bytes);
    EXPECT_EQ(report.admitted_peak_bytes, estimate.transition_peak_bytes);
    EXPECT_EQ(report.reserved_peak_bytes, reservation.largest_reserved_bytes());
    std::printf("peak: sampled %llu, cudaMemGetInfo checkpoints %llu, allocated %llu, admitted %llu, reserved %llu, "
                "bound %llu, resident %llu\n",
                static_cast<unsigned long long>(sampled_peak),
                static_cast<unsigned long long>(report.measured_peak_bytes),
                static_cast<unsigned long long>(report.allocated_peak_bytes),
                static_cast<unsigned long long>(estimate.transition_peak_bytes),
                static_cast<unsigned long long>(reservation.largest_reserved_bytes()),
                static_cast<unsigned long long>(estimate.max_transition_peak_bytes),
                static_cast<unsigned long long>(resident->resident_bytes()));
  }
}

TEST(CudaBackend, AReservationThatCannotGrowFailsTheLoadWith413AndFreesEverything) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  TempDir dir;
  const catalog::Acquisition acquisition = synthesize(dir, "nogrow", 48, 64, DType::uint16, synth::Preset::dense);
  const auto backend = cuda_backend();
  load(*backend, acquisition);  // warm-up
  const LoadEstimate estimate = backend->estimate_load(acquisition);
  const std::uint64_t in_use_before = cuda_resident_bytes_in_use();
  const std::uint64_t free_before = device_free_bytes();
  // Exactly what admission reserved, and not one byte more.
  LocalLoadReservation reservation(0, estimate.transition_peak_bytes, estimate.transition_peak_bytes);
  // Dense counts encode to about 0.9 of their shards: past the provisional half, so the load must grow.
  LoadProgress progress;
  const std::string text =
      error_text([&] { (void)backend->load(acquisition, 0, progress, reservation); }, ErrorKind::payload_too_large);
  EXPECT_NE(text.find("limited to"), std::string::npos) << text;
  EXPECT_EQ(progress.stage.load(), LoadStage::failed);
  EXPECT_GE(reservation.grow_calls(), 1u);
  EXPECT_EQ(cuda_resident_bytes_in_use(), in_use_before);
  EXPECT_GE(device_free_bytes() + (std::uint64_t{64} << 20), free_before);
}

TEST(CudaBackend, RunningOutOfDeviceMemoryIsPayloadTooLargeAndFreesEverything) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  const catalog::Acquisition acquisition = fixture("sharded");
  const auto backend = cuda_backend();  // default staging: two 64 MiB device slots
  load(*backend, acquisition);
  const std::uint64_t held_before = cuda_resident_bytes_in_use();
  // Leave about 40 MiB free.
  void* blocker = nullptr;
  std::uint64_t leave = std::uint64_t{40} << 20;
  for (int attempt = 0; attempt < 8 && blocker == nullptr; ++attempt, leave += std::uint64_t{64} << 20) {
    const std::uint64_t free_bytes = device_free_bytes();
    if (cudaMalloc(&blocker, free_bytes - leave) != cudaSuccess) {
      (void)cudaGetLastError();
      blocker = nullptr;
    }
  }
  ASSERT_NE(blocker, nullptr);
  LoadProgress progress;
  const std::string text = error_text([&] { backend->load(acquisition, 0, progress); }, ErrorKind::payload_too_large);
  EXPECT_NE(text.find("device memory"), std::string::npos) << text;
  EXPECT_EQ(progress.stage.load(), LoadStage::failed);
  EXPECT_EQ(cuda_resident_bytes_in_use(), held_before);
  ASSERT_EQ(cudaFree(blocker), cudaSuccess);
  expect_frames(*load(*backend, acquisition), expected_counts("sharded"), "after out-of-memory");
}

TEST(CudaBackend, RefusesUnknownDevicesAndSourcesThatAreNotReady) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  catalog::Acquisition acquisition = fixture("small");
  const auto backend = cuda_backend();
  LoadProgress progress;
  error_text([&] { backend->load(acquisition, 1000, progress); }, ErrorKind::bad_request);
  acquisition.status.loadable = false;
  acquisition.status.reason = "stored frame count is 3; expected 4 from master metadata ntrigger=4, nimages=1";
  EXPECT_EQ(error_text([&] { backend->load(acquisition, 0, progress); }, ErrorKind::conflict), acquisition.status.reason);
  catalog::Acquisition unknown_shape = acquisition;
  unknown_shape.scan_rows = 0;
  error_text([&] { backend->estimate_load(unknown_shape); }, ErrorKind::unprocessable);
}


// The overlapped pipeline: batch b is decoded into one dense slot while the
// encode worker encodes batch b - 1 from the other. Many small batches, three
// shards, products equal to the CPU backend's; both dense slots are live
// together with every piece of the resident at the last batch.
TEST(CudaBackend, TheOverlappedLoadHoldsTwoDenseBatchesAndMatchesTheCpuBackend) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  TempDir dir;
  const catalog::Acquisition acquisition =
      synthesize(dir, "overlap", 20, 40, DType::uint16, synth::Preset::realistic, /*frames_per_shard=*/170);
  const CudaLoadTuning tuning = small_tuning();  // 32 frames per batch
  const auto backend = cuda_backend(tuning);
  const std::uint64_t held_before = cuda_resident_bytes_in_use();
  {
    const auto resident = load(*backend, acquisition);
    const CudaLoadReport report = backend->last_load_report();
    const std::uint64_t frames = acquisition.frame_count();
    const std::uint64_t batch_frames = std::uint64_t{tuning.frames_per_group} * tuning.groups_per_batch;
    const std::uint64_t groups = (frames + tuning.frames_per_group - 1) / tuning.frames_per_group;
    EXPECT_EQ(report.batches, (frames + batch_frames - 1) / batch_frames);
    EXPECT_GT(report.gpu_encode_seconds, 0.0);
    EXPECT_EQ(report.host_decoded_chunks, 0u);
    const std::uint64_t dense_batch_bytes = batch_frames * acquisition.frame_pixels() * 2;
    const std::uint64_t pieces_bytes = resident->resident_bytes() - groups * 8;  // less the group table
    EXPECT_GE(report.allocated_peak_bytes, 2 * dense_batch_bytes + pieces_bytes);
    EXPECT_LE(report.allocated_peak_bytes, backend->estimate_load(acquisition).transition_peak_bytes);
    expect_same_products(*resident, *load(*cpu_backend(), acquisition), "overlap");
  }
  EXPECT_EQ(cuda_resident_bytes_in_use(), held_before);
}

// A corrupt chunk found by the encode worker in the first batch (while the
// loader reads and decodes the next ones) or in the last batch (found when the
// loader waits for the worker at the end) fails the load with the typed error
// and frees every device byte. The chunk is broken in place the way
// products_load_fixture.py does it: its first LZ4 block claims more bytes than
// the chunk holds.
TEST(CudaBackend, ACorruptChunkInTheFirstOrLastBatchFailsTheOverlappedLoadAndFreesEverything) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  const auto basename = [](const std::string& path) { return path.substr(path.find_last_of('/') + 1); };
  for (const std::uint64_t frame : {std::uint64_t{3}, std::uint64_t{640}}) {
    TempDir dir;
    // 24 x 27 = 648 frames, two shards: 21 batches of at most 32 frames with the small tuning.
    const catalog::Acquisition acquisition =
        synthesize(dir, "broken", 24, 32, DType::uint16, synth::Preset::realistic, /*frames_per_shard=*/400);
    const catalog::FrameIndex index = catalog::build_frame_index(acquisition);
    ASSERT_GT(index.frames.size(), frame);
    const catalog::FrameLocation& location = index.frames[frame];
    const std::string shard = index.shard_paths[location.shard];
    {
      std::FILE* file = std::fopen(shard.c_str(), "r+b");
      ASSERT_NE(file, nullptr) << shard;
      const unsigned char too_long[4] = {0x7f, 0xff, 0xff, 0xff};
      ASSERT_EQ(std::fseek(file, static_cast<long>(location.file_offset + 12), SEEK_SET), 0);
      ASSERT_EQ(std::fwrite(too_long, 1, 4, file), 4u);
      ASSERT_EQ(std::fclose(file), 0);
    }
    for (const CudaLoadTuning& tuning : {CudaLoadTuning{}, small_tuning()}) {
      const std::string where = "frame " + std::to_string(frame) + (tuning.frames_per_group != 0 ? " (small)" : "");
      const auto backend = cuda_backend(tuning);
      const std::uint64_t held_before = cuda_resident_bytes_in_use();
      LoadProgress progress;
      try {
        backend->load(acquisition, 0, progress);
        ADD_FAILURE() << where << ": a corrupt chunk loaded";
      } catch (const CorruptChunk& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("frame " + std::to_string(frame) + " "), std::string::npos) << message;
        EXPECT_NE(message.find(basename(shard)), std::string::npos) << message;
      }
      EXPECT_EQ(progress.stage.load(), LoadStage::failed) << where;
      EXPECT_EQ(cuda_resident_bytes_in_use(), held_before) << where;
      expect_frames(*load(*backend, fixture("small")), expected_counts("small"), where + ": after corrupt");
    }
  }
}

}  // namespace
}  // namespace quantem::backend

namespace quantem::backend {
namespace {

// Decodes encoded export chunks (the CPU codec) into uint32 values, frame after frame.
std::vector<std::uint32_t> decode_export_chunks(const Resident::EncodedChunks& chunks, std::uint64_t count,
                                                std::uint64_t pixels, std::size_t element_size) {
  std::vector<std::uint32_t> values;
  std::vector<std::uint8_t> frame(pixels * element_size);
  codec::ChunkFormat format;
  format.filter = codec::ChunkFilter::bitshuffle_lz4;
  format.element_size = element_size;
  for (std::uint64_t i = 0; i < count; ++i) {
    codec::decode_chunk(format, chunks.bytes.data() + chunks.offsets[i], chunks.offsets[i + 1] - chunks.offsets[i],
                        frame.data(), frame.size());
    for (std::uint64_t p = 0; p < pixels; ++p) {
      std::uint32_t value = 0;
      std::memcpy(&value, frame.data() + p * element_size, element_size);  // little-endian host
      values.push_back(value);
    }
  }
  return values;
}

CudaLoadTuning seek_point_tuning() {
  CudaLoadTuning tuning = small_tuning();
  tuning.frames_per_seek_point = 4;  // runs cut at seek segments inside groups
  return tuning;
}

// The export's device encoder: every plan shape, batches of whole rows and
// of rows cut at both ends, decode to the CPU backend's frames_u32.
TEST(CudaBackend, ExportChunksDecodeToTheCpuBackendsFramesForEveryPlan) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  TempDir dir;
  const auto cpu = cpu_backend();
  for (const SynthCase& c : synthesized_cases()) {
    const catalog::Acquisition acquisition = synthesize(dir, c.prefix, 13, 40, c.dtype, c.preset, 90);
    const auto cpu_resident = load(*cpu, acquisition);
    const std::vector<plan::BrowsePlan> plans = {
        {},
        {plan::ScanRegion{2, 11, 3, 14}, 1, 1},
        {std::nullopt, 2, 1},
        {std::nullopt, 1, 3},
        {plan::ScanRegion{1, 12, 2, 15}, 3, 2},
        {plan::ScanRegion{4, 9, 0, 16}, 1, 1},
    };
    for (const CudaLoadTuning& tuning : {CudaLoadTuning{}, small_tuning(), seek_point_tuning()}) {
      const auto gpu = cuda_backend(tuning);
      const auto resident = load(*gpu, acquisition);
      for (const plan::BrowsePlan& browse : plans) {
        const plan::PlanGeometry g = plan::resolve_plan(browse, acquisition.scan_rows, acquisition.scan_cols,
                                                        acquisition.detector_rows, acquisition.detector_cols);
        const bool bins = g.scan_bin > 1 || g.detector_bin > 1;
        const std::size_t element_size = bins ? 4 : dtype_size(c.dtype);
        const std::uint64_t positions = g.positions();
        const std::string where = c.prefix + " " + plan::to_string(g);
        const auto shape = resident->export_batch_shape(g, element_size);
        EXPECT_GT(shape.positions, 0u) << where;
        EXPECT_EQ(shape.positions % g.scan_cols, 0u) << where << ": batches of whole plan rows";
        for (const auto& [first, count] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
                 {0, positions}, {1, positions - 2}, {g.scan_cols, g.scan_cols}, {positions - 1, 1}}) {
          Resident::EncodedChunks chunks;
          ASSERT_TRUE(resident->encode_export_chunks(g, first, count, element_size, chunks)) << where;
          ASSERT_EQ(chunks.offsets.size(), count + 1) << where;
          std::vector<std::uint32_t> expected;
          ASSERT_TRUE(cpu_resident->frames_u32(g, first, count, expected)) << where;
          EXPECT_EQ(decode_export_chunks(chunks, count, g.detector_pixels(), element_size), expected)
              << where << " positions [" << first << ", " << first + count << ")";
        }
      }
    }
  }
}

TEST(CudaBackend, ExportChunksRefuseABinnedValueAboveUint32AndBadArguments) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  const catalog::Acquisition acquisition = fixture("hot");
  const auto gpu = cuda_backend();
  const auto resident = load(*gpu, acquisition);
  // Four frames with a 4,000,000,000 pixel each, binned into one value.
  const plan::PlanGeometry g = plan::resolve_plan({std::nullopt, 2, 6}, acquisition.scan_rows,
                                                  acquisition.scan_cols, acquisition.detector_rows,
                                                  acquisition.detector_cols);
  Resident::EncodedChunks chunks;
  EXPECT_NE(error_text([&] { resident->encode_export_chunks(g, 0, g.positions(), 4, chunks); }, ErrorKind::conflict)
                .find("exceeds 2^32 - 1"),
            std::string::npos);
  error_text([&] { resident->encode_export_chunks(g, 0, g.positions() + 1, 4, chunks); }, ErrorKind::bad_request);
  error_text([&] { resident->encode_export_chunks(g, 0, 1, 3, chunks); }, ErrorKind::bad_request);
  // The resident still answers after the refusal.
  const plan::PlanGeometry whole = plan::resolve_plan({}, acquisition.scan_rows, acquisition.scan_cols,
                                                      acquisition.detector_rows, acquisition.detector_cols);
  EXPECT_TRUE(resident->encode_export_chunks(whole, 0, whole.positions(), 4, chunks));
}

}  // namespace
}  // namespace quantem::backend
