#include "quantem/plan/plan.hpp"

#include <algorithm>
#include <string>

#include "quantem/core/error.hpp"

namespace quantem::plan {
namespace {

std::uint64_t ceil_div(std::uint64_t value, std::uint64_t divisor) { return value / divisor + (value % divisor != 0); }

void check_bin(const char* name, std::uint64_t bin, std::uint64_t rows, std::uint64_t cols, const char* what) {
  const std::uint64_t longest = std::max(rows, cols);
  if (bin < 1 || bin > longest) {
    throw bad_request(std::string(name) + "=" + std::to_string(bin) + " must be between 1 and " +
                      std::to_string(longest) + ", the longer axis of the " + std::to_string(rows) + " x " +
                      std::to_string(cols) + " " + what);
  }
}

}  // namespace

bool PlanGeometry::operator==(const PlanGeometry& o) const {
  return source_scan_rows == o.source_scan_rows && source_scan_cols == o.source_scan_cols &&
         source_detector_rows == o.source_detector_rows && source_detector_cols == o.source_detector_cols &&
         region == o.region && cropped == o.cropped && scan_bin == o.scan_bin && detector_bin == o.detector_bin &&
         scan_rows == o.scan_rows && scan_cols == o.scan_cols && detector_rows == o.detector_rows &&
         detector_cols == o.detector_cols;
}

PlanGeometry resolve_plan(const BrowsePlan& plan, std::uint64_t source_scan_rows, std::uint64_t source_scan_cols,
                          std::uint64_t source_detector_rows, std::uint64_t source_detector_cols) {
  if (plan.crop && (plan.crop->row_stop <= plan.crop->row_start || plan.crop->col_stop <= plan.crop->col_start)) {
    throw bad_request("scan crop must be a nonempty half-open (row, column) region");
  }
  if (source_scan_rows == 0 || source_scan_cols == 0 || source_detector_rows == 0 || source_detector_cols == 0) {
    throw unprocessable("the source scan and detector shapes must be known to resolve a plan (got " +
                        std::to_string(source_scan_rows) + " x " + std::to_string(source_scan_cols) + " scan, " +
                        std::to_string(source_detector_rows) + " x " + std::to_string(source_detector_cols) +
                        " detector)");
  }
  if (plan.crop && (plan.crop->row_stop > source_scan_rows || plan.crop->col_stop > source_scan_cols)) {
    throw bad_request("scan crop exceeds the source scan shape");
  }

  PlanGeometry geometry;
  geometry.source_scan_rows = source_scan_rows;
  geometry.source_scan_cols = source_scan_cols;
  geometry.source_detector_rows = source_detector_rows;
  geometry.source_detector_cols = source_detector_cols;
  const ScanRegion full{0, source_scan_rows, 0, source_scan_cols};
  geometry.region = plan.crop.value_or(full);
  geometry.cropped = !(geometry.region == full);

  const std::uint64_t region_rows = geometry.region.row_stop - geometry.region.row_start;
  const std::uint64_t region_cols = geometry.region.col_stop - geometry.region.col_start;
  check_bin("scan_bin", plan.scan_bin, region_rows, region_cols, "scan region");
  check_bin("det_bin", plan.detector_bin, source_detector_rows, source_detector_cols, "detector");

  geometry.scan_bin = plan.scan_bin;
  geometry.detector_bin = plan.detector_bin;
  geometry.scan_rows = ceil_div(region_rows, plan.scan_bin);
  geometry.scan_cols = ceil_div(region_cols, plan.scan_bin);
  geometry.detector_rows = ceil_div(source_detector_rows, plan.detector_bin);
  geometry.detector_cols = ceil_div(source_detector_cols, plan.detector_bin);
  return geometry;
}

}  // namespace quantem::plan

