// read_master_metadata in-process: the well-known fields of a synth
// acquisition (values synth writes, two of them given), unit conversion and
// what does not count (0 for "not set", an unknown unit), every scalar
// attribute and dataset without following external links, the limits on a
// crafted master, and the typed errors.
#include <hdf5.h>

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "quantem/catalog/master_metadata.hpp"
#include "quantem/core/error.hpp"
#include "quantem/synth/synth.hpp"
#include "test_support.hpp"

using namespace quantem;
using namespace quantem::catalog;

namespace {

std::map<std::string, MetadataField> fields_of(const MasterMetadata& metadata) {
  std::map<std::string, MetadataField> fields;
  for (const auto& field : metadata.fields) fields[field.name] = field;
  return fields;
}

const MetadataEntry* entry_of(const MasterMetadata& metadata, const std::string& path) {
  for (const auto& entry : metadata.entries)
    if (entry.path == path) return &entry;
  return nullptr;
}

std::string synth_master(const std::string& folder) {
  synth::SynthOptions options;
  options.output_dir = folder;
  options.prefix = "alpha";
  options.scan_rows = 2;
  options.scan_cols = 3;
  options.detector_rows = 8;
  options.detector_cols = 8;
  options.threads = 1;
  options.high_tension_V = 200000.0;
  options.camera_length_m = 0.245;
  return synth::write_acquisition(options).master_path;
}

void write_double(hid_t parent, const char* name, double value, const char* units) {
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t dataset = H5Dcreate2(parent, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &value);
  if (units) {
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, std::string(units).size());
    const hid_t attribute = H5Acreate2(dataset, "units", type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attribute, type, units);
    H5Aclose(attribute);
    H5Tclose(type);
  }
  H5Dclose(dataset);
  H5Sclose(space);
}

void write_text_attribute(hid_t object, const char* name, const std::string& text) {
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, text.size());
  const hid_t attribute = H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attribute, type, text.data());
  H5Aclose(attribute);
  H5Tclose(type);
  H5Sclose(space);
}

hid_t create_groups(hid_t file, const std::string& path) {
  const hid_t list = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(list, 1);
  const hid_t group = H5Gcreate2(file, path.c_str(), list, H5P_DEFAULT, H5P_DEFAULT);
  H5Pclose(list);
  return group;
}

}  // namespace

TEST(MasterMetadata, WellKnownFieldsOfASynthAcquisition) {
  test::TempDir dir;
  const MasterMetadata metadata = read_master_metadata(synth_master(dir.path()));
  EXPECT_EQ(metadata.sidecar_name, "alpha.h5");
  auto fields = fields_of(metadata);
  const std::map<std::string, std::pair<double, std::string>> numbers = {
      {"high_tension", {200000.0, "V"}}, {"camera_length", {0.245, "m"}},     {"dwell_time", {1e-4, "s"}},
      {"count_time", {9.95e-5, "s"}},    {"frame_time", {1e-4, "s"}},         {"sensor_thickness", {1.5e-3, "m"}},
      {"x_pixel_size", {1e-4, "m"}},     {"y_pixel_size", {1e-4, "m"}},       {"threshold_energy", {17500.0, "eV"}},
      {"magnification", {2.0e7, ""}},
  };
  for (const auto& [name, expected] : numbers) {
    ASSERT_TRUE(fields.count(name)) << name;
    EXPECT_EQ(fields[name].value.kind, MetadataValue::Kind::real) << name;
    EXPECT_EQ(fields[name].value.real, expected.first) << name;
    EXPECT_EQ(fields[name].unit, expected.second) << name;
  }
  EXPECT_EQ(fields["high_tension"].source, "alpha.h5:/STEM Metadata@High Tension");
  EXPECT_EQ(fields["count_time"].source, "alpha_master.h5:/entry/instrument/detector/count_time");
  EXPECT_EQ(fields["detector"].value.text, "Dectris ARINA CZT");
  EXPECT_EQ(fields["detector_number"].value.text, "SYNTH-0001");
  EXPECT_EQ(fields["sensor_material"].value.text, "CZT");
  EXPECT_EQ(fields["trigger_mode"].value.text, "exts");
  EXPECT_EQ(fields["bit_depth_image"].value.kind, MetadataValue::Kind::integer);
  EXPECT_EQ(fields["bit_depth_image"].value.integer, 16);
  EXPECT_FALSE(fields.count("detector_distance"));  // synth writes none
  EXPECT_FALSE(fields.count("wavelength"));
  // The fields come in the table's order.
  std::size_t position = 0;
  for (const auto& spec : master_metadata_fields()) {
    if (position < metadata.fields.size() && metadata.fields[position].name == spec.name) ++position;
  }
  EXPECT_EQ(position, metadata.fields.size());
}

