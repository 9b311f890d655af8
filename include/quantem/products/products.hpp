#pragma once
// Protocol products built from a Resident's exact primitives
// (docs/protocol.md, 'Products' and '4. Tightened rules'):
//   realspace:      BF / ABF / ADF / HAADF / DF (one annulus rule), CoMx / CoMy /
//                   CoMmag / DPC (float32), iCoM (FFT integration, float32)
//   realspace-shape: circle / square / annulus in absolute binned detector pixels
//   cbed:           the binned frame at one plan position
//   cbed-region:    mean (sum + divisor) / sum / max over a scan ROI
// Validation of request parameters happens in the protocol layer before any
// residency work; these functions assume finite, validated inputs unless noted.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/plan/plan.hpp"

namespace quantem::products {

// A 2-D result. Integer products keep exact uint64 values; the protocol layer
// turns a value above 2^32-1 into the reference's 409 overflow error.
struct Image {
  std::uint64_t height = 0;
  std::uint64_t width = 0;
  bool is_float = false;
  std::vector<std::uint64_t> counts;  // when !is_float, height*width values (or, instead:)
  std::vector<std::uint32_t> narrow_counts;  // the same values, already known to fit uint32 (narrowed where computed)
  std::vector<float> values;          // when is_float
  std::uint64_t value_divisor = 1;    // x-value-divisor (cbed-region mean)

  // The integer values, whichever way they are held.
  std::vector<std::uint64_t> integer_values() const {
    return narrow_counts.empty() ? counts : std::vector<std::uint64_t>(narrow_counts.begin(), narrow_counts.end());
  }
};

// The fitted bright-field disk, in binned detector pixels (float64 from the
// exact uint64 mean pattern: threshold = mean + population std, strict >,
// centre = mean index of pixels above it, radius = sqrt(count / pi); no pixel
// above -> centre (H/2, W/2), radius min(H, W) / 4).
struct BrightFieldGeometry {
  double center_row = 0.0;
  double center_col = 0.0;
  double radius = 0.0;
};
BrightFieldGeometry fit_bright_field(const std::vector<std::uint64_t>& pattern_sum, std::uint64_t positions,
                                     std::uint64_t detector_rows, std::uint64_t detector_cols);

// The geometry actually used for a product (reported in provenance).
struct UsedGeometry {
  std::optional<double> center_row;
  std::optional<double> center_col;
  std::optional<double> inner_radius_px;
  std::optional<double> outer_radius_px;
  std::optional<BrightFieldGeometry> bright_field;
};

enum class RealspaceMode { BF, ABF, ADF, HAADF, DF, CoMx, CoMy, CoMmag, DPC, iCoM };
// The one table of virtual-image mode names (the wire's too): exact, case-sensitive.
std::optional<RealspaceMode> realspace_mode_from_name(const std::string& name);

struct RealspaceRequest {
  RealspaceMode mode = RealspaceMode::BF;
  double inner = 0.0;               // fraction of the fitted BF radius
  double outer = 1.0;
  std::optional<double> center_col; // cx; nullopt: fitted centre column
  std::optional<double> center_row; // cy
};

enum class DetectorShape { circle, square, annulus };
struct ShapeRequest {
  DetectorShape shape = DetectorShape::annulus;
  double center_col = 0.0;  // cx, binned detector pixels
  double center_row = 0.0;  // cy
  double inner = 0.0;       // absolute pixels
  double outer = 0.0;       // absolute pixels (square: half-width)
};

enum class ScanRoiShape { circle, square };
struct RegionRequest {
  ScanRoiShape shape = ScanRoiShape::circle;
  double center_col = 0.0;  // cx in the plan's scan grid
  double center_row = 0.0;  // cy
  double radius = 1.0;
  enum class Reduce { mean, sum, max } reduce = Reduce::mean;
};

// Row-major flat indices of the scan ROI, ascending (docs/protocol.md, 'Products'). Throws
// bad_request "scan ROI does not include any scan positions" when empty.
std::vector<std::uint64_t> scan_roi_positions(const RegionRequest& request, std::uint64_t scan_rows,
                                              std::uint64_t scan_cols);

// Per-plan derived values (the BF fit, the CoM maps, iCoM) are computed once
// per (resident, geometry) and kept in the resident's DerivedCache, so a second
// request for the same plan reuses them; they die with the resident.
// All functions below are thread-safe for concurrent calls on one resident.

Image realspace(backend::Resident& resident, const plan::PlanGeometry& geometry, const RealspaceRequest& request,
                UsedGeometry& used);
// Several realspace images of one plan, computed together (the products
// route): the bright-field fit once, the masks of every BF / ABF / ADF /
// HAADF / DF request summed in one Resident::masked_sums_u32 call, the CoM
// maps once for every CoM-family request. images[i] and used[i] equal what
// realspace(requests[i]) returns, value for value (the same typed errors).
std::vector<Image> realspace_together(backend::Resident& resident, const plan::PlanGeometry& geometry,
                                      const std::vector<RealspaceRequest>& requests, std::vector<UsedGeometry>& used);
Image realspace_shape(backend::Resident& resident, const plan::PlanGeometry& geometry, const ShapeRequest& request,
                      UsedGeometry& used);
Image selected_diffraction(backend::Resident& resident, const plan::PlanGeometry& geometry, std::int64_t scan_row,
                           std::int64_t scan_col);  // indices clamped into the grid, as the reference does
Image region_diffraction(backend::Resident& resident, const plan::PlanGeometry& geometry,
                         const RegionRequest& request);

}  // namespace quantem::products