namespace quantem::plan {

std::string to_string(const PlanGeometry& geometry) {
  const auto n = [](std::uint64_t value) { return std::to_string(value); };
  return "scan " + n(geometry.source_scan_rows) + "x" + n(geometry.source_scan_cols) + " region [" +
         n(geometry.region.row_start) + "," + n(geometry.region.row_stop) + ")x[" + n(geometry.region.col_start) +
         "," + n(geometry.region.col_stop) + ")" + (geometry.cropped ? " cropped" : "") + " bin " +
         n(geometry.scan_bin) + " -> " + n(geometry.scan_rows) + "x" + n(geometry.scan_cols) + " detector " +
         n(geometry.source_detector_rows) + "x" + n(geometry.source_detector_cols) + " bin " +
         n(geometry.detector_bin) + " -> " + n(geometry.detector_rows) + "x" + n(geometry.detector_cols);
}

void require_resolved_for(const PlanGeometry& geometry, std::uint64_t source_scan_rows,
                          std::uint64_t source_scan_cols, std::uint64_t source_detector_rows,
                          std::uint64_t source_detector_cols, const std::string& source_name) {
  BrowsePlan plan;
  if (geometry.cropped) plan.crop = geometry.region;
  plan.scan_bin = geometry.scan_bin;
  plan.detector_bin = geometry.detector_bin;
  bool consistent = false;
  try {
    consistent = resolve_plan(plan, source_scan_rows, source_scan_cols, source_detector_rows, source_detector_cols) ==
                 geometry;
  } catch (const Error&) {
    consistent = false;
  }
  if (!consistent) {
    throw internal_error("plan geometry (" + to_string(geometry) + ") was not resolved for the resident " +
                         source_name + " (" + std::to_string(source_scan_rows) + "x" +
                         std::to_string(source_scan_cols) + " scan, " + std::to_string(source_detector_rows) + "x" +
                         std::to_string(source_detector_cols) + " detector)");
  }
}

std::vector<std::uint64_t> sorted_distinct_positions(const PlanGeometry& geometry,
                                                     const std::vector<std::uint64_t>& positions) {
  std::vector<std::uint64_t> sorted = positions;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] >= geometry.positions()) {
      throw bad_request("scan position index " + std::to_string(sorted[i]) + " is outside the plan's " +
                        std::to_string(geometry.positions()) + " positions");
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      throw bad_request("scan position index " + std::to_string(sorted[i]) + " is listed twice");
    }
  }
  return sorted;
}

std::vector<std::uint8_t> source_detector_mask(const PlanGeometry& g, const std::vector<std::uint8_t>& binned_mask) {
  const std::uint64_t rows = g.source_detector_rows;
  const std::uint64_t cols = g.source_detector_cols;
  std::vector<std::uint8_t> source(rows * cols);
  if (g.detector_bin == 1) {
    for (std::uint64_t i = 0; i < rows * cols; ++i) source[i] = binned_mask[i] != 0 ? 1 : 0;
    return source;
  }
  // Bin indices advance with counters: no division per pixel (this runs on every masked-sum request).
  std::uint64_t binned_row = 0;
  std::uint64_t row_in_bin = 0;
  for (std::uint64_t r = 0; r < rows; ++r) {
    const std::uint8_t* mask_row = binned_mask.data() + binned_row * g.detector_cols;
    std::uint8_t* out_row = source.data() + r * cols;
    std::uint64_t binned_col = 0;
    std::uint64_t col_in_bin = 0;
    for (std::uint64_t c = 0; c < cols; ++c) {
      out_row[c] = mask_row[binned_col] != 0 ? 1 : 0;
      if (++col_in_bin == g.detector_bin) col_in_bin = 0, ++binned_col;
    }
    if (++row_in_bin == g.detector_bin) row_in_bin = 0, ++binned_row;
  }
  return source;
}

