#include "quantem/protocol/requests.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "quantem/core/error.hpp"

namespace quantem::protocol {

const char* const kCropIncompleteMessage = "scan crop requires row_start, row_stop, column_start, and column_stop";
const char* const kCropEmptyMessage = "scan crop must be a nonempty half-open (row, column) region";

namespace {

struct RawPlan {
  std::int64_t det_bin = 1;
  std::int64_t scan_bin = 1;
  std::optional<std::int64_t> row_start, row_stop, column_start, column_stop;
};

std::optional<plan::ScanRegion> validate_crop(const RawPlan& raw) {
  const int given = int(raw.row_start.has_value()) + int(raw.row_stop.has_value()) +
                    int(raw.column_start.has_value()) + int(raw.column_stop.has_value());
  if (given == 0) return std::nullopt;
  if (given != 4) throw bad_request(kCropIncompleteMessage);
  if (*raw.row_start < 0 || *raw.column_start < 0 || *raw.row_stop <= *raw.row_start ||
      *raw.column_stop <= *raw.column_start) {
    throw bad_request(kCropEmptyMessage);
  }
  plan::ScanRegion region;
  region.row_start = static_cast<std::uint64_t>(*raw.row_start);
  region.row_stop = static_cast<std::uint64_t>(*raw.row_stop);
  region.col_start = static_cast<std::uint64_t>(*raw.column_start);
  region.col_stop = static_cast<std::uint64_t>(*raw.column_stop);
  return region;
}

void validate_bin(const char* name, std::int64_t value) {
  if (value < 1) {
    throw bad_request(std::string(name) + " must be a positive integer (1 up to the axis length); got " +
                      std::to_string(value));
  }
}

plan::BrowsePlan validate_plan(const RawPlan& raw) {
  plan::BrowsePlan result;
  result.crop = validate_crop(raw);
  validate_bin("det_bin", raw.det_bin);
  validate_bin("scan_bin", raw.scan_bin);
  result.detector_bin = static_cast<std::uint64_t>(raw.det_bin);
  result.scan_bin = static_cast<std::uint64_t>(raw.scan_bin);
  return result;
}

PayloadFormat validate_format(const std::string& name) {
  if (name == "raw") return PayloadFormat::raw;
  if (name == "npy") return PayloadFormat::npy;
  throw bad_request("format must be raw or npy");
}

products::DetectorShape detector_shape_from_wire(const std::string& name) {
  if (name == "circle") return products::DetectorShape::circle;
  if (name == "square") return products::DetectorShape::square;
  if (name == "annulus") return products::DetectorShape::annulus;
  throw bad_request("detector shape must be circle, square, or annulus");
}

products::ScanRoiShape scan_roi_shape_from_wire(const std::string& name) {
  if (name == "circle") return products::ScanRoiShape::circle;
  if (name == "square") return products::ScanRoiShape::square;
  throw bad_request("scan ROI shape must be circle or square");
}

products::RegionRequest::Reduce region_reduce_from_wire(const std::string& name) {
  using Reduce = products::RegionRequest::Reduce;
  if (name == "mean") return Reduce::mean;
  if (name == "sum") return Reduce::sum;
  if (name == "max") return Reduce::max;
  throw bad_request("scan ROI reduction must be mean, sum, or max");
}

bool all_finite(std::initializer_list<double> values) {
  for (double v : values)
    if (!std::isfinite(v)) return false;
  return true;
}

// Reads one UTF-8 sequence at i (leniently: the text was sanitised by the
// query parser) and advances i past it.
void next_code_point(const std::string& text, std::size_t& i, std::uint32_t& code_point) {
  const auto lead = static_cast<unsigned char>(text[i]);
  std::size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
  if (i + length > text.size()) length = text.size() - i;
  code_point = lead;
  if (length == 2) code_point = lead & 0x1F;
  if (length == 3) code_point = lead & 0x0F;
  if (length == 4) code_point = lead & 0x07;
  for (std::size_t k = 1; k < length; ++k) code_point = (code_point << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  i += length;
}

}  // namespace

bool realspace_mode_is_float(products::RealspaceMode mode) {
  using M = products::RealspaceMode;
  return mode == M::CoMx || mode == M::CoMy || mode == M::CoMmag || mode == M::DPC || mode == M::iCoM;
}

std::string python_str_repr(const std::string& text) {
  const bool has_single = text.find('\'') != std::string::npos;
  const bool has_double = text.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = i;
    std::uint32_t cp = 0;
    next_code_point(text, i, cp);
    char buffer[16];
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<std::uint32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0xA0) || cp == 0xAD) {
      std::snprintf(buffer, sizeof buffer, "\\x%02x", cp);
      out += buffer;
    } else if (cp == 0x2028 || cp == 0x2029 || (cp >= 0x200B && cp <= 0x200F) || cp == 0xFEFF) {
      std::snprintf(buffer, sizeof buffer, "\\u%04x", cp);
      out += buffer;
    } else {
      out.append(text, start, i - start);
    }
  }
  out += quote;
  return out;
}

