#pragma once
// JSON documents of the browse protocol that are not images: capabilities
// (the reference's plus the added fields), acquisition events, residency
// status (added), and the provenance header of every array response
// (docs/protocol.md, '3. Routes' and 'Array responses').
// All are nlohmann::ordered_json so keys keep the reference's order, and are
// sent compact (dump() with no indent: separators "," and ":").
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/plan/plan.hpp"

namespace quantem::protocol {

inline constexpr const char* kProtocolName = "quantem-gpu-browse";
inline constexpr int kProtocolVersion = 1;

// 24 lower-case hex digits (96 bits) of a deterministic hash of `bytes`.
std::string digest_hex24(std::string_view bytes);

// Digest of a source signature (every path, existence, size, mtime).
std::string signature_digest(const catalog::SourceSignature& signature);

// ---- capabilities -----------------------------------------------------------

// One device's live capacity (docs/admission.md, '2. The capacity model').
struct DeviceCapacity {
  int index = 0;
  std::string name;
  std::optional<std::uint64_t> total_memory_bytes;
  std::uint64_t cache_budget_bytes = 0;
  std::optional<std::uint64_t> free_bytes;
  std::uint64_t resident_bytes = 0;
  std::uint64_t resident_entries = 0;
  std::uint64_t active_resident_bytes = 0;
  std::uint64_t evictable_bytes = 0;
  std::optional<std::uint64_t> available_peak_bytes;
  std::optional<std::uint64_t> available_resident_bytes;
};

struct CapabilitiesInput {
  std::string backend;  // "cpu" or "cuda"
  std::string implementation_revision;
  std::string data_folder;
  double cache_fraction = 0.8;
  std::vector<DeviceCapacity> devices;
};

nlohmann::ordered_json capabilities_document(const CapabilitiesInput& input);

// ---- acquisitions -------------------------------------------------------------

// Python datetime.fromtimestamp(ns / 1e9, timezone.utc).isoformat():
// "2026-08-15T08:12:07.479486+00:00", the fraction only when non-zero.
std::string iso_utc_from_ns(std::int64_t mtime_ns);

// One event object (kind, path, stem, chunks_seen, chunks_expected, bytes_total, ts).
nlohmann::ordered_json acquisition_event(const catalog::Acquisition& acquisition);

// {"enabled", "pending", "in_flight", "history", "ready_token"} for
// inspections in master-list order. ready_token changes exactly when the list
// of ready masters or any of their signature entries changes.
nlohmann::ordered_json acquisitions_document(const std::vector<catalog::Acquisition>& inspections);
// One ready acquisition's part of the ready_token's input (appended to `out`);
// the token is digest_hex24 of the parts in master-list order.
void append_ready_token_input(std::string& out, const catalog::Acquisition& acquisition);

// ---- provenance -------------------------------------------------------------

struct Provenance {
  std::string session;
  std::string file;
  std::string signature;  // signature_digest()
  std::uint64_t source_scan_rows = 0, source_scan_cols = 0;
  std::uint64_t source_detector_rows = 0, source_detector_cols = 0;
  std::string source_dtype;       // "uint16"
  std::string resident_encoding;  // Resident::encoding()
  std::uint64_t output_rows = 0, output_cols = 0;
  std::string output_dtype;       // "<u4" / "<f4"
  plan::ScanRegion scan_region;   // half-open, source scan coordinates
  std::uint64_t scan_bin = 1, detector_bin = 1;
  nlohmann::ordered_json geometry = nlohmann::ordered_json::object();  // route-specific
  std::uint64_t masked_pixel_count = 0;
  std::string backend;
  int device_index = 0;
  std::string implementation_revision;
};

// Compact, ASCII-only JSON (non-ASCII escaped as \uXXXX) so it is a valid
// header value; non-finite numbers become null.
std::string provenance_header(const Provenance& provenance);

}  // namespace quantem::protocol
