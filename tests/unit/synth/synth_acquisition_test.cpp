// write_acquisition end to end, checked by an independent reader: h5py + the
// official bitshuffle filter (tests/support/python/synth_inspect.py).
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/core/error.hpp"
#include "quantem/synth/synth.hpp"
#include "test_support.hpp"

namespace quantem::synth {
namespace {

using nlohmann::json;
using quantem::test::TempDir;

SynthOptions tiny_options(const std::string& folder) {
  SynthOptions options;
  options.output_dir = folder;
  options.scan_rows = 4;
  options.scan_cols = 6;
  options.detector_rows = 24;
  options.detector_cols = 32;
  options.seed = 5;
  options.threads = 2;
  return options;
}

json inspect(const SynthReport& report) {
  const auto result = quantem::test::run_python_script("synth_inspect.py", "'" + report.master_path + "'");
  if (result.status != 0) return json::object();
  return json::parse(result.output);
}

std::string file_bytes_of(const std::string& path) {
  const std::vector<std::uint8_t> bytes = quantem::test::read_file(path);
  return std::string(bytes.begin(), bytes.end());
}

TEST(SynthAcquisition, WritesArinaMasterSidecarAndLinkedShard) {
  TempDir folder;
  SynthOptions options = tiny_options(folder.path());
  const SynthReport report = write_acquisition(options);
  EXPECT_EQ(report.master_path, folder.file("synth_master.h5"));
  EXPECT_EQ(report.frames, 24u);
  EXPECT_EQ(report.dense_bytes, 24u * 24u * 32u * 2u);
  EXPECT_GT(report.stored_bytes, 0u);
  EXPECT_GT(report.seconds, 0.0);

  const json out = inspect(report);
  ASSERT_TRUE(out.contains("shards"));
  EXPECT_EQ(out["data"]["files"],
            json({"synth.h5", "synth_data_000001.h5", "synth_master.h5"}));  // nothing partial left behind
  EXPECT_EQ(out["signal"], "data_000001");

  ASSERT_EQ(out["shards"].size(), 1u);  // frames_per_shard 0: one data file
  const json& shard = out["shards"][0];
  EXPECT_EQ(shard["file"], "synth_data_000001.h5");  // a relative basename
  EXPECT_EQ(shard["path"], "/entry/data/data");
  EXPECT_EQ(shard["shape"], json({24, 24, 32}));
  EXPECT_EQ(shard["maxshape"], json({-1, 24, 32}));
  EXPECT_EQ(shard["chunks"], json({1, 24, 32}));
  EXPECT_EQ(shard["dtype"], "<u2");
  EXPECT_EQ(shard["filter_count"], 1);
  EXPECT_EQ(shard["filter_id"], 32008);
  EXPECT_EQ(shard["filter_flags"], 0);  // mandatory, like the real Arina file
  EXPECT_EQ(shard["cd_values"], json({0, 3, 2, 0, 2}));
  EXPECT_EQ(shard["fill_value"], 65535);
  EXPECT_EQ(shard["image_nr_low"], 1);
  EXPECT_EQ(shard["image_nr_high"], 24);
  EXPECT_EQ(shard["image_nr_dtype"], "<u8");
  EXPECT_EQ(shard["stored_bytes"], report.stored_bytes);
  EXPECT_EQ(shard["chunks_match_official_encoder"], true);

  const json& detector = out["detector"];
  EXPECT_EQ(detector["description"]["value"], "Dectris ARINA CZT");
  EXPECT_EQ(detector["bit_depth_image"]["value"], 16);
  EXPECT_EQ(detector["bit_depth_image"]["dtype"], "<u2");
  EXPECT_EQ(detector["bit_depth_readout"]["value"], 16);
  EXPECT_EQ(detector["saturation_value"]["value"], 65534);
  EXPECT_EQ(detector["saturation_value"]["dtype"], "<i8");
  EXPECT_EQ(detector["countrate_correction_count_cutoff"]["value"], 65534);
  EXPECT_EQ(detector["countrate_correction_count_cutoff"]["dtype"], "<u4");
  EXPECT_EQ(detector["x_pixel_size"]["dtype"], "<f8");
  EXPECT_EQ(detector["count_time"]["dtype"], "<f8");
  EXPECT_EQ(detector["frame_time"]["dtype"], "<f8");
  EXPECT_EQ(detector["nimages"]["value"], 1);
  EXPECT_EQ(detector["nimages"]["dtype"], "<u8");
  EXPECT_EQ(detector["ntrigger"]["value"], 24);
  EXPECT_EQ(detector["ntrigger"]["dtype"], "<u8");
  EXPECT_EQ(detector["trigger_mode"]["value"], "exts");
  EXPECT_EQ(detector["x_pixels_in_detector"]["value"], 32);
  EXPECT_EQ(detector["y_pixels_in_detector"]["value"], 24);
  EXPECT_EQ(detector["compression"]["value"], "bslz4");
  EXPECT_EQ(detector["number_of_excluded_pixels"]["value"], 3);
  EXPECT_EQ(detector["eiger_fw_version"]["value"], "synthetic-quantem");

  const json& mask = out["pixel_mask"];
  EXPECT_EQ(mask["dtype"], "<u4");
  EXPECT_EQ(mask["shape"], json({24, 32}));
  EXPECT_EQ(mask["contiguous"], true);
  EXPECT_EQ(mask["filter_count"], 0);
  EXPECT_EQ(mask["bad"].size(), 3u);

  const json& stem = out["stem_metadata"];
  EXPECT_EQ(stem["NumPixelsX"]["value"], 6);
  EXPECT_EQ(stem["NumPixelsX"]["dtype"], "<i8");
  EXPECT_EQ(stem["NumPixelsY"]["value"], 4);
  EXPECT_EQ(stem["NumPixelsY"]["dtype"], "<i8");
  EXPECT_EQ(stem["NumPixelsPrescan"]["value"], json({0}));
  EXPECT_EQ(stem["NumPixelsPrescan"]["dtype"], "<u4");
  EXPECT_TRUE(stem.contains("Pixel Size"));
  EXPECT_TRUE(stem.contains("High Tension"));
  EXPECT_TRUE(stem.contains("Camera Length"));

  EXPECT_EQ(out["data"]["shape"], json({24, 24, 32}));
  EXPECT_EQ(out["data"]["dtype"], "<u2");
  EXPECT_EQ(out["data"]["bad_pixels_all_ones"], true);
  EXPECT_EQ(out["data"]["all_ones_unmasked"], 0);
}

TEST(SynthAcquisition, SplitsANonSquareScanIntoShardsWithImageNumbers) {
  TempDir folder;
  SynthOptions options = tiny_options(folder.path());
  options.scan_rows = 5;
  options.scan_cols = 7;
  options.frames_per_shard = 10;
  options.prefix = "scan5x7";
  const SynthReport report = write_acquisition(options);
  EXPECT_EQ(report.master_path, folder.file("scan5x7_master.h5"));
  const json out = inspect(report);
  ASSERT_TRUE(out.contains("shards"));
  ASSERT_EQ(out["shards"].size(), 4u);
  const std::uint64_t expected_frames[] = {10, 10, 10, 5};
  std::uint64_t stored = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    const json& shard = out["shards"][i];
    char name[64];
    std::snprintf(name, sizeof name, "scan5x7_data_%06zu.h5", i + 1);
    EXPECT_EQ(shard["file"], name);
    EXPECT_EQ(shard["shape"][0], expected_frames[i]);
    EXPECT_EQ(shard["image_nr_low"], 10 * i + 1);
    EXPECT_EQ(shard["image_nr_high"], 10 * i + expected_frames[i]);
    EXPECT_EQ(shard["chunks_match_official_encoder"], true);
    stored += shard["stored_bytes"].get<std::uint64_t>();
  }
  EXPECT_EQ(stored, report.stored_bytes);
  EXPECT_EQ(out["data"]["shape"], json({35, 24, 32}));
  EXPECT_EQ(out["detector"]["ntrigger"]["value"], 35);
  EXPECT_EQ(out["stem_metadata"]["NumPixelsX"]["value"], 7);
  EXPECT_EQ(out["stem_metadata"]["NumPixelsY"]["value"], 5);
  EXPECT_TRUE(quantem::test::file_exists(folder.file("scan5x7.h5")));
}

TEST(SynthAcquisition, SameSeedGivesIdenticalFilesForOneAndTwoThreads) {
  TempDir one_thread, two_threads, other_seed;
  SynthOptions options = tiny_options(one_thread.path());
  options.frames_per_shard = 7;
  options.threads = 1;
  write_acquisition(options);
  options.output_dir = two_threads.path();
  options.threads = 2;
  write_acquisition(options);
  options.output_dir = other_seed.path();
  options.seed += 1;
  write_acquisition(options);

  for (const char* name : {"synth_master.h5", "synth.h5", "synth_data_000001.h5", "synth_data_000002.h5",
                           "synth_data_000003.h5", "synth_data_000004.h5"}) {
    SCOPED_TRACE(name);
    const std::string bytes = file_bytes_of(one_thread.file(name));
    EXPECT_FALSE(bytes.empty());
    EXPECT_TRUE(bytes == file_bytes_of(two_threads.file(name)));
  }
  EXPECT_FALSE(file_bytes_of(one_thread.file("synth_data_000001.h5")) ==
               file_bytes_of(other_seed.file("synth_data_000001.h5")));
}

// Every object header, the root group's included, is written without times:
// a file stamped with its creation second differs from the same options'
// file written a second later (the flaky identical-files check above).
TEST(SynthAcquisition, NoObjectCarriesAModificationTime) {
  TempDir folder;
  write_acquisition(tiny_options(folder.path()));
  for (const char* name : {"synth_master.h5", "synth.h5", "synth_data_000001.h5"}) {
    SCOPED_TRACE(name);
    const hid_t file = H5Fopen(folder.file(name).c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    struct Visit {
      int objects = 0;
      std::vector<std::string> stamped;
    } visit;
    const auto record = [](hid_t, const char* path, const H5O_info_t* info, void* data) -> herr_t {
      auto* seen = static_cast<Visit*>(data);
      ++seen->objects;
      if (info->atime != 0 || info->mtime != 0 || info->ctime != 0 || info->btime != 0)
        seen->stamped.push_back(path);
      return 0;
    };
    EXPECT_GE(H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_NATIVE, record, &visit, H5O_INFO_TIME), 0);
    EXPECT_GT(visit.objects, 1);
    EXPECT_EQ(visit.stamped, std::vector<std::string>{});
    H5Fclose(file);
  }
}

TEST(SynthAcquisition, WritesEveryDtypeWithoutSilentOverflow) {
  struct Case {
    DType dtype;
    Preset preset;
    const char* numpy;
    int bits;
    std::uint64_t saturation;
  };
  const Case cases[] = {
      {DType::uint8, Preset::realistic, "|u1", 8, 254},
      {DType::uint8, Preset::dense, "|u1", 8, 254},
      {DType::uint16, Preset::sparse, "<u2", 16, 65534},
      {DType::uint32, Preset::dense, "<u4", 32, 4294967294ull},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " preset " + std::to_string(static_cast<int>(c.preset)));
    TempDir folder;
    SynthOptions options = tiny_options(folder.path());
    options.dtype = c.dtype;
    options.preset = c.preset;
    const json out = inspect(write_acquisition(options));
    ASSERT_TRUE(out.contains("shards"));
    const json& shard = out["shards"][0];
    EXPECT_EQ(shard["dtype"], c.numpy);
    EXPECT_EQ(shard["cd_values"], json({0, 3, c.bits / 8, 0, 2}));
    EXPECT_EQ(shard["chunks_match_official_encoder"], true);
    EXPECT_EQ(shard["fill_value"], (1ull << c.bits) - 1);
    EXPECT_EQ(out["detector"]["bit_depth_image"]["value"], c.bits);
    EXPECT_EQ(out["detector"]["saturation_value"]["value"], c.saturation);
    EXPECT_EQ(out["data"]["bad_pixels_all_ones"], true);
    EXPECT_EQ(out["data"]["all_ones_unmasked"], 0);
    const auto largest = out["data"]["max_unmasked"].get<std::uint64_t>();
    EXPECT_LE(largest, c.saturation);
    if (c.preset == Preset::dense && c.dtype == DType::uint8) {
      EXPECT_EQ(largest, 254u);  // clamped
    }
    if (c.preset == Preset::dense && c.dtype == DType::uint32) {
      EXPECT_GT(largest, 65535u);
    }
    if (c.preset == Preset::sparse) {
      EXPECT_LT(largest, 30u);
    }
  }
}