namespace {

// ---- the parameters every product route shares, read in one place --------------
// Each route declares session and file first, then its own parameters, then
// det_bin, scan_bin and the crop, then (some) ensure_resident, then the
// additive format. Errors are collected in that order.

SourceRef read_source(QueryReader& reader) {
  SourceRef source;
  source.session = reader.required_string("session");
  source.file = reader.required_string("file");
  return source;
}

RawPlan read_plan(QueryReader& reader) {
  RawPlan raw;
  raw.det_bin = reader.int_or("det_bin", 1);
  raw.scan_bin = reader.int_or("scan_bin", 1);
  raw.row_start = reader.optional_int("row_start");
  raw.row_stop = reader.optional_int("row_stop");
  raw.column_start = reader.optional_int("column_start");
  raw.column_stop = reader.optional_int("column_stop");
  return raw;
}

// A mask's shape and centre (shape, cx, cy, in that order) into a query with
// a shape_name and a request with a centre (ShapeQuery, RegionQuery).
template <class MaskQuery>
void read_shape_and_center(QueryReader& reader, const char* default_shape, MaskQuery& query) {
  query.shape_name = reader.string_or("shape", default_shape);
  query.request.center_col = reader.float_or("cx", 0.0);
  query.request.center_row = reader.float_or("cy", 0.0);
}

// The parameters after a route's own: det_bin, scan_bin and the crop, then
// ensure_resident where the route has it (into `query`), then format; the
// query then ends. The plan and the format are returned as given: each route
// validates them in its own order.
struct PlanAndFormat {
  RawPlan raw;
  std::string format;
};

enum class EnsureResident { absent, accepted };

PlanAndFormat finish_product_query(QueryReader& reader, ProductQuery& query, EnsureResident ensure_resident,
                                   const char* default_format = "raw") {
  PlanAndFormat tail;
  tail.raw = read_plan(reader);
  if (ensure_resident == EnsureResident::accepted) query.ensure_resident = reader.bool_or("ensure_resident", false);
  tail.format = reader.string_or("format", default_format);
  reader.finish();
  return tail;
}

}  // namespace

RealspaceQuery parse_realspace_query(const QueryParams& params) {
  // Declaration order: session, file, mode, inner, outer, cx, cy, det_bin,
  // dtype, scan_bin, crop, ensure_resident (then the additive format). dtype
  // is accepted and ignored (docs/protocol.md, routes) and never fails, so it
  // is read before the plan.
  QueryReader reader(params);
  RealspaceQuery query;
  query.source = read_source(reader);
  query.mode_name = reader.string_or("mode", "BF");
  query.request.inner = reader.float_or("inner", 0.0);
  query.request.outer = reader.float_or("outer", 1.0);
  query.request.center_col = reader.optional_float("cx");
  query.request.center_row = reader.optional_float("cy");
  (void)reader.string_or("dtype", "uint16");
  const PlanAndFormat tail = finish_product_query(reader, query, EnsureResident::accepted);

  const auto mode = products::realspace_mode_from_name(query.mode_name);
  if (!mode) throw bad_request("unknown virtual-image mode: " + python_str_repr(query.mode_name));
  query.request.mode = *mode;
  query.plan = validate_plan(tail.raw);
  if (!all_finite({query.request.inner, query.request.outer, query.request.center_col.value_or(0.0),
                   query.request.center_row.value_or(0.0)})) {
    throw bad_request("detector center and radii must be finite");
  }
  query.format = validate_format(tail.format);
  return query;
}

