#pragma once
// What a master (and its Arina sidecar <stem>.h5) says about the instrument:
// high tension, camera length, count and frame time, the detector..., read on
// demand for GET /api/browse/metadata (docs/protocol.md). Never part of an
// inspection or the catalog cache. The daemon reads it in its inspector
// worker (inspector/inspector.hpp, decision 0012); tools and tests may read
// it in-process.
//
// Two parts:
//  - fields: well-known quantities, each taken from the first of its
//    candidate locations that holds a usable value (MetadataFieldSpec below;
//    the table is master_metadata_fields()), converted to the field's unit
//    when the file's `units` attribute names a unit of the same kind
//    (m, mm, um, nm; s, ms, us, ns; eV, keV, V, kV; angstrom, nm); a
//    candidate whose unit is not recognised is passed over. A physical
//    quantity must be finite and positive to count: the writers store 0 for
//    "not set" (an Arina master's detector_distance, the sidecar's
//    ScanDwellTime);
//  - entries: every scalar (one element) attribute and dataset of the master
//    and the sidecar, walked from "/" over hard links only (external links
//    lead to the frames), at most kMaxMetadataEntriesPerFile per file and
//    kMaxMetadataGroupsPerFile groups, kMaxMetadataDepth deep; texts cut at
//    kMaxMetadataTextBytes. A dataset's `units` attribute is its entry's unit.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace quantem::catalog {

constexpr std::size_t kMaxMetadataEntriesPerFile = 400;
constexpr std::size_t kMaxMetadataGroupsPerFile = 256;
constexpr std::size_t kMaxMetadataDepth = 8;
constexpr std::size_t kMaxMetadataTextBytes = 256;
constexpr std::size_t kMaxMetadataPathBytes = 512;

// One scalar as read: an integer, a real or a text.
struct MetadataValue {
  enum class Kind { integer, real, text };
  Kind kind = Kind::text;
  std::int64_t integer = 0;
  double real = 0.0;   // finite (a non-finite real is kept as the text "nan", "inf" or "-inf")
  std::string text;
  bool truncated = false;  // text cut at kMaxMetadataTextBytes
  bool operator==(const MetadataValue& o) const {
    return kind == o.kind && integer == o.integer && real == o.real && text == o.text && truncated == o.truncated;
  }
};

// The value as a JSON scalar (Json: an nlohmann::basic_json): the integer,
// the real or the text, as read.
template <class Json>
Json metadata_value_json(const MetadataValue& value) {
  switch (value.kind) {
    case MetadataValue::Kind::integer: return value.integer;
    case MetadataValue::Kind::real: return value.real;
    case MetadataValue::Kind::text: break;
  }
  return value.text;
}

struct MetadataField {
  std::string name;    // a name of master_metadata_fields(): "high_tension", "camera_length", ...
  MetadataValue value; // in `unit`
  std::string unit;    // the field's unit; "" for a count or a text
  std::string source;  // "<file name>:<object path>" or "<file name>:<object path>@<attribute>"
  bool operator==(const MetadataField& o) const {
    return name == o.name && value == o.value && unit == o.unit && source == o.source;
  }
};

struct MetadataEntry {
  std::string file;    // the file's name (the master's or the sidecar's), without its folder
  std::string path;    // "/entry/instrument/detector/count_time", or "<object>@<attribute>"
  MetadataValue value;
  std::string unit;    // a dataset's `units` attribute; "" when it has none
  bool operator==(const MetadataEntry& o) const {
    return file == o.file && path == o.path && value == o.value && unit == o.unit;
  }
};

struct MasterMetadata {
  std::string master_path;
  std::string sidecar_name;  // "<stem>.h5" when it exists and was read; "" otherwise
  std::vector<MetadataField> fields;    // in master_metadata_fields() order, absent ones left out
  std::vector<MetadataEntry> entries;   // the master's, then the sidecar's
  bool entries_truncated = false;       // a file had more than the limits above
};

// A well-known field: its name, what the viewer calls it, its unit, and where
// it is looked for, first match wins.
struct MetadataCandidate {
  bool sidecar = false;         // in <stem>.h5 rather than the master
  std::string object;           // a dataset, or the object holding `attribute`
  std::string attribute;        // "" : the dataset's own value
  std::string default_unit;     // the unit when the file names none
};
struct MetadataFieldSpec {
  std::string name;
  std::string label;
  std::string unit;             // "" : a count or a text, taken as it is
  std::vector<MetadataCandidate> candidates;
};
const std::vector<MetadataFieldSpec>& master_metadata_fields();

// The factor that converts a value in `unit` to `target` (both of one kind,
// see above), or 0 when `unit` is not a unit of that kind this knows.
double unit_factor(const std::string& unit, const std::string& target);

// Reads the master's and its sidecar's metadata with libhdf5 in this process
// (under the process-wide HDF5 lock). Throws quantem::Error: not_found when
// the master does not exist, corrupt_data when it is not readable HDF5. A
// sidecar that cannot be read is left out (logged).
MasterMetadata read_master_metadata(const std::string& master_path);

}  // namespace quantem::catalog
