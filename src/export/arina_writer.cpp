#include "quantem/export/arina_writer.hpp"
#include "quantem/export/deferred_raw_writes.hpp"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "recording_file_driver.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/version.hpp"

namespace quantem::arina {

namespace {

[[noreturn]] void fail(const std::string& what) { hdf5::throw_error_with_trace(what); }

hid_t check_id(hid_t id, const std::string& what) {
  if (id < 0) fail(what);
  return id;
}

void check_status(herr_t status, const std::string& what) {
  if (status < 0) fail(what);
}

hdf5::PropertyList make_property_list(hid_t property_class) {
  return hdf5::PropertyList(check_id(H5Pcreate(property_class), "H5Pcreate"));
}

// Creation property lists without modification times, so the same options
// always give byte-identical files.
hdf5::PropertyList make_creation_list(hid_t property_class) {
  hdf5::PropertyList list = make_property_list(property_class);
  check_status(H5Pset_obj_track_times(list.id(), false), "H5Pset_obj_track_times");
  return list;
}

hdf5::Dataspace make_scalar_space() { return hdf5::Dataspace(check_id(H5Screate(H5S_SCALAR), "H5Screate")); }

hdf5::Dataspace make_simple_space(std::initializer_list<hsize_t> dims) {
  const std::vector<hsize_t> shape(dims);
  return hdf5::Dataspace(
      check_id(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr), "H5Screate_simple"));
}

// Fixed-length, NUL-terminated ASCII, sized to the text plus its NUL, like the
// strings DECTRIS writes.
hdf5::Datatype make_string_type(const std::string& text) {
  hdf5::Datatype type(check_id(H5Tcopy(H5T_C_S1), "H5Tcopy"));
  check_status(H5Tset_size(type.id(), text.size() + 1), "H5Tset_size");
  check_status(H5Tset_strpad(type.id(), H5T_STR_NULLTERM), "H5Tset_strpad");
  check_status(H5Tset_cset(type.id(), H5T_CSET_ASCII), "H5Tset_cset");
  return type;
}

hid_t file_type_of(DType dtype) {
  switch (dtype) {
    case DType::uint8: return H5T_STD_U8LE;
    case DType::uint16: return H5T_STD_U16LE;
    case DType::uint32: return H5T_STD_U32LE;
  }
  return H5T_STD_U16LE;
}

hid_t memory_type_of(DType dtype) {
  switch (dtype) {
    case DType::uint8: return H5T_NATIVE_UINT8;
    case DType::uint16: return H5T_NATIVE_UINT16;
    case DType::uint32: return H5T_NATIVE_UINT32;
  }
  return H5T_NATIVE_UINT16;
}

// The filter function of our 32008 class: chunks only ever arrive through
// H5Dwrite_chunk, so any call means someone tried to filter data in-process.
size_t refuse_to_filter(unsigned /*flags*/, size_t /*cd_nelmts*/, const unsigned /*cd_values*/[], size_t /*nbytes*/,
                        size_t* /*buf_size*/, void** /*buf*/) {
  return 0;  // failure
}

// The comment the official plugin stores in the filter pipeline message.
constexpr const char* kBitshuffleFilterName = "bitshuffle; see https://github.com/kiyo-masui/bitshuffle";

}  // namespace

// ---------------------------------------------------------------------------

RecordedFile create_file(const std::string& path, DeferredRawWrites* raw_writes, ChunkIndex index) {
  RecordedFile file;
  file.failure_ = std::make_unique<detail::WriteFailure>();
  file.path_ = path;
  // Bounds 1.8: superblock v2 and a version-3 layout message, i.e. the v1
  // B-tree chunk index of real Arina files (1.10 bounds would pick an
  // extensible array for the unlimited frame axis). Bounds 1.10 with a fixed
  // frame axis: a version-4 layout message with a fixed-array index.
  hdf5::PropertyList access(detail::make_recording_access_list(file.failure_.get(), raw_writes));
  const H5F_libver_t bound = index == ChunkIndex::fixed_array ? H5F_LIBVER_V110 : H5F_LIBVER_V18;
  check_status(H5Pset_libver_bounds(access.id(), bound, bound), "H5Pset_libver_bounds");
  // The root group takes its object-creation properties from the file-creation
  // list: without this its header carries the creation second, and two runs
  // that straddle a second boundary differ in every file.
  hdf5::PropertyList creation = make_creation_list(H5P_FILE_CREATE);
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, creation.id(), access.id());
  if (id < 0) fail("cannot create " + path);
  file.handle_ = hdf5::File(id);
  return file;
}

