#include "quantem/products/products.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "icom.hpp"
#include "quantem/core/error.hpp"

namespace quantem::products {
namespace {

// Per-plan CoM maps in binned detector coordinates (docs/protocol.md, '4. Tightened rules', CoM).
struct CenterOfMassMaps {
  std::vector<float> row;  // CoMy
  std::vector<float> col;  // CoMx
};
struct IntegratedCenterOfMass {
  std::vector<float> values;
};

std::string cache_key(const char* what, const plan::PlanGeometry& geometry) {
  return std::string(what) + ' ' + plan::to_string(geometry);
}

BrightFieldGeometry cached_bright_field(backend::Resident& resident, const plan::PlanGeometry& geometry) {
  return *resident.derived_cache().get_or_compute<BrightFieldGeometry>(cache_key("bright-field", geometry), [&] {
    return fit_bright_field(resident.pattern_sum(geometry), geometry.positions(), geometry.detector_rows,
                            geometry.detector_cols);
  });
}

std::shared_ptr<const CenterOfMassMaps> cached_center_of_mass(backend::Resident& resident,
                                                              const plan::PlanGeometry& geometry) {
  return resident.derived_cache().get_or_compute<CenterOfMassMaps>(cache_key("center-of-mass", geometry), [&] {
    const backend::CenterOfMassSums sums = resident.center_of_mass_sums(geometry);
    CenterOfMassMaps maps;
    const std::size_t positions = sums.total.size();
    maps.row.resize(positions);
    maps.col.resize(positions);
    for (std::size_t p = 0; p < positions; ++p) {
      if (sums.total[p] == 0) {
        maps.row[p] = 0.0f;
        maps.col[p] = 0.0f;
        continue;
      }
      const double total = static_cast<double>(sums.total[p]);
      maps.row[p] = static_cast<float>(static_cast<double>(sums.row_moment[p]) / total);
      maps.col[p] = static_cast<float>(static_cast<double>(sums.col_moment[p]) / total);
    }
    return maps;
  });
}

Image count_image(std::uint64_t height, std::uint64_t width, std::vector<std::uint64_t> counts) {
  Image image;
  image.height = height;
  image.width = width;
  image.counts = std::move(counts);
  return image;
}

Image narrow_count_image(std::uint64_t height, std::uint64_t width, std::vector<std::uint32_t> counts) {
  Image image = count_image(height, width, {});
  image.narrow_counts = std::move(counts);
  return image;
}

// A masked-sum image: narrowed to the wire's uint32 where the sums are when
// every value fits; otherwise the exact uint64 sums (the wire encoder then
// reports the overflow, never a wrapped value).
Image masked_sum_image(backend::Resident& resident, const plan::PlanGeometry& geometry,
                       const std::vector<std::uint8_t>& mask) {
  if (auto narrow = resident.masked_sum_u32(geometry, mask)) {
    return narrow_count_image(geometry.scan_rows, geometry.scan_cols, std::move(*narrow));
  }
  return count_image(geometry.scan_rows, geometry.scan_cols, resident.masked_sum(geometry, mask));
}

Image float_image(std::uint64_t height, std::uint64_t width, std::vector<float> values) {
  Image image;
  image.height = height;
  image.width = width;
  image.is_float = true;
  image.values = std::move(values);
  return image;
}

// Detector pixels (binned grid, integer centres) selected by `keep(d², dr, dc)`,
// with d² = (r − cy)² + (c − cx)² in float64 exactly as the reference computes it.
template <class Keep>
std::vector<std::uint8_t> detector_mask(const plan::PlanGeometry& geometry, double center_row, double center_col,
                                        Keep keep) {
  std::vector<std::uint8_t> mask(geometry.detector_pixels());
  for (std::uint64_t r = 0; r < geometry.detector_rows; ++r) {
    const double dr = static_cast<double>(r) - center_row;
    for (std::uint64_t c = 0; c < geometry.detector_cols; ++c) {
      const double dc = static_cast<double>(c) - center_col;
      const double distance_squared = dr * dr + dc * dc;
      mask[r * geometry.detector_cols + c] = keep(distance_squared, dr, dc) ? 1 : 0;
    }
  }
  return mask;
}

// Python's max(a, b): a unless b > a (so a NaN b keeps a).
double python_max(double a, double b) { return b > a ? b : a; }

}  // namespace

BrightFieldGeometry fit_bright_field(const std::vector<std::uint64_t>& pattern_sum, std::uint64_t positions,
                                     std::uint64_t detector_rows, std::uint64_t detector_cols) {
  const std::uint64_t pixels = detector_rows * detector_cols;
  if (pattern_sum.size() != pixels || pixels == 0) {
    throw internal_error("bright-field fit: the pattern has " + std::to_string(pattern_sum.size()) +
                         " values for a " + std::to_string(detector_rows) + " x " + std::to_string(detector_cols) +
                         " detector");
  }
  BrightFieldGeometry fallback;
  fallback.center_row = static_cast<double>(detector_rows) / 2.0;
  fallback.center_col = static_cast<double>(detector_cols) / 2.0;
  fallback.radius = static_cast<double>(std::min(detector_rows, detector_cols)) / 4.0;
  if (positions == 0) return fallback;

  // The mean pattern in float64 from the exact uint64 sums.
  std::vector<double> mean_pattern(pixels);
  const double divisor = static_cast<double>(positions);
  double sum = 0.0;
  for (std::uint64_t p = 0; p < pixels; ++p) {
    mean_pattern[p] = static_cast<double>(pattern_sum[p]) / divisor;
    sum += mean_pattern[p];
  }
  const double mean = sum / static_cast<double>(pixels);
  double squares = 0.0;
  for (const double value : mean_pattern) squares += (value - mean) * (value - mean);
  const double threshold = mean + std::sqrt(squares / static_cast<double>(pixels));  // population std

  std::uint64_t count = 0;
  std::uint64_t row_sum = 0;
  std::uint64_t col_sum = 0;
  for (std::uint64_t r = 0; r < detector_rows; ++r) {
    for (std::uint64_t c = 0; c < detector_cols; ++c) {
      if (mean_pattern[r * detector_cols + c] > threshold) {
        ++count;
        row_sum += r;
        col_sum += c;
      }
    }
  }
  if (count == 0) return fallback;
  BrightFieldGeometry fit;
  fit.center_row = static_cast<double>(row_sum) / static_cast<double>(count);
  fit.center_col = static_cast<double>(col_sum) / static_cast<double>(count);
  fit.radius = std::sqrt(static_cast<double>(count) / M_PI);
  return fit;
}

std::optional<RealspaceMode> realspace_mode_from_name(const std::string& name) {
  static const std::pair<const char*, RealspaceMode> kModes[] = {
      {"BF", RealspaceMode::BF},         {"ABF", RealspaceMode::ABF},       {"ADF", RealspaceMode::ADF},
      {"HAADF", RealspaceMode::HAADF},   {"DF", RealspaceMode::DF},         {"CoMx", RealspaceMode::CoMx},
      {"CoMy", RealspaceMode::CoMy},     {"CoMmag", RealspaceMode::CoMmag}, {"DPC", RealspaceMode::DPC},
      {"iCoM", RealspaceMode::iCoM},
  };
  for (const auto& [mode_name, mode] : kModes) {
    if (name == mode_name) return mode;
  }
  return std::nullopt;
}

std::vector<std::uint64_t> scan_roi_positions(const RegionRequest& request, std::uint64_t scan_rows,
                                              std::uint64_t scan_cols) {
  const double radius = request.radius;
  if (!std::isfinite(radius) || radius <= 0.0) throw bad_request("scan ROI radius must be greater than zero");
  if (!std::isfinite(request.center_row) || !std::isfinite(request.center_col)) {
    throw bad_request("scan ROI center must be finite");
  }
  const auto candidates = [radius](double center, std::uint64_t size, std::uint64_t& first, std::uint64_t& last) {
    const double low = std::max(0.0, std::ceil(center - radius));
    const double high = std::min(static_cast<double>(size) - 1.0, std::floor(center + radius));
    if (size == 0 || low > high) return false;
    first = static_cast<std::uint64_t>(low);
    last = static_cast<std::uint64_t>(high);
    return true;
  };
  std::uint64_t row_first = 0, row_last = 0, col_first = 0, col_last = 0;
  std::vector<std::uint64_t> positions;
  if (candidates(request.center_row, scan_rows, row_first, row_last) &&
      candidates(request.center_col, scan_cols, col_first, col_last)) {
    for (std::uint64_t row = row_first; row <= row_last; ++row) {
      const double dr = static_cast<double>(row) - request.center_row;
      for (std::uint64_t col = col_first; col <= col_last; ++col) {
        const double dc = static_cast<double>(col) - request.center_col;
        if (request.shape == ScanRoiShape::square || dr * dr + dc * dc <= radius * radius) {
          positions.push_back(row * scan_cols + col);
        }
      }
    }
  }
  if (positions.empty()) throw bad_request("scan ROI does not include any scan positions");
  return positions;
}

namespace {

bool center_of_mass_family(RealspaceMode mode) {
  switch (mode) {
    case RealspaceMode::CoMx:
    case RealspaceMode::CoMy:
    case RealspaceMode::CoMmag:
    case RealspaceMode::DPC:
    case RealspaceMode::iCoM:
      return true;
    case RealspaceMode::BF:
    case RealspaceMode::ABF:
    case RealspaceMode::ADF:
    case RealspaceMode::HAADF:
    case RealspaceMode::DF:
      break;
  }
  return false;
}

// A CoM-family image (CoMx, CoMy, CoMmag, DPC, iCoM) from the plan's CoM maps.
Image center_of_mass_image(backend::Resident& resident, const plan::PlanGeometry& geometry,
                           const CenterOfMassMaps& maps, RealspaceMode mode) {
  if (mode == RealspaceMode::CoMx) return float_image(geometry.scan_rows, geometry.scan_cols, maps.col);
  if (mode == RealspaceMode::CoMy) return float_image(geometry.scan_rows, geometry.scan_cols, maps.row);
  if (mode == RealspaceMode::iCoM) {
    const auto integrated = resident.derived_cache().get_or_compute<IntegratedCenterOfMass>(
        cache_key("integrated-center-of-mass", geometry), [&] {
          return IntegratedCenterOfMass{
              integrate_center_of_mass(maps.row, maps.col, geometry.scan_rows, geometry.scan_cols)};
        });
    return float_image(geometry.scan_rows, geometry.scan_cols, integrated->values);
  }
  std::vector<float> magnitude(maps.row.size());
  for (std::size_t p = 0; p < magnitude.size(); ++p) magnitude[p] = std::hypot(maps.row[p], maps.col[p]);
  return float_image(geometry.scan_rows, geometry.scan_cols, std::move(magnitude));
}

// The detector mask of a BF / ABF / ADF / HAADF / DF request around the
// fitted disk (docs/protocol.md, '4. Tightened rules', Bright-field fit), and
// the geometry it used.
std::vector<std::uint8_t> annular_mode_mask(const plan::PlanGeometry& geometry, const BrightFieldGeometry& bright_field,
                                            const RealspaceRequest& request, UsedGeometry& used) {
  const double inner_px = python_max(0.0, request.inner * bright_field.radius);
  const double outer_px = python_max(inner_px + 1.0, request.outer * bright_field.radius);
  const double center_row = request.center_row.value_or(bright_field.center_row);
  const double center_col = request.center_col.value_or(bright_field.center_col);
  const double inner_squared = inner_px * inner_px;
  const double outer_squared = outer_px * outer_px;
  const bool disk = request.mode == RealspaceMode::BF;
  used.center_row = center_row;
  used.center_col = center_col;
  if (!disk) used.inner_radius_px = inner_px;
  used.outer_radius_px = outer_px;
  used.bright_field = bright_field;
  return detector_mask(geometry, center_row, center_col, [&](double d2, double, double) {
    return disk ? d2 <= outer_squared : (d2 >= inner_squared && d2 <= outer_squared);
  });
}

}  // namespace

Image realspace(backend::Resident& resident, const plan::PlanGeometry& geometry, const RealspaceRequest& request,
                UsedGeometry& used) {
  used = UsedGeometry{};
  if (center_of_mass_family(request.mode)) {
    return center_of_mass_image(resident, geometry, *cached_center_of_mass(resident, geometry), request.mode);
  }
  const BrightFieldGeometry bright_field = cached_bright_field(resident, geometry);
  return masked_sum_image(resident, geometry, annular_mode_mask(geometry, bright_field, request, used));
}

std::vector<Image> realspace_together(backend::Resident& resident, const plan::PlanGeometry& geometry,
                                      const std::vector<RealspaceRequest>& requests, std::vector<UsedGeometry>& used) {
  used.assign(requests.size(), UsedGeometry{});
  std::vector<Image> images(requests.size());
  std::vector<std::size_t> masked;  // requests answered by a masked sum, in order
  std::vector<std::vector<std::uint8_t>> masks;
  std::shared_ptr<const CenterOfMassMaps> maps;                // once, for every CoM-family request
  std::optional<BrightFieldGeometry> bright_field;             // once, for every masked request
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (center_of_mass_family(requests[i].mode)) {
      if (!maps) maps = cached_center_of_mass(resident, geometry);
      images[i] = center_of_mass_image(resident, geometry, *maps, requests[i].mode);
      continue;
    }
    if (!bright_field) bright_field = cached_bright_field(resident, geometry);
    masks.push_back(annular_mode_mask(geometry, *bright_field, requests[i], used[i]));
    masked.push_back(i);
  }
  if (masks.empty()) return images;
  auto sums = resident.masked_sums_u32(geometry, masks);
  for (std::size_t k = 0; k < masked.size(); ++k) {
    // As masked_sum_image: the exact uint64 sums when one does not fit (the
    // wire encoder then reports the overflow).
    const std::uint64_t rows = geometry.scan_rows, cols = geometry.scan_cols;
    images[masked[k]] = sums[k] ? narrow_count_image(rows, cols, std::move(*sums[k]))
                                : count_image(rows, cols, resident.masked_sum(geometry, masks[k]));
  }
  return images;
}