TEST(SynthAcquisition, BadPixelsAreMaskedAndHoldAllOnesInEveryFrame) {
  TempDir folder;
  SynthOptions options = tiny_options(folder.path());
  options.bad_pixels = 7;
  const json out = inspect(write_acquisition(options));
  ASSERT_TRUE(out.contains("pixel_mask"));
  ASSERT_EQ(out["pixel_mask"]["bad"].size(), 7u);
  for (const json& pixel : out["pixel_mask"]["bad"]) {
    const auto bits = pixel[2].get<std::uint32_t>();
    EXPECT_TRUE(bits == 1u || bits == 2u) << pixel;  // gap or dead
  }
  EXPECT_EQ(out["detector"]["number_of_excluded_pixels"]["value"], 7);
  EXPECT_EQ(out["data"]["bad_pixels_all_ones"], true);
  EXPECT_EQ(out["data"]["all_ones_unmasked"], 0);
  // The all-ones values are exactly the bad pixels' contribution to the sum.
  EXPECT_EQ(out["data"]["sum"].get<std::uint64_t>() - out["data"]["sum_unmasked"].get<std::uint64_t>(),
            24u * 7u * 65535u);
}

TEST(SynthAcquisition, BrightFieldDiskSitsAtTheDetectorCentreAndImagesShowStructure) {
  TempDir folder;
  SynthOptions options = tiny_options(folder.path());
  options.scan_rows = 12;
  options.scan_cols = 12;
  options.detector_rows = 64;
  options.detector_cols = 80;
  const json out = inspect(write_acquisition(options));
  ASSERT_TRUE(out.contains("physics"));
  const json& physics = out["physics"];
  EXPECT_NEAR(physics["bright_centroid"][0].get<double>(), 31.5, 1.5);
  EXPECT_NEAR(physics["bright_centroid"][1].get<double>(), 39.5, 1.5);
  const double radius = 64.0 / 6.2;
  EXPECT_NEAR(physics["bright_area"].get<double>(), M_PI * radius * radius, 0.25 * M_PI * radius * radius);
  EXPECT_GT(physics["bf_relative_std"].get<double>(), 0.03);
  EXPECT_GT(physics["adf_relative_std"].get<double>(), 0.03);
  EXPECT_GT(physics["com_row_std"].get<double>() + physics["com_col_std"].get<double>(), 0.2);
}

