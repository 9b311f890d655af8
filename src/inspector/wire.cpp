#include "quantem/inspector/wire.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/catalog/acquisition_fields.hpp"
#include "quantem/core/error.hpp"

namespace quantem::inspector {

namespace {

using nlohmann::json;

// Every number of an Acquisition is a count or a size; the worker's JSON keeps
// them below 2^53 only by accident, so they travel as JSON unsigned integers.
constexpr std::size_t kMaxShards = 1u << 20;
constexpr std::size_t kMaxStringBytes = 1u << 16;

ProtocolError malformed(const std::string& what) { return ProtocolError("malformed inspector reply: " + what); }

const json& member(const json& object, const char* key) {
  if (!object.is_object()) throw malformed(std::string("expected an object holding '") + key + "'");
  const auto it = object.find(key);
  if (it == object.end()) throw malformed(std::string("'") + key + "' is missing");
  return *it;
}

std::uint64_t unsigned_of(const json& object, const char* key) {
  const json& value = member(object, key);
  if (!value.is_number_unsigned()) throw malformed(std::string("'") + key + "' is not an unsigned integer");
  return value.get<std::uint64_t>();
}

std::int64_t signed_of(const json& object, const char* key) {
  const json& value = member(object, key);
  if (!value.is_number_integer()) throw malformed(std::string("'") + key + "' is not an integer");
  return value.get<std::int64_t>();
}

bool bool_of(const json& object, const char* key) {
  const json& value = member(object, key);
  if (!value.is_boolean()) throw malformed(std::string("'") + key + "' is not a boolean");
  return value.get<bool>();
}

std::string string_of(const json& object, const char* key) {
  const json& value = member(object, key);
  if (!value.is_string()) throw malformed(std::string("'") + key + "' is not a string");
  std::string text = value.get<std::string>();
  if (text.size() > kMaxStringBytes) throw malformed(std::string("'") + key + "' is too long");
  if (text.find('\0') != std::string::npos) throw malformed(std::string("'") + key + "' holds a NUL");
  return text;
}

std::optional<std::uint64_t> optional_unsigned_of(const json& object, const char* key) {
  if (member(object, key).is_null()) return std::nullopt;
  return unsigned_of(object, key);
}

std::optional<double> optional_double_of(const json& object, const char* key) {
  const json& value = member(object, key);
  if (value.is_null()) return std::nullopt;
  if (!value.is_number()) throw malformed(std::string("'") + key + "' is not a number");
  return value.get<double>();
}

const json& array_of(const json& object, const char* key, std::size_t max_size) {
  const json& value = member(object, key);
  if (!value.is_array()) throw malformed(std::string("'") + key + "' is not an array");
  if (value.size() > max_size) throw malformed(std::string("'") + key + "' has too many entries");
  return value;
}

bool multiply_fits(std::uint64_t a, std::uint64_t b, std::uint64_t& product) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return false;
  product = a * b;
  return true;
}

const char* filter_name(codec::ChunkFilter filter) {
  switch (filter) {
    case codec::ChunkFilter::none: return "none";
    case codec::ChunkFilter::bitshuffle_lz4: return "bitshuffle_lz4";
    case codec::ChunkFilter::lz4: return "lz4";
  }
  return "none";
}

codec::ChunkFilter filter_from(const std::string& name) {
  if (name == "none") return codec::ChunkFilter::none;
  if (name == "bitshuffle_lz4") return codec::ChunkFilter::bitshuffle_lz4;
  if (name == "lz4") return codec::ChunkFilter::lz4;
  throw malformed("unknown chunk filter '" + name + "'");
}

json optional_json(const std::optional<std::uint64_t>& value) { return value ? json(*value) : json(nullptr); }

// Writes each field of a record into one JSON object under its key; a nested
// record's fields go into the same object, a list of records into an array
// of objects.
class JsonFieldWriter {
 public:
  explicit JsonFieldWriter(json& object) : object_(object) {}

  template <typename T>
  void operator()(const char* key, const T& value) {
    if constexpr (catalog::has_fields_v<T>) {
      catalog::for_each_field(*this, value);
    } else if constexpr (catalog::is_record_list_v<T>) {
      json list = json::array();
      for (const auto& record : value) list.push_back(to_json_object(record));
      object_[key] = std::move(list);
    } else {
      object_[key] = plain(value);
    }
  }

  template <typename Record>
  static json to_json_object(const Record& record) {
    json object = json::object();
    JsonFieldWriter writer(object);
    catalog::for_each_field(writer, record);
    return object;
  }

