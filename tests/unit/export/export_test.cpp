// Exports of plans from the CPU resident, checked by an independent reader:
// the source written by h5py + the official bitshuffle filter
// (products_load_fixture.py), the export read back by h5py + the official
// filter and compared with the plan computed by numpy from the source
// (export_reference.py). Then the export as this daemon's catalog and CPU
// backend see it, and every fault the export must survive without leaving
// anything that looks finished.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/error.hpp"
#include "quantem/export/export.hpp"
#include "quantem/plan/plan.hpp"
#include "export_folders.hpp"
#include "test_support.hpp"

namespace quantem::exporter {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::TempDir;

struct RoundTrip {
  const char* label;
  const char* fixture;  // products_load_fixture.py write options
  std::optional<plan::ScanRegion> crop;
  std::uint64_t scan_bin = 1;
  std::uint64_t detector_bin = 1;
  std::uint64_t frames_per_file = 0;
  DType expected_dtype = DType::uint16;
};

std::ostream& operator<<(std::ostream& out, const RoundTrip& c) { return out << c.label; }

catalog::Acquisition write_source(const TempDir& dir, const std::string& stem, const std::string& options) {
  test::run_python_script("products_load_fixture.py", "write " + dir.path() + " " + stem + " " + options + " --no-expected");
  catalog::Acquisition acquisition = catalog::inspect_master(dir.file(stem + "_master.h5"));
  EXPECT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  return acquisition;
}

std::unique_ptr<backend::Backend> cpu_backend() {
  backend::CpuBackendOptions options;
  options.threads = 2;
  options.budget_bytes_per_device = std::uint64_t{1} << 30;
  return backend::make_cpu_backend(options);
}

std::shared_ptr<backend::Resident> load(backend::Backend& backend, const catalog::Acquisition& acquisition) {
  backend::LoadProgress progress;
  return backend.load(acquisition, 0, progress);
}

ExportRequest request_for(const std::string& folder, const RoundTrip& c) {
  ExportRequest request;
  request.plan.crop = c.crop;
  request.plan.scan_bin = c.scan_bin;
  request.plan.detector_bin = c.detector_bin;
  request.output_folder = folder;
  request.frames_per_file = c.frames_per_file;
  request.threads = 2;
  request.positions_per_batch = 3;  // several batches even for small scans
  request.implementation_revision = "test-revision";
  return request;
}

json reference_check(const std::string& source_master, const ExportReport& report, const RoundTrip& c,
                     const plan::PlanGeometry& g) {
  std::string arguments = "'" + source_master + "' '" + report.master_path + "' --scan-bin " +
                          std::to_string(c.scan_bin) + " --det-bin " + std::to_string(c.detector_bin);
  arguments += " --crop " + std::to_string(g.region.row_start) + "," + std::to_string(g.region.row_stop) + "," +
               std::to_string(g.region.col_start) + "," + std::to_string(g.region.col_stop);
  if (c.frames_per_file) arguments += " --frames-per-file " + std::to_string(c.frames_per_file);
  const auto result = test::run_python_script("export_reference.py", arguments);
  if (result.status != 0) return json::object();
  return json::parse(result.output);
}

using test::folder_entries;

class ExportRoundTrip : public ::testing::TestWithParam<RoundTrip> {};

TEST_P(ExportRoundTrip, EqualsThePlanComputedByNumpyFromTheSource) {
  const RoundTrip& c = GetParam();
  TempDir dir;
  const catalog::Acquisition source = write_source(dir, "sample", c.fixture);
  auto backend = cpu_backend();
  auto resident = load(*backend, source);
  fs::create_directory(dir.file("out"));
  const ExportRequest request = request_for(dir.file("out"), c);
  const ExportLayout layout = plan_export(source, request);
  EXPECT_EQ(layout.dtype, c.expected_dtype);
  ExportProgress progress;
  const ExportReport report = export_plan(*resident, source, layout, request, progress);

  EXPECT_EQ(progress.stage.load(), ExportStage::done);
  EXPECT_EQ(progress.frames_done.load(), layout.geometry.positions());
  EXPECT_EQ(report.frames, layout.geometry.positions());
  EXPECT_EQ(report.encoder, "host");
  EXPECT_EQ(report.folder, dir.file("out") + "/" + layout.name);
  // Only the finished folder: no incomplete folder, no lock file inside.
  EXPECT_EQ(folder_entries(dir.file("out")), std::vector<std::string>{layout.name});
  for (const auto& name : folder_entries(report.folder)) EXPECT_NE(name[0], '.') << name;

  const json out = reference_check(source.master_path, report, c, layout.geometry);
  ASSERT_TRUE(out.contains("checks")) << "the reference could not read the export";
  for (const auto& [check, passed] : out["checks"].items()) EXPECT_TRUE(passed.get<bool>()) << check << ": " << out.dump();
  EXPECT_EQ(out["files"].size(), report.data_files);
}

const RoundTrip kRoundTrips[] = {
    {"Uint16FullOddShapesSeveralFiles", "--scan 7x5 --det 9x11 --dtype uint16 --mask '2,3;8,10'", std::nullopt, 1, 1,
     4, DType::uint16},
    {"Uint8CropTouchingBottomRightEdges", "--scan 6x7 --det 13x6 --dtype uint8 --mask '0,0'",
     plan::ScanRegion{2, 6, 4, 7}, 1, 1, 0, DType::uint8},
    {"Uint8CropTouchingTopLeftEdgesDetectorBin4", "--scan 6x7 --det 13x6 --dtype uint8",
     plan::ScanRegion{0, 3, 0, 5}, 1, 4, 0, DType::uint32},
    {"Uint16PartialScanAndDetectorBins", "--scan 7x5 --det 10x11 --dtype uint16 --mask '4,4;9,10'",
     plan::ScanRegion{1, 7, 0, 5}, 2, 3, 4, DType::uint32},
    {"Uint32NarrowDetectorBinWithAFullyMaskedBin",
     "--scan 5x6 --det 8x9 --dtype uint32 --mask '0,0;0,1;1,0;1,1;5,8'", std::nullopt, 1, 2, 0, DType::uint32},
    {"Uint32WideNative", "--scan 5x6 --det 8x9 --dtype uint32 --hot 100000 --mask '3,3'", std::nullopt, 1, 1, 7,
     DType::uint32},
    {"Uint32WideScanBin3Partial", "--scan 7x8 --det 6x5 --dtype uint32 --hot 4000000000", std::nullopt, 3, 1, 0,
     DType::uint32},
    {"Uint16SeveralSourceShards", "--scan 6x6 --det 7x7 --dtype uint16 --shard-frames 10,20,6",
     plan::ScanRegion{1, 5, 1, 6}, 1, 1, 5, DType::uint16},
};

INSTANTIATE_TEST_SUITE_P(Plans, ExportRoundTrip, ::testing::ValuesIn(kRoundTrips),
                         [](const ::testing::TestParamInfo<RoundTrip>& param_info) { return std::string(param_info.param.label); });

TEST(ExportNames, ComeFromTheStemAndThePlan) {
  const auto g = plan::resolve_plan({plan::ScanRegion{1, 5, 0, 3}, 2, 3}, 8, 6, 9, 9);
  EXPECT_EQ(export_name("sample", g), "sample_crop1-5x0-3_scanbin2_detbin3");
  EXPECT_EQ(export_name("../we ird/..x", plan::resolve_plan({}, 8, 6, 9, 9)), "we_ird_..x_full");
  EXPECT_EQ(export_name("", plan::resolve_plan({std::nullopt, 1, 2}, 8, 6, 9, 9)), "acquisition_detbin2");
}

TEST(ExportOverflow, ABinnedValueAboveUint32FailsAndLeavesNothing) {
  TempDir dir;
  // 4 x 4e9 > 2^32 - 1 in one scan bin of 2 x 2.
  const catalog::Acquisition source = write_source(dir, "hot", "--scan 4x4 --det 4x4 --dtype uint32 --hot 4000000000");
  auto backend = cpu_backend();
  auto resident = load(*backend, source);
  fs::create_directory(dir.file("out"));
  RoundTrip c{"overflow", "", std::nullopt, 4, 4};
  const ExportRequest request = request_for(dir.file("out"), c);
  const ExportLayout layout = plan_export(source, request);
  ExportProgress progress;
  try {
    export_plan(*resident, source, layout, request, progress);
    ADD_FAILURE() << "an overflowing bin was exported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::conflict) << e.what();
    EXPECT_NE(std::string(e.what()).find("2^32 - 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(progress.stage.load(), ExportStage::failed);
  EXPECT_TRUE(folder_entries(dir.file("out")).empty());
}

// The export's read: Resident::frames_u32 (the CPU resident copies runs of a
// group at once for unbinned plans) equals frame_u32 position by position.
TEST(ResidentFrames, BatchesEqualFrameByFrameAcrossGroupsCropsAndBins) {
  TempDir dir;
  const catalog::Acquisition source = write_source(dir, "frames", "--scan 9x11 --det 5x7 --dtype uint16 --mask '1,1'");
  auto backend = cpu_backend();
  auto resident = load(*backend, source);
  const plan::BrowsePlan plans[] = {
      {}, {plan::ScanRegion{2, 9, 3, 10}, 1, 1}, {plan::ScanRegion{0, 9, 10, 11}, 1, 1}, {std::nullopt, 2, 3}};
  for (const auto& browse_plan : plans) {
    const auto g = plan::resolve_plan(browse_plan, 9, 11, 5, 7);
    for (const std::uint64_t batch : {1u, 5u, 32u, 40u}) {
      for (std::uint64_t first = 0; first < g.positions(); first += batch) {
        const std::uint64_t count = std::min<std::uint64_t>(batch, g.positions() - first);
        std::vector<std::uint32_t> values;
        ASSERT_TRUE(resident->frames_u32(g, first, count, values));
        ASSERT_EQ(values.size(), count * g.detector_pixels());
        for (std::uint64_t i = 0; i < count; ++i) {
          const std::uint64_t position = first + i;
          const auto expected = resident->frame_u32(g, position / g.scan_cols, position % g.scan_cols);
          ASSERT_TRUE(expected);
          const std::vector<std::uint32_t> got(values.begin() + i * g.detector_pixels(),
                                               values.begin() + (i + 1) * g.detector_pixels());
          ASSERT_EQ(got, *expected) << plan::to_string(g) << " position " << position << " batch " << batch;
        }
      }
    }
    std::vector<std::uint32_t> values;
    EXPECT_THROW(resident->frames_u32(g, g.positions() - 1, 2, values), Error);
  }
}

// The CPU resident's export chunks (unbinned plans, straight at the source's
// dtype) decode to its frames_u32; binned plans and other element sizes are
// left to the export's host path (false).
TEST(ResidentFrames, ExportChunksOfUnbinnedPlansDecodeToTheFrames) {
  TempDir dir;
  for (const char* options : {"--scan 9x11 --det 5x7 --dtype uint16 --mask '1,1'",
                              "--scan 7x6 --det 9x9 --dtype uint8", "--scan 6x5 --det 4x11 --dtype uint32"}) {
    const catalog::Acquisition source = write_source(dir, "chunks", options);
    auto backend = cpu_backend();
    auto resident = load(*backend, source);
    const std::size_t element_size = dtype_size(*source.dtype);
    const plan::BrowsePlan plans[] = {{},
                                      {plan::ScanRegion{2, source.scan_rows, 3, source.scan_cols - 1}, 1, 1},
                                      {plan::ScanRegion{0, source.scan_rows, source.scan_cols - 1, source.scan_cols}, 1, 1}};
    for (const auto& browse_plan : plans) {
      const auto g = plan::resolve_plan(browse_plan, source.scan_rows, source.scan_cols, source.detector_rows,
                                        source.detector_cols);
      for (const std::uint64_t batch : {1u, 7u, 40u}) {
        for (std::uint64_t first = 0; first < g.positions(); first += batch) {
          const std::uint64_t count = std::min<std::uint64_t>(batch, g.positions() - first);
          backend::Resident::EncodedChunks chunks;
          ASSERT_TRUE(resident->encode_export_chunks(g, first, count, element_size, chunks));
          ASSERT_EQ(chunks.offsets.size(), count + 1);
          std::vector<std::uint32_t> expected;
          ASSERT_TRUE(resident->frames_u32(g, first, count, expected));
          codec::ChunkFormat format;
          format.filter = codec::ChunkFilter::bitshuffle_lz4;
          format.element_size = element_size;
          std::vector<std::uint8_t> frame(g.detector_pixels() * element_size);
          for (std::uint64_t i = 0; i < count; ++i) {
            codec::decode_chunk(format, chunks.bytes.data() + chunks.offsets[i], chunks.offsets[i + 1] - chunks.offsets[i],
                                frame.data(), frame.size());
            for (std::uint64_t p = 0; p < g.detector_pixels(); ++p) {
              std::uint32_t value = 0;
              std::memcpy(&value, frame.data() + p * element_size, element_size);
              ASSERT_EQ(value, expected[i * g.detector_pixels() + p]) << options << " " << plan::to_string(g);
            }
          }
        }
      }
    }
    const auto binned = plan::resolve_plan({std::nullopt, 2, 1}, source.scan_rows, source.scan_cols,
                                           source.detector_rows, source.detector_cols);
    backend::Resident::EncodedChunks chunks;
    EXPECT_FALSE(resident->encode_export_chunks(binned, 0, 1, 4, chunks));
    EXPECT_THROW(resident->encode_export_chunks(binned, 0, 1, 3, chunks), Error);
  }
}

// --- faults ---------------------------------------------------------------------

class ExportFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = write_source(dir_, "src", "--scan 8x6 --det 12x10 --dtype uint16 --mask '1,1'");
    backend_ = cpu_backend();
    resident_ = load(*backend_, source_);
    out_ = dir_.file("out");
    fs::create_directory(out_);
    request_ = request_for(out_, RoundTrip{"", "", std::nullopt, 1, 1});
  }
  void TearDown() override {
    ::unsetenv(kFreeBytesTestVariable);
    ::unsetenv("QUANTEM_EXPORT_BATCH_DELAY_MS_FOR_TESTING");
  }

  // Runs the export; returns the error kind (nullopt on success) and its text.
  std::optional<ErrorKind> run(std::string* message = nullptr) {
    try {
      const ExportLayout layout = plan_export(source_, request_);
      export_plan(*resident_, source_, layout, request_, progress_);
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
};

// A chunk write that fails (here: past RLIMIT_FSIZE, EFBIG, as a full disk
// that statvfs did not foresee fails with ENOSPC) fails the export with a
// typed error naming the file, and nothing of it remains.
TEST(ExportWriteFailure, AChunkWriteThatFailsFailsTheExportAndLeavesNothing) {
  TempDir dir;
  const catalog::Acquisition source = write_source(dir, "big", "--scan 12x10 --det 64x64 --dtype uint16");
  auto backend = cpu_backend();
  auto resident = load(*backend, source);
  const std::string out = dir.file("out");
  fs::create_directory(out);
  const ExportRequest request = request_for(out, RoundTrip{"", "", std::nullopt, 1, 1});
  const ExportLayout layout = plan_export(source, request);
  ExportProgress progress;
  rlimit previous{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &previous), 0);
  const auto previous_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = previous;
  small.rlim_cur = 96 << 10;  // the files' first metadata fits, the chunks do not
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::optional<Error> failure;
  try {
    export_plan(*resident, source, layout, request, progress);
  } catch (const Error& e) {
    failure = e;
  }
  ::setrlimit(RLIMIT_FSIZE, &previous);
  ::signal(SIGXFSZ, previous_handler);
  ASSERT_TRUE(failure.has_value()) << "the export succeeded past the file size limit";
  EXPECT_EQ(failure->kind(), ErrorKind::payload_too_large) << failure->what();
  EXPECT_NE(std::string(failure->what()).find("File too large"), std::string::npos) << failure->what();
  EXPECT_EQ(progress.stage.load(), ExportStage::failed);
  EXPECT_TRUE(folder_entries(out).empty()) << folder_entries(out).front();
}

TEST_F(ExportFaults, NoExportFolderIsNotFound) {
  request_.output_folder = dir_.file("missing");
  std::string message;
  EXPECT_EQ(run(&message), ErrorKind::not_found);
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(dir_.file("missing")));
}

TEST_F(ExportFaults, UnwritableFolderIsAnIoErrorAndLeavesNothing) {
  // root passes access(W_OK) on a 0555 folder, so root gets procfs instead.
  if (::geteuid() == 0) {
    request_.output_folder = "/proc/self";
  } else {
    ::chmod(out_.c_str(), 0555);
  }
  std::string message;
  EXPECT_EQ(run(&message), ErrorKind::io) << message;
  ::chmod(out_.c_str(), 0755);
  EXPECT_TRUE(folder_entries(out_).empty());
}

TEST_F(ExportFaults, NotEnoughSpaceIsRefusedBeforeWriting) {
  ::setenv(kFreeBytesTestVariable, "4096", 1);
  std::string message;
  EXPECT_EQ(run(&message), ErrorKind::payload_too_large);
  EXPECT_NE(message.find("not enough free space"), std::string::npos) << message;
  EXPECT_TRUE(folder_entries(out_).empty());
}

TEST_F(ExportFaults, AnExistingExportIsNeverOverwritten) {
  ASSERT_EQ(run(), std::nullopt);
  const std::string name = folder_entries(out_).at(0);
  const std::string master = out_ + "/" + name + "/" + name + "_master.h5";
  const auto before = fs::last_write_time(master);
  std::string message;
  EXPECT_EQ(run(&message), ErrorKind::conflict);
  EXPECT_NE(message.find("already exists"), std::string::npos) << message;
  EXPECT_EQ(fs::last_write_time(master), before);
  EXPECT_EQ(folder_entries(out_), std::vector<std::string>{name});
}

TEST_F(ExportFaults, ACancelledExportLeavesNothing) {
  ::setenv("QUANTEM_EXPORT_BATCH_DELAY_MS_FOR_TESTING", "20", 1);
  request_.positions_per_batch = 1;
  std::thread canceller([&] {
    while (progress_.frames_done.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    progress_.cancel_requested = true;
  });
  std::string message;
  EXPECT_EQ(run(&message), ErrorKind::unavailable);
  canceller.join();
  EXPECT_NE(message.find("cancelled"), std::string::npos) << message;
  EXPECT_EQ(progress_.stage.load(), ExportStage::cancelled);
  EXPECT_LT(progress_.frames_done.load(), 48u);
  EXPECT_TRUE(folder_entries(out_).empty());
}

TEST_F(ExportFaults, ASourceChangedDuringTheExportFailsAndLeavesNothing) {
  ::setenv("QUANTEM_EXPORT_BATCH_DELAY_MS_FOR_TESTING", "10", 1);
  request_.positions_per_batch = 1;
  std::thread toucher([&] {
    while (progress_.frames_done.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // A new modification time: the files are no longer those the resident was loaded from.
    struct utimbuf times {1000000000, 1000000000};
    ::utime(source_.master_path.c_str(), &times);
  });
  std::string message;
  EXPECT_EQ(run(&message), ErrorKind::conflict);
  toucher.join();
  EXPECT_NE(message.find("changed during the export"), std::string::npos) << message;
  EXPECT_TRUE(folder_entries(out_).empty());
}

TEST_F(ExportFaults, AnAbandonedIncompleteFolderIsRemovedAndALiveOneIsLeftAlone) {
  const std::string name = plan_export(source_, request_).name;
  const std::string incomplete = out_ + "/." + name + kIncompleteSuffix;
  // A live writer: its marker written, the lock held.
  fs::create_directory(incomplete);
  const int fd = ::open((incomplete + "/.export-lock").c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const std::string marker = "quantem-gpu incomplete export\npid 1\nhost elsewhere\n";
  ASSERT_EQ(::write(fd, marker.data(), marker.size()), static_cast<ssize_t>(marker.size()));
  std::string message;
  EXPECT_EQ(run(&message), ErrorKind::conflict);
  EXPECT_NE(message.find("is running"), std::string::npos) << message;
  EXPECT_TRUE(fs::exists(incomplete));
  // Its writer died: the lock is free, so the next export removes it.
  ::close(fd);
  test::write_file(incomplete + "/" + name + "_data_000001.h5", {1, 2, 3});
  EXPECT_EQ(run(), std::nullopt);
  EXPECT_EQ(folder_entries(out_), std::vector<std::string>{name});
}

TEST_F(ExportFaults, APlanOutsideTheSourceIsABadRequest) {
  request_.plan.crop = plan::ScanRegion{0, 9, 0, 6};
  EXPECT_EQ(run(), ErrorKind::bad_request);
  EXPECT_TRUE(folder_entries(out_).empty());
}

// --- the export as this daemon sees it -------------------------------------------

TEST(ExportCatalog, TheExportIsLoadableAndItsProductsEqualThePlansOnTheSource) {
  TempDir dir;
  const catalog::Acquisition source =
      write_source(dir, "sample", "--scan 9x7 --det 12x11 --dtype uint16 --mask '0,0;0,1;1,0;1,1;6,6'");
  auto backend = cpu_backend();
  auto resident = load(*backend, source);
  fs::create_directory(dir.file("out"));
  const ExportRequest request = request_for(dir.file("out"), {"", "", plan::ScanRegion{1, 9, 2, 7}, 2, 2, 5});
  const ExportLayout layout = plan_export(source, request);
  ExportProgress progress;
  const ExportReport report = export_plan(*resident, source, layout, request, progress);

  const catalog::Acquisition exported = catalog::inspect_master(report.master_path);
  ASSERT_TRUE(exported.status.loadable) << exported.status.reason;
  EXPECT_EQ(exported.scan_rows, layout.geometry.scan_rows);
  EXPECT_EQ(exported.scan_cols, layout.geometry.scan_cols);
  EXPECT_EQ(exported.detector_rows, layout.geometry.detector_rows);
  EXPECT_EQ(exported.detector_cols, layout.geometry.detector_cols);
  EXPECT_EQ(exported.dtype, DType::uint32);
  EXPECT_EQ(exported.masked_pixel_count, 1u);  // the one bin whose four source pixels are all masked
  auto exported_resident = load(*backend, exported);
  const plan::PlanGeometry whole = plan::resolve_plan({}, exported.scan_rows, exported.scan_cols,
                                                      exported.detector_rows, exported.detector_cols);
  // A bright-field disk on the binned detector, the same bytes for both.
  std::vector<std::uint8_t> disk(layout.geometry.detector_pixels(), 0);
  for (std::uint64_t r = 0; r < layout.geometry.detector_rows; ++r) {
    for (std::uint64_t c = 0; c < layout.geometry.detector_cols; ++c) {
      const double dr = double(r) - 2.5, dc = double(c) - 2.5;
      disk[r * layout.geometry.detector_cols + c] = dr * dr + dc * dc <= 4.0;
    }
  }
  EXPECT_EQ(exported_resident->masked_sum(whole, disk), resident->masked_sum(layout.geometry, disk));
  EXPECT_EQ(exported_resident->pattern_sum(whole), resident->pattern_sum(layout.geometry));
  EXPECT_EQ(exported_resident->frame(whole, 3, 1), resident->frame(layout.geometry, 3, 1));
}

}  // namespace
}  // namespace quantem::exporter
