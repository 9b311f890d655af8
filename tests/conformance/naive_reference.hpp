#pragma once
// The obviously-correct version of every Resident primitive: build the binned
// 4-D volume of a plan explicitly (crop, scan-bin and detector-bin sums with
// partial edges, uint64), then read products off it with plain loops.
// Slow, tiny inputs only; every backend's resident is compared to it bit for bit.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/plan/plan.hpp"

namespace quantem::test {

class NaiveReference {
 public:
  // masked_counts: the resident's content (masked pixels already zero), source shape.
  NaiveReference(const std::vector<std::uint64_t>& masked_counts, const plan::PlanGeometry& g) : g_(g) {
    binned_.assign(g.positions() * g.detector_pixels(), 0);
    const std::uint64_t source_pixels = g.source_detector_rows * g.source_detector_cols;
    for (std::uint64_t sr = g.region.row_start; sr < g.region.row_stop; ++sr) {
      for (std::uint64_t sc = g.region.col_start; sc < g.region.col_stop; ++sc) {
        const std::uint64_t position =
            ((sr - g.region.row_start) / g.scan_bin) * g.scan_cols + (sc - g.region.col_start) / g.scan_bin;
        const std::uint64_t frame = sr * g.source_scan_cols + sc;
        for (std::uint64_t r = 0; r < g.source_detector_rows; ++r) {
          for (std::uint64_t c = 0; c < g.source_detector_cols; ++c) {
            const std::uint64_t pixel = (r / g.detector_bin) * g.detector_cols + c / g.detector_bin;
            binned_[position * g.detector_pixels() + pixel] +=
                masked_counts[frame * source_pixels + r * g.source_detector_cols + c];
          }
        }
      }
    }
  }

  std::uint64_t at(std::uint64_t position, std::uint64_t pixel) const {
    return binned_[position * g_.detector_pixels() + pixel];
  }

  std::vector<std::uint64_t> pattern_sum() const {
    std::vector<std::uint64_t> out(g_.detector_pixels(), 0);
    for (std::uint64_t p = 0; p < g_.positions(); ++p)
      for (std::uint64_t q = 0; q < g_.detector_pixels(); ++q) out[q] += at(p, q);
    return out;
  }

  std::vector<std::uint64_t> masked_sum(const std::vector<std::uint8_t>& mask) const {
    std::vector<std::uint64_t> out(g_.positions(), 0);
    for (std::uint64_t p = 0; p < g_.positions(); ++p)
      for (std::uint64_t q = 0; q < g_.detector_pixels(); ++q)
        if (mask[q] != 0) out[p] += at(p, q);
    return out;
  }

  backend::CenterOfMassSums center_of_mass_sums() const {
    backend::CenterOfMassSums sums;
    sums.total.assign(g_.positions(), 0);
    sums.row_moment.assign(g_.positions(), 0);
    sums.col_moment.assign(g_.positions(), 0);
    for (std::uint64_t p = 0; p < g_.positions(); ++p) {
      for (std::uint64_t r = 0; r < g_.detector_rows; ++r) {
        for (std::uint64_t c = 0; c < g_.detector_cols; ++c) {
          const std::uint64_t v = at(p, r * g_.detector_cols + c);
          sums.total[p] += v;
          sums.row_moment[p] += r * v;
          sums.col_moment[p] += c * v;
        }
      }
    }
    return sums;
  }

  std::vector<std::uint64_t> frame(std::uint64_t row, std::uint64_t col) const {
    const std::uint64_t p = row * g_.scan_cols + col;
    return {binned_.begin() + static_cast<std::ptrdiff_t>(p * g_.detector_pixels()),
            binned_.begin() + static_cast<std::ptrdiff_t>((p + 1) * g_.detector_pixels())};
  }

  std::vector<std::uint64_t> region_reduce(const std::vector<std::uint64_t>& positions,
                                           backend::RegionReduce reduce) const {
    std::vector<std::uint64_t> out(g_.detector_pixels(), 0);
    for (const std::uint64_t p : positions)
      for (std::uint64_t q = 0; q < g_.detector_pixels(); ++q)
        out[q] = reduce == backend::RegionReduce::sum ? out[q] + at(p, q) : std::max(out[q], at(p, q));
    return out;
  }

 private:
  plan::PlanGeometry g_;
  std::vector<std::uint64_t> binned_;
};

}  // namespace quantem::test