 private:
  static json plain(const std::string& value) { return value; }
  static json plain(DType value) { return dtype_name(value); }
  static json plain(codec::ChunkFilter value) { return filter_name(value); }
  static json plain(const std::vector<std::uint8_t>& pixel_mask) {
    return pixel_mask.empty() ? json(nullptr) : json(catalog::pixel_mask_runs(pixel_mask));
  }
  template <typename T>
  static json plain(const std::optional<T>& value) {
    return value ? plain(*value) : json(nullptr);
  }
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  static json plain(T value) {
    return value;
  }

  json& object_;
};

// Reads each field of a record from one JSON object, refusing a missing key
// or a value of the wrong type; the pixel mask's runs are kept aside, to be
// checked against the detector shape once it is read (acquisition_from_json).
class JsonFieldReader {
 public:
  JsonFieldReader(const json& object, const json*& mask_runs) : object_(object), mask_runs_(mask_runs) {}

  template <typename T>
  void operator()(const char* key, T& value) {
    if constexpr (catalog::has_fields_v<T>) {
      catalog::for_each_field(*this, value);
    } else if constexpr (catalog::is_record_list_v<T>) {
      for (const json& entry : array_of(object_, key, max_entries(value))) {
        JsonFieldReader reader(entry, mask_runs_);
        catalog::for_each_field(reader, value.emplace_back());
      }
    } else {
      read(key, value);
    }
  }

 private:
  static std::size_t max_entries(const std::vector<catalog::Shard>&) { return kMaxShards; }
  static std::size_t max_entries(const std::vector<catalog::SignatureEntry>&) { return kMaxShards + 1; }

  void read(const char* key, std::string& value) const { value = string_of(object_, key); }
  void read(const char* key, bool& value) const { value = bool_of(object_, key); }
  void read(const char* key, std::int64_t& value) const { value = signed_of(object_, key); }
  void read(const char* key, std::uint64_t& value) const { value = unsigned_of(object_, key); }
  void read(const char* key, codec::ChunkFilter& value) const { value = filter_from(string_of(object_, key)); }
  void read(const char* key, std::optional<std::uint64_t>& value) const { value = optional_unsigned_of(object_, key); }
  void read(const char* key, std::optional<double>& value) const { value = optional_double_of(object_, key); }
  void read(const char* key, std::optional<DType>& value) const {
    value.reset();
    if (member(object_, key).is_null()) return;
    value = dtype_from_name(string_of(object_, key));
    if (!value) throw malformed("unknown dtype");
  }
  void read(const char* key, std::vector<std::uint8_t>&) const { mask_runs_ = &member(object_, key); }

  const json& object_;
  const json*& mask_runs_;
};

// The pixel mask from its runs (null: no mask), which must cover the detector.
void read_pixel_mask(const json& runs, catalog::Acquisition& a) {
  std::uint64_t pixels = 0;
  if (!multiply_fits(a.detector_rows, a.detector_cols, pixels)) throw malformed("the detector shape overflows");
  if (runs.is_null()) {
    if (a.masked_pixel_count != 0) throw malformed("masked_pixel_count without a mask");
    return;
  }
  if (!runs.is_array() || runs.empty()) throw malformed("'pixel_mask_runs' is not a non-empty array");
  if (pixels == 0 || pixels > kMaxLineBytes) throw malformed("a pixel mask without a detector shape it can cover");
  std::vector<std::uint64_t> lengths;
  lengths.reserve(runs.size());
  for (const json& run : runs) {
    if (!run.is_number_unsigned()) throw malformed("a pixel mask run is not an unsigned integer");
    lengths.push_back(run.get<std::uint64_t>());
  }
  std::uint64_t masked = 0;
  if (const char* problem = catalog::pixel_mask_from_runs(lengths, pixels, a.pixel_mask, masked)) throw malformed(problem);
  if (masked != a.masked_pixel_count) throw malformed("masked_pixel_count differs from the mask");
}

// What inspect_master guarantees of a loadable acquisition, which the loaders
// rely on.
void check_loadable_invariants(const catalog::Acquisition& a) {
  std::uint64_t frames = 0, shard_frames = 0;
  if (!a.dtype || a.signature.empty()) throw malformed("a loadable acquisition without dtype or signature");
  if (!multiply_fits(a.scan_rows, a.scan_cols, frames) || (a.scan_shape_known() && frames != a.stored_frames)) {
    throw malformed("a loadable acquisition whose scan shape does not cover its stored frames");
  }
  for (const auto& shard : a.shards) {
    if (!shard.exists || shard.file_path.empty() || shard.file_path.front() != '/') {
      throw malformed("a loadable acquisition with a missing or relative shard");
    }
    if (shard.frame_count > a.stored_frames - shard_frames) throw malformed("the shards hold more frames than stored");
    shard_frames += shard.frame_count;
  }
  if (shard_frames != a.stored_frames) throw malformed("the shards' frames differ from stored_frames");
  if (dtype_size(*a.dtype) != a.chunk_format.element_size) throw malformed("chunk_element_size differs from the dtype");
}

}  // namespace