void bin_detector_sums(const std::uint64_t* source, std::uint64_t rows, std::uint64_t cols, std::uint64_t bin,
                       std::uint64_t* out) {
  if (bin == 1) {
    std::copy(source, source + rows * cols, out);
    return;
  }
  const std::uint64_t out_cols = (cols + bin - 1) / bin;
  const std::uint64_t out_rows = (rows + bin - 1) / bin;
  std::fill(out, out + out_rows * out_cols, 0);
  for (std::uint64_t r = 0; r < rows; ++r) {
    std::uint64_t* out_row = out + (r / bin) * out_cols;
    const std::uint64_t* in_row = source + r * cols;
    for (std::uint64_t first = 0, binned = 0; first < cols; first += bin, ++binned) {
      const std::uint64_t end = std::min(cols, first + bin);
      for (std::uint64_t c = first; c < end; ++c) out_row[binned] += in_row[c];
    }
  }
}

std::vector<std::uint64_t> bin_detector_sums(std::vector<std::uint64_t> source, std::uint64_t rows,
                                             std::uint64_t cols, std::uint64_t bin) {
  if (bin == 1) return source;
  std::vector<std::uint64_t> out(((rows + bin - 1) / bin) * ((cols + bin - 1) / bin));
  bin_detector_sums(source.data(), rows, cols, bin, out.data());
  return out;
}

std::vector<std::uint64_t> bin_scan_sums(const PlanGeometry& g, std::vector<std::uint64_t> per_region_frame) {
  if (g.scan_bin == 1) return per_region_frame;
  const std::uint64_t region_cols = g.region.col_stop - g.region.col_start;
  const std::uint64_t region_rows = g.region.row_stop - g.region.row_start;
  std::vector<std::uint64_t> out(g.positions(), 0);
  for (std::uint64_t r = 0; r < region_rows; ++r) {
    std::uint64_t* out_row = out.data() + (r / g.scan_bin) * g.scan_cols;
    const std::uint64_t* in_row = per_region_frame.data() + r * region_cols;
    for (std::uint64_t first = 0, binned = 0; first < region_cols; first += g.scan_bin, ++binned) {
      const std::uint64_t end = std::min(region_cols, first + g.scan_bin);
      for (std::uint64_t c = first; c < end; ++c) out_row[binned] += in_row[c];
    }
  }
  return out;
}

void for_each_region_row(const PlanGeometry& g, const std::function<void(std::uint64_t, std::uint64_t)>& visit) {
  for (std::uint64_t row = g.region.row_start; row < g.region.row_stop; ++row) {
    visit(row * g.source_scan_cols + g.region.col_start, row * g.source_scan_cols + g.region.col_stop);
  }
}

void for_each_position_row(const PlanGeometry& g, std::uint64_t position,
                           const std::function<void(std::uint64_t, std::uint64_t)>& visit) {
  const std::uint64_t row_begin = g.region.row_start + position / g.scan_cols * g.scan_bin;
  const std::uint64_t row_end = std::min(g.region.row_stop, row_begin + g.scan_bin);
  const std::uint64_t col_begin = g.region.col_start + position % g.scan_cols * g.scan_bin;
  const std::uint64_t col_end = std::min(g.region.col_stop, col_begin + g.scan_bin);
  for (std::uint64_t row = row_begin; row < row_end; ++row) {
    visit(row * g.source_scan_cols + col_begin, row * g.source_scan_cols + col_end);
  }
}

std::vector<std::uint64_t> region_frame_indices(const PlanGeometry& g) {
  std::vector<std::uint64_t> frames;
  frames.reserve(region_frame_count(g));
  for_each_region_row(g, [&](std::uint64_t first, std::uint64_t end) {
    for (std::uint64_t frame = first; frame < end; ++frame) frames.push_back(frame);
  });
  return frames;
}

std::vector<std::uint64_t> position_frame_indices(const PlanGeometry& g, std::uint64_t position) {
  std::vector<std::uint64_t> frames;
  for_each_position_row(g, position, [&](std::uint64_t first, std::uint64_t end) {
    for (std::uint64_t frame = first; frame < end; ++frame) frames.push_back(frame);
  });
  return frames;
}

}  // namespace quantem::plan