void write_string_attribute(hid_t object, const char* name, const std::string& value) {
  hdf5::Datatype type = make_string_type(value);
  hdf5::Dataspace space = make_scalar_space();
  hdf5::Attribute attribute(check_id(H5Acreate2(object, name, type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
                                     std::string("H5Acreate2 ") + name));
  check_status(H5Awrite(attribute.id(), type.id(), value.c_str()), std::string("H5Awrite ") + name);
}

void write_attribute(hid_t object, const char* name, hid_t file_type, hid_t memory_type, const void* value,
                     hsize_t count) {
  hdf5::Dataspace space = count == 0 ? make_scalar_space() : make_simple_space({count});
  hdf5::Attribute attribute(check_id(H5Acreate2(object, name, file_type, space.id(), H5P_DEFAULT, H5P_DEFAULT),
                                     std::string("H5Acreate2 ") + name));
  check_status(H5Awrite(attribute.id(), memory_type, value), std::string("H5Awrite ") + name);
}

hdf5::Group create_group(hid_t parent, const char* name, const char* nx_class) {
  hdf5::PropertyList creation = make_creation_list(H5P_GROUP_CREATE);
  hdf5::Group group(check_id(H5Gcreate2(parent, name, H5P_DEFAULT, creation.id(), H5P_DEFAULT),
                             std::string("H5Gcreate2 ") + name));
  if (nx_class) write_string_attribute(group.id(), "NX_class", nx_class);
  return group;
}

static void write_dataset(hid_t group, const char* name, hid_t file_type, hid_t memory_type, hid_t space, const void* value,
                   const char* units = nullptr) {
  hdf5::PropertyList creation = make_creation_list(H5P_DATASET_CREATE);
  hdf5::Dataset dataset(check_id(H5Dcreate2(group, name, file_type, space, H5P_DEFAULT, creation.id(), H5P_DEFAULT),
                                 std::string("H5Dcreate2 ") + name));
  check_status(H5Dwrite(dataset.id(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, value),
               std::string("H5Dwrite ") + name);
  if (units) write_string_attribute(dataset.id(), "units", units);
}

static void write_scalar(hid_t group, const char* name, hid_t file_type, hid_t memory_type, const void* value,
                  const char* units = nullptr) {
  hdf5::Dataspace space = make_scalar_space();
  write_dataset(group, name, file_type, memory_type, space.id(), value, units);
}

void write_u64(hid_t group, const char* name, std::uint64_t value) {
  write_scalar(group, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}
void write_u32(hid_t group, const char* name, std::uint32_t value) {
  write_scalar(group, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &value);
}
void write_u16(hid_t group, const char* name, std::uint16_t value) {
  write_scalar(group, name, H5T_STD_U16LE, H5T_NATIVE_UINT16, &value);
}
static void write_i64(hid_t group, const char* name, std::int64_t value) {
  write_scalar(group, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}
void write_i8(hid_t group, const char* name, std::int8_t value) {
  write_scalar(group, name, H5T_STD_I8LE, H5T_NATIVE_INT8, &value);
}
void write_f64(hid_t group, const char* name, double value, const char* units) {
  write_scalar(group, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, units);
}
void write_text(hid_t group, const char* name, const std::string& value) {
  hdf5::Datatype type = make_string_type(value);
  write_scalar(group, name, type.id(), type.id(), value.c_str());
}

void write_u32_image(hid_t group, const char* name, const std::vector<std::uint32_t>& values, std::uint64_t rows,
                     std::uint64_t cols) {
  hdf5::Dataspace space = make_simple_space({rows, cols});
  write_dataset(group, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, space.id(), values.data());
}

void write_data_links(hid_t data_group, const std::vector<std::string>& shard_basenames) {
  write_string_attribute(data_group, "signal", shard_basenames.empty() ? "" : "data_000001");
  for (std::size_t i = 0; i < shard_basenames.size(); ++i) {
    char link_name[32];
    std::snprintf(link_name, sizeof link_name, "data_%06zu", i + 1);
    check_status(H5Lcreate_external(shard_basenames[i].c_str(), "/entry/data/data", data_group, link_name,
                                    H5P_DEFAULT, H5P_DEFAULT),
                 std::string("H5Lcreate_external ") + link_name);
  }
}

RecordedFile::RecordedFile() = default;
RecordedFile::RecordedFile(RecordedFile&& other) noexcept = default;
RecordedFile& RecordedFile::operator=(RecordedFile&& other) noexcept {
  if (this != &other) {
    handle_.reset();  // closes while its record is still ours
    failure_ = std::move(other.failure_);
    path_ = std::move(other.path_);
    handle_ = std::move(other.handle_);
  }
  return *this;
}
RecordedFile::~RecordedFile() { handle_.reset(); }

void RecordedFile::check_writes() const {
  if (!failure_ || failure_->error == 0) return;
  const int error = failure_->error;
  const std::string text = std::string(std::strerror(error)) + " (" + failure_->operation + ")";
  if (error == ENOSPC || error == EDQUOT || error == EFBIG) {
    throw payload_too_large("the disk holding " + path_ + " is full: " + text);
  }
  throw IoError("cannot write " + path_ + ": " + text);
}

void RecordedFile::close(const std::string& what) {
  handle_.close(what);
  check_writes();
}

BitshuffleFilterRegistration::BitshuffleFilterRegistration() {
  if (hdf5::file_close_failed()) {
    throw unavailable("an HDF5 file of this process failed to close, which leaves libhdf5 unsafe to write with: "
                      "restart the process to write HDF5 files again");
  }
  static const H5Z_class2_t filter_class = {
      H5Z_CLASS_T_VERS,
      static_cast<H5Z_filter_t>(kBitshuffleFilterId),
      1,  // encoder present
      1,  // decoder present
      kBitshuffleFilterName,
      nullptr,  // can_apply
      nullptr,  // set_local: keep our cd_values as given
      refuse_to_filter,
  };
  check_status(H5Zregister(&filter_class), "H5Zregister(32008)");
}

BitshuffleFilterRegistration::~BitshuffleFilterRegistration() {
  // Lets a later read in this process load the official plugin again. Never
  // after a failed file close: H5Zunregister walks the open files, and
  // libhdf5 1.10 keeps such a file registered with its memory freed.
  if (hdf5::file_close_failed()) return;
  if (H5Zunregister(static_cast<H5Z_filter_t>(kBitshuffleFilterId)) < 0) H5Eclear2(H5E_DEFAULT);
}

// ---------------------------------------------------------------------------

ShardFile::ShardFile(const std::string& path, std::uint64_t first_image_number, std::uint64_t frames,
                     std::uint64_t detector_rows, std::uint64_t detector_cols, DType dtype,
                     DeferredRawWrites* raw_writes, ChunkIndex index)
    : path_(path), raw_writes_(raw_writes) {
  file_ = create_file(path, raw_writes, index);
  hdf5::Group entry = create_group(file_.id(), "entry", "NXentry");
  hdf5::Group data = create_group(entry.id(), "data", "NXdata");

  const std::array<hsize_t, 3> dims = {frames, detector_rows, detector_cols};
  const std::array<hsize_t, 3> max_dims = {index == ChunkIndex::fixed_array ? frames : H5S_UNLIMITED, detector_rows,
                                           detector_cols};
  const std::array<hsize_t, 3> chunk = {1, detector_rows, detector_cols};
  hdf5::Dataspace space(check_id(H5Screate_simple(3, dims.data(), max_dims.data()), "H5Screate_simple"));

  hdf5::PropertyList creation = make_creation_list(H5P_DATASET_CREATE);
  check_status(H5Pset_chunk(creation.id(), 3, chunk.data()), "H5Pset_chunk");
  const std::array<unsigned, 5> cd_values = {0, 3, static_cast<unsigned>(dtype_size(dtype)), 0, 2};
  check_status(H5Pset_filter(creation.id(), static_cast<H5Z_filter_t>(kBitshuffleFilterId), H5Z_FLAG_MANDATORY,
                             cd_values.size(), cd_values.data()),
               "H5Pset_filter(32008)");
  const std::uint32_t all_ones = dtype_max(dtype);
  const std::uint8_t fill_u8 = static_cast<std::uint8_t>(all_ones);
  const std::uint16_t fill_u16 = static_cast<std::uint16_t>(all_ones);
  const void* fill = dtype == DType::uint8 ? static_cast<const void*>(&fill_u8)
                     : dtype == DType::uint16 ? static_cast<const void*>(&fill_u16)
                                              : static_cast<const void*>(&all_ones);
  check_status(H5Pset_fill_value(creation.id(), memory_type_of(dtype), fill), "H5Pset_fill_value");
  check_status(H5Pset_fill_time(creation.id(), H5D_FILL_TIME_IFSET), "H5Pset_fill_time");
  check_status(H5Pset_alloc_time(creation.id(), H5D_ALLOC_TIME_INCR), "H5Pset_alloc_time");

  dataset_ = hdf5::Dataset(check_id(H5Dcreate2(data.id(), "data", file_type_of(dtype), space.id(), H5P_DEFAULT,
                                               creation.id(), H5P_DEFAULT),
                                    "H5Dcreate2 /entry/data/data in " + path));
  const std::uint64_t last_image_number = first_image_number + frames - 1;
  write_attribute(dataset_.id(), "image_nr_low", H5T_STD_U64LE, H5T_NATIVE_UINT64, &first_image_number);
  write_attribute(dataset_.id(), "image_nr_high", H5T_STD_U64LE, H5T_NATIVE_UINT64, &last_image_number);
}

void ShardFile::write_chunk(std::uint64_t local_index, const std::uint8_t* stored, std::size_t stored_bytes) {
  const std::array<hsize_t, 3> offset = {local_index, 0, 0};
  const herr_t status = H5Dwrite_chunk(dataset_.id(), H5P_DEFAULT, 0, offset.data(), stored_bytes, stored);
  file_.check_writes();
  if (status < 0) {
    fail("H5Dwrite_chunk frame " + std::to_string(local_index) + " of " + path_);
  }
}

void ShardFile::close() {
  if (raw_writes_ != nullptr) raw_writes_->wait_for_all();  // a failed chunk write first, as its own error
  dataset_.close("H5Dclose " + path_);
  file_.close("H5Fclose " + path_);
}

// ---------------------------------------------------------------------------

void write_master(const std::string& path, const MasterContents& contents) {
  RecordedFile file = create_file(path);
  write_string_attribute(file.id(), "default", "entry");
  hdf5::Group entry = create_group(file.id(), "entry", "NXentry");
  write_string_attribute(entry.id(), "default", "data");
  write_text(entry.id(), "definition", "NXmx");

  {
    hdf5::Group data = create_group(entry.id(), "data", "NXdata");
    write_data_links(data.id(), contents.shard_basenames);
    if (contents.scan_sampling_A) {
      write_attribute(data.id(), "scan_sampling_A", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &*contents.scan_sampling_A);
    }
    if (contents.k_pixel_size_mrad) {
      write_attribute(data.id(), "k_pixel_size_mrad", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &*contents.k_pixel_size_mrad);
    }
  }

  const unsigned bits = static_cast<unsigned>(dtype_size(contents.dtype) * 8);
  hdf5::Group instrument = create_group(entry.id(), "instrument", "NXinstrument");
  hdf5::Group detector = create_group(instrument.id(), "detector", "NXdetector");
  write_text(detector.id(), "description", "Dectris ARINA CZT");
  write_text(detector.id(), "detector_number", "SYNTH-0001");
  write_text(detector.id(), "sensor_material", "CZT");
  write_f64(detector.id(), "sensor_thickness", 1.5e-3, "m");
  write_u16(detector.id(), "bit_depth_image", static_cast<std::uint16_t>(bits));
  write_u16(detector.id(), "bit_depth_readout", static_cast<std::uint16_t>(bits));
  write_i64(detector.id(), "saturation_value", static_cast<std::int64_t>(contents.saturation_count));
  write_f64(detector.id(), "x_pixel_size", 1e-4, "m");
  write_f64(detector.id(), "y_pixel_size", 1e-4, "m");
  write_f64(detector.id(), "count_time", 9.95e-5, "s");
  write_f64(detector.id(), "frame_time", 1e-4, "s");
  write_f64(detector.id(), "threshold_energy", 17500.0, "eV");
  write_f64(detector.id(), "beam_center_x", (static_cast<double>(contents.detector_cols) - 1.0) / 2.0, "pixel");
  write_f64(detector.id(), "beam_center_y", (static_cast<double>(contents.detector_rows) - 1.0) / 2.0, "pixel");
  write_i8(detector.id(), "countrate_correction_applied", 1);
  write_i8(detector.id(), "pixel_mask_applied", 1);
  write_i8(detector.id(), "flatfield_correction_applied", 0);
  write_i8(detector.id(), "virtual_pixel_correction_applied", 1);

  hdf5::Group specific = create_group(detector.id(), "detectorSpecific", "NXcollection");
  write_u64(specific.id(), "nimages", 1);
  write_u64(specific.id(), "ntrigger", contents.scan_rows * contents.scan_cols);
  write_text(specific.id(), "trigger_mode", "exts");
  write_u64(specific.id(), "x_pixels_in_detector", contents.detector_cols);
  write_u64(specific.id(), "y_pixels_in_detector", contents.detector_rows);
  write_text(specific.id(), "compression", "bslz4");
  write_u32(specific.id(), "countrate_correction_count_cutoff", contents.saturation_count);
  write_u32(specific.id(), "number_of_excluded_pixels", contents.excluded_pixels);
  write_text(specific.id(), "eiger_fw_version", "synthetic-quantem");
  write_text(specific.id(), "software_version", std::string("quantem-gpu ") + version_string());
  write_text(specific.id(), "roi_mode", "");
  write_f64(specific.id(), "frame_count_time", 9.95e-5, "s");
  write_f64(specific.id(), "frame_period", 1e-4, "s");
  write_f64(specific.id(), "photon_energy", contents.photon_energy_eV, "eV");
  write_u32_image(specific.id(), "pixel_mask", contents.pixel_mask, contents.detector_rows, contents.detector_cols);

  specific.close("H5Gclose detectorSpecific");
  detector.close("H5Gclose detector");
  instrument.close("H5Gclose instrument");
  entry.close("H5Gclose entry");
  file.close("H5Fclose " + path);
}

void write_stem_metadata(const std::string& path, const StemMetadata& microscope) {
  RecordedFile file = create_file(path);
  hdf5::Group metadata = create_group(file.id(), "STEM Metadata", nullptr);
  const auto num_pixels_x = static_cast<std::int64_t>(microscope.scan_cols);
  const auto num_pixels_y = static_cast<std::int64_t>(microscope.scan_rows);
  const std::uint32_t prescan = 0;
  const std::uint8_t calibrated = 0;
  write_attribute(metadata.id(), "NumPixelsX", H5T_STD_I64LE, H5T_NATIVE_INT64, &num_pixels_x);
  write_attribute(metadata.id(), "NumPixelsY", H5T_STD_I64LE, H5T_NATIVE_INT64, &num_pixels_y);
  write_attribute(metadata.id(), "NumPixelsPrescan", H5T_STD_U32LE, H5T_NATIVE_UINT32, &prescan, 1);
  write_attribute(metadata.id(), "IsPixelSizeCalibrated", H5T_STD_U8LE, H5T_NATIVE_UINT8, &calibrated, 1);
  const std::pair<const char*, double> doubles[] = {
      {"Pixel Size", 0.25},        // nm
      {"High Tension", microscope.high_tension_V},    // V
      {"Camera Length", microscope.camera_length_m},  // m
      {"ScanDwellTime", 1e-4},     // s
      {"Rotation", 0.0},
      {"Magnification", 2.0e7},
  };
  for (const auto& [name, value] : doubles) {
    write_attribute(metadata.id(), name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, 1);
  }
  metadata.close("H5Gclose STEM Metadata");
  file.close("H5Fclose " + path);
}

}  // namespace quantem::arina
