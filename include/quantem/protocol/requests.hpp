#pragma once
// Typed parameters of every route, read and validated before any residency
// work (docs/protocol.md, 'Order of checks for an array request'). Each parse_* function:
//  1. reads the parameters in the reference's declaration order, throwing
//     QueryValidationError (422, pydantic list) when any coercion fails;
//  2. checks everything that does not need the source: mode and shape names,
//     finiteness, radii, crop form, bin signs, format — quantem::Error
//     (bad_request) with the reference's exact texts where it has one.
// Checks that need the source shape (crop bounds, bins beyond an axis, an
// empty scan ROI) happen after resolution, still before residency.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quantem/plan/plan.hpp"
#include "quantem/products/products.hpp"
#include "quantem/protocol/query.hpp"
#include "quantem/protocol/wire_image.hpp"

namespace quantem::protocol {

// Exact 400 texts of the reference used by the parsers.
extern const char* const kCropIncompleteMessage;
extern const char* const kCropEmptyMessage;

struct SourceRef {
  std::string session;
  std::string file;
};

struct ProductQuery {
  SourceRef source;
  plan::BrowsePlan plan;
  PayloadFormat format = PayloadFormat::raw;
  // Load the acquisition when it is not resident (realspace, cbed and
  // cbed-region declare it; realspace-shape always loads).
  bool ensure_resident = false;
};

struct RealspaceQuery : ProductQuery {
  std::string mode_name;
  products::RealspaceRequest request;
};

struct ShapeQuery : ProductQuery {
  std::string shape_name;
  products::ShapeRequest request;
};

struct CbedQuery : ProductQuery {
  std::int64_t scan_row = 0;  // sx: scan ROW (the reference's naming)
  std::int64_t scan_col = 0;  // sy: scan COLUMN
};

struct RegionQuery : ProductQuery {
  std::string shape_name;
  std::string reduce_name;
  products::RegionRequest request;
};

// GET /api/browse/products: several realspace images of one plan in one
// response (docs/protocol.md, 'Products of one plan in one request').
// requests[i] is what GET /api/browse/realspace?mode=<mode_names[i]> with the
// mode's radii would ask for; `format` stays raw (the bundle format is
// bundle_format).
enum class BundleFormat { json, npz, raw };
struct ProductsQuery : ProductQuery {
  std::vector<std::string> mode_names;                 // in the request's order, distinct
  std::vector<products::RealspaceRequest> requests;    // one per mode name
  BundleFormat bundle_format = BundleFormat::json;
};
// The modes a products request names when it names none.
extern const char* const kDefaultProductModes;

// POST /api/browse/export: the source, the plan named as the image routes
// name it, and frames_per_file (0: the default).
struct ExportQuery : ProductQuery {
  std::int64_t frames_per_file = 0;
};

RealspaceQuery parse_realspace_query(const QueryParams& params);
ProductsQuery parse_products_query(const QueryParams& params);
ExportQuery parse_export_query(const QueryParams& params);
ShapeQuery parse_shape_query(const QueryParams& params);
CbedQuery parse_cbed_query(const QueryParams& params);
RegionQuery parse_region_query(const QueryParams& params);
SourceRef parse_source_query(const QueryParams& params);  // residency routes: session, file
bool parse_sessions_refresh(const QueryParams& params);   // refresh: bool = false

struct SessionsQuery {
  bool refresh = false;
  bool partial = false;  // added: while the first catalog is built, answer what is known (complete: false)
};
SessionsQuery parse_sessions_query(const QueryParams& params);  // refresh, then partial

// Python's repr() of a str (quotes and escapes as CPython 3 prints them);
// used in "unknown virtual-image mode: 'bf'".
std::string python_str_repr(const std::string& text);

// Modes whose images are float32 on the wire (the others are uint32). A
// mode's wire name is its name in products::realspace_mode_from_name.
bool realspace_mode_is_float(products::RealspaceMode mode);

}  // namespace quantem::protocol