const char* const kDefaultProductModes = "BF,ABF,ADF,CoMx,CoMy,iCoM";

namespace {

// The modes whose detector radii a products request may give per mode
// (inner_<MODE>, outer_<MODE>), in the order they are read.
const char* const kAnnularModes[] = {"BF", "ABF", "ADF", "HAADF", "DF"};

std::vector<std::string> split_modes(const std::string& text) {
  std::vector<std::string> names;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    names.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return names;
    start = comma + 1;
  }
}

struct ModeRadii {
  std::optional<double> inner, outer;
};

}  // namespace

ProductsQuery parse_products_query(const QueryParams& params) {
  // session, file, modes, inner, outer, cx, cy, inner_<MODE> and
  // outer_<MODE> for BF, ABF, ADF, HAADF, DF, dtype (ignored), det_bin,
  // scan_bin, crop, ensure_resident, format: the realspace route's
  // parameters with a list of modes and per-mode radii.
  QueryReader reader(params);
  ProductsQuery query;
  query.source = read_source(reader);
  const std::string modes = reader.string_or("modes", kDefaultProductModes);
  const double inner = reader.float_or("inner", 0.0);
  const double outer = reader.float_or("outer", 1.0);
  const std::optional<double> center_col = reader.optional_float("cx");
  const std::optional<double> center_row = reader.optional_float("cy");
  std::vector<ModeRadii> radii;
  for (const char* mode : kAnnularModes) {
    ModeRadii r;
    r.inner = reader.optional_float(std::string("inner_") + mode);
    r.outer = reader.optional_float(std::string("outer_") + mode);
    radii.push_back(r);
  }
  (void)reader.string_or("dtype", "uint16");
  const PlanAndFormat tail = finish_product_query(reader, query, EnsureResident::accepted, "json");

  if (modes.empty()) throw bad_request("modes must name at least one virtual-image mode");
  for (const std::string& name : split_modes(modes)) {
    const auto mode = products::realspace_mode_from_name(name);
    if (!mode) throw bad_request("unknown virtual-image mode: " + python_str_repr(name));
    if (std::find(query.mode_names.begin(), query.mode_names.end(), name) != query.mode_names.end()) {
      throw bad_request("modes names the mode " + python_str_repr(name) + " more than once");
    }
    products::RealspaceRequest request;
    request.mode = *mode;
    request.inner = inner;
    request.outer = outer;
    request.center_col = center_col;
    request.center_row = center_row;
    for (std::size_t k = 0; k < radii.size(); ++k) {
      if (name != kAnnularModes[k]) continue;
      request.inner = radii[k].inner.value_or(inner);
      request.outer = radii[k].outer.value_or(outer);
    }
    query.mode_names.push_back(name);
    query.requests.push_back(request);
  }
  query.plan = validate_plan(tail.raw);
  for (const auto& r : query.requests) {
    if (!all_finite({r.inner, r.outer, r.center_col.value_or(0.0), r.center_row.value_or(0.0)})) {
      throw bad_request("detector center and radii must be finite");
    }
  }
  if (tail.format == "json") {
    query.bundle_format = BundleFormat::json;
  } else if (tail.format == "npz") {
    query.bundle_format = BundleFormat::npz;
  } else if (tail.format == "raw") {
    query.bundle_format = BundleFormat::raw;
  } else {
    throw bad_request("format must be json, npz or raw");
  }
  return query;
}