TEST(SynthAcquisition, RealisticPresetCompressesLikeRealArinaData) {
  for (const std::uint64_t seed : {1ull, 2ull, 3ull}) {
    SCOPED_TRACE(seed);
    TempDir folder;
    SynthOptions options = tiny_options(folder.path());
    options.scan_rows = 8;
    options.scan_cols = 8;
    options.detector_rows = 192;
    options.detector_cols = 192;
    options.seed = seed;
    const SynthReport report = write_acquisition(options);
    const double ratio = static_cast<double>(report.dense_bytes) / static_cast<double>(report.stored_bytes);
    EXPECT_GE(ratio, 5.0);
    EXPECT_LE(ratio, 8.0);
  }
}

TEST(SynthAcquisition, UsesTheV1BTreeChunkIndexOfRealArinaFiles) {
  TempDir folder;
  write_acquisition(tiny_options(folder.path()));
  const hid_t file = H5Fopen(folder.file("synth_data_000001.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t dataset = H5Dopen2(file, "/entry/data/data", H5P_DEFAULT);
  ASSERT_GE(dataset, 0);
  H5D_chunk_index_t index_type = H5D_CHUNK_IDX_NTYPES;
  EXPECT_GE(H5Dget_chunk_index_type(dataset, &index_type), 0);
  EXPECT_EQ(index_type, H5D_CHUNK_IDX_BTREE);
  unsigned super_version = 99;
  H5F_info2_t info{};
  EXPECT_GE(H5Fget_info2(file, &info), 0);
  super_version = info.super.version;
  EXPECT_EQ(super_version, 2u);  // as in the real Arina files

  // write_acquisition's write-only 32008 class is gone: reading in this process
  // goes through the official plugin (HDF5_PLUGIN_PATH) again.
  std::vector<std::uint16_t> frames(24 * 24 * 32, 0);
  EXPECT_GE(H5Dread(dataset, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, frames.data()), 0);
  std::uint64_t sum = 0;
  for (const std::uint16_t value : frames) sum += value;
  EXPECT_GT(sum, 0u);
  H5Dclose(dataset);
  H5Fclose(file);
}

TEST(SynthAcquisition, HandlesDetectorsWhoseSizeIsNotAMultipleOfEight) {
  TempDir folder;
  SynthOptions options = tiny_options(folder.path());
  options.detector_rows = 17;
  options.detector_cols = 23;  // 391 elements: a raw tail of 7 after the bitshuffled blocks
  options.dtype = DType::uint32;
  const json out = inspect(write_acquisition(options));
  ASSERT_TRUE(out.contains("shards"));
  EXPECT_EQ(out["shards"][0]["shape"], json({24, 17, 23}));
  EXPECT_EQ(out["shards"][0]["chunks_match_official_encoder"], true);
  EXPECT_EQ(out["data"]["bad_pixels_all_ones"], true);
  EXPECT_GT(out["data"]["sum_unmasked"].get<std::uint64_t>(), 0u);
}

TEST(SynthAcquisition, RejectsInvalidOptionsAsBadRequest) {
  TempDir folder;
  const auto expect_bad_request = [](const SynthOptions& options, const char* why) {
    try {
      write_acquisition(options);
      ADD_FAILURE() << "expected bad_request: " << why;
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::bad_request) << why << ": " << error.what();
    }
  };
  SynthOptions options = tiny_options(folder.path());
  options.scan_cols = 0;
  expect_bad_request(options, "empty scan");
  options = tiny_options(folder.path());
  options.detector_rows = 0;
  expect_bad_request(options, "empty detector");
  options = tiny_options(folder.path());
  options.prefix = "a/b";
  expect_bad_request(options, "prefix with a slash");
  options = tiny_options(folder.path());
  options.prefix = "";
  expect_bad_request(options, "empty prefix");
  options = tiny_options(folder.path());
  options.output_dir = "";
  expect_bad_request(options, "empty output folder");
  options = tiny_options(folder.path());
  options.bad_pixels = 24 * 32;
  expect_bad_request(options, "too many bad pixels");
  options = tiny_options(folder.path());
  options.scan_rows = 2000;
  options.scan_cols = 1000;
  options.frames_per_shard = 1;
  expect_bad_request(options, "too many data files");
  options = tiny_options(folder.path());
  options.scan_sampling_A = 0.0;
  expect_bad_request(options, "a zero scan sampling");
  options = tiny_options(folder.path());
  options.k_pixel_size_mrad = std::nan("");
  expect_bad_request(options, "a NaN detector sampling");
  EXPECT_TRUE(std::filesystem::is_empty(folder.path()));
}

// The entry/data attribute `name` of a master as a double, or NaN when absent.
double data_attribute(const std::string& master, const char* name) {
  double value = std::nan("");
  const hid_t file = H5Fopen(master.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return value;
  if (H5Aexists_by_name(file, "entry/data", name, H5P_DEFAULT) > 0) {
    const hid_t attribute = H5Aopen_by_name(file, "entry/data", name, H5P_DEFAULT, H5P_DEFAULT);
    if (H5Aread(attribute, H5T_NATIVE_DOUBLE, &value) < 0) value = std::nan("");
    H5Aclose(attribute);
  }
  H5Fclose(file);
  return value;
}

TEST(SynthAcquisition, WritesCalibrationsOnlyWhenGiven) {
  TempDir plain_folder;
  const SynthReport plain = write_acquisition(tiny_options(plain_folder.path()));
  EXPECT_TRUE(std::isnan(data_attribute(plain.master_path, "scan_sampling_A")));
  EXPECT_TRUE(std::isnan(data_attribute(plain.master_path, "k_pixel_size_mrad")));
  TempDir calibrated_folder;
  SynthOptions options = tiny_options(calibrated_folder.path());
  options.scan_sampling_A = 2.5;
  options.k_pixel_size_mrad = 0.75;
  const SynthReport calibrated = write_acquisition(options);
  EXPECT_EQ(data_attribute(calibrated.master_path, "scan_sampling_A"), 2.5);
  EXPECT_EQ(data_attribute(calibrated.master_path, "k_pixel_size_mrad"), 0.75);
}

// A double attribute `name` of the object `object` in `file_path`, or NaN when absent.
double attribute_of(const std::string& file_path, const char* object, const char* name) {
  double value = std::nan("");
  const hid_t file = H5Fopen(file_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return value;
  if (H5Aexists_by_name(file, object, name, H5P_DEFAULT) > 0) {
    const hid_t attribute = H5Aopen_by_name(file, object, name, H5P_DEFAULT, H5P_DEFAULT);
    if (H5Aread(attribute, H5T_NATIVE_DOUBLE, &value) < 0) value = std::nan("");
    H5Aclose(attribute);
  }
  H5Fclose(file);
  return value;
}

// A scalar double dataset of a file, or NaN.
double dataset_of(const std::string& file_path, const char* path) {
  double value = std::nan("");
  const hid_t file = H5Fopen(file_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return value;
  const hid_t dataset = H5Dopen2(file, path, H5P_DEFAULT);
  if (dataset >= 0) {
    if (H5Dread(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &value) < 0) value = std::nan("");
    H5Dclose(dataset);
  }
  H5Fclose(file);
  return value;
}

TEST(SynthAcquisition, WritesTheGivenHighTensionAndCameraLength) {
  const char* specific_energy = "/entry/instrument/detector/detectorSpecific/photon_energy";
  TempDir plain_folder;
  const SynthReport plain = write_acquisition(tiny_options(plain_folder.path()));
  EXPECT_EQ(attribute_of(plain_folder.file("synth.h5"), "STEM Metadata", "High Tension"), 300000.0);
  EXPECT_EQ(attribute_of(plain_folder.file("synth.h5"), "STEM Metadata", "Camera Length"), 0.115);
  EXPECT_EQ(dataset_of(plain.master_path, specific_energy), 300000.0);
  TempDir folder;
  SynthOptions options = tiny_options(folder.path());
  options.high_tension_V = 200000.0;
  options.camera_length_m = 0.245;
  const SynthReport given = write_acquisition(options);
  EXPECT_EQ(attribute_of(folder.file("synth.h5"), "STEM Metadata", "High Tension"), 200000.0);
  EXPECT_EQ(attribute_of(folder.file("synth.h5"), "STEM Metadata", "Camera Length"), 0.245);
  EXPECT_EQ(dataset_of(given.master_path, specific_energy), 200000.0);
  options.high_tension_V = -1.0;
  EXPECT_THROW(write_acquisition(options), Error);
  options.high_tension_V.reset();
  options.camera_length_m = 0.0;
  EXPECT_THROW(write_acquisition(options), Error);
}

TEST(SynthAcquisition, ReportsIoErrorsForAnUnwritableOutput) {
  TempDir folder;
  quantem::test::write_file(folder.file("plain_file"), {1, 2, 3});
  SynthOptions options = tiny_options(folder.file("plain_file") + "/inside");
  try {
    write_acquisition(options);
    ADD_FAILURE() << "expected an io error for a folder below a regular file";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::io) << error.what();
  }

  // HDF5 cannot create a data file where a folder of that name exists.
  std::filesystem::create_directories(folder.file("blocked/synth_data_000001.h5"));
  options = tiny_options(folder.file("blocked"));
  try {
    write_acquisition(options);
    ADD_FAILURE() << "expected an io error when HDF5 cannot create the data file";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::io) << error.what();
    EXPECT_NE(std::string(error.what()).find("synth_data_000001.h5"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(quantem::test::file_exists(folder.file("blocked/synth_master.h5")));
}

}  // namespace
}  // namespace quantem::synth
