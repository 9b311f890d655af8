#include "quantem/catalog/master_metadata.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>
#include <utility>

#include <spdlog/spdlog.h>

#include "quantem/hdf5/error.hpp"
#include "quantem/hdf5/library_lock.hpp"
#include "quantem/hdf5/handle.hpp"
#include "quantem/hdf5/read.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/error.hpp"

namespace quantem::catalog {

namespace {

const std::string kStem = "/STEM Metadata";
const std::string kDetector = "/entry/instrument/detector";
const std::string kSpecific = "/entry/instrument/detector/detectorSpecific";

MetadataCandidate master_dataset(const std::string& path, const std::string& default_unit = "") {
  return MetadataCandidate{false, path, "", default_unit};
}
MetadataCandidate sidecar_attribute(const std::string& name, const std::string& default_unit = "") {
  return MetadataCandidate{true, kStem, name, default_unit};
}

}  // namespace

const std::vector<MetadataFieldSpec>& master_metadata_fields() {
  // DECTRIS writes the electron energy of an Arina or Quadro as photon_energy
  // (eV); for electrons an energy in eV is the high tension in V.
  static const std::vector<MetadataFieldSpec> fields = {
      {"high_tension", "high tension", "V",
       {sidecar_attribute("High Tension", "V"), master_dataset("/entry/instrument/beam/incident_energy", "eV"),
        master_dataset(kSpecific + "/photon_energy", "eV")}},
      {"wavelength", "wavelength", "Å", {master_dataset("/entry/instrument/beam/incident_wavelength", "Å")}},
      {"camera_length", "camera length", "m", {sidecar_attribute("Camera Length", "m")}},
      {"detector_distance", "detector distance", "m", {master_dataset(kDetector + "/detector_distance", "m")}},
      {"dwell_time", "dwell time", "s", {sidecar_attribute("ScanDwellTime", "s")}},
      {"count_time", "count time", "s",
       {master_dataset(kDetector + "/count_time", "s"), master_dataset(kSpecific + "/frame_count_time", "s")}},
      {"frame_time", "frame time", "s",
       {master_dataset(kDetector + "/frame_time", "s"), master_dataset(kSpecific + "/frame_period", "s")}},
      {"magnification", "magnification", "", {sidecar_attribute("Magnification")}},
      {"detector", "detector", "",
       {master_dataset(kDetector + "/description"), master_dataset(kDetector + "/detector_description")}},
      {"detector_number", "detector number", "", {master_dataset(kDetector + "/detector_number")}},
      {"sensor_material", "sensor material", "", {master_dataset(kDetector + "/sensor_material")}},
      {"sensor_thickness", "sensor thickness", "m", {master_dataset(kDetector + "/sensor_thickness", "m")}},
      {"x_pixel_size", "pixel size x", "m", {master_dataset(kDetector + "/x_pixel_size", "m")}},
      {"y_pixel_size", "pixel size y", "m", {master_dataset(kDetector + "/y_pixel_size", "m")}},
      {"threshold_energy", "threshold energy", "eV", {master_dataset(kDetector + "/threshold_energy", "eV")}},
      {"bit_depth_image", "bit depth", "", {master_dataset(kDetector + "/bit_depth_image")}},
      {"saturation_value", "saturation value", "",
       {master_dataset(kDetector + "/saturation_value"),
        master_dataset(kSpecific + "/countrate_correction_count_cutoff")}},
      {"trigger_mode", "trigger mode", "", {master_dataset(kSpecific + "/trigger_mode")}},
      {"firmware_version", "firmware", "", {master_dataset(kSpecific + "/eiger_fw_version")}},
      {"software_version", "software", "", {master_dataset(kSpecific + "/software_version")}},
      {"collection_date", "collected", "", {master_dataset(kSpecific + "/data_collection_date")}},
  };
  return fields;
}

double unit_factor(const std::string& unit, const std::string& target) {
  struct Unit {
    const char* name;
    const char* kind;  // the target it converts to
    double factor;
  };
  static const Unit units[] = {
      {"m", "m", 1.0},        {"mm", "m", 1e-3},      {"um", "m", 1e-6},        {"µm", "m", 1e-6},
      {"micron", "m", 1e-6},  {"nm", "m", 1e-9},      {"s", "s", 1.0},          {"ms", "s", 1e-3},
      {"us", "s", 1e-6},      {"µs", "s", 1e-6},      {"ns", "s", 1e-9},        {"eV", "eV", 1.0},
      {"keV", "eV", 1e3},     {"V", "V", 1.0},        {"kV", "V", 1e3},         {"eV", "V", 1.0},
      {"keV", "V", 1e3},      {"Å", "Å", 1.0},        {"A", "Å", 1.0},          {"angstrom", "Å", 1.0},
      {"Angstrom", "Å", 1.0}, {"nm", "Å", 10.0},      {"m", "Å", 1e10},
  };
  for (const Unit& u : units) {
    if (unit == u.name && target == u.kind) return u.factor;
  }
  return 0.0;
}

namespace {

std::string file_name_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// A one-element value of an integer, float or string type; nullopt for
// anything else (arrays, compounds, references, an enum libhdf5 will not
// convert).
std::optional<MetadataValue> scalar_of(const hdf5::Value& read) {
  MetadataValue value;
  if (read.text) {
    value.kind = MetadataValue::Kind::text;
    value.text = *read.text;
    if (value.text.size() > kMaxMetadataTextBytes) {
      value.text.resize(kMaxMetadataTextBytes);
      value.truncated = true;
    }
    return value;
  }
  if (read.is_integer && read.integers.size() == 1) {
    value.kind = MetadataValue::Kind::integer;
    value.integer = read.integers.front();
    return value;
  }
  if (read.is_real && read.reals.size() == 1) {
    const double real = read.reals.front();
    if (std::isfinite(real)) {
      value.kind = MetadataValue::Kind::real;
      value.real = real;
    } else {
      value.kind = MetadataValue::Kind::text;
      value.text = std::isnan(real) ? "nan" : real > 0 ? "inf" : "-inf";
    }
    return value;
  }
  return std::nullopt;
}

bool is_single_element(const hdf5::Dataspace& space) { return space.is_scalar() || space.element_count() == 1; }

std::optional<MetadataValue> read_attribute(hid_t object, const std::string& name) {
  try {
    const hdf5::Attribute attribute = hdf5::open_attribute(object, name);
    if (!is_single_element(attribute.space())) return std::nullopt;
    return scalar_of(hdf5::read_value(attribute));
  } catch (const Error&) {
    return std::nullopt;
  }
}

// The dataset's value when it holds one element, and its units attribute.
std::optional<MetadataValue> read_dataset(const hdf5::Dataset& dataset, std::string& unit) {
  try {
    if (!is_single_element(dataset.space())) return std::nullopt;
    auto value = scalar_of(hdf5::read_value(dataset));
    unit.clear();
    if (value && hdf5::attribute_exists(dataset.id(), "units")) {
      if (const auto units = read_attribute(dataset.id(), "units"); units && units->kind == MetadataValue::Kind::text) {
        unit = units->text;
      }
    }
    return value;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// Names of an object's attributes, or of a group's links with their kinds, at most `limit`.
herr_t collect_attribute(hid_t, const char* name, const H5A_info_t*, void* data) {
  auto* names = static_cast<std::pair<std::vector<std::string>, std::size_t>*>(data);
  names->first.emplace_back(name);
  return names->first.size() >= names->second ? 1 : 0;
}
std::vector<std::string> attribute_names(hid_t object, std::size_t limit) {
  std::pair<std::vector<std::string>, std::size_t> names{{}, limit};
  hsize_t index = 0;
  if (limit > 0 && H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, &index, collect_attribute, &names) < 0) {
    H5Eclear2(H5E_DEFAULT);
  }
  return std::move(names.first);
}

struct Link {
  std::string name;
  bool hard = false;
};
herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* data) {
  auto* links = static_cast<std::pair<std::vector<Link>, std::size_t>*>(data);
  links->first.push_back(Link{name, info && info->type == H5L_TYPE_HARD});
  return links->first.size() >= links->second ? 1 : 0;
}
std::vector<Link> link_names(hid_t group, std::size_t limit) {
  std::pair<std::vector<Link>, std::size_t> links{{}, limit};
  hsize_t index = 0;
  if (limit > 0 && H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &index, collect_link, &links) < 0) {
    H5Eclear2(H5E_DEFAULT);
  }
  return std::move(links.first);
}

std::string child_path(const std::string& parent, const std::string& name) {
  return parent == "/" ? "/" + name : parent + "/" + name;
}

// Every scalar attribute and dataset of one file, within the limits.
class EntryWalker {
 public:
  EntryWalker(std::string file_name, MasterMetadata& out) : file_(std::move(file_name)), out_(out) {}

