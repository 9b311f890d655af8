#pragma once
// GET /api/browse/metadata?session=&file= (docs/protocol.md "Instrument
// metadata"): what the master and its Arina sidecar say about the instrument
// (catalog/master_metadata.hpp), read on demand through `reader` (the
// daemon's: its inspector worker, decision 0012; never libhdf5 in the
// daemon's process) and never stored in the catalog or its cache file.
//
// Answers are kept per acquisition signature: the catalog's signature of the
// master and its data files plus a stat of the sidecar <stem>.h5, so a
// changed file is read again; at most `kept_answers` (least recently used
// forgotten). Each answer carries an ETag of that signature (304 on
// If-None-Match). Errors (quantem::Error, mapped once by the service): 400 /
// 422 for the query, 404 for an unknown session or master, 422 for a master
// that is not readable HDF5 or that stopped the inspector, 503 while no
// inspector worker can start.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "quantem/catalog/master_metadata.hpp"
#include "quantem/protocol/query.hpp"
#include "quantem/server/browse_service.hpp"
#include "quantem/server/catalog_service.hpp"
#include "quantem/server/http_types.hpp"
#include "quantem/server/metrics.hpp"

namespace quantem::server {

class MetadataRoute {
 public:
  using Reader = std::function<catalog::MasterMetadata(const std::string& master_path)>;
  static constexpr const char* kPath = "/api/browse/metadata";

  MetadataRoute(CatalogService& catalog, Reader reader, std::size_t kept_answers = 64);
  MetadataRoute(const MetadataRoute&) = delete;
  MetadataRoute& operator=(const MetadataRoute&) = delete;

  // Registers GET kPath on `service` (before its server starts); this object
  // must outlive the service's requests.
  void add_to(BrowseService& service);
  // The route; throws quantem::Error (the service maps it).
  HttpResponse handle(const HttpRequest& request, const protocol::QueryParams& params);

  std::uint64_t reads() const;  // answers read through `reader` (not from the kept ones): tests

 private:
  std::shared_ptr<const std::string> kept(const std::string& key);
  void keep(const std::string& key, std::shared_ptr<const std::string> body);

  CatalogService& catalog_;
  Reader reader_;
  const std::size_t kept_answers_;
  mutable std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const std::string>>> lru_;  // most recent first
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
  std::uint64_t reads_ = 0;
};

// The route's document (without session and file) for one reading.
nlohmann::ordered_json metadata_document(const catalog::MasterMetadata& metadata);

}  // namespace quantem::server
