// Per-master inspection (readiness, shapes, calibration, pixel mask,
// signature): docs/protocol.md, 'Masters, sessions and readiness'.
#include "quantem/catalog/acquisition.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <spdlog/spdlog.h>

#include "dataset_storage.hpp"
#include "quantem/hdf5/error.hpp"
#include "quantem/hdf5/library_lock.hpp"
#include "quantem/hdf5/read.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/text.hpp"

namespace quantem::catalog {

namespace {

namespace fs = std::filesystem;
using detail::python_tuple;

constexpr const char* kMasterSuffix = "_master.h5";
constexpr const char* kDetectorSpecific = "entry/instrument/detector/detectorSpecific";
constexpr const char* kPixelMaskPath = "entry/instrument/detector/detectorSpecific/pixel_mask";

// --- readiness texts (the reference's; the tightenings in the same style) ---

LoadStatus not_ready(std::string reason, std::string action) { return {false, std::move(reason), std::move(action)}; }

const char* kActionPermissions = "Fix file permissions or storage availability, then poll again.";
const char* kActionWaitChunks = "Wait for the remaining detector frames or chunks to finish writing, then poll again.";
const char* kActionLinkedFileNotReadable =
    "Wait for the detector writer to close or flush the file, then poll again; recopy it if the error persists.";

// --- paths and stat ---

std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

struct StatResult {
  int error = 0;  // errno, 0 on success
  struct stat info {};
};

StatResult stat_path(const std::string& path) {
  StatResult result;
  if (::stat(path.c_str(), &result.info) != 0) result.error = errno;
  return result;
}

std::int64_t nanoseconds(const struct timespec& t) {
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000LL + static_cast<std::int64_t>(t.tv_nsec);
}

SignatureEntry signature_entry(const std::string& path, const StatResult& stat_result) {
  SignatureEntry entry;
  entry.path = path;
  if (stat_result.error != 0) return entry;
  entry.exists = true;
  entry.size_bytes = static_cast<std::int64_t>(stat_result.info.st_size);
  entry.mtime_ns = nanoseconds(stat_result.info.st_mtim);
  entry.ctime_ns = nanoseconds(stat_result.info.st_ctim);
  entry.device = static_cast<std::uint64_t>(stat_result.info.st_dev);
  entry.inode = static_cast<std::uint64_t>(stat_result.info.st_ino);
  return entry;
}

// --- metadata values ---

std::optional<std::int64_t> as_integer(const hdf5::Value& value) {
  if (value.is_integer && value.integers.size() == 1) return value.integers[0];
  if (value.is_real && value.reals.size() == 1 && std::isfinite(value.reals[0])) {
    return static_cast<std::int64_t>(std::trunc(value.reals[0]));
  }
  if (value.text) {
    const std::string& text = *value.text;
    char* end = nullptr;
    errno = 0;
    const long long parsed = std::strtoll(text.c_str(), &end, 10);
    if (errno == 0 && end != text.c_str()) {
      while (*end == ' ' || *end == '\t' || *end == '\n') ++end;
      if (*end == '\0') return parsed;
    }
  }
  return std::nullopt;
}

// Python float(): numbers, or text such as "0.5"; non-finite values count as
// not convertible (they would break the JSON document).
std::optional<double> as_finite_real(const hdf5::Value& value) {
  std::optional<double> real;
  if (value.is_real && value.reals.size() == 1) real = value.reals[0];
  if (!real && value.text) {
    const std::string& text = *value.text;
    char* end = nullptr;
    const double parsed = std::strtod(text.c_str(), &end);
    if (end != text.c_str()) {
      while (*end == ' ' || *end == '\t' || *end == '\n') ++end;
      if (*end == '\0') real = parsed;
    }
  }
  if (real && std::isfinite(*real)) return real;
  return std::nullopt;
}

// A 2-D shape (scan or detector), ordered by rows then columns.
struct Shape2D {
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
  bool operator<(const Shape2D& other) const {
    return rows != other.rows ? rows < other.rows : cols < other.cols;
  }
  bool operator==(const Shape2D& other) const { return rows == other.rows && cols == other.cols; }
};
using ScanShape = Shape2D;

// A positive integral 2-vector, or nothing.
std::optional<ScanShape> as_scan_shape(const hdf5::Value& value) {
  if (value.is_integer && value.integers.size() == 2 && value.integers[0] > 0 && value.integers[1] > 0) {
    return ScanShape{static_cast<std::uint64_t>(value.integers[0]), static_cast<std::uint64_t>(value.integers[1])};
  }
  if (!value.is_integer && value.is_real && value.reals.size() == 2) {
    const double rows = value.reals[0], cols = value.reals[1];
    if (rows >= 1 && cols >= 1 && rows < 9e15 && cols < 9e15 && std::trunc(rows) == rows && std::trunc(cols) == cols) {
      return ScanShape{static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols)};
    }
  }
  return std::nullopt;
}

std::optional<hdf5::Value> attribute_value(hid_t object, const std::string& name) {
  try {
    if (!hdf5::attribute_exists(object, name)) return std::nullopt;
    return hdf5::read_value(hdf5::open_attribute(object, name));
  } catch (const HdfError& e) {
    spdlog::warn("catalog: cannot read attribute {}: {}", name, e.what());
    return std::nullopt;
  }
}

std::optional<hdf5::Value> dataset_value(hid_t loc, const std::string& path) {
  try {
    if (hdf5::object_type(loc, path) != H5O_TYPE_DATASET) return std::nullopt;
    const hdf5::Dataset dataset = hdf5::open_dataset(loc, path);
    if (dataset.space().element_count() > 100) return std::nullopt;  // small metadata only
    return hdf5::read_value(dataset);
  } catch (const HdfError& e) {
    spdlog::warn("catalog: cannot read dataset {}: {}", path, e.what());
    return std::nullopt;
  }
}

std::string scan_shape_text(const ScanShape& shape) { return python_tuple({shape.rows, shape.cols}); }

// text(item) of each item, ", "-separated in the items' order: the list an
// inconsistency's reason names.
template <class Items, class Text>
std::string comma_list(const Items& items, const Text& text) {
  std::string list;
  for (const auto& item : items) list += (list.empty() ? "" : ", ") + text(item);
  return list;
}

std::string comma_list(const std::set<std::string>& names) {
  return comma_list(names, [](const std::string& name) { return name; });
}

// --- per-source facts gathered by the readiness pass ---

struct SourceFacts {
  std::string file_path;     // absolute
  std::string dataset_path;  // inside file_path
  std::vector<std::uint64_t> dims;
  std::string numpy_dtype;   // numpy dtype.str
  std::optional<DType> dtype;  // supported dtypes only
  detail::DatasetStorage storage;
  std::uint64_t frames = 0;
  std::uint64_t chunks_written = 0;     // chunked layout
  bool contiguous_allocated = false;    // contiguous layout
};

bool is_data_source_name(const std::string& name) {
  if (name.size() != 11 || name.compare(0, 5, "data_") != 0) return false;
  return std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::optional<DType> supported_dtype(const hdf5::Datatype& type) {
  if (type.type_class() != H5T_INTEGER || type.is_signed()) return std::nullopt;
  if (type.size() > 1 && !type.is_little_endian()) return std::nullopt;
  return dtype_from_size(type.size());
}

class MasterInspection {
 public:
  explicit MasterInspection(Acquisition& acquisition) : acq_(acquisition) {}

  void run() {
    const StatResult master_stat = stat_path(acq_.master_path);
    acq_.signature.push_back(signature_entry(acq_.master_path, master_stat));
    acq_.status = check_master(master_stat);
    finish_sizes();
  }

 private:
  LoadStatus check_master(const StatResult& master_stat) {
    static const FileTexts kMasterTexts{
        "master file", "Wait for the master file to be atomically renamed into place, then poll again.",
        "Wait for the master HDF5 header to finish writing, then poll again.",
        "Wait for the master writer to close or flush the file, then poll again; recopy it if the error persists."};
    if (LoadStatus status = open_file(acq_.master_path, master_stat, kMasterTexts, master_); !status.loadable) {
      return status;
    }
    LoadStatus status;
    try {
      status = check_headers();
    } catch (const std::exception& e) {
      status = header_error(e);
    }
    try {
      read_metadata();
    } catch (const std::exception& e) {
      spdlog::warn("catalog: {}: metadata: {}", acq_.master_path, e.what());
    }
    if (status.loadable) status = check_derived();
    if (status.loadable) status = check_stability();
    return status;
  }

  LoadStatus header_error(const std::exception& e) const {
    return not_ready("master HDF5 headers are incomplete or invalid: " + acq_.master_path + " (" + hdf5_message(e) + ")",
                     "Wait for acquisition to finish, then poll again; recopy or repair the group if the error persists.");
  }

  // HdfError messages are "<call>: <HDF5 message>"; users see HDF5's part.
  static std::string hdf5_message(const std::exception& e) {
    const std::string text = e.what();
    if (dynamic_cast<const HdfError*>(&e) == nullptr) return text;
    auto colon = text.find("): ");
    if (colon != std::string::npos) return text.substr(colon + 3);
    colon = text.find(": ");
    return colon == std::string::npos ? text : text.substr(colon + 2);
  }

  // ntrigger and nimages (default 1), read before the checks so that the scan
  // shape can use them whatever the checks find.
  void read_frame_metadata() {
    const hid_t master = master_.id();
    if (const auto value = dataset_value(master, std::string(kDetectorSpecific) + "/ntrigger")) {
      raw_ntrigger_ = as_integer(*value);
    }
    if (!raw_ntrigger_) return;
    if (const auto value = dataset_value(master, std::string(kDetectorSpecific) + "/nimages")) {
      if (const auto parsed = as_integer(*value)) raw_nimages_ = *parsed;
    }
    if (*raw_ntrigger_ >= 1 && raw_nimages_ >= 1) {
      acq_.ntrigger = static_cast<std::uint64_t>(*raw_ntrigger_);
      acq_.nimages = static_cast<std::uint64_t>(raw_nimages_);
    }
  }

  // The header checks, in order, the first that fails giving the status: the
  // entry/data group and its sources, positive frame-count metadata, each
  // source on its own, then the sources against each other (detector shape,
  // dtype, scan_shape) and the stored frames against the expected count.
  LoadStatus check_headers() {
    read_frame_metadata();
    if (LoadStatus status = find_sources(); !status.loadable) return status;
    if (LoadStatus status = check_frame_metadata(); !status.loadable) return status;
    // Each source on its own (check_source), in name order; the first failure is the status.
    for (std::size_t i = 0; i < acq_.shards.size(); ++i) {
      LoadStatus status = check_source(acq_.shards[i]);
      if (!status.loadable) return status;
    }
    all_sources_read_ = true;
    if (LoadStatus status = check_sources_agree(); !status.loadable) return status;
    std::set<ScanShape> scan_shapes = collect_scan_shapes();
    if (scan_shapes.size() > 1) {
      return not_ready("detector sources have inconsistent scan_shape metadata: " +
                           comma_list(scan_shapes, scan_shape_text),
                       "Repair the conflicting scan_shape attributes, or pass the correct explicit scan_shape after "
                       "confirming the acquisition layout.");
    }
    if (LoadStatus status = check_stored_frames(scan_shapes); !status.loadable) return status;
    return check_storage();
  }

  // The entry/data group and its data sources (data_NNNNNN links in name
  // order, else an inline entry/data/data), resolved into shards.
  LoadStatus find_sources() {
    const hid_t master = master_.id();
    if (hdf5::object_type(master, "entry/data") != H5O_TYPE_GROUP) {
      return not_ready("master is missing the entry/data group",
                       "Wait for acquisition to finish, or recopy a complete master file.");
    }
    data_group_ = hdf5::open_group(master, "entry/data");
    std::vector<std::string> names;
    for (const auto& name : hdf5::member_names(data_group_.id())) {
      if (is_data_source_name(name)) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    if (names.empty() && hdf5::link_exists(data_group_.id(), "data")) names.push_back("data");
    if (names.empty()) {
      return not_ready("master has no entry/data/data dataset or data_NNNNNN sources",
                       "Wait for detector data links to finish writing, or recopy the complete acquisition group.");
    }
    resolve_shards(names);
    return {true, {}, {}};
  }

  // ntrigger and nimages, when the master has them, are positive.
  LoadStatus check_frame_metadata() const {
    if (!raw_ntrigger_) return {true, {}, {}};
    if (*raw_ntrigger_ < 1) {
      return not_ready("master ntrigger metadata is not positive: " + std::to_string(*raw_ntrigger_),
                       "Wait for acquisition metadata to finish writing, or repair ntrigger before loading.");
    }
    if (raw_nimages_ < 1) {
      return not_ready("master nimages metadata is not positive: " + std::to_string(raw_nimages_),
                       "Wait for acquisition metadata to finish writing, or repair nimages before loading.");
    }
    return {true, {}, {}};
  }

  // Every source has the same detector shape and the same dtype; sets the
  // acquisition's detector shape, dtype and stored frames.
  LoadStatus check_sources_agree() {
    std::set<Shape2D> detector_shapes;
    std::set<std::string> dtypes;
    std::uint64_t stored = 0;
    for (const auto& facts : sources_) {
      detector_shapes.insert(Shape2D{facts.dims[facts.dims.size() - 2], facts.dims.back()});
      dtypes.insert(facts.numpy_dtype);
      stored += facts.frames;
    }
    acq_.stored_frames = stored;
    if (detector_shapes.size() > 1) {
      return not_ready("detector sources have inconsistent detector shapes: " +
                           comma_list(detector_shapes, scan_shape_text),
                       "Use a narrower master pattern or repair the acquisition so every detector chunk has the same "
                       "(row, col) shape.");
    }
    if (dtypes.size() > 1) {
      return not_ready("detector sources have inconsistent dtypes: " + comma_list(dtypes),
                       "Repair or reacquire the acquisition so every detector chunk uses the same stored dtype.");
    }
    acq_.detector_rows = detector_shapes.begin()->rows;
    acq_.detector_cols = detector_shapes.begin()->cols;
    acq_.dtype = sources_.front().dtype;
    return {true, {}, {}};
  }

  // Every scan_shape attribute: the master's, entry/data's, each source's.
  std::set<ScanShape> collect_scan_shapes() const {
    std::set<ScanShape> scan_shapes;
    const auto collect = [&](hid_t object) {
      if (const auto value = attribute_value(object, "scan_shape")) {
        if (const auto shape = as_scan_shape(*value)) scan_shapes.insert(*shape);
      }
    };
    collect(master_.id());
    collect(data_group_.id());
    for (const auto& attrs : source_scan_shapes_) {
      if (attrs) scan_shapes.insert(*attrs);
    }
    return scan_shapes;
  }

  // Some frames are stored, and exactly as many as the metadata expects
  // (ntrigger x nimages, else the one scan_shape) when it says.
  LoadStatus check_stored_frames(const std::set<ScanShape>& scan_shapes) {
    std::string basis;
    if (acq_.ntrigger) {
      acq_.expected_frames = *acq_.ntrigger * *acq_.nimages;
      basis = "master metadata ntrigger=" + std::to_string(*acq_.ntrigger) +
              ", nimages=" + std::to_string(*acq_.nimages);
    } else if (scan_shapes.size() == 1) {
      const ScanShape shape = *scan_shapes.begin();
      acq_.expected_frames = shape.rows * shape.cols;
      basis = "HDF5 scan_shape=" + scan_shape_text(shape);
    }
    const std::uint64_t stored = acq_.stored_frames;
    if (stored == 0) {
      return not_ready("detector sources contain zero stored frames",
                       "Wait for detector frames to be written, then poll again.");
    }
    if (acq_.expected_frames && stored != *acq_.expected_frames) {
      return not_ready("stored frame count is " + std::to_string(stored) + "; expected " +
                           std::to_string(*acq_.expected_frames) + " from " + basis,
                       stored < *acq_.expected_frames
                           ? kActionWaitChunks
                           : "Pass the correct explicit scan_shape or repair the master frame-count metadata before "
                             "loading.");
    }
    return {true, {}, {}};
  }

  // Reads every source's link value so that the signature and size cover
  // every linked file, whatever the checks find later.
  void resolve_shards(const std::vector<std::string>& names) {
    const std::string master_directory = directory_of(acq_.master_path);
    std::set<std::string> seen{acq_.master_path};
    for (const auto& name : names) {
      Shard shard;
      shard.link_name = name;
      const hdf5::LinkInfo link = hdf5::link_info(data_group_.id(), name);
      if (link.type == H5L_TYPE_EXTERNAL) {
        shard.external = true;
        shard.file_path = lexically_absolute(link.external_file.empty() || link.external_file[0] != '/'
                                                 ? master_directory + "/" + link.external_file
                                                 : link.external_file);
        shard.dataset_path = link.external_object;
        if (seen.insert(shard.file_path).second) {
          const StatResult linked_stat = stat_path(shard.file_path);
          acq_.signature.push_back(signature_entry(shard.file_path, linked_stat));
        }
      } else {
        shard.file_path = acq_.master_path;
        shard.dataset_path = "/entry/data/" + name;
      }
      acq_.shards.push_back(shard);
    }
  }

  // One source: its linked file exists, is not empty and opens as HDF5; its
  // dataset exists and is a dataset; its shape holds frames of a detector.
  LoadStatus check_source(Shard& shard) {
    hdf5::File external_file;
    hid_t file = master_.id();
    if (shard.external) {
      if (LoadStatus status = open_linked_file(shard, external_file); !status.loadable) return status;
      file = external_file.id();
      if (hdf5::object_type(file, shard.dataset_path) != H5O_TYPE_DATASET) {
        return not_ready("linked detector dataset is missing: " + shard.file_path + ":" + shard.dataset_path,
                         "Repair the external link or recopy the acquisition so it targets entry/data/data.");
      }
    } else {
      shard.exists = true;
      if (hdf5::object_type(file, shard.dataset_path) != H5O_TYPE_DATASET) {
        return not_ready("inline detector dataset is not readable: " + shard.dataset_path + " (not a dataset)",
                         "Wait for the master dataset header to finish writing, then poll again; recopy it if the "
                         "error persists.");
      }
    }
    return read_source(shard, file);
  }

  // A source's linked file: it exists, is a regular file, is not empty and
  // opens as HDF5 (into `opened`).
  LoadStatus open_linked_file(Shard& shard, hdf5::File& opened) {
    static const FileTexts kLinkedTexts{
        "linked detector file",
        "Finish copying or writing the linked detector file next to the master, then poll again.",
        "Wait for the linked detector HDF5 file to finish writing, then poll again.", kActionLinkedFileNotReadable};
    const StatResult linked = stat_path(shard.file_path);
    if (linked.error == 0) shard.exists = true;
    return open_file(shard.file_path, linked, kLinkedTexts, opened);
  }

  // What the readiness texts of a file's checks say: "<kind> is missing: ..."
  // and the actions for a missing, an empty and an unreadable file.
  struct FileTexts {
    const char* kind;
    const char* missing_action;
    const char* empty_action;
    const char* not_readable_action;
  };

  // A file the inspection reads: it exists (as `stat` found it), is a regular
  // file, is not empty and opens as HDF5 (into `opened`).
  static LoadStatus open_file(const std::string& path, const StatResult& stat, const FileTexts& texts,
                              hdf5::File& opened) {
    const std::string kind = texts.kind;
    if (stat.error == ENOENT || stat.error == ENOTDIR) return not_ready(kind + " is missing: " + path, texts.missing_action);
    if (stat.error != 0) {
      return not_ready(kind + " cannot be inspected: " + path + " (" + std::strerror(stat.error) + ")",
                       kActionPermissions);
    }
    if (stat.info.st_size == 0) return not_ready(kind + " is empty: " + path, texts.empty_action);
    if (!S_ISREG(stat.info.st_mode)) {
      return not_ready(kind + " is not readable HDF5: " + path + " (" +
                           (S_ISDIR(stat.info.st_mode) ? "Is a directory" : "not a regular file") + ")",
                       texts.not_readable_action);
    }
    try {
      opened = hdf5::File::open_read_only(path);
    } catch (const HdfError& e) {
      return not_ready(kind + " is not readable HDF5: " + path + " (" + hdf5_message(e) + ")", texts.not_readable_action);
    }
    return {true, {}, {}};
  }

  // A source's dataset in `file`: its shape holds frames of a detector; its
  // dtype, storage and scan_shape attribute are kept for the later checks.
  LoadStatus read_source(Shard& shard, hid_t file) {
    const std::string& d = shard.dataset_path;
    SourceFacts facts;
    facts.file_path = shard.file_path;
    facts.dataset_path = d;
    std::optional<ScanShape> attribute_shape;
    try {
      const hdf5::Dataset dataset = hdf5::open_dataset(file, d);
      const auto dims = dataset.space().dims();
      facts.dims.assign(dims.begin(), dims.end());
      if (facts.dims.size() < 3) {
        return not_ready("detector dataset " + d + " has shape " +
                             python_tuple({facts.dims.begin(), facts.dims.end()}) +
                             "; expected at least (frame, det_row, det_col)",
                         "Repair or reacquire the dataset with explicit frame and two detector dimensions.");
      }
      facts.frames = 1;
      for (std::size_t i = 0; i + 2 < facts.dims.size(); ++i) facts.frames *= facts.dims[i];
      const hdf5::Datatype type = dataset.type();
      facts.numpy_dtype = type.numpy_str();
      facts.dtype = supported_dtype(type);
      facts.storage = detail::describe_storage(dataset, type.size());
      if (facts.storage.layout == H5D_CHUNKED) {
        facts.chunks_written = dataset.allocated_chunk_count();
      } else if (facts.storage.layout == H5D_CONTIGUOUS) {
        facts.contiguous_allocated = dataset.contiguous_offset().has_value();
      }
      if (const auto value = attribute_value(dataset.id(), "scan_shape")) attribute_shape = as_scan_shape(*value);
    } catch (const HdfError& e) {
      if (shard.external) {
        return not_ready("linked detector file is not readable HDF5: " + shard.file_path + " (" + hdf5_message(e) + ")",
                         kActionLinkedFileNotReadable);
      }
      return not_ready("inline detector dataset is not readable: " + d + " (" + hdf5_message(e) + ")",
                       "Wait for the master dataset header to finish writing, then poll again; recopy it if the error "
                       "persists.");
    }
    shard.frame_count = facts.frames;
    sources_.push_back(std::move(facts));
    source_scan_shapes_.push_back(attribute_shape);
    return {true, {}, {}};
  }

  // Tightenings on how the sources are stored, once the frame counts agree:
  // dtype, chunk layout, filter pipeline, chunks written, one compression.
  LoadStatus check_storage() {
    const SourceFacts& first = sources_.front();
    if (!acq_.dtype) {
      return not_ready("detector dataset " + first.file_path + ":" + first.dataset_path + " has dtype " +
                           first.numpy_dtype + "; expected unsigned 8, 16 or 32-bit integers (uint8, uint16, uint32)",
                       "Convert or reacquire the acquisition with unsigned 8, 16 or 32-bit detector counts.");
    }
    std::set<codec::ChunkFilter> filters;
    for (const auto& facts : sources_) {
      const std::string where = facts.file_path + ":" + facts.dataset_path;
      const auto& storage = facts.storage;
      if (storage.layout == H5D_COMPACT || storage.layout == H5D_VIRTUAL) {
        return not_ready("detector dataset " + where + " uses " +
                             (storage.layout == H5D_COMPACT ? "compact" : "virtual") +
                             " storage; expected chunked (one frame per chunk) or contiguous storage",
                         "Rewrite the detector data as a chunked (one frame per chunk) or contiguous dataset, then "
                         "poll again.");
      }
      if (storage.layout == H5D_CHUNKED) {
        std::vector<unsigned long long> frame_chunk(facts.dims.size(), 1);
        frame_chunk[frame_chunk.size() - 2] = facts.dims[facts.dims.size() - 2];
        frame_chunk.back() = facts.dims.back();
        const std::vector<unsigned long long> chunk(storage.chunk_dims.begin(), storage.chunk_dims.end());
        if (chunk != frame_chunk) {
          return not_ready("detector dataset " + where + " is stored in chunks of " + python_tuple(chunk) +
                               "; expected one frame per chunk " + python_tuple(frame_chunk),
                           "Rewrite the detector data with one frame per chunk (chunk shape (1, rows, cols)), then "
                           "poll again.");
        }
      }
      if (!storage.filter) {
        return not_ready("detector dataset " + where + " uses an unsupported HDF5 filter pipeline: " +
                             storage.filter_description +
                             "; expected bitshuffle-LZ4 (32008), LZ4 (32004) or no filter",
                         "Recompress the detector data with bitshuffle-LZ4 (as DECTRIS writers do), LZ4 or no filter, "
                         "then poll again.");
      }
      filters.insert(*storage.filter);
      if (storage.layout == H5D_CHUNKED && facts.chunks_written < facts.frames) {
        return not_ready("detector dataset " + where + " has " + std::to_string(facts.chunks_written) + " of " +
                             std::to_string(facts.frames) + " frame chunks written",
                         kActionWaitChunks);
      }
      if (storage.layout == H5D_CONTIGUOUS && !facts.contiguous_allocated) {
        return not_ready("detector dataset " + where + " has no data written yet", kActionWaitChunks);
      }
    }
    if (filters.size() > 1) {
      std::string list;
      for (const auto filter : filters) list += std::string(list.empty() ? "" : ", ") + detail::chunk_filter_name(filter);
      return not_ready("detector sources use inconsistent compression: " + list,
                       "Repair or reacquire the acquisition so every detector chunk uses the same compression.");
    }
    acq_.chunk_format.filter = *filters.begin();
    acq_.chunk_format.element_size = dtype_size(*acq_.dtype);
    return {true, {}, {}};
  }

  // After metadata: a known scan shape must cover the stored frames.
  LoadStatus check_derived() const {
    if (acq_.scan_shape_known() && acq_.frame_count() != acq_.stored_frames) {
      return not_ready("scan shape " + scan_shape_text({acq_.scan_rows, acq_.scan_cols}) + " from " +
                           acq_.scan_shape_basis + " covers " + std::to_string(acq_.frame_count()) +
                           " frames; the detector sources store " + std::to_string(acq_.stored_frames),
                       "Repair the scan_shape metadata so it matches the stored frames, then poll again.");
    }
    return {true, "master and detector sources are complete, readable, and internally consistent",
            "Ready to open with Show4DSTEM."};
  }

  // The files did not change while they were inspected (every signature entry
  // read again is the same); then the acquisition is ready.
  LoadStatus check_stability() const {
    std::set<std::string> changed;
    for (const auto& before : acq_.signature) {
      if (signature_entry(before.path, stat_path(before.path)) != before) changed.insert(base_name(before.path));
    }
    if (!changed.empty()) {
      return not_ready("source files changed during readiness inspection: " + comma_list(changed),
                       "Wait for acquisition or copy writes to finish, then compare a fresh readiness signature on the "
                       "next poll.");
    }
    return {true, "master and detector sources are complete, readable, and internally consistent",
            "Ready to open with Show4DSTEM."};
  }

  // --- metadata: scan shape, calibration, pixel mask ---

  void read_metadata() {
    const hid_t master = master_.id();
    read_scan_shape(master);
    read_calibration(master);
    if (acq_.detector_shape_known()) read_pixel_mask(master);
  }

  // The frame total the sidecar and the square guess must explain.
  std::optional<std::uint64_t> frame_total() const {
    if (acq_.ntrigger) return *acq_.ntrigger * *acq_.nimages;
    if (all_sources_read_ && acq_.stored_frames > 0) return acq_.stored_frames;
    return std::nullopt;
  }

  void set_scan_shape(const ScanShape& shape, std::string basis) {
    acq_.scan_rows = shape.rows;
    acq_.scan_cols = shape.cols;
    acq_.scan_shape_basis = std::move(basis);
  }

  void read_scan_shape(hid_t master) {
    // 1. The first scan_shape: root dataset, root attribute, entry/data, first source.
    if (const auto value = dataset_value(master, "scan_shape")) {
      if (const auto shape = as_scan_shape(*value)) return set_scan_shape(*shape, "root dataset scan_shape");
    }
    if (const auto value = attribute_value(master, "scan_shape")) {
      if (const auto shape = as_scan_shape(*value)) return set_scan_shape(*shape, "root attribute scan_shape");
    }
    if (data_group_.valid()) {
      if (const auto value = attribute_value(data_group_.id(), "scan_shape")) {
        if (const auto shape = as_scan_shape(*value)) return set_scan_shape(*shape, "entry/data attribute scan_shape");
      }
      // The first source's own attribute (entry/data/data, or the first data_NNNNNN).
      if (!source_scan_shapes_.empty() && source_scan_shapes_.front()) {
        return set_scan_shape(*source_scan_shapes_.front(),
                              "scan_shape attribute of entry/data/" + acq_.shards.front().link_name);
      }
    }
    const auto total = frame_total();
    // 2. The Arina sidecar.
    if (total && read_sidecar_scan_shape(*total)) return;
    // 3. A square of the frame total.
    if (total) {
      const auto side = static_cast<std::uint64_t>(std::llround(std::sqrt(static_cast<double>(*total))));
      for (std::uint64_t s = side > 0 ? side - 1 : 0; s <= side + 1; ++s) {
        if (s > 0 && s * s == *total) {
          return set_scan_shape({s, s}, acq_.ntrigger ? "square of ntrigger x nimages = " + std::to_string(*total)
                                                      : "square of the stored frame count " + std::to_string(*total));
        }
      }
    }
  }

  bool read_sidecar_scan_shape(std::uint64_t total) {
    const std::string sidecar = directory_of(acq_.master_path) + "/" + acq_.stem + ".h5";
    const StatResult sidecar_stat = stat_path(sidecar);
    if (sidecar_stat.error != 0 || !S_ISREG(sidecar_stat.info.st_mode) || sidecar_stat.info.st_size == 0) return false;
    try {
      const hdf5::File file = hdf5::File::open_read_only(sidecar);
      if (hdf5::object_type(file.id(), "STEM Metadata") != H5O_TYPE_GROUP) return false;
      const hdf5::Group group = hdf5::open_group(file.id(), "STEM Metadata");
      const auto read = [&](const char* name) -> std::optional<std::int64_t> {
        const auto value = attribute_value(group.id(), name);
        return value ? as_integer(*value) : std::nullopt;
      };
      const auto cols = read("NumPixelsX");
      const auto rows = read("NumPixelsY");
      if (!cols || !rows || *cols < 1 || *rows < 1) return false;
      const auto x = static_cast<std::uint64_t>(*cols), y = static_cast<std::uint64_t>(*rows);
      const std::string name = base_name(sidecar);
      if (x * y == total) {
        set_scan_shape({y, x}, "STEM Metadata sidecar " + name);
        return true;
      }
      const auto prescan = read("NumPixelsPrescan");
      if (prescan && *prescan > 0 && (x + static_cast<std::uint64_t>(*prescan)) * y == total) {
        set_scan_shape({y, x + static_cast<std::uint64_t>(*prescan)},
                       "STEM Metadata sidecar " + name + " (NumPixelsX + NumPixelsPrescan columns)");
        return true;
      }
      spdlog::warn("catalog: {}: sidecar {} scan {}x{} (prescan {}) does not match {} frames; ignored",
                   acq_.master_path, sidecar, y, x, prescan.value_or(0), total);
    } catch (const std::exception& e) {
      spdlog::warn("catalog: {}: cannot read sidecar {}: {}", acq_.master_path, sidecar, e.what());
    }
    return false;
  }

  // As the reference: entry/data attributes, then root attributes, then
  // root-level datasets (later assignments win in the Python metadata dict).
  void read_calibration(hid_t master) {
    const auto lookup = [&](const std::string& key) -> std::optional<double> {
      std::optional<hdf5::Value> value;
      if (data_group_.valid()) value = attribute_value(data_group_.id(), key);
      if (!value) value = attribute_value(master, key);
      if (!value) value = dataset_value(master, key);
      if (!value) return std::nullopt;
      return as_finite_real(*value);
    };
    acq_.scan_sampling_A = lookup("scan_sampling_A");
    if (!acq_.scan_sampling_A) acq_.scan_sampling_A = lookup("scan_sampling_angstrom");
    acq_.k_pixel_size_mrad = lookup("k_pixel_size_mrad");
    if (!acq_.k_pixel_size_mrad) acq_.k_pixel_size_mrad = lookup("detector_sampling_mrad");
  }

  void read_pixel_mask(hid_t master) {
    if (hdf5::object_type(master, kPixelMaskPath) != H5O_TYPE_DATASET) return;
    try {
      const hdf5::Dataset dataset = hdf5::open_dataset(master, kPixelMaskPath);
      const auto dims = dataset.space().dims();
      const hdf5::Datatype type = dataset.type();
      if (type.type_class() != H5T_INTEGER) {
        spdlog::warn("catalog: {}: pixel_mask is not an integer dataset ({}); ignored", acq_.master_path,
                     type.numpy_str());
        return;
      }
      if (dims.size() != 2 || dims[0] != acq_.detector_rows || dims[1] != acq_.detector_cols) {
        spdlog::warn("catalog: {}: pixel_mask shape {} differs from the detector ({}, {}); ignored", acq_.master_path,
                     python_tuple({dims.begin(), dims.end()}), acq_.detector_rows, acq_.detector_cols);
        return;
      }
      const std::size_t pixels = static_cast<std::size_t>(dims[0] * dims[1]);
      std::vector<std::uint64_t> values(pixels);
      // Signed values convert exactly to int64 and unsigned ones to uint64;
      // both keep the bit pattern of the low 16 bits.
      const hid_t memory_type = type.is_signed() ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64;
      if (H5Dread(dataset.id(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) {
        hdf5::throw_error("H5Dread(pixel_mask)");
      }
      acq_.pixel_mask.assign(pixels, 0);
      acq_.masked_pixel_count = 0;
      for (std::size_t i = 0; i < pixels; ++i) {
        if (values[i] & 0xFFFFu) {
          acq_.pixel_mask[i] = 1;
          ++acq_.masked_pixel_count;
        }
      }
    } catch (const std::exception& e) {
      acq_.pixel_mask.clear();
      acq_.masked_pixel_count = 0;
      spdlog::warn("catalog: {}: cannot read pixel_mask: {}; ignored", acq_.master_path, e.what());
    }
  }

  // size_bytes: the master plus every distinct linked file that exists
  // (as the reference; an empty master falls back to the <stem>_data_*.h5 glob).
  void finish_sizes() {
    std::uint64_t total = 0;
    for (const auto& entry : acq_.signature) {
      if (entry.exists && entry.size_bytes > 0) total += static_cast<std::uint64_t>(entry.size_bytes);
    }
    if (total == 0) {
      std::error_code error;
      const std::string prefix = acq_.stem + "_data_";
      for (fs::directory_iterator it(directory_of(acq_.master_path), error), end; !error && it != end;
           it.increment(error)) {
        const std::string name = it->path().filename().string();
        if (name.size() > prefix.size() + 3 && name.compare(0, prefix.size(), prefix) == 0 &&
            name.compare(name.size() - 3, 3, ".h5") == 0) {
          std::error_code size_error;
          const auto bytes = fs::file_size(it->path(), size_error);
          if (!size_error) total += bytes;
        }
      }
    }
    acq_.size_bytes = total;
  }

  Acquisition& acq_;
  hdf5::File master_;
  hdf5::Group data_group_;
  std::vector<SourceFacts> sources_;
  std::vector<std::optional<ScanShape>> source_scan_shapes_;
  bool all_sources_read_ = false;
  std::optional<std::int64_t> raw_ntrigger_;
  std::int64_t raw_nimages_ = 1;
};

}  // namespace

std::string lexically_absolute(const std::string& path) {
  fs::path p(path);
  if (p.is_relative()) {
    std::error_code error;
    const fs::path cwd = fs::current_path(error);
    p = (error ? fs::path("/") : cwd) / p;
  }
  std::string normal = p.lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}

Acquisition named_acquisition(const std::string& master_path) {
  Acquisition acquisition;
  acquisition.master_path = lexically_absolute(master_path);
  acquisition.name = base_name(acquisition.master_path);
  const std::string suffix = kMasterSuffix;
  acquisition.stem = acquisition.name;
  if (acquisition.stem.size() >= suffix.size() &&
      acquisition.stem.compare(acquisition.stem.size() - suffix.size(), suffix.size(), suffix) == 0) {
    acquisition.stem.resize(acquisition.stem.size() - suffix.size());
  }
  return acquisition;
}

Acquisition inspect_master(const std::string& master_path) {
  const hdf5::LibraryLock hdf5_lock;
  Acquisition acquisition = named_acquisition(master_path);
  try {
    MasterInspection(acquisition).run();
  } catch (const std::exception& e) {
    // Nothing may escape: an unexpected failure is reported like any other
    // invalid header, "master HDF5 headers are incomplete or invalid".
    acquisition.status = {false,
                          "master HDF5 headers are incomplete or invalid: " + acquisition.master_path + " (" +
                              e.what() + ")",
                          "Wait for acquisition to finish, then poll again; recopy or repair the group if the error "
                          "persists."};
  }
  if (!acquisition.status.loadable) {
    // Keep the reference's "unknown until every source was read" reporting.
    if (acquisition.detector_rows == 0 || acquisition.detector_cols == 0) acquisition.dtype.reset();
  }
  return acquisition;
}

SourceSignature restat_signature(const SourceSignature& signature) {
  SourceSignature fresh;
  fresh.reserve(signature.size());
  for (const auto& entry : signature) fresh.push_back(signature_entry(entry.path, stat_path(entry.path)));
  return fresh;
}

}  // namespace quantem::catalog
