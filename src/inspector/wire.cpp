#include "quantem/inspector/wire.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include <nlohmann/json.hpp>

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
json optional_json(const std::optional<double>& value) { return value ? json(*value) : json(nullptr); }

json mask_runs(const std::vector<std::uint8_t>& mask) {
  json runs = json::array();
  std::uint64_t run = 0;
  std::uint8_t current = 0;  // runs start with unmasked pixels
  for (const std::uint8_t pixel : mask) {
    const std::uint8_t value = pixel != 0 ? 1 : 0;
    if (value != current) {
      runs.push_back(run);
      run = 0;
      current = value;
    }
    ++run;
  }
  runs.push_back(run);
  return runs;
}

}  // namespace

json acquisition_to_json(const catalog::Acquisition& a) {
  json shards = json::array();
  for (const auto& shard : a.shards) {
    shards.push_back({{"link_name", shard.link_name},
                      {"file_path", shard.file_path},
                      {"dataset_path", shard.dataset_path},
                      {"external", shard.external},
                      {"exists", shard.exists},
                      {"frame_count", shard.frame_count}});
  }
  json signature = json::array();
  for (const auto& entry : a.signature) {
    signature.push_back({{"path", entry.path},
                         {"exists", entry.exists},
                         {"size_bytes", entry.size_bytes},
                         {"mtime_ns", entry.mtime_ns},
                         {"ctime_ns", entry.ctime_ns},
                         {"device", entry.device},
                         {"inode", entry.inode}});
  }
  json document = {{"master_path", a.master_path},
                   {"name", a.name},
                   {"stem", a.stem},
                   {"scan_rows", a.scan_rows},
                   {"scan_cols", a.scan_cols},
                   {"detector_rows", a.detector_rows},
                   {"detector_cols", a.detector_cols},
                   {"scan_shape_basis", a.scan_shape_basis},
                   {"dtype", a.dtype ? json(dtype_name(*a.dtype)) : json(nullptr)},
                   {"chunk_filter", filter_name(a.chunk_format.filter)},
                   {"chunk_element_size", a.chunk_format.element_size},
                   {"shards", std::move(shards)},
                   {"stored_frames", a.stored_frames},
                   {"expected_frames", optional_json(a.expected_frames)},
                   {"ntrigger", optional_json(a.ntrigger)},
                   {"nimages", optional_json(a.nimages)},
                   {"pixel_mask_runs", a.pixel_mask.empty() ? json(nullptr) : mask_runs(a.pixel_mask)},
                   {"masked_pixel_count", a.masked_pixel_count},
                   {"size_bytes", a.size_bytes},
                   {"loadable", a.status.loadable},
                   {"reason", a.status.reason},
                   {"action", a.status.action},
                   {"scan_sampling_A", optional_json(a.scan_sampling_A)},
                   {"k_pixel_size_mrad", optional_json(a.k_pixel_size_mrad)},
                   {"signature", std::move(signature)}};
  return document;
}

