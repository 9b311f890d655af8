#pragma once
// A browse plan is a view of one resident acquisition: a half-open scan crop,
// a scan bin and a detector bin. Plans never touch devices; every plan of an
// acquisition is served from its one resident (docs/protocol.md, '4. Tightened rules').
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace quantem::plan {

// Half-open scan region [row_start, row_stop) × [col_start, col_stop).
struct ScanRegion {
  std::uint64_t row_start = 0;
  std::uint64_t row_stop = 0;
  std::uint64_t col_start = 0;
  std::uint64_t col_stop = 0;
  bool operator==(const ScanRegion& o) const {
    return row_start == o.row_start && row_stop == o.row_stop && col_start == o.col_start && col_stop == o.col_stop;
  }
};

// What a request asks for, before it is checked against the source shape.
struct BrowsePlan {
  std::optional<ScanRegion> crop;  // nullopt: the full scan
  std::uint64_t scan_bin = 1;
  std::uint64_t detector_bin = 1;
};

// A plan resolved against a source: every size the products need.
// Output sizes use ceiling division (partial edge bins are kept).
struct PlanGeometry {
  std::uint64_t source_scan_rows = 0;
  std::uint64_t source_scan_cols = 0;
  std::uint64_t source_detector_rows = 0;
  std::uint64_t source_detector_cols = 0;
  ScanRegion region;  // always explicit (the full scan when the plan has no crop)
  bool cropped = false;  // false when the crop was absent or equal to the full scan
  std::uint64_t scan_bin = 1;
  std::uint64_t detector_bin = 1;
  std::uint64_t scan_rows = 0;      // ceil((row_stop - row_start) / scan_bin)
  std::uint64_t scan_cols = 0;      // ceil((col_stop - col_start) / scan_bin)
  std::uint64_t detector_rows = 0;  // ceil(source_detector_rows / detector_bin)
  std::uint64_t detector_cols = 0;

  std::uint64_t positions() const { return scan_rows * scan_cols; }
  std::uint64_t detector_pixels() const { return detector_rows * detector_cols; }
  bool operator==(const PlanGeometry& o) const;
};

// Validates a plan against a source shape and resolves it. Throws
// quantem::Error(bad_request) with the reference's exact texts:
//  "scan crop must be a nonempty half-open (row, column) region"
//  "scan crop exceeds the source scan shape"
// and, for bins outside 1..axis length, a clear message naming the bin and the axis.
PlanGeometry resolve_plan(const BrowsePlan& plan, std::uint64_t source_scan_rows, std::uint64_t source_scan_cols,
                          std::uint64_t source_detector_rows, std::uint64_t source_detector_cols);

// A compact, unique text form of every field of a geometry, e.g.
// "scan 8x6 region [0,8)x[0,6) bin 2 detector 5x7 bin 3"; equal geometries give
// equal texts. Used for cache keys and logs.
std::string to_string(const PlanGeometry& geometry);

// Checks that `geometry` is exactly what resolve_plan gives for a source of
// this shape (a resident's primitives accept nothing else). Throws
// quantem::Error(internal) naming the geometry and `source_name` otherwise.
void require_resolved_for(const PlanGeometry& geometry, std::uint64_t source_scan_rows,
                          std::uint64_t source_scan_cols, std::uint64_t source_detector_rows,
                          std::uint64_t source_detector_cols, const std::string& source_name);

// Plan positions (row-major flat indices) sorted ascending. Throws
// quantem::Error(bad_request) for an index outside the plan or listed twice.
std::vector<std::uint64_t> sorted_distinct_positions(const PlanGeometry& geometry,
                                                     const std::vector<std::uint64_t>& positions);

// --- Geometry shared by every backend's resident ------------------------------

// The binned detector mask at source resolution: one 0/1 byte per source
// detector pixel, 1 where the pixel's detector bin is selected (non-zero).
// binned_mask has geometry.detector_pixels() bytes.
std::vector<std::uint8_t> source_detector_mask(const PlanGeometry& geometry,
                                               const std::vector<std::uint8_t>& binned_mask);

// out[r / bin][c / bin] = Σ source[r][c]; out has ceil(rows/bin) x ceil(cols/bin) values.
void bin_detector_sums(const std::uint64_t* source, std::uint64_t rows, std::uint64_t cols, std::uint64_t bin,
                       std::uint64_t* out);
// The same into a new vector; at bin 1 `source` itself is returned (moved, not copied).
std::vector<std::uint64_t> bin_detector_sums(std::vector<std::uint64_t> source, std::uint64_t rows,
                                             std::uint64_t cols, std::uint64_t bin);

// Sums per-frame values of the region (row-major over the region) into plan
// positions (geometry.positions() values; partial edge bins kept).
std::vector<std::uint64_t> bin_scan_sums(const PlanGeometry& geometry, std::vector<std::uint64_t> per_region_frame);

// Calls visit(first_frame, end_frame) with the half-open global frame range
// (row-major source scan order) of each source scan row of the region,
// ascending.
void for_each_region_row(const PlanGeometry& geometry,
                         const std::function<void(std::uint64_t, std::uint64_t)>& visit);
// The same for the source frames of one plan position: its scan_bin x
// scan_bin block, cut at the region's edge.
void for_each_position_row(const PlanGeometry& geometry, std::uint64_t position,
                           const std::function<void(std::uint64_t, std::uint64_t)>& visit);

// Global frame indices (ascending) of the region, and of one plan position.
std::vector<std::uint64_t> region_frame_indices(const PlanGeometry& geometry);
std::vector<std::uint64_t> position_frame_indices(const PlanGeometry& geometry, std::uint64_t position);

// Index of a global frame of the region in the region's row-major per-frame arrays.
inline std::uint64_t region_index(const PlanGeometry& geometry, std::uint64_t frame) {
  return (frame / geometry.source_scan_cols - geometry.region.row_start) *
             (geometry.region.col_stop - geometry.region.col_start) +
         frame % geometry.source_scan_cols - geometry.region.col_start;
}

// Number of source frames in the region.
inline std::uint64_t region_frame_count(const PlanGeometry& geometry) {
  return (geometry.region.row_stop - geometry.region.row_start) *
         (geometry.region.col_stop - geometry.region.col_start);
}

}  // namespace quantem::plan