  void walk(hid_t file) {
    try {
      const hdf5::Group root = hdf5::open_group(file, "/");
      group(root.id(), "/", 0);
    } catch (const Error& e) {
      spdlog::debug("metadata: {}: {}", file_, e.what());
    }
  }

 private:
  bool full() {
    if (added_ < kMaxMetadataEntriesPerFile) return false;
    out_.entries_truncated = true;
    return true;
  }
  void add(const std::string& path, MetadataValue value, std::string unit) {
    if (full() || path.size() > kMaxMetadataPathBytes) return;
    out_.entries.push_back(MetadataEntry{file_, path, std::move(value), std::move(unit)});
    ++added_;
  }
  // The attributes of an object; a dataset's `units` is its unit, not an entry.
  void attributes(hid_t object, const std::string& path, bool is_dataset) {
    for (const std::string& name : attribute_names(object, kMaxMetadataEntriesPerFile + 1)) {
      if (full()) return;
      if (is_dataset && name == "units") continue;
      if (auto value = read_attribute(object, name)) add(path + "@" + name, std::move(*value), "");
    }
  }
  void dataset(hid_t parent, const std::string& name, const std::string& path) {
    try {
      const hdf5::Dataset dataset = hdf5::open_dataset(parent, name);
      std::string unit;
      if (auto value = read_dataset(dataset, unit)) add(path, std::move(*value), std::move(unit));
      attributes(dataset.id(), path, true);
    } catch (const Error& e) {
      spdlog::debug("metadata: {}:{}: {}", file_, path, e.what());
    }
  }
  void group(hid_t group_id, const std::string& path, std::size_t depth) {
    if (++groups_ > kMaxMetadataGroupsPerFile) {
      out_.entries_truncated = true;
      return;
    }
    attributes(group_id, path, false);
    for (const Link& link : link_names(group_id, kMaxMetadataEntriesPerFile + 1)) {
      if (full()) return;
      if (!link.hard) continue;  // external links lead to the frames; soft links to what is walked anyway
      const std::string path_of_child = child_path(path, link.name);
      H5O_info_t info{};
      if (H5Oget_info_by_name2(group_id, link.name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) {
        H5Eclear2(H5E_DEFAULT);
        continue;
      }
      if (info.type == H5O_TYPE_DATASET) {
        dataset(group_id, link.name, path_of_child);
      } else if (info.type == H5O_TYPE_GROUP) {
        if (depth + 1 >= kMaxMetadataDepth) {
          out_.entries_truncated = true;
          continue;
        }
        try {
          const hdf5::Group child = hdf5::open_group(group_id, link.name);
          group(child.id(), path_of_child, depth + 1);
        } catch (const Error& e) {
          spdlog::debug("metadata: {}:{}: {}", file_, path_of_child, e.what());
        }
      }
    }
  }

  std::string file_;
  MasterMetadata& out_;
  std::size_t added_ = 0;
  std::size_t groups_ = 0;
};

// One candidate's value in the field's unit; nullopt when absent or unusable.
std::optional<MetadataValue> candidate_value(hid_t file, const MetadataCandidate& candidate,
                                             const MetadataFieldSpec& field) {
  if (hdf5::object_type(file, candidate.object) == H5O_TYPE_UNKNOWN) return std::nullopt;
  std::optional<MetadataValue> value;
  std::string unit;
  try {
    if (candidate.attribute.empty()) {
      if (hdf5::object_type(file, candidate.object) != H5O_TYPE_DATASET) return std::nullopt;
      value = read_dataset(hdf5::open_dataset(file, candidate.object), unit);
    } else {
      const hid_t object = H5Oopen(file, candidate.object.c_str(), H5P_DEFAULT);
      if (object < 0) hdf5::throw_error("H5Oopen(" + candidate.object + ")");
      if (hdf5::attribute_exists(object, candidate.attribute)) value = read_attribute(object, candidate.attribute);
      H5Oclose(object);
    }
  } catch (const Error&) {
    return std::nullopt;
  }
  if (!value) return std::nullopt;
  if (field.unit.empty()) {
    if (value->kind == MetadataValue::Kind::text && value->text.empty()) return std::nullopt;
    if (value->kind == MetadataValue::Kind::real && !(value->real > 0.0)) return std::nullopt;  // magnification 0: not set
    return value;
  }
  // A physical quantity: a positive finite number in a known unit.
  double number = 0.0;
  if (value->kind == MetadataValue::Kind::real) {
    number = value->real;
  } else if (value->kind == MetadataValue::Kind::integer) {
    number = static_cast<double>(value->integer);
  } else {
    return std::nullopt;
  }
  const double factor = unit_factor(unit.empty() ? candidate.default_unit : unit, field.unit);
  const double converted = number * factor;
  if (factor == 0.0 || !std::isfinite(converted) || !(converted > 0.0)) return std::nullopt;
  MetadataValue result;
  result.kind = MetadataValue::Kind::real;
  result.real = converted;
  return result;
}

std::string source_of(const std::string& file_name, const MetadataCandidate& candidate) {
  return file_name + ":" + candidate.object + (candidate.attribute.empty() ? "" : "@" + candidate.attribute);
}

// The sidecar <stem>.h5 beside the master, open; an invalid file when there is none.
hdf5::File open_sidecar(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode) || info.st_size == 0) return hdf5::File();
  try {
    hdf5::File file = hdf5::File::open_read_only(path);
    if (hdf5::object_type(file.id(), kStem) != H5O_TYPE_GROUP) return hdf5::File();
    return file;
  } catch (const Error& e) {
    spdlog::warn("metadata: cannot read the sidecar {}: {}", path, e.what());
    return hdf5::File();
  }
}

}  // namespace

