#include "quantem/server/metadata_route.hpp"

#include <algorithm>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/error.hpp"
#include "quantem/protocol/documents.hpp"
#include "quantem/protocol/requests.hpp"

namespace quantem::server {

namespace {

using json = nlohmann::ordered_json;

// The value, its unit (when it has one) and whether its text was cut, into `item`.
void put_value(json& item, const catalog::MetadataValue& value, const std::string& unit) {
  item["value"] = catalog::metadata_value_json<json>(value);
  if (!unit.empty()) item["unit"] = unit;
  if (value.truncated) item["truncated"] = true;
}

const catalog::MetadataFieldSpec* spec_of(const std::string& name) {
  const auto& specs = catalog::master_metadata_fields();
  const auto it = std::find_if(specs.begin(), specs.end(), [&](const auto& spec) { return spec.name == name; });
  return it == specs.end() ? nullptr : &*it;
}

// The master's signature and the sidecar's stat: what an answer is kept for.
std::string answer_signature(const catalog::Acquisition& acquisition) {
  catalog::SignatureEntry sidecar;
  const auto slash = acquisition.master_path.find_last_of('/');
  sidecar.path = acquisition.master_path.substr(0, slash == std::string::npos ? 0 : slash + 1) + acquisition.stem + ".h5";
  catalog::SourceSignature signature = acquisition.signature;
  signature.push_back(catalog::restat_signature({sidecar}).front());
  return protocol::signature_digest(signature);
}

}  // namespace

json metadata_document(const catalog::MasterMetadata& metadata) {
  json doc;
  doc["path"] = metadata.master_path;
  doc["sidecar"] = metadata.sidecar_name.empty() ? json(nullptr) : json(metadata.sidecar_name);
  json fields = json::object();
  for (const auto& field : metadata.fields) {
    const auto* spec = spec_of(field.name);
    json item;
    item["label"] = spec ? spec->label : field.name;
    put_value(item, field.value, field.unit);
    item["source"] = field.source;
    fields[field.name] = std::move(item);
  }
  doc["fields"] = std::move(fields);
  json entries = json::array();
  for (const auto& entry : metadata.entries) {
    json item;
    item["file"] = entry.file;
    item["path"] = entry.path;
    put_value(item, entry.value, entry.unit);
    entries.push_back(std::move(item));
  }
  doc["entries"] = std::move(entries);
  doc["entries_truncated"] = metadata.entries_truncated;
  doc["limits"] = {{"entries_per_file", catalog::kMaxMetadataEntriesPerFile},
                   {"groups_per_file", catalog::kMaxMetadataGroupsPerFile},
                   {"depth", catalog::kMaxMetadataDepth},
                   {"text_bytes", catalog::kMaxMetadataTextBytes}};
  return doc;
}

MetadataRoute::MetadataRoute(CatalogService& catalog, Reader reader, std::size_t kept_answers)
    : catalog_(catalog), reader_(std::move(reader)), kept_answers_(std::max<std::size_t>(1, kept_answers)) {}

void MetadataRoute::add_to(BrowseService& service) {
  service.add_route(kPath, "GET", [this](const HttpRequest& request, const protocol::QueryParams& params, RequestTiming&) {
    return handle(request, params);
  });
}

HttpResponse MetadataRoute::handle(const HttpRequest& request, const protocol::QueryParams& params) {
  const protocol::SourceRef source = protocol::parse_source_query(params);
  const auto acquisition = catalog_.resolve_shared(source.session, source.file);
  const std::string digest = answer_signature(*acquisition);
  const std::string etag = "\"metadata-" + digest + "\"";
  HttpResponse response;
  response.set_header("cache-control", "no-cache");
  response.set_header("etag", etag);
  const auto if_none_match = request.header("if-none-match");
  if (if_none_match && if_none_match_names(*if_none_match, etag)) {
    response.status = 304;
    return response;
  }
  const std::string key = source.session + '\n' + source.file + '\n' + acquisition->master_path + '\n' + digest;
  std::shared_ptr<const std::string> body = kept(key);
  if (!body) {
    json doc;
    doc["session"] = source.session;
    doc["file"] = source.file;
    json read = metadata_document(reader_(acquisition->master_path));
    for (auto& [name, value] : read.items()) doc[name] = std::move(value);
    body = std::make_shared<const std::string>(HttpResponse::json(200, doc).body);
    keep(key, body);
  }
  response.status = 200;
  response.content_type = "application/json";
  response.shared_body = protocol::SharedBytes::of(body);
  return response;
}

std::shared_ptr<const std::string> MetadataRoute::kept(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void MetadataRoute::keep(const std::string& key, std::shared_ptr<const std::string> body) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++reads_;
  if (const auto it = index_.find(key); it != index_.end()) {
    lru_.erase(it->second);
    index_.erase(it);
  }
  lru_.emplace_front(key, std::move(body));
  index_[key] = lru_.begin();
  while (lru_.size() > kept_answers_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

std::uint64_t MetadataRoute::reads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reads_;
}

}  // namespace quantem::server