json acquisition_to_json(const catalog::Acquisition& a) { return JsonFieldWriter::to_json_object(a); }

catalog::Acquisition acquisition_from_json(const json& d) {
  if (!d.is_object()) throw malformed("the acquisition is not an object");
  catalog::Acquisition a;
  const json* mask_runs = nullptr;
  JsonFieldReader reader(d, mask_runs);
  catalog::for_each_field(reader, a);
  if (a.chunk_format.element_size == 0 || a.chunk_format.element_size > 8) throw malformed("chunk_element_size out of range");
  read_pixel_mask(*mask_runs, a);
  if (a.status.loadable) check_loadable_invariants(a);
  return a;
}

json shard_storage_to_json(const catalog::ShardStorage& s) {
  json chunks = json::array();
  for (const auto& chunk : s.chunks) {
    chunks.push_back(json::array({chunk.element_offsets, chunk.file_offset, chunk.stored_bytes, chunk.filter_mask}));
  }
  const char* layout = s.layout == catalog::ShardLayout::contiguous ? "contiguous"
                       : s.layout == catalog::ShardLayout::chunked  ? "chunked"
                                                                    : "other";
  return {{"dims", s.dims},
          {"max_dims", s.max_dims},
          {"offset_size", s.offset_size},
          {"length_size", s.length_size},
          {"base_address", s.base_address},
          {"layout", layout},
          {"chunk_dims", s.chunk_dims},
          {"object_header_address", s.object_header_address},
          {"contiguous_offset", optional_json(s.contiguous_offset)},
          {"chunks_listed", s.chunks_listed},
          {"chunks", std::move(chunks)}};
}

namespace {

constexpr std::size_t kMaxRank = 32;  // H5S_MAX_RANK

std::vector<std::uint64_t> unsigned_array(const json& value, const char* what, std::size_t max_size) {
  if (!value.is_array() || value.size() > max_size) throw malformed(std::string("'") + what + "' is not a short array");
  std::vector<std::uint64_t> numbers;
  for (const json& number : value) {
    if (!number.is_number_unsigned()) throw malformed(std::string("'") + what + "' holds a non-count");
    numbers.push_back(number.get<std::uint64_t>());
  }
  return numbers;
}

bool is_address_size(std::uint64_t bytes) { return bytes == 2 || bytes == 4 || bytes == 8; }

}  // namespace

