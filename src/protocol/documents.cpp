#include "quantem/protocol/documents.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>

namespace quantem::protocol {

namespace {

std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t basis) {
  std::uint64_t hash = basis;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

// splitmix64 finaliser: spreads FNV's weak low bits.
std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

void append_field(std::string& out, std::string_view text) {
  out += std::to_string(text.size());
  out += ':';
  out.append(text.data(), text.size());
}

void append_signature(std::string& out, const catalog::SourceSignature& signature) {
  for (const auto& entry : signature) {
    append_field(out, entry.path);
    append_field(out, entry.exists ? "1" : "0");
    append_field(out, std::to_string(entry.size_bytes));
    append_field(out, std::to_string(entry.mtime_ns));
    append_field(out, std::to_string(entry.ctime_ns));
    append_field(out, std::to_string(entry.device));
    append_field(out, std::to_string(entry.inode));
  }
}

nlohmann::ordered_json optional_number(const std::optional<std::uint64_t>& value) {
  return value ? nlohmann::ordered_json(*value) : nlohmann::ordered_json(nullptr);
}

}  // namespace

std::string digest_hex24(std::string_view bytes) {
  const std::uint64_t high = mix64(fnv1a64(bytes, 0xcbf29ce484222325ULL));
  const std::uint64_t low = mix64(fnv1a64(bytes, 0x84222325cbf29ce4ULL) ^ bytes.size());
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%016llx%08llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low >> 32));
  return buffer;
}

std::string signature_digest(const catalog::SourceSignature& signature) {
  std::string bytes;
  append_signature(bytes, signature);
  return digest_hex24(bytes);
}

nlohmann::ordered_json capabilities_document(const CapabilitiesInput& input) {
  using json = nlohmann::ordered_json;
  json doc;
  doc["protocol"] = kProtocolName;
  doc["protocol_version"] = kProtocolVersion;
  doc["backend"] = input.backend;
  doc["device_name"] = input.devices.empty() ? json(nullptr) : json(input.devices.front().name);
  doc["device_error"] = nullptr;
  // The replaced service names a GPU here only when it browses on CUDA: the
  // CPU backend's virtual devices are listed in browse_gpus and devices only.
  doc["browse_gpu"] =
      input.devices.empty() || input.backend != "cuda" ? json(nullptr) : json(input.devices.front().index);
  json indices = json::array();
  std::uint64_t largest_budget = 0, aggregate_budget = 0;
  std::optional<std::uint64_t> largest_memory;
  for (const auto& device : input.devices) {
    indices.push_back(device.index);
    largest_budget = std::max(largest_budget, device.cache_budget_bytes);
    aggregate_budget += device.cache_budget_bytes;
    if (device.total_memory_bytes) largest_memory = std::max(largest_memory.value_or(0), *device.total_memory_bytes);
  }
  doc["browse_gpus"] = indices;
  doc["cache_fraction"] = input.cache_fraction;
  doc["cache_budget_bytes"] = largest_budget;
  doc["aggregate_cache_budget_bytes"] = aggregate_budget;
  doc["largest_device_memory_bytes"] = optional_number(largest_memory);
  json devices = json::array();
  for (const auto& device : input.devices) {
    json entry;
    entry["index"] = device.index;
    entry["name"] = device.name;
    entry["total_memory_bytes"] = optional_number(device.total_memory_bytes);
    entry["cache_budget_bytes"] = device.cache_budget_bytes;
    entry["free_bytes"] = optional_number(device.free_bytes);
    entry["resident_bytes"] = device.resident_bytes;
    entry["resident_entries"] = device.resident_entries;
    entry["active_resident_bytes"] = device.active_resident_bytes;
    entry["evictable_bytes"] = device.evictable_bytes;
    entry["available_peak_bytes"] = optional_number(device.available_peak_bytes);
    entry["available_resident_bytes"] = optional_number(device.available_resident_bytes);
    devices.push_back(std::move(entry));
  }
  doc["devices"] = std::move(devices);
  doc["data_folders"] = json::array({input.data_folder});
  json features;
  features["catalog_refresh"] = true;
  features["selected_diffraction"] = true;
  features["virtual_detectors"] = true;
  features["custom_detector"] = true;
  features["scan_roi_diffraction"] = true;
  features["acquisition_events"] = true;
  features["exact_integer_images"] = true;
  features["multi_gpu_residency"] = input.devices.size() > 1;
  // SSB is not implemented by quantem-gpu: advertised as not ready, with a
  // reason, as the reference recommends; MAPED is omitted (presence means
  // "available").
  json ssb;
  ssb["name"] = "ssb";
  ssb["implicitFallback"] = false;
  ssb["ready"] = false;
  ssb["unavailableReason"] = "SSB reconstruction is not provided by the quantem-gpu daemon.";
  ssb["implementationRevision"] = input.implementation_revision;
  features["ssb"] = std::move(ssb);
  features["npy_payloads"] = true;
  features["provenance_header"] = true;
  features["residency_control"] = true;
  doc["features"] = std::move(features);
  doc["implementation_revision"] = input.implementation_revision;
  return doc;
}

