#pragma once
// The inspector's wire format (decision 0012): one JSON document per line,
// each way, between the daemon and `quantem-gpu inspect-worker`.
//
//   request  {"inspect": "/abs/path/x_master.h5"}
//   reply    {"acquisition": {...}}          the Acquisition as plain data
//   request  {"storage": {"file": "/abs/x_data_000001.h5", "dataset": "/entry/data/data"}}
//   reply    {"storage": {...}}              catalog::ShardStorage as plain data
//            {"failed": {"kind": "io", "message": "..."}}   read_shard_storage threw
//   request  {"metadata": "/abs/path/x_master.h5"}
//   reply    {"metadata": {...}}             catalog::MasterMetadata as plain data
//            {"failed": {"kind": "not_found", "message": "..."}}   read_master_metadata threw
//   any      {"error": "message"}            a request it could not parse
//
// The worker is less trusted than the daemon: it runs libhdf5 on files from
// the data folder, and a crafted file may have corrupted it. So the daemon's
// parser (parse_reply) accepts only a well-formed reply whose acquisition
// keeps every invariant inspect_master guarantees; anything else is a
// protocol violation (quantem::Error, kind corrupt_data), which the daemon
// handles like the worker's death.
//
// The pixel mask travels as run lengths: {"pixel_mask_runs": [u0, m0, u1, m1,
// ...]} alternating unmasked and masked pixel counts in row-major order,
// summing to the detector's pixels (absent when the master has no mask).
#include <cstddef>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/master_metadata.hpp"
#include "quantem/catalog/shard_storage.hpp"
#include "quantem/core/error.hpp"

namespace quantem::inspector {

// A reply that breaks the protocol (kind corrupt_data): the daemon stops the
// worker that sent it.
class ProtocolError : public Error {
 public:
  explicit ProtocolError(const std::string& message) : Error(ErrorKind::corrupt_data, message) {}
};

// The longest line either side accepts, newline excluded: a full mask of a
// 4096 x 4096 detector that alternates every pixel fits.
constexpr std::size_t kMaxLineBytes = std::size_t{256} << 20;

nlohmann::json acquisition_to_json(const catalog::Acquisition& acquisition);

// Throws quantem::Error (corrupt_data) naming the first field that is
// missing, of the wrong type, out of range or inconsistent.
catalog::Acquisition acquisition_from_json(const nlohmann::json& document);

// The worker's first line, once it is ready for requests.
constexpr const char* kWorkerHello = "{\"ready\":\"quantem-gpu inspect-worker\"}";

// One request line (no newline) for `master_path`.
std::string inspect_request(const std::string& master_path);

// A worker's reply line (no newline) to an inspect request for
// `requested_path`: the acquisition. Throws quantem::Error: internal when the
// worker answered with an error (it reports only requests it cannot parse,
// which the daemon never sends); corrupt_data for anything malformed, or for
// an acquisition of another master.
catalog::Acquisition parse_reply(const std::string& line, const std::string& requested_path);

nlohmann::json shard_storage_to_json(const catalog::ShardStorage& storage);
// Throws quantem::Error (corrupt_data) like acquisition_from_json.
catalog::ShardStorage shard_storage_from_json(const nlohmann::json& document);

std::string storage_request(const std::string& file_path, const std::string& dataset_path);

// A worker's reply line to a storage request: the facts, or the typed error
// read_shard_storage threw in the worker (rethrown as quantem::Error of that
// kind: io, corrupt_data, conflict or not_found). Throws quantem::Error:
// internal for the worker's error reply, corrupt_data for anything malformed.
catalog::ShardStorage parse_storage_reply(const std::string& line);

nlohmann::json master_metadata_to_json(const catalog::MasterMetadata& metadata);
// Throws quantem::Error (corrupt_data) like acquisition_from_json: every
// field a known one in its unit, every text and list within the limits of
// master_metadata.hpp.
catalog::MasterMetadata master_metadata_from_json(const nlohmann::json& document);

std::string metadata_request(const std::string& master_path);

// A worker's reply line to a metadata request for `requested_path`: the
// metadata, or the typed error read_master_metadata threw in the worker
// (rethrown as quantem::Error of that kind: io, corrupt_data or not_found).
// Throws quantem::Error: internal for the worker's error reply, corrupt_data
// for anything malformed or for the metadata of another master.
catalog::MasterMetadata parse_metadata_reply(const std::string& line, const std::string& requested_path);

}  // namespace quantem::inspector