catalog::ShardStorage shard_storage_from_json(const json& d) {
  if (!d.is_object()) throw malformed("the storage is not an object");
  catalog::ShardStorage s;
  s.dims = unsigned_array(member(d, "dims"), "dims", kMaxRank);
  s.max_dims = unsigned_array(member(d, "max_dims"), "max_dims", kMaxRank);
  if (s.max_dims.size() != s.dims.size()) throw malformed("dims and max_dims differ in rank");
  s.offset_size = unsigned_of(d, "offset_size");
  s.length_size = unsigned_of(d, "length_size");
  if (!is_address_size(s.offset_size) || !is_address_size(s.length_size)) throw malformed("address sizes out of range");
  s.base_address = unsigned_of(d, "base_address");
  const std::string layout = string_of(d, "layout");
  if (layout == "contiguous") {
    s.layout = catalog::ShardLayout::contiguous;
  } else if (layout == "chunked") {
    s.layout = catalog::ShardLayout::chunked;
  } else if (layout == "other") {
    s.layout = catalog::ShardLayout::other;
  } else {
    throw malformed("unknown layout '" + layout + "'");
  }
  s.chunk_dims = unsigned_array(member(d, "chunk_dims"), "chunk_dims", kMaxRank + 1);
  s.object_header_address = unsigned_of(d, "object_header_address");
  s.contiguous_offset = optional_unsigned_of(d, "contiguous_offset");
  s.chunks_listed = bool_of(d, "chunks_listed");
  const json& chunks = member(d, "chunks");
  if (!chunks.is_array()) throw malformed("'chunks' is not an array");
  if (!s.chunks_listed && !chunks.empty()) throw malformed("chunks listed without chunks_listed");
  s.chunks.reserve(chunks.size());
  for (const json& c : chunks) {
    if (!c.is_array() || c.size() != 4) throw malformed("a chunk is not [offsets, file offset, bytes, mask]");
    catalog::ShardChunk chunk;
    chunk.element_offsets = unsigned_array(c[0], "element offsets", kMaxRank);
    if (chunk.element_offsets.size() != s.dims.size()) throw malformed("a chunk's offsets differ in rank");
    if (!c[1].is_number_unsigned() || !c[2].is_number_unsigned() || !c[3].is_number_unsigned()) {
      throw malformed("a chunk holds a non-count");
    }
    chunk.file_offset = c[1].get<std::uint64_t>();
    chunk.stored_bytes = c[2].get<std::uint64_t>();
    const auto mask = c[3].get<std::uint64_t>();
    if (mask > std::numeric_limits<std::uint32_t>::max()) throw malformed("a chunk's filter mask is out of range");
    chunk.filter_mask = static_cast<std::uint32_t>(mask);
    s.chunks.push_back(std::move(chunk));
  }
  return s;
}

std::string storage_request(const std::string& file_path, const std::string& dataset_path) {
  return json({{"storage", {{"file", file_path}, {"dataset", dataset_path}}}})
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// A reply line as JSON: an object of one member, not the worker's "error"
// (a request it could not parse, which the daemon never sends: internal).
json parse_reply_object(const std::string& line) {
  if (line.size() > kMaxLineBytes) throw malformed("the reply is too long");
  json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded()) throw malformed("the reply is not JSON");
  if (!reply.is_object() || reply.size() != 1) throw malformed("the reply is not an object with one member");
  if (reply.contains("error")) {
    const json& message = reply["error"];
    throw Error(ErrorKind::internal,
                "the inspector refused the request: " + (message.is_string() ? message.get<std::string>() : message.dump()));
  }
  return reply;
}

// The worker's typed failure of a request, rethrown when of an allowed kind.
void throw_if_failed(const json& reply, std::initializer_list<ErrorKind> allowed_kinds) {
  if (!reply.contains("failed")) return;
  const json& failed = reply["failed"];
  const std::string kind = string_of(failed, "kind");
  const std::string message = string_of(failed, "message");
  for (const ErrorKind allowed : allowed_kinds) {
    if (kind == error_kind_name(allowed)) throw Error(allowed, message);
  }
  throw malformed("an error of kind '" + kind + "'");
}

}  // namespace

catalog::ShardStorage parse_storage_reply(const std::string& line) {
  const json reply = parse_reply_object(line);
  throw_if_failed(reply, {ErrorKind::io, ErrorKind::corrupt_data, ErrorKind::conflict, ErrorKind::not_found});
  return shard_storage_from_json(member(reply, "storage"));
}

// ---- metadata ---------------------------------------------------------------------

namespace {

catalog::MetadataValue metadata_value_from_json(const json& holder) {
  const json& v = member(holder, "value");
  catalog::MetadataValue value;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
      throw malformed("a metadata integer out of range");
    }
    value.kind = catalog::MetadataValue::Kind::integer;
    value.integer = v.get<std::int64_t>();
  } else if (v.is_number_float()) {
    value.kind = catalog::MetadataValue::Kind::real;
    value.real = v.get<double>();
    if (!std::isfinite(value.real)) throw malformed("a metadata real is not finite");
  } else if (v.is_string()) {
    value.kind = catalog::MetadataValue::Kind::text;
    value.text = string_of(holder, "value");
    if (value.text.size() > catalog::kMaxMetadataTextBytes) throw malformed("a metadata text is too long");
  } else {
    throw malformed("a metadata value is not a number or a text");
  }
  if (holder.contains("truncated")) {
    value.truncated = bool_of(holder, "truncated");
    if (value.truncated && value.kind != catalog::MetadataValue::Kind::text) throw malformed("a truncated number");
  }
  return value;
}

std::string bounded_string_of(const json& object, const char* key, std::size_t max_bytes) {
  std::string text = string_of(object, key);
  if (text.size() > max_bytes) throw malformed(std::string("'") + key + "' is too long");
  return text;
}