MasterMetadata read_master_metadata(const std::string& master_path) {
  const Acquisition named = named_acquisition(master_path);
  MasterMetadata out;
  out.master_path = named.master_path;
  struct stat info {};
  if (::stat(out.master_path.c_str(), &info) != 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) throw not_found("master not found: " + out.master_path);
    throw IoError("cannot stat " + out.master_path + ": " + std::strerror(error));
  }
  const hdf5::LibraryLock hdf5_lock;
  hdf5::File master;
  try {
    master = hdf5::File::open_read_only(out.master_path);
  } catch (const Error& e) {
    throw Error(ErrorKind::corrupt_data, "master file is not readable HDF5: " + out.master_path + " (" + e.what() + ")");
  }
  const std::string sidecar_path = folder_of(out.master_path) + "/" + named.stem + ".h5";
  const hdf5::File sidecar = sidecar_path == out.master_path ? hdf5::File() : open_sidecar(sidecar_path);
  if (sidecar.valid()) out.sidecar_name = file_name_of(sidecar_path);

  const std::string master_name = file_name_of(out.master_path);
  for (const MetadataFieldSpec& field : master_metadata_fields()) {
    for (const MetadataCandidate& candidate : field.candidates) {
      const hdf5::File& file = candidate.sidecar ? sidecar : master;
      if (!file.valid()) continue;
      if (auto value = candidate_value(file.id(), candidate, field)) {
        out.fields.push_back(MetadataField{field.name, std::move(*value), field.unit,
                                           source_of(candidate.sidecar ? out.sidecar_name : master_name, candidate)});
        break;
      }
    }
  }
  EntryWalker(master_name, out).walk(master.id());
  if (sidecar.valid()) EntryWalker(out.sidecar_name, out).walk(sidecar.id());
  return out;
}

}  // namespace quantem::catalog