catalog::Acquisition acquisition_from_json(const json& d) {
  if (!d.is_object()) throw malformed("the acquisition is not an object");
  catalog::Acquisition a;
  a.master_path = string_of(d, "master_path");
  a.name = string_of(d, "name");
  a.stem = string_of(d, "stem");
  a.scan_rows = unsigned_of(d, "scan_rows");
  a.scan_cols = unsigned_of(d, "scan_cols");
  a.detector_rows = unsigned_of(d, "detector_rows");
  a.detector_cols = unsigned_of(d, "detector_cols");
  a.scan_shape_basis = string_of(d, "scan_shape_basis");
  if (!member(d, "dtype").is_null()) {
    a.dtype = dtype_from_name(string_of(d, "dtype"));
    if (!a.dtype) throw malformed("unknown dtype");
  }
  a.chunk_format.filter = filter_from(string_of(d, "chunk_filter"));
  a.chunk_format.element_size = unsigned_of(d, "chunk_element_size");
  if (a.chunk_format.element_size == 0 || a.chunk_format.element_size > 8) throw malformed("chunk_element_size out of range");
  for (const json& s : array_of(d, "shards", kMaxShards)) {
    catalog::Shard shard;
    shard.link_name = string_of(s, "link_name");
    shard.file_path = string_of(s, "file_path");
    shard.dataset_path = string_of(s, "dataset_path");
    shard.external = bool_of(s, "external");
    shard.exists = bool_of(s, "exists");
    shard.frame_count = unsigned_of(s, "frame_count");
    a.shards.push_back(std::move(shard));
  }
  a.stored_frames = unsigned_of(d, "stored_frames");
  a.expected_frames = optional_unsigned_of(d, "expected_frames");
  a.ntrigger = optional_unsigned_of(d, "ntrigger");
  a.nimages = optional_unsigned_of(d, "nimages");
  a.masked_pixel_count = unsigned_of(d, "masked_pixel_count");
  a.size_bytes = unsigned_of(d, "size_bytes");
  a.status.loadable = bool_of(d, "loadable");
  a.status.reason = string_of(d, "reason");
  a.status.action = string_of(d, "action");
  a.scan_sampling_A = optional_double_of(d, "scan_sampling_A");
  a.k_pixel_size_mrad = optional_double_of(d, "k_pixel_size_mrad");
  for (const json& e : array_of(d, "signature", kMaxShards + 1)) {
    catalog::SignatureEntry entry;
    entry.path = string_of(e, "path");
    entry.exists = bool_of(e, "exists");
    entry.size_bytes = signed_of(e, "size_bytes");
    entry.mtime_ns = signed_of(e, "mtime_ns");
    entry.ctime_ns = signed_of(e, "ctime_ns");
    entry.device = unsigned_of(e, "device");
    entry.inode = unsigned_of(e, "inode");
    a.signature.push_back(std::move(entry));
  }

  std::uint64_t pixels = 0;
  if (!multiply_fits(a.detector_rows, a.detector_cols, pixels)) throw malformed("the detector shape overflows");
  const json& runs = member(d, "pixel_mask_runs");
  if (!runs.is_null()) {
    if (!runs.is_array() || runs.empty()) throw malformed("'pixel_mask_runs' is not a non-empty array");
    if (pixels == 0 || pixels > kMaxLineBytes) throw malformed("a pixel mask without a detector shape it can cover");
    a.pixel_mask.reserve(pixels);
    std::uint8_t value = 0;
    std::uint64_t masked = 0;
    for (const json& run : runs) {
      if (!run.is_number_unsigned()) throw malformed("a pixel mask run is not an unsigned integer");
      const auto length = run.get<std::uint64_t>();
      if (length > pixels - a.pixel_mask.size()) throw malformed("the pixel mask runs exceed the detector's pixels");
      a.pixel_mask.insert(a.pixel_mask.end(), length, value);
      if (value) masked += length;
      value ^= 1;
    }
    if (a.pixel_mask.size() != pixels) throw malformed("the pixel mask runs do not cover the detector");
    if (masked != a.masked_pixel_count) throw malformed("masked_pixel_count differs from the mask");
  } else if (a.masked_pixel_count != 0) {
    throw malformed("masked_pixel_count without a mask");
  }

  // What inspect_master guarantees of a loadable acquisition, which the
  // loaders rely on.
  if (a.status.loadable) {
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

// A reply line of one member: the parsed object, after the worker's error
// reply (internal) and its typed failure (rethrown when of an allowed kind)
// are thrown.
json checked_reply(const std::string& line, std::initializer_list<ErrorKind> failures) {
  if (line.size() > kMaxLineBytes) throw malformed("the reply is too long");
  json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded()) throw malformed("the reply is not JSON");
  if (!reply.is_object() || reply.size() != 1) throw malformed("the reply is not an object with one member");
  if (reply.contains("error")) {
    const json& message = reply["error"];
    throw Error(ErrorKind::internal,
                "the inspector refused the request: " + (message.is_string() ? message.get<std::string>() : message.dump()));
  }
  if (reply.contains("failed")) {
    const json& failed = reply["failed"];
    const std::string kind = string_of(failed, "kind");
    const std::string message = string_of(failed, "message");
    for (const ErrorKind allowed : failures) {
      if (kind == error_kind_name(allowed)) throw Error(allowed, message);
    }
    throw malformed("an error of kind '" + kind + "'");
  }
  return reply;
}

}  // namespace

catalog::ShardStorage parse_storage_reply(const std::string& line) {
  const json reply =
      checked_reply(line, {ErrorKind::io, ErrorKind::corrupt_data, ErrorKind::conflict, ErrorKind::not_found});
  return shard_storage_from_json(member(reply, "storage"));
}

// ---- metadata ---------------------------------------------------------------------

namespace {

json metadata_value_to_json(const catalog::MetadataValue& value) {
  switch (value.kind) {
    case catalog::MetadataValue::Kind::integer: return value.integer;
    case catalog::MetadataValue::Kind::real: return value.real;
    case catalog::MetadataValue::Kind::text: break;
  }
  return value.text;
}

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
                      {"value", metadata_value_to_json(field.value)},
                      {"unit", field.unit},
                      {"source", field.source}});
    if (field.value.truncated) fields.back()["truncated"] = true;
  }
  json entries = json::array();
  for (const auto& entry : m.entries) {
    entries.push_back({{"file", entry.file},
                       {"path", entry.path},
                       {"value", metadata_value_to_json(entry.value)},
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
  const json reply = checked_reply(line, {ErrorKind::io, ErrorKind::corrupt_data, ErrorKind::not_found});
  catalog::MasterMetadata metadata = master_metadata_from_json(member(reply, "metadata"));
  if (metadata.master_path != requested_path) throw malformed("the metadata of another master");
  return metadata;
}

std::string inspect_request(const std::string& master_path) {
  return json({{"inspect", master_path}}).dump(-1, ' ', false, json::error_handler_t::replace);
}

catalog::Acquisition parse_reply(const std::string& line, const std::string& requested_path) {
  if (line.size() > kMaxLineBytes) throw malformed("the reply is too long");
  const json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded()) throw malformed("the reply is not JSON");
  if (!reply.is_object() || reply.size() != 1) throw malformed("the reply is not an object with one member");
  if (reply.contains("error")) {
    const json& message = reply["error"];
    throw Error(ErrorKind::internal,
                "the inspector refused the request: " + (message.is_string() ? message.get<std::string>() : message.dump()));
  }
  catalog::Acquisition acquisition = acquisition_from_json(member(reply, "acquisition"));
  if (acquisition.master_path != requested_path) throw malformed("an acquisition of another master");
  return acquisition;
}

}  // namespace quantem::inspector
