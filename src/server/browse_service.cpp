#include "quantem/server/browse_service.hpp"
#include "quantem/server/document_response.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <spdlog/spdlog.h>

#include "quantem/core/error.hpp"
#include "quantem/plan/plan.hpp"
#include "quantem/protocol/bundle.hpp"
#include "quantem/protocol/npy.hpp"
#include "quantem/protocol/wire_image.hpp"
#include "quantem/server/error_mapping.hpp"
#include "quantem/server/export_routes.hpp"
#include "quantem/viewer/assets.hpp"

namespace quantem::server {

const char* const kNotResidentMessage = "The requested crop/bin is no longer resident; load a virtual image first.";
const char* const kUnusableShapeMessage = "The master does not report a usable 4D shape.";

namespace {

using json = nlohmann::ordered_json;
using protocol::QueryParams;

json optional_double(const std::optional<double>& value) { return value ? json(*value) : json(nullptr); }

std::string double_bits(double value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(bits));
  return buffer;
}

std::string geometry_key(const plan::PlanGeometry& g) {
  return std::to_string(g.region.row_start) + ":" + std::to_string(g.region.row_stop) + ":" +
         std::to_string(g.region.col_start) + ":" + std::to_string(g.region.col_stop) + "/s" +
         std::to_string(g.scan_bin) + "/d" + std::to_string(g.detector_bin);
}

// Sources that are not ready or have no usable shape are refused before any
// residency work (docs/protocol.md, '4. Tightened rules').
void require_servable(const catalog::Acquisition& acquisition) {
  if (!acquisition.status.loadable) throw conflict(acquisition.status.reason);
  if (!acquisition.scan_shape_known() || !acquisition.detector_shape_known()) throw unprocessable(kUnusableShapeMessage);
  if (!acquisition.dtype) {
    throw unprocessable("The master's detector dtype is not supported; quantem-gpu serves uint8, uint16 and uint32 counts.");
  }
}

json used_geometry_json(const products::UsedGeometry& used) {
  json g;
  g["center_row"] = optional_double(used.center_row);
  g["center_col"] = optional_double(used.center_col);
  g["inner_radius_px"] = optional_double(used.inner_radius_px);
  g["outer_radius_px"] = optional_double(used.outer_radius_px);
  if (used.bright_field) {
    json bf;
    bf["center_row"] = used.bright_field->center_row;
    bf["center_col"] = used.bright_field->center_col;
    bf["radius"] = used.bright_field->radius;
    g["bright_field"] = std::move(bf);
  } else {
    g["bright_field"] = nullptr;
  }
  return g;
}

std::string url_encode(const std::string& text) {
  static const char* const hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    const bool unreserved = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                            c == '_' || c == '.' || c == '~';
    if (unreserved) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

std::string params_query_string(const protocol::SourceRef& source) {
  return "session=" + url_encode(source.session) + "&file=" + url_encode(source.file);
}

std::uint64_t clamp_index(std::int64_t value, std::uint64_t extent) {
  if (value < 0 || extent == 0) return 0;
  return std::min<std::uint64_t>(static_cast<std::uint64_t>(value), extent - 1);
}

}  // namespace

// ---- the four array routes: what each adds to the shared pipeline ---------------

// One array request's route-specific part (answer_product runs the rest).
class BrowseService::ProductCall {
 public:
  virtual ~ProductCall() = default;
  virtual const protocol::ProductQuery& query() const = 0;
  // The route's lines of the product key, after the shared prefix (route,
  // master, signature, plan). Checks that need the source shape but no
  // residency (an empty scan ROI: 400) throw here.
  virtual std::string key_details(const Resolved& resolved) = 0;
  // The image, computed on the resident under its compute lock, and the
  // geometry its provenance reports.
  virtual products::Image compute(backend::Resident& resident, const Resolved& resolved, json& geometry) const = 0;
  // The products route: its query (the images' names and the bundle's
  // format), and its images, computed together; nullptr for one-image routes.
  virtual const protocol::ProductsQuery* products_query() const { return nullptr; }
  virtual std::vector<products::Image> compute_all(backend::Resident& resident, const Resolved& resolved,
                                                   json& geometry) const {
    std::vector<products::Image> images;
    images.push_back(compute(resident, resolved, geometry));
    return images;
  }
};

// One array route as the pipeline sees it.
struct BrowseService::ProductRoute {
  const char* name;           // the product key's first line
  const char* cache_control;
  bool always_loads;          // false: loads only with ensure_resident=true, else 409 when not resident
  bool marks_active;          // a request that may load makes the acquisition the active one
  bool keeps_images;          // the realspace image cache
  std::unique_ptr<ProductCall> (*parse)(const QueryParams& params);
};

namespace {

using ProductCall = BrowseService::ProductCall;
using Resolved = BrowseService::Resolved;

template <class Call>
std::unique_ptr<ProductCall> parse_as(const QueryParams& params) {
  return std::make_unique<Call>(params);
}

// "<route>\n<master path>\n<signature digest>\n<plan geometry>" : the start of
// every product key (the image cache's and the entity tag's).
std::string product_key_prefix(const char* route, const Resolved& resolved) {
  std::string key = route;
  key += '\n';
  key += resolved.acquisition->master_path;
  key += '\n';
  key += resolved.signature_digest;
  key += '\n';
  key += geometry_key(resolved.geometry);
  return key;
}

// What every route's call holds: its query, parsed from the request's parameters by Parse.
template <class Query, Query (*Parse)(const QueryParams&)>
class QueryCall : public ProductCall {
 public:
  explicit QueryCall(const QueryParams& params) : query_(Parse(params)) {}
  const protocol::ProductQuery& query() const override { return query_; }

