#pragma once
// Every route of the daemon as a function from HttpRequest to HttpResponse,
// without sockets (the HTTP adapter is http_server.hpp). handle() never
// throws: errors go through error_mapping.
//
// Routes (docs/protocol.md):
//   GET    /api/browse/capabilities | sessions | acquisitions
//   GET    /api/browse/realspace | realspace-shape | cbed | cbed-region
//   GET    /api/browse/residency     POST /api/browse/load     DELETE /api/browse/resident
//   GET    /api/health/live | /api/health/ready                 GET /metrics
//   GET    /  and  /viewer/<file>   the browser viewer (docs/viewer.md; no token needed)
// Order of checks for every request: Host header (403), token (403, token
// mode, health routes exempt), route (404, or 307 to the path without a
// trailing slash), method (405), query coercion (422), parameter validation
// (400), resolution (400/404), readiness (409/422), plan against the source
// shape (400), If-None-Match (304, array routes: no residency work), image
// cache (realspace), residency (409/413/503), compute, encoding (409 overflow).
// Every response carries `server-timing` (RequestTiming in metrics.hpp); the
// array routes carry an `etag` (docs/protocol.md "ETag").
#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "quantem/backend/backend.hpp"
#include "quantem/products/products.hpp"
#include "quantem/protocol/body_pool.hpp"
#include "quantem/protocol/documents.hpp"
#include "quantem/protocol/requests.hpp"
#include "quantem/protocol/wire_image.hpp"
#include "quantem/residency/residency_manager.hpp"
#include "quantem/server/catalog_service.hpp"
#include "quantem/server/http_types.hpp"
#include "quantem/server/metrics.hpp"
#include "quantem/server/security.hpp"

namespace quantem::server {

class ExportJobs;

struct BrowseConfig {
  std::string implementation_revision;
  AccessPolicy access;
  std::size_t image_cache_entries = 64;                   // realspace images kept (the reference's 64)...
  std::uint64_t image_cache_bytes = 256ull << 20;         // ...within this many bytes of values
  protocol::BodyPoolLimits body_pool;                     // recycled image bodies (body_pool.hpp)
};

class BrowseService {
 public:
  BrowseService(BrowseConfig config, backend::Backend& backend, residency::ResidencyManager& residency,
                CatalogService& catalog, Metrics& metrics);
  BrowseService(const BrowseService&) = delete;
  BrowseService& operator=(const BrowseService&) = delete;

  HttpResponse handle(const HttpRequest& request) noexcept;

  // Readiness for /api/health/ready: the serve command sets it once the
  // catalog is built and the devices are initialised, and clears it on shutdown.
  void set_ready(bool ready) { ready_ = ready; }
  // The export job routes (export_routes.hpp); they answer 404 until set.
  void set_export_jobs(ExportJobs* jobs) { export_jobs_ = jobs; }
  bool ready() const { return ready_; }

  // Forgets the cached realspace images of these masters (every image when
  // `all`): their files changed. Stale images are never served anyway (the
  // key holds the source signature); this frees their memory at once.
  // Returns how many were dropped.
  std::size_t drop_cached_images(const std::vector<std::string>& master_paths, bool all = false);

  // The recycled image bodies: every image response's body (raw, and .npy
  // of the uncached routes) is written into a buffer from this pool and
  // returns to it once the response is written and the image cache drops it.
  protocol::BodyPool::Stats body_pool_stats() const { return body_pool_.stats(); }

