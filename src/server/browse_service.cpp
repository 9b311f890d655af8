#include "quantem/server/browse_service.hpp"
#include "quantem/server/document_response.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <spdlog/spdlog.h>

#include "quantem/core/error.hpp"
#include "quantem/plan/plan.hpp"
#include "quantem/protocol/npy.hpp"
#include "quantem/protocol/wire_image.hpp"
#include "quantem/server/error_mapping.hpp"
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
// residency work (PROTOCOL.md §2).
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

BrowseService::BrowseService(BrowseConfig config, backend::Backend& backend, residency::ResidencyManager& residency,
                             CatalogService& catalog, Metrics& metrics)
    : config_(std::move(config)),
      backend_(backend),
      residency_(residency),
      catalog_(catalog),
      metrics_(metrics),
      body_pool_(config_.body_pool) {
  routes_["/api/browse/capabilities"] = {"GET", &BrowseService::capabilities};
  routes_["/api/browse/sessions"] = {"GET", &BrowseService::sessions};
  routes_["/api/browse/acquisitions"] = {"GET", &BrowseService::acquisitions};
  routes_["/api/browse/realspace"] = {"GET", &BrowseService::realspace, false, true};
  routes_["/api/browse/realspace-shape"] = {"GET", &BrowseService::realspace_shape, false, true};
  routes_["/api/browse/cbed"] = {"GET", &BrowseService::cbed, false, true};
  routes_["/api/browse/cbed-region"] = {"GET", &BrowseService::cbed_region, false, true};
  routes_["/api/browse/residency"] = {"GET", &BrowseService::residency_status};
  routes_["/api/browse/load"] = {"POST", &BrowseService::load};
  routes_["/api/browse/resident"] = {"DELETE", &BrowseService::evict};
  routes_["/api/health/live"] = {"GET", &BrowseService::health_live, true};
  routes_["/api/health/ready"] = {"GET", &BrowseService::health_ready, true};
  routes_["/metrics"] = {"GET", &BrowseService::metrics};
  // The browser viewer: the page holds no data, so no token (the Host rule applies).
  for (const auto& asset : viewer::assets()) routes_[std::string(asset.path)] = {"GET", &BrowseService::viewer_asset, true};
}

HttpResponse BrowseService::handle(const HttpRequest& request) noexcept {
  RequestTiming timing;
  std::string route_label = "other";
  bool is_product = false;
  HttpResponse response;
  try {
    response = dispatch(request, route_label, is_product, timing);
  } catch (...) {
    response = error_response(std::current_exception());
  }
  try {
    metrics_.observe_request(route_label, response.status, timing.total_seconds(), is_product, &timing);
    response.set_header("server-timing", timing.header());
  } catch (...) {
    // Metrics never fail a request.
  }
  return response;
}