ShapeQuery parse_shape_query(const QueryParams& params) {
  // session, file, shape, cx, cy, inner, outer, det_bin, scan_bin, crop (then format).
  QueryReader reader(params);
  ShapeQuery query;
  query.source = read_source(reader);
  read_shape_and_center(reader, "annulus", query);
  query.request.inner = reader.float_or("inner", 0.0);
  query.request.outer = reader.float_or("outer", 0.0);
  const PlanAndFormat tail = finish_product_query(reader, query, EnsureResident::absent);

  query.request.shape = detector_shape_from_wire(query.shape_name);
  const auto& r = query.request;
  if (!all_finite({r.center_col, r.center_row, r.inner, r.outer})) {
    throw bad_request("detector center and radii must be finite");
  }
  if (r.outer <= 0 || (r.shape == products::DetectorShape::annulus && (r.inner < 0 || r.outer <= r.inner))) {
    throw bad_request("detector radii must satisfy 0 <= inner < outer");
  }
  query.plan = validate_plan(tail.raw);
  query.format = validate_format(tail.format);
  return query;
}

CbedQuery parse_cbed_query(const QueryParams& params) {
  // session, file, sx, sy, det_bin, scan_bin, crop, ensure_resident (then format).
  QueryReader reader(params);
  CbedQuery query;
  query.source = read_source(reader);
  query.scan_row = reader.int_or("sx", 0);
  query.scan_col = reader.int_or("sy", 0);
  const PlanAndFormat tail = finish_product_query(reader, query, EnsureResident::accepted);

  query.plan = validate_plan(tail.raw);
  query.format = validate_format(tail.format);
  return query;
}

RegionQuery parse_region_query(const QueryParams& params) {
  // session, file, shape, cx, cy, radius, reduce, det_bin, scan_bin, crop,
  // ensure_resident (then format).
  QueryReader reader(params);
  RegionQuery query;
  query.source = read_source(reader);
  read_shape_and_center(reader, "circle", query);
  query.request.radius = reader.float_or("radius", 1.0);
  query.reduce_name = reader.string_or("reduce", "mean");
  const PlanAndFormat tail = finish_product_query(reader, query, EnsureResident::accepted);

  query.request.reduce = region_reduce_from_wire(query.reduce_name);
  query.plan = validate_plan(tail.raw);
  query.request.shape = scan_roi_shape_from_wire(query.shape_name);
  if (!std::isfinite(query.request.radius) || query.request.radius <= 0) {
    throw bad_request("scan ROI radius must be greater than zero");
  }
  if (!std::isfinite(query.request.center_col) || !std::isfinite(query.request.center_row)) {
    throw bad_request("scan ROI center must be finite");
  }
  query.format = validate_format(tail.format);
  return query;
}

ExportQuery parse_export_query(const QueryParams& params) {
  QueryReader reader(params);
  ExportQuery query;
  query.source = read_source(reader);
  const RawPlan raw = read_plan(reader);
  query.frames_per_file = reader.int_or("frames_per_file", 0);
  reader.finish();
  query.plan = validate_plan(raw);
  if (query.frames_per_file < 0) throw bad_request("frames_per_file must be 0 (the default) or positive");
  return query;
}

SourceRef parse_source_query(const QueryParams& params) {
  QueryReader reader(params);
  SourceRef source = read_source(reader);
  reader.finish();
  return source;
}

bool parse_sessions_refresh(const QueryParams& params) {
  QueryReader reader(params);
  const bool refresh = reader.bool_or("refresh", false);
  reader.finish();
  return refresh;
}

SessionsQuery parse_sessions_query(const QueryParams& params) {
  QueryReader reader(params);
  SessionsQuery query;
  query.refresh = reader.bool_or("refresh", false);
  query.partial = reader.bool_or("partial", false);
  reader.finish();
  return query;
}

}  // namespace quantem::protocol