 protected:
  Query query_;
};

// The provenance geometry of one realspace image, as the realspace route reports it.
json realspace_geometry(const products::UsedGeometry& used, const std::string& mode_name) {
  json geometry = used_geometry_json(used);
  geometry["mode"] = mode_name;
  return geometry;
}

// The key lines of one realspace image's parameters (exact values).
std::string realspace_key(const std::string& mode_name, const products::RealspaceRequest& r) {
  return "\n" + mode_name + "\n" + double_bits(r.inner) + "\n" + double_bits(r.outer) + "\n" +
         (r.center_row ? double_bits(*r.center_row) : "none") + "\n" +
         (r.center_col ? double_bits(*r.center_col) : "none");
}

class RealspaceCall final : public QueryCall<protocol::RealspaceQuery, protocol::parse_realspace_query> {
 public:
  using QueryCall::QueryCall;
  // Exact values: a different centre or radius never reuses an image.
  std::string key_details(const Resolved&) override { return realspace_key(query_.mode_name, query_.request); }
  products::Image compute(backend::Resident& resident, const Resolved& resolved, json& geometry) const override {
    products::UsedGeometry used;
    products::Image image = products::realspace(resident, resolved.geometry, query_.request, used);
    geometry = realspace_geometry(used, query_.mode_name);
    return image;
  }
};

const char* bundle_format_key(protocol::BundleFormat format) {
  switch (format) {
    case protocol::BundleFormat::npz: return "\nnpz";
    case protocol::BundleFormat::raw: return "\nraw";
    case protocol::BundleFormat::json: break;
  }
  return "\njson";
}

// Several realspace images of one plan in one response (a bundle).
class ProductsCall final : public QueryCall<protocol::ProductsQuery, protocol::parse_products_query> {
 public:
  using QueryCall::QueryCall;
  const protocol::ProductsQuery* products_query() const override { return &query_; }
  // The cached body holds the provenance with the request's names: they are
  // part of the key (an alias keeps its own body).
  std::string key_details(const Resolved&) override {
    std::string key = bundle_format_key(query_.bundle_format);
    key += "\n" + query_.source.session + "\n" + query_.source.file;
    for (std::size_t i = 0; i < query_.requests.size(); ++i) {
      key += realspace_key(query_.mode_names[i], query_.requests[i]);
    }
    return key;
  }
  products::Image compute(backend::Resident&, const Resolved&, json&) const override {
    throw internal_error("the products route computes its images together");
  }
  std::vector<products::Image> compute_all(backend::Resident& resident, const Resolved& resolved,
                                           json& geometry) const override {
    std::vector<products::UsedGeometry> used;
    std::vector<products::Image> images =
        products::realspace_together(resident, resolved.geometry, query_.requests, used);
    json modes = json::array();
    json per_image = json::array();
    for (std::size_t i = 0; i < images.size(); ++i) {
      modes.push_back(query_.mode_names[i]);
      per_image.push_back(realspace_geometry(used[i], query_.mode_names[i]));
    }
    geometry["modes"] = std::move(modes);
    geometry["images"] = std::move(per_image);
    return images;
  }
};

class RealspaceShapeCall final : public QueryCall<protocol::ShapeQuery, protocol::parse_shape_query> {
 public:
  using QueryCall::QueryCall;
  std::string key_details(const Resolved&) override {
    const auto& r = query_.request;
    return "\n" + query_.shape_name + "\n" + double_bits(r.center_row) + "\n" + double_bits(r.center_col) + "\n" +
           double_bits(r.inner) + "\n" + double_bits(r.outer);
  }
  products::Image compute(backend::Resident& resident, const Resolved& resolved, json& geometry) const override {
    products::UsedGeometry used;
    products::Image image = products::realspace_shape(resident, resolved.geometry, query_.request, used);
    geometry = used_geometry_json(used);
    geometry["shape"] = query_.shape_name;
    return image;
  }
};

class CbedCall final : public QueryCall<protocol::CbedQuery, protocol::parse_cbed_query> {
 public:
  using QueryCall::QueryCall;
  // Indices are clamped into the plan's scan, as the reference does.
  std::string key_details(const Resolved& resolved) override {
    scan_row_ = clamp_index(query_.scan_row, resolved.geometry.scan_rows);
    scan_col_ = clamp_index(query_.scan_col, resolved.geometry.scan_cols);
    return "\n" + std::to_string(scan_row_) + "\n" + std::to_string(scan_col_);
  }
  products::Image compute(backend::Resident& resident, const Resolved& resolved, json& geometry) const override {
    products::Image image =
        products::selected_diffraction(resident, resolved.geometry, query_.scan_row, query_.scan_col);
    geometry["scan_row"] = scan_row_;
    geometry["scan_col"] = scan_col_;
    return image;
  }