TEST(MasterMetadata, EveryScalarAttributeAndDatasetWithoutTheFrames) {
  test::TempDir dir;
  const MasterMetadata metadata = read_master_metadata(synth_master(dir.path()));
  EXPECT_FALSE(metadata.entries_truncated);
  const MetadataEntry* count_time = entry_of(metadata, "/entry/instrument/detector/count_time");
  ASSERT_NE(count_time, nullptr);
  EXPECT_EQ(count_time->file, "alpha_master.h5");
  EXPECT_EQ(count_time->unit, "s");
  EXPECT_EQ(count_time->value.real, 9.95e-5);
  EXPECT_EQ(entry_of(metadata, "/entry/instrument/detector/count_time@units"), nullptr);  // the unit, not an entry
  const MetadataEntry* nx_class = entry_of(metadata, "/entry/instrument/detector@NX_class");
  ASSERT_NE(nx_class, nullptr);
  EXPECT_EQ(nx_class->value.text, "NXdetector");
  const MetadataEntry* high_tension = entry_of(metadata, "/STEM Metadata@High Tension");
  ASSERT_NE(high_tension, nullptr);
  EXPECT_EQ(high_tension->file, "alpha.h5");
  EXPECT_EQ(entry_of(metadata, "/entry/instrument/detector/detectorSpecific/pixel_mask"), nullptr);  // not a scalar
  for (const auto& entry : metadata.entries) {
    EXPECT_NE(entry.path.rfind("/entry/data/data_", 0), 0u) << "followed an external link: " << entry.path;
  }
}

TEST(MasterMetadata, UnitsAreConvertedAndUnsetOrUnknownOnesLeftOut) {
  test::TempDir dir;
  const std::string path = dir.file("units_master.h5");
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t detector = create_groups(file, "/entry/instrument/detector");
  write_double(detector, "count_time", 250.0, "us");
  write_double(detector, "frame_time", 0.5, "ms");
  write_double(detector, "sensor_thickness", 0.75, "mm");
  write_double(detector, "x_pixel_size", 55.0, "furlong");  // not a unit this knows: left out
  write_double(detector, "detector_distance", 0.0, "m");     // 0: not set
  write_double(detector, "threshold_energy", 8.5, "keV");
  H5Gclose(detector);
  const hid_t beam = create_groups(file, "/entry/instrument/beam");
  write_double(beam, "incident_wavelength", 0.0197, "angstrom");
  write_double(beam, "incident_energy", 80.0, "keV");
  H5Gclose(beam);
  H5Fclose(file);

  auto fields = fields_of(read_master_metadata(path));
  EXPECT_DOUBLE_EQ(fields["count_time"].value.real, 250e-6);
  EXPECT_DOUBLE_EQ(fields["frame_time"].value.real, 0.5e-3);
  EXPECT_DOUBLE_EQ(fields["sensor_thickness"].value.real, 0.75e-3);
  EXPECT_DOUBLE_EQ(fields["threshold_energy"].value.real, 8500.0);
  EXPECT_EQ(fields["threshold_energy"].unit, "eV");
  EXPECT_DOUBLE_EQ(fields["high_tension"].value.real, 80000.0);
  EXPECT_EQ(fields["high_tension"].source, "units_master.h5:/entry/instrument/beam/incident_energy");
  EXPECT_EQ(fields["wavelength"].value.real, 0.0197);
  EXPECT_EQ(fields["wavelength"].unit, "Å");
  EXPECT_FALSE(fields.count("x_pixel_size"));
  EXPECT_FALSE(fields.count("detector_distance"));
  EXPECT_EQ(unit_factor("kV", "V"), 1e3);
  EXPECT_EQ(unit_factor("s", "m"), 0.0);
}

TEST(MasterMetadata, LimitsHoldOnACraftedMaster) {
  test::TempDir dir;
  const std::string path = dir.file("crafted_master.h5");
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t many = create_groups(file, "/entry/many");
  for (int i = 0; i < 600; ++i) write_text_attribute(many, ("a" + std::to_string(10000 + i)).c_str(), "x");
  H5Gclose(many);
  const hid_t root = H5Gopen2(file, "/", H5P_DEFAULT);
  write_text_attribute(root, "long", std::string(5000, 'y'));
  H5Gclose(root);
  std::string deep = "/deep";
  for (int i = 0; i < 20; ++i) deep += "/g";
  H5Gclose(create_groups(file, deep));
  H5Fclose(file);

  const MasterMetadata metadata = read_master_metadata(path);
  EXPECT_TRUE(metadata.entries_truncated);
  EXPECT_LE(metadata.entries.size(), kMaxMetadataEntriesPerFile);
  const MetadataEntry* long_text = entry_of(metadata, "/@long");
  ASSERT_NE(long_text, nullptr);
  EXPECT_EQ(long_text->value.text, std::string(kMaxMetadataTextBytes, 'y'));
  EXPECT_TRUE(long_text->value.truncated);
}

TEST(MasterMetadata, TypedErrorsForAMissingOrUnreadableMaster) {
  test::TempDir dir;
  try {
    read_master_metadata(dir.file("absent_master.h5"));
    ADD_FAILURE() << "expected not_found";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::not_found) << error.what();
  }
  test::write_file(dir.file("junk_master.h5"), std::vector<std::uint8_t>(4096, 7));
  try {
    read_master_metadata(dir.file("junk_master.h5"));
    ADD_FAILURE() << "expected corrupt_data";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::corrupt_data) << error.what();
    EXPECT_NE(std::string(error.what()).find("not readable HDF5"), std::string::npos) << error.what();
  }
}
