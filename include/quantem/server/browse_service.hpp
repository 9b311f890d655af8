#pragma once
// Every route of the daemon as a function from HttpRequest to HttpResponse,
// without sockets (the HTTP adapter is http_server.hpp). handle() never
// throws: errors go through error_mapping.
//
// Routes (docs/protocol.md):
//   GET    /api/browse/capabilities | sessions | acquisitions
//   GET    /api/browse/realspace | products | realspace-shape | cbed | cbed-region
//   GET    /api/browse/residency     POST /api/browse/load     DELETE /api/browse/resident
//   GET    /api/browse/metadata      (metadata_route.hpp, added with add_route())
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
// The five array routes are ProductRoute descriptors run by one pipeline
// (answer_product, a named step per stage); the route table is add_routes(),
// and add_route() serves a function written elsewhere. A request that has to
// wait for a load is handed back unanswered by handle_or_defer()
// (HttpResponse::later, docs/decisions/0017).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
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

  // Answers a request completely (a request that needs a load waits for it
  // on the calling thread).
  HttpResponse handle(const HttpRequest& request) noexcept;

  // handle(), except that a request that has to wait for a load comes back
  // unanswered: its HttpResponse::later waits and answers (the HTTP server
  // runs it on its waiting threads, docs/decisions/0017).
  HttpResponse handle_or_defer(const HttpRequest& request) noexcept;

  // The Host and token checks alone, for a request whose body has not been
  // read yet: the refusal (403) or nullopt. Counted in the metrics like any
  // answer.
  std::optional<HttpResponse> screen(const HttpRequest& request) noexcept;

  // What the HTTP server serves: handle_or_defer and screen.
  HttpService http_service();

  // A route served by a function outside this class (in its own file),
  // called after the Host and token checks with the parsed query. Register
  // before the server starts.
  using RouteFunction = std::function<HttpResponse(const HttpRequest&, const protocol::QueryParams&, RequestTiming&)>;
  enum class TokenRule { required, exempt };
  void add_route(const std::string& path, const std::string& method, RouteFunction function,
                 TokenRule token = TokenRule::required);

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

  struct Resolved {
    std::shared_ptr<const catalog::Acquisition> acquisition;
    plan::PlanGeometry geometry;
    std::string signature_digest;
  };
  class ProductCall;  // one array request's route-specific part (browse_service.cpp)
  struct ProductRoute;

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
    // The products route: `body` is the whole bundle (json, npz or raw, its
    // content type in wire.content_type), sent as it is; a raw bundle's
    // index (the x-quantem-images header) in bundle_index.
    bool bundle = false;
    std::string bundle_index;
  };
  struct ProductState;  // an array request between its steps
  struct Route {
    std::string method;
    RouteFunction function;
    bool token_exempt = false;
    bool is_product = false;
  };
  using Member = HttpResponse (BrowseService::*)(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);

  void add_routes();
  void add_member_route(const std::string& path, const std::string& method, Member member,
                        TokenRule token = TokenRule::required);
  void add_product_route(const std::string& path, const ProductRoute& route);
  HttpResponse dispatch(const HttpRequest& request, std::string& route_label, bool& is_product, RequestTiming& timing);
  HttpResponse slash_redirect_or_not_found(const HttpRequest& request) const;
  // Metrics and the server-timing header of a finished answer.
  void finish(HttpResponse& response, const std::string& route_label, bool is_product, const RequestTiming& timing);

  HttpResponse capabilities(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse sessions(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse acquisitions(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse residency_status(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse load(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse evict(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse health_live(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse health_ready(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse metrics(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);
  HttpResponse viewer_asset(const HttpRequest&, const protocol::QueryParams&, RequestTiming&);

  // ---- the array routes: one pipeline, its steps in order -----------------------
  // parse -> resolve -> key and entity tag -> 304 -> image cache (realspace)
  // -> acquire (or wait for the load) -> compute -> provenance -> respond.
  HttpResponse answer_product(const ProductRoute& route, const HttpRequest& request,
                              const protocol::QueryParams& params, RequestTiming& timing);
  Resolved resolve_product(const protocol::ProductQuery& query);
  // Runs `then` with the request's resident: at once when it is resident;
  // 409 when it is not and the request does not load; else a response whose
  // `later` waits for the load (ResidencyManager::acquire) and then runs `then`.
  HttpResponse with_resident(const std::shared_ptr<ProductState>& state, bool loads,
                             std::function<HttpResponse(const residency::ResidentLease&)> then);
  HttpResponse answer_from_cache(const std::shared_ptr<ProductState>& state, std::shared_ptr<const CachedImage> cached,
                                 RequestTiming& timing);
  HttpResponse respond_from_cache(const ProductState& state, const CachedImage& cached, RequestTiming& timing) const;
  HttpResponse compute_and_respond(const ProductState& state, const residency::ResidentLease& resident,
                                   RequestTiming& timing);
  // realspace: the response, and its image kept in the image cache.
  HttpResponse respond_and_keep(const ProductState& state, products::Image& image,
                                protocol::Provenance provenance_record, RequestTiming& timing);
  // The products route: its images as one bundle (json or npz), kept in the
  // image cache like a realspace image.
  HttpResponse respond_bundle(const ProductState& state, const backend::Resident& resident,
                              std::vector<products::Image>& images, nlohmann::ordered_json geometry,
                              RequestTiming& timing);
  HttpResponse bundle_response(const CachedImage& bundle, const char* cache_control, const std::string& etag) const;
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
// comparison as RFC 9110, section 13.1.2, asks, or "*").
bool if_none_match_names(const std::string& header_value, const std::string& etag);

// Errors whose texts clients match (the reference's texts).
extern const char* const kNotResidentMessage;
extern const char* const kUnusableShapeMessage;

}  // namespace quantem::server