std::string iso_utc_from_ns(std::int64_t mtime_ns) {
  if (mtime_ns < 0) mtime_ns = 0;
  std::int64_t seconds = mtime_ns / 1'000'000'000;
  std::int64_t micros = (mtime_ns % 1'000'000'000 + 500) / 1000;
  if (micros >= 1'000'000) {
    micros -= 1'000'000;
    seconds += 1;
  }
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char buffer[64];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%S", &utc);
  std::string text = buffer;
  if (micros != 0) {
    std::snprintf(buffer, sizeof buffer, ".%06lld", static_cast<long long>(micros));
    text += buffer;
  }
  return text + "+00:00";
}

nlohmann::ordered_json acquisition_event(const catalog::Acquisition& acquisition) {
  std::uint64_t chunks_seen = 0, bytes_total = 0;
  std::int64_t latest_ns = 0;
  const auto& signature = acquisition.signature;
  for (std::size_t i = 0; i < signature.size(); ++i) {
    const auto& entry = signature[i];
    if (!entry.exists) continue;
    if (i > 0) ++chunks_seen;
    bytes_total += static_cast<std::uint64_t>(std::max<std::int64_t>(0, entry.size_bytes));
    latest_ns = std::max(latest_ns, entry.mtime_ns);
  }
  nlohmann::ordered_json event;
  event["kind"] = acquisition.status.loadable ? "ready" : "writing";
  event["path"] = acquisition.master_path;
  event["stem"] = acquisition.stem;
  event["chunks_seen"] = chunks_seen;
  event["chunks_expected"] = signature.empty() ? 0 : signature.size() - 1;
  event["bytes_total"] = bytes_total;
  event["ts"] = iso_utc_from_ns(latest_ns);
  return event;
}

void append_ready_token_input(std::string& out, const catalog::Acquisition& acquisition) {
  append_field(out, acquisition.master_path);
  append_signature(out, acquisition.signature);
  out += '\n';
}

nlohmann::ordered_json acquisitions_document(const std::vector<catalog::Acquisition>& inspections) {
  using json = nlohmann::ordered_json;
  json pending = json::array(), history = json::array();
  std::string token_input;
  for (const auto& acquisition : inspections) {
    if (acquisition.status.loadable) {
      history.push_back(acquisition_event(acquisition));
      append_ready_token_input(token_input, acquisition);
    } else {
      pending.push_back(acquisition_event(acquisition));
    }
  }
  json doc;
  doc["enabled"] = true;
  doc["pending"] = std::move(pending);
  doc["in_flight"] = json::array();
  doc["history"] = std::move(history);
  doc["ready_token"] = digest_hex24(token_input);
  return doc;
}

std::string provenance_header(const Provenance& p) {
  using json = nlohmann::ordered_json;
  json doc;
  doc["session"] = p.session;
  doc["file"] = p.file;
  doc["signature"] = p.signature;
  doc["source_scan_shape"] = json::array({p.source_scan_rows, p.source_scan_cols});
  doc["source_detector_shape"] = json::array({p.source_detector_rows, p.source_detector_cols});
  doc["source_dtype"] = p.source_dtype;
  doc["resident_encoding"] = p.resident_encoding;
  doc["output_shape"] = json::array({p.output_rows, p.output_cols});
  doc["output_dtype"] = p.output_dtype;
  json region;
  region["row_start"] = p.scan_region.row_start;
  region["row_stop"] = p.scan_region.row_stop;
  region["column_start"] = p.scan_region.col_start;
  region["column_stop"] = p.scan_region.col_stop;
  doc["scan_region"] = std::move(region);
  doc["scan_bin"] = p.scan_bin;
  doc["detector_bin"] = p.detector_bin;
  doc["geometry"] = p.geometry;
  doc["masked_pixel_count"] = p.masked_pixel_count;
  doc["backend"] = p.backend;
  doc["device_index"] = p.device_index;
  doc["implementation_revision"] = p.implementation_revision;
  return doc.dump(-1, ' ', true, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace quantem::protocol