 private:
  // A realspace image as it goes on the wire: the raw body and the headers
  // that do not depend on the request's names, so a hit is a lookup, and its
  // body goes to the socket from the cache's own bytes.
  struct CachedImage {
    protocol::WireImage wire;                  // the raw format's headers; its body is moved to `body`
    // The raw values, shared with every response (no copy): the image's own
    // value vector, or a body_pool_ string when they had to be narrowed; npy
    // derived on request.
    protocol::SharedBytes body;
    protocol::Provenance provenance;
    std::string provenance_header;  // rendered for provenance.session/file
  };
  struct Resolved {
    std::shared_ptr<const catalog::Acquisition> acquisition;
    plan::PlanGeometry geometry;
    std::string signature_digest;
  };
  using Handler = HttpResponse (BrowseService::*)(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  struct Route {
    std::string method;
    Handler handler;
    bool token_exempt = false;
    bool is_product = false;
  };

  HttpResponse dispatch(const HttpRequest& request, std::string& route_label, bool& is_product, RequestTiming& timing);

  HttpResponse capabilities(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse sessions(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse acquisitions(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse realspace(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse realspace_shape(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse cbed(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse cbed_region(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse residency_status(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse load(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse evict(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse health_live(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse health_ready(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse metrics(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse viewer_asset(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);

  Resolved resolve_product(const protocol::ProductQuery& query);
  protocol::Provenance provenance(const protocol::ProductQuery& query, const Resolved& resolved,
                                  const backend::Resident& resident, const products::Image& image,
                                  nlohmann::ordered_json geometry) const;
  // The strong entity tag of an array response: a digest of the product key
  // (source signature, plan, route, parameters), the format, the names, the
  // backend and the implementation revision.
  std::string entity_tag(const std::string& product_key, const protocol::ProductQuery& query) const;
  // 304 when the request's If-None-Match names `etag`, else nullopt.
  std::optional<HttpResponse> not_modified(const HttpRequest& request, const std::string& etag,
                                           const char* cache_control, RequestTiming& timing) const;
  HttpResponse image_headers(const protocol::WireImage& wire, const std::string& provenance_header,
                             const char* cache_control, const std::string& etag) const;
  HttpResponse image_response(const CachedImage& image, const std::string& provenance_header,
                              protocol::PayloadFormat format, const char* cache_control, const std::string& etag) const;
  // An uncached image's response (its body from wire_body).
  HttpResponse image_response(products::Image& image, const protocol::Provenance& provenance,
                              protocol::PayloadFormat format, const char* cache_control, const std::string& etag,
                              RequestTiming& timing);
  // The body of an image: its own value vector when the values already are
  // the wire's bytes (protocol::wire_image_in_place, no copy), else encoded
  // into a recycled body_pool_ string that returns to the pool once released.
  std::pair<protocol::WireImage, protocol::SharedBytes> wire_body(products::Image& image,
                                                                  protocol::PayloadFormat format);
  nlohmann::ordered_json residency_document(const protocol::SourceRef& source, const catalog::Acquisition& acquisition,
                                            const residency::ResidencyStatus& status) const;

  // signature_digest() of a resolved acquisition, remembered while the
  // catalog keeps handing out the same inspection (a shared pointer).
  std::string signature_digest(const std::shared_ptr<const catalog::Acquisition>& acquisition);
  std::shared_ptr<const CachedImage> cached_image(const std::string& key);
  static std::uint64_t image_bytes(const CachedImage& image) { return image.body.size; }
  void store_image(const std::string& key, std::shared_ptr<const CachedImage> image);

  BrowseConfig config_;
  backend::Backend& backend_;
  residency::ResidencyManager& residency_;
  CatalogService& catalog_;
  Metrics& metrics_;
  std::map<std::string, Route> routes_;  // by path
  std::atomic<bool> ready_{false};
  ExportJobs* export_jobs_ = nullptr;
  protocol::BodyPool body_pool_;  // image bodies; declared before the image cache, which returns them

  std::mutex digest_mutex_;
  std::unordered_map<const catalog::Acquisition*,
                     std::pair<std::weak_ptr<const catalog::Acquisition>, std::string>> signature_digests_;

  std::mutex image_mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const CachedImage>>> image_lru_;  // most recent first
  std::unordered_map<std::string, decltype(image_lru_)::iterator> image_index_;
  std::uint64_t image_bytes_ = 0;
};

// Whether an If-None-Match header value names `etag` (a list of tags, weak
// comparison as RFC 9110 §13.1.2 asks, or "*").
bool if_none_match_names(const std::string& header_value, const std::string& etag);

// Errors whose texts clients match (reference §6).
extern const char* const kNotResidentMessage;
extern const char* const kUnusableShapeMessage;

}  // namespace quantem::server