HttpResponse BrowseService::dispatch(const HttpRequest& request, std::string& route_label, bool& is_product,
                                     RequestTiming& timing) {
  const QueryParams query = protocol::parse_query_string(request.query);
  auto route = routes_.find(request.path);
  const bool exempt = route != routes_.end() && route->second.token_exempt;
  config_.access.check(request, query, exempt);

  if (route == routes_.end()) {
    // Starlette's redirect_slashes: a known path with a trailing slash redirects.
    if (request.path.size() > 1 && request.path.back() == '/' &&
        routes_.count(request.path.substr(0, request.path.size() - 1))) {
      HttpResponse redirect;
      redirect.status = 307;
      std::string location = "http://" + request.header("host").value_or("localhost") +
                             request.path.substr(0, request.path.size() - 1);
      if (!request.query.empty()) location += "?" + request.query;
      redirect.set_header("location", location);
      return redirect;
    }
    return HttpResponse::detail(404, "Not Found");
  }
  route_label = route->first;
  is_product = route->second.is_product;
  if (request.method != route->second.method) {
    HttpResponse response = HttpResponse::detail(405, "Method Not Allowed");
    response.set_header("allow", route->second.method);
    return response;
  }
  return (this->*(route->second.handler))(request, query, timing);
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

HttpResponse BrowseService::image_response(products::Image& image, const protocol::Provenance& provenance,
                                           protocol::PayloadFormat format, const char* cache_control,
                                           const std::string& etag, RequestTiming& timing) {
  timing.lap("compute");
  auto [wire, body] = wire_body(image, format);
  HttpResponse response = image_headers(wire, protocol::provenance_header(provenance), cache_control, etag);
  response.shared_body = std::move(body);
  timing.lap("encode");
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

namespace {

// "<route>\n<master path>\n<signature digest>\n<plan geometry>" : the start of
// every product key (the image cache's and the entity tag's).
std::string product_key_prefix(const char* route, const std::string& master_path, const std::string& signature_digest,
                               const plan::PlanGeometry& geometry) {
  std::string key = route;
  key += '\n';
  key += master_path;
  key += '\n';
  key += signature_digest;
  key += '\n';
  key += geometry_key(geometry);
  return key;
}

}  // namespace

HttpResponse BrowseService::realspace(const HttpRequest& request, const QueryParams& params, RequestTiming& timing) {
  const auto query = protocol::parse_realspace_query(params);
  timing.lap("parse");
  const Resolved resolved = resolve_product(query);
  const auto& acquisition = *resolved.acquisition;
  const auto& r = query.request;
  // Exact values and the source signature: a rewritten file or a different
  // centre never reuses an image (reference §8.8 tightened).
  const std::string key = product_key_prefix("realspace", acquisition.master_path, resolved.signature_digest,
                                             resolved.geometry) +
                          "\n" + query.mode_name + "\n" + double_bits(r.inner) + "\n" + double_bits(r.outer) + "\n" +
                          (r.center_row ? double_bits(*r.center_row) : "none") + "\n" +
                          (r.center_col ? double_bits(*r.center_col) : "none");
  const std::string etag = entity_tag(key, query);
  timing.lap("resolve");
  if (auto unchanged = not_modified(request, etag, "max-age=300", timing)) return std::move(*unchanged);

  if (auto cached = cached_image(key)) {
    timing.set_cache("hit");
    if (query.ensure_resident) {
      // As the reference: the hit makes the acquisition resident and the one
      // on the user's screen (resident_result, then mark_active).
      const auto resident = residency_.acquire(acquisition);
      residency_.mark_active(acquisition.master_path);
      timing.lap("acquire");
    }
    const bool same_names =
        cached->provenance.session == query.source.session && cached->provenance.file == query.source.file;
    std::string header;
    if (!same_names) {
      protocol::Provenance provenance = cached->provenance;  // the names this request used (an alias may differ)
      provenance.session = query.source.session;
      provenance.file = query.source.file;
      header = protocol::provenance_header(provenance);
    }
    HttpResponse response =
        image_response(*cached, same_names ? cached->provenance_header : header, query.format, "max-age=300", etag);
    timing.lap("encode");
    return response;
  }
  timing.set_cache("miss");
  const auto resident = residency_.acquire(acquisition);
  const auto compute = resident.lock_compute();
  timing.lap("acquire");
  products::UsedGeometry used;
  products::Image image = products::realspace(*resident, resolved.geometry, r, used);
  json geometry = used_geometry_json(used);
  geometry["mode"] = query.mode_name;
  residency_.mark_active(acquisition.master_path);
  timing.lap("compute");
  auto entry = std::make_shared<CachedImage>();
  entry->provenance = provenance(query, resolved, *resident, image, std::move(geometry));
  entry->provenance_header = protocol::provenance_header(entry->provenance);
  // Shared by the cache and the responses.
  std::tie(entry->wire, entry->body) = wire_body(image, protocol::PayloadFormat::raw);
  HttpResponse response = image_response(*entry, entry->provenance_header, query.format, "max-age=300", etag);
  timing.lap("encode");
  store_image(key, std::move(entry));
  timing.lap("store");
  return response;
}

HttpResponse BrowseService::realspace_shape(const HttpRequest& request, const QueryParams& params,
                                            RequestTiming& timing) {
  const auto query = protocol::parse_shape_query(params);
  timing.lap("parse");
  const Resolved resolved = resolve_product(query);
  const auto& acquisition = *resolved.acquisition;
  const auto& r = query.request;
  const std::string key = product_key_prefix("realspace-shape", acquisition.master_path, resolved.signature_digest,
                                             resolved.geometry) +
                          "\n" + query.shape_name + "\n" + double_bits(r.center_row) + "\n" +
                          double_bits(r.center_col) + "\n" + double_bits(r.inner) + "\n" + double_bits(r.outer);
  const std::string etag = entity_tag(key, query);
  timing.lap("resolve");
  if (auto unchanged = not_modified(request, etag, "max-age=300", timing)) return std::move(*unchanged);
  const auto resident = residency_.acquire(acquisition);
  const auto compute = resident.lock_compute();
  timing.lap("acquire");
  products::UsedGeometry used;
  products::Image image = products::realspace_shape(*resident, resolved.geometry, r, used);
  json geometry = used_geometry_json(used);
  geometry["shape"] = query.shape_name;
  const auto p = provenance(query, resolved, *resident, image, std::move(geometry));
  residency_.mark_active(acquisition.master_path);
  return image_response(image, p, query.format, "max-age=300", etag, timing);
}

HttpResponse BrowseService::cbed(const HttpRequest& request, const QueryParams& params, RequestTiming& timing) {
  const auto query = protocol::parse_cbed_query(params);
  timing.lap("parse");
  const Resolved resolved = resolve_product(query);
  const auto& acquisition = *resolved.acquisition;
  const std::uint64_t scan_row = clamp_index(query.scan_row, resolved.geometry.scan_rows);
  const std::uint64_t scan_col = clamp_index(query.scan_col, resolved.geometry.scan_cols);
  const std::string key =
      product_key_prefix("cbed", acquisition.master_path, resolved.signature_digest, resolved.geometry) + "\n" +
      std::to_string(scan_row) + "\n" + std::to_string(scan_col);
  const std::string etag = entity_tag(key, query);
  timing.lap("resolve");
  if (auto unchanged = not_modified(request, etag, "max-age=60", timing)) return std::move(*unchanged);
  const auto resident = query.ensure_resident ? residency_.acquire(acquisition) : residency_.find(acquisition);
  if (!resident) throw conflict(kNotResidentMessage);
  const auto compute = resident.lock_compute();
  timing.lap("acquire");
  products::Image image = products::selected_diffraction(*resident, resolved.geometry, query.scan_row, query.scan_col);
  json geometry;
  geometry["scan_row"] = scan_row;
  geometry["scan_col"] = scan_col;
  const auto p = provenance(query, resolved, *resident, image, std::move(geometry));
  return image_response(image, p, query.format, "max-age=60", etag, timing);
}

HttpResponse BrowseService::cbed_region(const HttpRequest& request, const QueryParams& params, RequestTiming& timing) {
  const auto query = protocol::parse_region_query(params);
  timing.lap("parse");
  const Resolved resolved = resolve_product(query);
  const auto& acquisition = *resolved.acquisition;
  // An empty ROI is a bad request, found before any residency work.
  const auto positions =
      products::scan_roi_positions(query.request, resolved.geometry.scan_rows, resolved.geometry.scan_cols);
  const auto& r = query.request;
  const std::string key = product_key_prefix("cbed-region", acquisition.master_path, resolved.signature_digest,
                                             resolved.geometry) +
                          "\n" + query.shape_name + "\n" + query.reduce_name + "\n" + double_bits(r.center_row) +
                          "\n" + double_bits(r.center_col) + "\n" + double_bits(r.radius);
  const std::string etag = entity_tag(key, query);
  timing.lap("resolve");
  if (auto unchanged = not_modified(request, etag, "no-store", timing)) return std::move(*unchanged);
  const auto resident = query.ensure_resident ? residency_.acquire(acquisition) : residency_.find(acquisition);
  if (!resident) throw conflict(kNotResidentMessage);
  const auto compute = resident.lock_compute();
  timing.lap("acquire");
  products::Image image = products::region_diffraction(*resident, resolved.geometry, r);
  json geometry;
  geometry["shape"] = query.shape_name;
  geometry["center_row"] = r.center_row;
  geometry["center_col"] = r.center_col;
  geometry["radius"] = r.radius;
  geometry["reduce"] = query.reduce_name;
  geometry["positions"] = positions.size();
  const auto p = provenance(query, resolved, *resident, image, std::move(geometry));
  return image_response(image, p, query.format, "no-store", etag, timing);
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
  response.body = metrics_.render(residency_.device_usage(), residency_.counters(), catalog_.builds(), ready_);
  return response;
}

}  // namespace quantem::server