catalog::MetadataField metadata_field_from_json(const json& f) {
  catalog::MetadataField field;
  field.name = string_of(f, "name");
  const auto& specs = catalog::master_metadata_fields();
  const auto spec = std::find_if(specs.begin(), specs.end(), [&](const auto& s) { return s.name == field.name; });
  if (spec == specs.end()) throw malformed("an unknown metadata field '" + field.name + "'");
  field.value = metadata_value_from_json(f);
  field.unit = string_of(f, "unit");
  field.source = bounded_string_of(f, "source", 2 * catalog::kMaxMetadataPathBytes);
  if (field.unit != spec->unit) throw malformed("the metadata field '" + field.name + "' in another unit");
  if (!spec->unit.empty() &&
      (field.value.kind != catalog::MetadataValue::Kind::real || !(field.value.real > 0.0))) {
    throw malformed("the metadata field '" + field.name + "' is not a positive number");
  }
  return field;
}

}  // namespace

json master_metadata_to_json(const catalog::MasterMetadata& m) {
  json fields = json::array();
  for (const auto& field : m.fields) {
    fields.push_back({{"name", field.name},
                      {"value", catalog::metadata_value_json<json>(field.value)},
                      {"unit", field.unit},
                      {"source", field.source}});
    if (field.value.truncated) fields.back()["truncated"] = true;
  }
  json entries = json::array();
  for (const auto& entry : m.entries) {
    entries.push_back({{"file", entry.file},
                       {"path", entry.path},
                       {"value", catalog::metadata_value_json<json>(entry.value)},
                       {"unit", entry.unit}});
    if (entry.value.truncated) entries.back()["truncated"] = true;
  }
  return {{"master_path", m.master_path},
          {"sidecar", m.sidecar_name},
          {"fields", std::move(fields)},
          {"entries", std::move(entries)},
          {"entries_truncated", m.entries_truncated}};
}

catalog::MasterMetadata master_metadata_from_json(const json& d) {
  if (!d.is_object()) throw malformed("the metadata is not an object");
  catalog::MasterMetadata m;
  m.master_path = string_of(d, "master_path");
  m.sidecar_name = bounded_string_of(d, "sidecar", 4096);
  if (m.sidecar_name.find('/') != std::string::npos) throw malformed("the sidecar's name holds a '/'");
  for (const json& f : array_of(d, "fields", catalog::master_metadata_fields().size())) {
    m.fields.push_back(metadata_field_from_json(f));
    for (std::size_t i = 0; i + 1 < m.fields.size(); ++i) {
      if (m.fields[i].name == m.fields.back().name) throw malformed("a metadata field twice");
    }
  }
  for (const json& e : array_of(d, "entries", 2 * catalog::kMaxMetadataEntriesPerFile)) {
    catalog::MetadataEntry entry;
    entry.file = bounded_string_of(e, "file", 4096);
    entry.path = bounded_string_of(e, "path", catalog::kMaxMetadataPathBytes);
    entry.value = metadata_value_from_json(e);
    entry.unit = bounded_string_of(e, "unit", catalog::kMaxMetadataTextBytes);
    m.entries.push_back(std::move(entry));
  }
  m.entries_truncated = bool_of(d, "entries_truncated");
  return m;
}

std::string metadata_request(const std::string& master_path) {
  return json({{"metadata", master_path}}).dump(-1, ' ', false, json::error_handler_t::replace);
}

catalog::MasterMetadata parse_metadata_reply(const std::string& line, const std::string& requested_path) {
  const json reply = parse_reply_object(line);
  throw_if_failed(reply, {ErrorKind::io, ErrorKind::corrupt_data, ErrorKind::not_found});
  catalog::MasterMetadata metadata = master_metadata_from_json(member(reply, "metadata"));
  if (metadata.master_path != requested_path) throw malformed("the metadata of another master");
  return metadata;
}

std::string inspect_request(const std::string& master_path) {
  return json({{"inspect", master_path}}).dump(-1, ' ', false, json::error_handler_t::replace);
}

catalog::Acquisition parse_reply(const std::string& line, const std::string& requested_path) {
  const json reply = parse_reply_object(line);
  catalog::Acquisition acquisition = acquisition_from_json(member(reply, "acquisition"));
  if (acquisition.master_path != requested_path) throw malformed("an acquisition of another master");
  return acquisition;
}

}  // namespace quantem::inspector