Image realspace_shape(backend::Resident& resident, const plan::PlanGeometry& geometry, const ShapeRequest& request,
                      UsedGeometry& used) {
  used = UsedGeometry{};
  const double inner_squared = request.inner * request.inner;
  const double outer_squared = request.outer * request.outer;
  const double outer = request.outer;
  std::vector<std::uint8_t> mask;
  switch (request.shape) {
    case DetectorShape::circle:
      mask = detector_mask(geometry, request.center_row, request.center_col,
                           [&](double d2, double, double) { return d2 <= outer_squared; });
      break;
    case DetectorShape::annulus:
      mask = detector_mask(geometry, request.center_row, request.center_col,
                           [&](double d2, double, double) { return d2 >= inner_squared && d2 <= outer_squared; });
      used.inner_radius_px = request.inner;
      break;
    case DetectorShape::square:
      mask = detector_mask(geometry, request.center_row, request.center_col, [&](double, double dr, double dc) {
        return std::fabs(dr) <= outer && std::fabs(dc) <= outer;
      });
      break;
  }
  used.center_row = request.center_row;
  used.center_col = request.center_col;
  used.outer_radius_px = request.outer;
  return masked_sum_image(resident, geometry, mask);
}

Image selected_diffraction(backend::Resident& resident, const plan::PlanGeometry& geometry, std::int64_t scan_row,
                           std::int64_t scan_col) {
  const auto clamp = [](std::int64_t index, std::uint64_t size) -> std::uint64_t {
    if (index <= 0 || size == 0) return 0;
    return std::min(static_cast<std::uint64_t>(index), size - 1);
  };
  const std::uint64_t row = clamp(scan_row, geometry.scan_rows);
  const std::uint64_t col = clamp(scan_col, geometry.scan_cols);
  // Narrowed to the wire's uint32 where the values are when every one fits
  // (sent without a copy); otherwise the exact uint64 values (the wire encoder
  // then reports the overflow).
  if (auto narrow = resident.frame_u32(geometry, row, col)) {
    return narrow_count_image(geometry.detector_rows, geometry.detector_cols, std::move(*narrow));
  }
  return count_image(geometry.detector_rows, geometry.detector_cols, resident.frame(geometry, row, col));
}

Image region_diffraction(backend::Resident& resident, const plan::PlanGeometry& geometry,
                         const RegionRequest& request) {
  const std::vector<std::uint64_t> positions = scan_roi_positions(request, geometry.scan_rows, geometry.scan_cols);
  const backend::RegionReduce reduce =
      request.reduce == RegionRequest::Reduce::max ? backend::RegionReduce::max : backend::RegionReduce::sum;
  // Narrowed where the values are when every one fits (sent without a copy),
  // as a frame is; otherwise the exact uint64 values (the overflow error).
  auto narrow = resident.region_reduce_u32(geometry, positions, reduce);
  Image image = narrow ? narrow_count_image(geometry.detector_rows, geometry.detector_cols, std::move(*narrow))
                       : count_image(geometry.detector_rows, geometry.detector_cols,
                                     resident.region_reduce(geometry, positions, reduce));
  if (request.reduce == RegionRequest::Reduce::mean) image.value_divisor = positions.size();
  return image;
}

}  // namespace quantem::products