 private:
  std::uint64_t scan_row_ = 0, scan_col_ = 0;
};

class CbedRegionCall final : public QueryCall<protocol::RegionQuery, protocol::parse_region_query> {
 public:
  using QueryCall::QueryCall;
  // An empty ROI is a bad request, found here, before any residency work.
  std::string key_details(const Resolved& resolved) override {
    positions_ =
        products::scan_roi_positions(query_.request, resolved.geometry.scan_rows, resolved.geometry.scan_cols).size();
    const auto& r = query_.request;
    return "\n" + query_.shape_name + "\n" + query_.reduce_name + "\n" + double_bits(r.center_row) + "\n" +
           double_bits(r.center_col) + "\n" + double_bits(r.radius);
  }
  products::Image compute(backend::Resident& resident, const Resolved& resolved, json& geometry) const override {
    products::Image image = products::region_diffraction(resident, resolved.geometry, query_.request);
    const auto& r = query_.request;
    geometry["shape"] = query_.shape_name;
    geometry["center_row"] = r.center_row;
    geometry["center_col"] = r.center_col;
    geometry["radius"] = r.radius;
    geometry["reduce"] = query_.reduce_name;
    geometry["positions"] = positions_;
    return image;
  }

 private:
  std::size_t positions_ = 0;
};

// {name, cache-control, always loads, marks active, keeps images, parser}
const BrowseService::ProductRoute kRealspaceRoute{"realspace", "max-age=300", true, true, true, &parse_as<RealspaceCall>};
// Several realspace images of one plan: loads, activates and keeps its
// bodies as the realspace route does.
const BrowseService::ProductRoute kProductsRoute{"products", "max-age=300", true, true, true, &parse_as<ProductsCall>};
const BrowseService::ProductRoute kRealspaceShapeRoute{"realspace-shape", "max-age=300", true, true, false,
                                                       &parse_as<RealspaceShapeCall>};
// The cbed routes, like the reference's, make the acquisition active when
// they ask for it to be resident (ensure_resident=true).
const BrowseService::ProductRoute kCbedRoute{"cbed", "max-age=60", false, true, false, &parse_as<CbedCall>};
const BrowseService::ProductRoute kCbedRegionRoute{"cbed-region", "no-store", false, true, false,
                                                   &parse_as<CbedRegionCall>};

}  // namespace

BrowseService::BrowseService(BrowseConfig config, backend::Backend& backend, residency::ResidencyManager& residency,
                             CatalogService& catalog, Metrics& metrics)
    : config_(std::move(config)),
      backend_(backend),
      residency_(residency),
      catalog_(catalog),
      metrics_(metrics),
      body_pool_(config_.body_pool) {
  add_routes();
}

// The route table: one line per route.
void BrowseService::add_routes() {
  using T = TokenRule;
  add_member_route("/api/browse/capabilities", "GET", &BrowseService::capabilities);
  add_member_route("/api/browse/sessions", "GET", &BrowseService::sessions);
  add_member_route("/api/browse/acquisitions", "GET", &BrowseService::acquisitions);
  add_product_route("/api/browse/realspace", kRealspaceRoute);
  add_product_route("/api/browse/products", kProductsRoute);
  add_product_route("/api/browse/realspace-shape", kRealspaceShapeRoute);
  add_product_route("/api/browse/cbed", kCbedRoute);
  add_product_route("/api/browse/cbed-region", kCbedRegionRoute);
  add_member_route("/api/browse/residency", "GET", &BrowseService::residency_status);
  add_member_route("/api/browse/load", "POST", &BrowseService::load);
  add_member_route("/api/browse/resident", "DELETE", &BrowseService::evict);
  add_member_route("/api/health/live", "GET", &BrowseService::health_live, T::exempt);
  add_member_route("/api/health/ready", "GET", &BrowseService::health_ready, T::exempt);
  add_member_route("/metrics", "GET", &BrowseService::metrics);
  // The browser viewer: the page holds no data, so no token (the Host rule applies).
  for (const auto& asset : viewer::assets()) {
    add_member_route(std::string(asset.path), "GET", &BrowseService::viewer_asset, T::exempt);
  }
}

void BrowseService::add_route(const std::string& path, const std::string& method, RouteFunction function,
                              TokenRule token) {
  routes_[path] = Route{method, std::move(function), token == TokenRule::exempt, false};
}

void BrowseService::add_member_route(const std::string& path, const std::string& method, Member member,
                                     TokenRule token) {
  add_route(path, method,
            [this, member](const HttpRequest& request, const QueryParams& params, RequestTiming& timing) {
              return (this->*member)(request, params, timing);
            },
            token);
}

void BrowseService::add_product_route(const std::string& path, const ProductRoute& route) {
  add_route(path, "GET", [this, &route](const HttpRequest& request, const QueryParams& params, RequestTiming& timing) {
    return answer_product(route, request, params, timing);
  });
  routes_[path].is_product = true;
}

HttpResponse BrowseService::handle(const HttpRequest& request) noexcept {
  HttpResponse response = handle_or_defer(request);
  if (response.later) return response.later();  // noexcept: the deferred part maps its own errors
  return response;
}

HttpResponse BrowseService::handle_or_defer(const HttpRequest& request) noexcept {
  // Shared with a deferred answer, which laps the stages it runs.
  auto timing = std::make_shared<RequestTiming>();
  std::string route_label = "other";
  bool is_product = false;
  HttpResponse response;
  try {
    response = dispatch(request, route_label, is_product, *timing);
  } catch (...) {
    response = error_response(std::current_exception());
  }
  if (response.later) {
    response.later = [this, waited = std::move(response.later), timing, route_label, is_product]() noexcept {
      HttpResponse answer;
      try {
        answer = waited();
      } catch (...) {
        answer = error_response(std::current_exception());
      }
      finish(answer, route_label, is_product, *timing);
      return answer;
    };
    return response;
  }
  finish(response, route_label, is_product, *timing);
  return response;
}

void BrowseService::finish(HttpResponse& response, const std::string& route_label, bool is_product,
                           const RequestTiming& timing) {
  try {
    metrics_.observe_request(route_label, response.status, timing.total_seconds(), is_product, &timing);
    response.set_header("server-timing", timing.header());
  } catch (...) {
    // Metrics never fail a request.
  }
}

std::optional<HttpResponse> BrowseService::screen(const HttpRequest& request) noexcept {
  const auto route = routes_.find(request.path);
  try {
    config_.access.check(request, protocol::parse_query_string(request.query),
                         route != routes_.end() && route->second.token_exempt);
    return std::nullopt;
  } catch (...) {
    HttpResponse refusal = error_response(std::current_exception());
    finish(refusal, route != routes_.end() ? route->first : "other", false, RequestTiming());
    return refusal;
  }
}

HttpService BrowseService::http_service() {
  HttpService service;
  service.handle = [this](const HttpRequest& request) { return handle_or_defer(request); };
  service.screen = [this](const HttpRequest& request) { return screen(request); };
  return service;
}

HttpResponse BrowseService::dispatch(const HttpRequest& request, std::string& route_label, bool& is_product,
                                     RequestTiming& timing) {
  const QueryParams query = protocol::parse_query_string(request.query);
  auto route = routes_.find(request.path);
  const bool exempt = route != routes_.end() && route->second.token_exempt;
  config_.access.check(request, query, exempt);
  if (route == routes_.end() && export_jobs_ && ExportJobs::handles(request.path)) {
    route_label = "/api/browse/export";
    return export_jobs_->handle(request, query);
  }
  if (route == routes_.end()) return slash_redirect_or_not_found(request);
  route_label = route->first;
  is_product = route->second.is_product;
  if (request.method != route->second.method) {
    HttpResponse response = HttpResponse::detail(405, "Method Not Allowed");
    response.set_header("allow", route->second.method);
    return response;
  }
  return route->second.function(request, query, timing);
}

// Starlette's redirect_slashes: a known path with a trailing slash redirects.
HttpResponse BrowseService::slash_redirect_or_not_found(const HttpRequest& request) const {
  if (request.path.size() > 1 && request.path.back() == '/' &&
      routes_.count(request.path.substr(0, request.path.size() - 1))) {
    HttpResponse redirect;
    redirect.status = 307;
    std::string location =
        "http://" + request.header("host").value_or("localhost") + request.path.substr(0, request.path.size() - 1);
    if (!request.query.empty()) location += "?" + request.query;
    redirect.set_header("location", location);
    return redirect;
  }
  return HttpResponse::detail(404, "Not Found");
}

// ---- documents ----------------------------------------------------------------

HttpResponse BrowseService::capabilities(const HttpRequest&, const QueryParams&, RequestTiming&) {
  protocol::CapabilitiesInput input;
  input.backend = backend_.name();
  input.implementation_revision = config_.implementation_revision;
  input.data_folder = catalog_.data_folder();
  const auto usages = residency_.device_usage();
  // The configured fraction (--device-budget 0.8, or the default); with a byte budget, that budget over the device's memory.
  if (!usages.empty()) {
    const auto& first = usages.front().info;
    if (first.budget_fraction > 0) {
      input.cache_fraction = first.budget_fraction;
    } else if (first.total_memory_bytes > 0) {
      input.cache_fraction = static_cast<double>(first.budget_bytes) / static_cast<double>(first.total_memory_bytes);
    }
  }
  for (const auto& usage : usages) {
    protocol::DeviceCapacity device;
    device.index = usage.info.index;
    device.name = usage.info.name;
    device.total_memory_bytes = usage.info.total_memory_bytes;
    device.cache_budget_bytes = usage.info.budget_bytes;
    device.free_bytes = usage.free_bytes;
    device.resident_bytes = usage.resident_bytes;
    device.resident_entries = usage.resident_entries;
    device.active_resident_bytes = usage.active_resident_bytes;
    device.evictable_bytes = usage.evictable_bytes;
    device.available_peak_bytes = usage.available_peak_bytes;
    device.available_resident_bytes = usage.available_resident_bytes;
    input.devices.push_back(std::move(device));
  }
  return HttpResponse::json(200, protocol::capabilities_document(input));
}

HttpResponse BrowseService::sessions(const HttpRequest& request, const QueryParams& query, RequestTiming&) {
  const auto parsed = protocol::parse_sessions_query(query);
  return document_response(request, *catalog_.sessions_body(parsed.refresh, parsed.partial));
}

HttpResponse BrowseService::acquisitions(const HttpRequest& request, const QueryParams&, RequestTiming&) {
  return document_response(request, *catalog_.acquisitions_body());
}

// ---- products -----------------------------------------------------------------

BrowseService::Resolved BrowseService::resolve_product(const protocol::ProductQuery& query) {
  Resolved resolved;
  resolved.acquisition = catalog_.resolve_shared(query.source.session, query.source.file);
  const auto& a = *resolved.acquisition;
  require_servable(a);
  resolved.geometry = plan::resolve_plan(query.plan, a.scan_rows, a.scan_cols, a.detector_rows, a.detector_cols);
  resolved.signature_digest = signature_digest(resolved.acquisition);
  return resolved;
}

std::string BrowseService::signature_digest(const std::shared_ptr<const catalog::Acquisition>& acquisition) {
  {
    std::lock_guard<std::mutex> lock(digest_mutex_);
    auto it = signature_digests_.find(acquisition.get());
    // The weak pointer tells a live entry from one whose inspection died and
    // whose address was reused.
    if (it != signature_digests_.end() && it->second.first.lock() == acquisition) return it->second.second;
  }
  std::string digest = protocol::signature_digest(acquisition->signature);
  std::lock_guard<std::mutex> lock(digest_mutex_);
  if (signature_digests_.size() >= 256) {
    for (auto it = signature_digests_.begin(); it != signature_digests_.end();) {
      it = it->second.first.expired() ? signature_digests_.erase(it) : std::next(it);
    }
    if (signature_digests_.size() >= 256) signature_digests_.clear();
  }
  signature_digests_[acquisition.get()] = {acquisition, digest};
  return digest;
}

protocol::Provenance BrowseService::provenance(const protocol::ProductQuery& query, const Resolved& resolved,
                                               const backend::Resident& resident, const products::Image& image,
                                               json geometry) const {
  const auto& a = *resolved.acquisition;
  protocol::Provenance p;
  p.session = query.source.session;
  p.file = query.source.file;
  p.signature = resolved.signature_digest;
  p.source_scan_rows = a.scan_rows;
  p.source_scan_cols = a.scan_cols;
  p.source_detector_rows = a.detector_rows;
  p.source_detector_cols = a.detector_cols;
  p.source_dtype = a.dtype ? dtype_name(*a.dtype) : "unknown";
  p.resident_encoding = resident.encoding();
  p.output_rows = image.height;
  p.output_cols = image.width;
  p.output_dtype = image.is_float ? "<f4" : "<u4";
  p.scan_region = resolved.geometry.region;
  p.scan_bin = resolved.geometry.scan_bin;
  p.detector_bin = resolved.geometry.detector_bin;
  p.geometry = std::move(geometry);
  p.masked_pixel_count = a.masked_pixel_count;
  p.backend = backend_.name();
  p.device_index = resident.device_index();
  p.implementation_revision = config_.implementation_revision;
  return p;
}

bool if_none_match_names(const std::string& header_value, const std::string& etag) {
  std::size_t position = 0;
  while (position < header_value.size()) {
    std::size_t comma = header_value.find(',', position);
    if (comma == std::string::npos) comma = header_value.size();
    std::size_t first = position, last = comma;
    while (first < last && (header_value[first] == ' ' || header_value[first] == '\t')) ++first;
    while (last > first && (header_value[last - 1] == ' ' || header_value[last - 1] == '\t')) --last;
    std::string_view tag(header_value.data() + first, last - first);
    if (tag == "*") return true;
    if (tag.size() >= 2 && tag.substr(0, 2) == "W/") tag.remove_prefix(2);  // weak comparison
    if (tag == etag) return true;
    position = comma + 1;
  }
  return false;
}

std::string BrowseService::entity_tag(const std::string& product_key, const protocol::ProductQuery& query) const {
  std::string bytes = product_key;
  bytes += query.format == protocol::PayloadFormat::npy ? "\nnpy\n" : "\nraw\n";
  bytes += query.source.session;
  bytes += '\n';
  bytes += query.source.file;
  bytes += '\n';
  bytes += backend_.name();
  bytes += '\n';
  bytes += config_.implementation_revision;
  return "\"" + protocol::digest_hex24(bytes) + "\"";
}

std::optional<HttpResponse> BrowseService::not_modified(const HttpRequest& request, const std::string& etag,
                                                        const char* cache_control, RequestTiming& timing) const {
  const auto condition = request.header("if-none-match");
  if (!condition || !if_none_match_names(*condition, etag)) return std::nullopt;
  HttpResponse response;
  response.status = 304;
  response.set_header("etag", etag);
  response.set_header("cache-control", cache_control);
  timing.set_cache("not-modified");
  return response;
}

HttpResponse BrowseService::image_response(const CachedImage& image, const std::string& provenance_header,
                                           protocol::PayloadFormat format, const char* cache_control,
                                           const std::string& etag) const {
  const protocol::WireImage& wire = image.wire;
  HttpResponse response = image_headers(wire, provenance_header, cache_control, etag);
  if (format == protocol::PayloadFormat::npy) {
    response.content_type = "application/x-npy";
    response.body = protocol::encode_npy(wire.dtype, 4, {wire.height, wire.width}, image.body.view());
  } else {
    response.shared_body = image.body;  // the cached bytes themselves
  }
  return response;
}

std::pair<protocol::WireImage, protocol::SharedBytes> BrowseService::wire_body(products::Image& image,
                                                                              protocol::PayloadFormat format) {
  // Values already in the wire's layout go out as they are; the rest are
  // written into a recycled body that returns to the pool once released.
  if (auto in_place = protocol::wire_image_in_place(image, format)) {
    return {std::move(in_place->wire), std::move(in_place->body)};
  }
  protocol::WireImage wire =
      protocol::encode_wire_image(image, format, body_pool_.acquire(protocol::wire_body_bytes(image, format)));
  protocol::SharedBytes body = protocol::SharedBytes::of(body_pool_.share(std::move(wire.body)));
  wire.body.clear();
  return {std::move(wire), std::move(body)};
}

// Status 200 and the headers every array response carries.
HttpResponse BrowseService::image_headers(const protocol::WireImage& wire, const std::string& provenance_header,
                                          const char* cache_control, const std::string& etag) const {
  HttpResponse response;
  response.status = 200;
  response.content_type = wire.content_type;
  response.headers.reserve(8);
  response.set_header("x-width", std::to_string(wire.width));
  response.set_header("x-height", std::to_string(wire.height));
  response.set_header("x-dtype", wire.dtype);
  response.set_header("x-value-divisor", std::to_string(wire.value_divisor));
  response.set_header("cache-control", cache_control);
  response.set_header("etag", etag);
  response.set_header("x-quantem-provenance", provenance_header);
  return response;
}

std::shared_ptr<const BrowseService::CachedImage> BrowseService::cached_image(const std::string& key) {
  std::lock_guard<std::mutex> lock(image_mutex_);
  auto it = image_index_.find(key);
  if (it == image_index_.end()) return nullptr;
  image_lru_.splice(image_lru_.begin(), image_lru_, it->second);
  return it->second->second;
}

void BrowseService::store_image(const std::string& key, std::shared_ptr<const CachedImage> image) {
  std::lock_guard<std::mutex> lock(image_mutex_);
  auto it = image_index_.find(key);
  if (it != image_index_.end()) {
    image_bytes_ -= image_bytes(*it->second->second);
    image_lru_.erase(it->second);
    image_index_.erase(it);
  }
  image_bytes_ += image_bytes(*image);
  image_lru_.emplace_front(key, std::move(image));
  image_index_[key] = image_lru_.begin();
  // Least recently used first; the newest image always stays.
  while (image_lru_.size() > 1 &&
         (image_lru_.size() > config_.image_cache_entries || image_bytes_ > config_.image_cache_bytes)) {
    image_bytes_ -= image_bytes(*image_lru_.back().second);
    image_index_.erase(image_lru_.back().first);
    image_lru_.pop_back();
  }
}

std::size_t BrowseService::drop_cached_images(const std::vector<std::string>& master_paths, bool all) {
  std::lock_guard<std::mutex> lock(image_mutex_);
  std::size_t dropped = 0;
  for (auto it = image_lru_.begin(); it != image_lru_.end();) {
    // Keys are "realspace\n<master path>\n...".
    const std::string& key = it->first;
    const auto first = key.find('\n');
    const auto second = first == std::string::npos ? std::string::npos : key.find('\n', first + 1);
    const std::string master = second == std::string::npos ? std::string() : key.substr(first + 1, second - first - 1);
    if (all || std::find(master_paths.begin(), master_paths.end(), master) != master_paths.end()) {
      image_bytes_ -= image_bytes(*it->second);
      image_index_.erase(key);
      it = image_lru_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

// ---- the array routes' pipeline -----------------------------------------------

// An array request between its steps: what the route parsed and what the
// shared steps found. Shared with a deferred answer.
struct BrowseService::ProductState {
  const ProductRoute* route = nullptr;
  std::unique_ptr<ProductCall> call;
  Resolved resolved;
  std::string key;
  std::string etag;
};

HttpResponse BrowseService::answer_product(const ProductRoute& route, const HttpRequest& request,
                                           const QueryParams& params, RequestTiming& timing) {
  auto state = std::make_shared<ProductState>();
  state->route = &route;
  state->call = route.parse(params);
  timing.lap("parse");
  const auto& query = state->call->query();
  state->resolved = resolve_product(query);
  state->key = product_key_prefix(route.name, state->resolved) + state->call->key_details(state->resolved);
  state->etag = entity_tag(state->key, query);
  timing.lap("resolve");
  if (auto unchanged = not_modified(request, state->etag, route.cache_control, timing)) return std::move(*unchanged);
  if (route.keeps_images) {
    if (auto cached = cached_image(state->key)) return answer_from_cache(state, std::move(cached), timing);
    timing.set_cache("miss");
  }
  const bool loads = route.always_loads || query.ensure_resident;
  return with_resident(state, loads, [this, state, &timing](const residency::ResidentLease& resident) {
    return compute_and_respond(*state, resident, timing);
  });
}

HttpResponse BrowseService::with_resident(const std::shared_ptr<ProductState>& state, bool loads,
                                          std::function<HttpResponse(const residency::ResidentLease&)> then) {
  // Only the plan's window: a load in progress may hold it already, and a load
  // this request starts reads it first (region-first).
  const backend::ScanWindow window = backend::scan_window_of(state->resolved.geometry);
  if (auto resident = residency_.find(*state->resolved.acquisition, window)) return then(resident);
  if (!loads) throw conflict(kNotResidentMessage);
  HttpResponse waiting;
  waiting.later = [this, state, window, then = std::move(then)] {
    return then(residency_.acquire(*state->resolved.acquisition, window));
  };
  return waiting;
}

HttpResponse BrowseService::answer_from_cache(const std::shared_ptr<ProductState>& state,
                                              std::shared_ptr<const CachedImage> cached, RequestTiming& timing) {
  timing.set_cache("hit");
  if (!state->call->query().ensure_resident) return respond_from_cache(*state, *cached, timing);
  // As the reference: the hit makes the acquisition resident and the one on
  // the user's screen (resident_result, then mark_active).
  return with_resident(state, true, [this, state, cached, &timing](const residency::ResidentLease&) {
    residency_.mark_active(state->resolved.acquisition->master_path);
    timing.lap("acquire");
    return respond_from_cache(*state, *cached, timing);
  });
}

HttpResponse BrowseService::respond_from_cache(const ProductState& state, const CachedImage& cached,
                                               RequestTiming& timing) const {
  const auto& query = state.call->query();
  if (cached.bundle) {  // its key holds the request's names: the provenance is this request's
    HttpResponse response = bundle_response(cached, state.route->cache_control, state.etag);
    timing.lap("encode");
    return response;
  }
  const bool same_names = cached.provenance.session == query.source.session && cached.provenance.file == query.source.file;
  std::string header;
  if (!same_names) {
    protocol::Provenance provenance = cached.provenance;  // the names this request used (an alias may differ)
    provenance.session = query.source.session;
    provenance.file = query.source.file;
    header = protocol::provenance_header(provenance);
  }
  HttpResponse response = image_response(cached, same_names ? cached.provenance_header : header, query.format,
                                         state.route->cache_control, state.etag);
  timing.lap("encode");
  return response;
}

HttpResponse BrowseService::compute_and_respond(const ProductState& state, const residency::ResidentLease& resident,
                                                RequestTiming& timing) {
  const auto compute = resident.lock_compute();
  timing.lap("acquire");
  const ProductRoute& route = *state.route;
  const auto& query = state.call->query();
  json geometry;
  std::vector<products::Image> images = state.call->compute_all(*resident, state.resolved, geometry);
  if (route.marks_active && (route.always_loads || query.ensure_resident)) {
    residency_.mark_active(state.resolved.acquisition->master_path);
  }
  timing.lap("compute");
  if (state.call->products_query()) return respond_bundle(state, *resident, images, std::move(geometry), timing);
  products::Image& image = images.front();
  protocol::Provenance provenance_record = provenance(query, state.resolved, *resident, image, std::move(geometry));
  if (route.keeps_images) return respond_and_keep(state, image, std::move(provenance_record), timing);
  auto [wire, body] = wire_body(image, query.format);
  HttpResponse response =
      image_headers(wire, protocol::provenance_header(provenance_record), route.cache_control, state.etag);
  response.shared_body = std::move(body);
  timing.lap("encode");
  return response;
}

HttpResponse BrowseService::respond_and_keep(const ProductState& state, products::Image& image,
                                             protocol::Provenance provenance_record, RequestTiming& timing) {
  auto entry = std::make_shared<CachedImage>();
  entry->provenance = std::move(provenance_record);
  entry->provenance_header = protocol::provenance_header(entry->provenance);
  // Shared by the cache and the responses.
  std::tie(entry->wire, entry->body) = wire_body(image, protocol::PayloadFormat::raw);
  HttpResponse response = image_response(*entry, entry->provenance_header, state.call->query().format,
                                         state.route->cache_control, state.etag);
  timing.lap("encode");
  store_image(state.key, std::move(entry));
  timing.lap("store");
  return response;
}

namespace {

// The provenance a json bundle's body carries: the header's without
// `device_index`, so that equal entity tags keep meaning equal bodies when a
// reload lands on another device (the header still names it).
std::string body_provenance(const std::string& provenance_header) {
  json provenance = json::parse(provenance_header);
  provenance.erase("device_index");
  return provenance.dump(-1, ' ', true, json::error_handler_t::replace);
}

}  // namespace

HttpResponse BrowseService::respond_bundle(const ProductState& state, const backend::Resident& resident,
                                           std::vector<products::Image>& images, json geometry,
                                           RequestTiming& timing) {
  const protocol::ProductsQuery& query = *state.call->products_query();
  auto entry = std::make_shared<CachedImage>();
  entry->bundle = true;
  entry->provenance = provenance(query, state.resolved, resident, images.front(), std::move(geometry));
  // Each image's dtype is in the body; the provenance names the one they
  // share, or "mixed".
  for (const auto& image : images) {
    if (image.is_float != images.front().is_float) entry->provenance.output_dtype = "mixed";
  }
  entry->provenance_header = protocol::provenance_header(entry->provenance);
  // Each image as the raw format carries it (the overflow check included),
  // then the bundle around them.
  std::vector<protocol::SharedBytes> bodies;
  std::vector<protocol::BundleImage> parts;
  for (std::size_t i = 0; i < images.size(); ++i) {
    auto [wire, body] = wire_body(images[i], protocol::PayloadFormat::raw);
    parts.push_back({query.mode_names[i], wire.height, wire.width, wire.dtype, wire.value_divisor, body.view()});
    bodies.push_back(std::move(body));
  }
  std::string body;
  switch (query.bundle_format) {
    case protocol::BundleFormat::npz:
      entry->wire.content_type = "application/zip";
      body = protocol::encode_bundle_npz(parts);
      break;
    case protocol::BundleFormat::raw:
      entry->wire.content_type = "application/octet-stream";
      entry->bundle_index = protocol::bundle_index_json(parts);
      body = protocol::encode_bundle_raw(parts, body_pool_.acquire(protocol::bundle_raw_bytes(parts)));
      break;
    case protocol::BundleFormat::json:
      entry->wire.content_type = "application/json";
      body = protocol::encode_bundle_json(parts, body_provenance(entry->provenance_header));
      break;
  }
  // Back to the body pool once neither the cache nor a response holds it.
  entry->body = protocol::SharedBytes::of(body_pool_.share(std::move(body)));
  HttpResponse response = bundle_response(*entry, state.route->cache_control, state.etag);
  timing.lap("encode");
  store_image(state.key, std::move(entry));
  timing.lap("store");
  return response;
}

HttpResponse BrowseService::bundle_response(const CachedImage& bundle, const char* cache_control,
                                            const std::string& etag) const {
  HttpResponse response;
  response.status = 200;
  response.content_type = bundle.wire.content_type;
  response.set_header("cache-control", cache_control);
  response.set_header("etag", etag);
  response.set_header("x-quantem-provenance", bundle.provenance_header);
  if (!bundle.bundle_index.empty()) response.set_header("x-quantem-images", bundle.bundle_index);
  response.shared_body = bundle.body;
  return response;
}

// ---- residency ----------------------------------------------------------------

json BrowseService::residency_document(const protocol::SourceRef& source, const catalog::Acquisition& acquisition,
                                       const residency::ResidencyStatus& status) const {
  json doc;
  doc["session"] = source.session;
  doc["file"] = source.file;
  doc["path"] = acquisition.master_path;
  doc["state"] = residency::residency_state_name(status.state);
  doc["device"] = status.device_index ? json(*status.device_index) : json(nullptr);
  doc["resident_bytes"] = status.resident_bytes;
  doc["reserved_bytes"] = status.reserved_bytes;
  doc["bytes_done"] = status.bytes_done;
  doc["bytes_total"] = status.bytes_total;
  doc["stage"] = status.stage.empty() ? json(nullptr) : json(status.stage);
  doc["encoding"] = status.encoding.empty() ? json(nullptr) : json(status.encoding);
  doc["failure_reason"] = status.failure_reason.empty() ? json(nullptr) : json(status.failure_reason);
  doc["tile_sums"] = {{"state", status.tile_sums_state}, {"bytes", status.tile_sums_bytes}};
  doc["scan_rows_resident"] = status.scan_rows_resident;
  doc["scan_rows"] = status.scan_rows != 0 ? status.scan_rows : acquisition.scan_rows;
  doc["loadable"] = acquisition.status.loadable;
  doc["reason"] = acquisition.status.reason;
  return doc;
}

HttpResponse BrowseService::residency_status(const HttpRequest&, const QueryParams& params, RequestTiming&) {
  const auto source = protocol::parse_source_query(params);
  const auto acquisition = catalog_.resolve(source.session, source.file);
  return HttpResponse::json(200, residency_document(source, acquisition, residency_.status(acquisition)));
}

HttpResponse BrowseService::load(const HttpRequest&, const QueryParams& params, RequestTiming&) {
  const auto source = protocol::parse_source_query(params);
  const auto acquisition = catalog_.resolve(source.session, source.file);
  require_servable(acquisition);
  const auto status = residency_.request_load(acquisition);
  HttpResponse response = HttpResponse::json(status.state == residency::ResidencyState::resident ? 200 : 202,
                                             residency_document(source, acquisition, status));
  response.set_header("location", "/api/browse/residency?" + params_query_string(source));
  return response;
}

HttpResponse BrowseService::evict(const HttpRequest&, const QueryParams& params, RequestTiming&) {
  const auto source = protocol::parse_source_query(params);
  const auto acquisition = catalog_.resolve(source.session, source.file);
  const bool evicted = residency_.evict(acquisition);
  json doc = residency_document(source, acquisition, residency_.status(acquisition));
  doc["evicted"] = evicted;
  return HttpResponse::json(200, doc);
}

// ---- viewer -------------------------------------------------------------------

HttpResponse BrowseService::viewer_asset(const HttpRequest& request, const QueryParams&, RequestTiming&) {
  const viewer::Asset* asset = viewer::find_asset(request.path);
  if (!asset) return HttpResponse::detail(404, "Not Found");
  const auto if_none_match = request.header("if-none-match");
  const bool not_modified = if_none_match && viewer::etag_matches(*if_none_match, asset->etag);
  HttpResponse response;
  response.status = not_modified ? 304 : 200;
  response.headers = viewer::asset_headers(*asset, not_modified);
  if (!not_modified) {
    response.content_type = std::string(asset->content_type);
    response.body = std::string(asset->body);
  }
  return response;
}

// ---- health and metrics ---------------------------------------------------------

HttpResponse BrowseService::health_live(const HttpRequest&, const QueryParams&, RequestTiming&) {
  json doc;
  doc["live"] = true;
  return HttpResponse::json(200, doc);
}

HttpResponse BrowseService::health_ready(const HttpRequest&, const QueryParams&, RequestTiming&) {
  json doc;
  doc["live"] = true;
  const auto stale = catalog_.check_data_folder();
  doc["ready"] = ready_.load() && !stale;
  catalog_.add_health_fields(doc);  // polled and unreadable folders: reported, still ready
  if (doc["ready"] == true) return HttpResponse::json(200, doc);
  if (stale) {
    doc["reason"] = *stale + "; the last good catalog is served, marked stale";
  } else {
    doc["reason"] = catalog_.built() ? "devices are not initialised or the daemon is stopping"
                                     : "the catalog is being built";
  }
  HttpResponse response = HttpResponse::json(503, doc);
  response.set_header("retry-after", "1");
  return response;
}

HttpResponse BrowseService::metrics(const HttpRequest&, const QueryParams&, RequestTiming&) {
  HttpResponse response;
  response.status = 200;
  response.content_type = "text/plain; version=0.0.4; charset=utf-8";
  response.body = metrics_.render(residency_.device_usage(), residency_.counters(), catalog_.builds(), ready_) +
                  catalog_.metrics_text();
  return response;
}

}  // namespace quantem::server
