#include "quantem/backend/ring_partition.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "quantem/core/error.hpp"

namespace quantem::backend {

RingPartition make_ring_partition(std::uint32_t rows, std::uint32_t cols, DetectorPoint centre) {
  if (rows == 0 || cols == 0) throw bad_request("a ring partition needs a non-empty detector");
  RingPartition partition;
  partition.rows = rows;
  partition.cols = cols;
  partition.centre.row = std::clamp(centre.row, 0.0, static_cast<double>(rows - 1));
  partition.centre.col = std::clamp(centre.col, 0.0, static_cast<double>(cols - 1));
  const std::uint64_t pixels = std::uint64_t{rows} * cols;
  partition.ring_of_pixel.resize(pixels);
  std::uint32_t largest = 0;
  for (std::uint32_t r = 0; r < rows; ++r) {
    for (std::uint32_t c = 0; c < cols; ++c) {
      const double dr = r - partition.centre.row;
      const double dc = c - partition.centre.col;
      const auto ring = static_cast<std::uint32_t>(std::floor(std::sqrt(dr * dr + dc * dc)));
      partition.ring_of_pixel[std::uint64_t{r} * cols + c] = static_cast<std::uint16_t>(ring);
      largest = std::max(largest, ring);
    }
  }
  // Renumber so that every ring holds a pixel (a centre between pixels can leave ring 0 empty).
  std::vector<std::uint32_t> counts(std::uint64_t{largest} + 1, 0);
  for (const std::uint16_t ring : partition.ring_of_pixel) ++counts[ring];
  std::vector<std::uint32_t> renumber(counts.size(), 0);
  std::uint32_t next = 0;
  for (std::size_t ring = 0; ring < counts.size(); ++ring) {
    renumber[ring] = next;
    if (counts[ring] != 0) ++next;
  }
  for (std::uint16_t& ring : partition.ring_of_pixel) ring = static_cast<std::uint16_t>(renumber[ring]);

  partition.pixels_by_ring.resize(pixels);
  std::iota(partition.pixels_by_ring.begin(), partition.pixels_by_ring.end(), 0u);
  std::stable_sort(partition.pixels_by_ring.begin(), partition.pixels_by_ring.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return partition.ring_of_pixel[a] < partition.ring_of_pixel[b]; });
  partition.ring_of_sorted.resize(pixels);
  partition.ring_starts.assign(std::uint64_t{next} + 1, 0);
  for (std::uint64_t i = 0; i < pixels; ++i) {
    const std::uint16_t ring = partition.ring_of_pixel[partition.pixels_by_ring[i]];
    partition.ring_of_sorted[i] = ring;
    ++partition.ring_starts[std::uint64_t{ring} + 1];
  }
  for (std::uint32_t ring = 0; ring < next; ++ring) partition.ring_starts[ring + 1] += partition.ring_starts[ring];
  return partition;
}

std::uint32_t max_ring_count(std::uint32_t rows, std::uint32_t cols) {
  const double diagonal = std::sqrt(static_cast<double>(rows - 1) * (rows - 1) + static_cast<double>(cols - 1) * (cols - 1));
  return static_cast<std::uint32_t>(std::floor(diagonal)) + 1;
}

DetectorPoint bright_centroid(const std::vector<std::uint64_t>& pattern, std::uint32_t rows, std::uint32_t cols) {
  if (pattern.size() != std::uint64_t{rows} * cols) throw bad_request("bright_centroid: pattern size mismatch");
  const std::uint64_t brightest = pattern.empty() ? 0 : *std::max_element(pattern.begin(), pattern.end());
  DetectorPoint centre{(rows - 1) / 2.0, (cols - 1) / 2.0};
  if (brightest == 0) return centre;
  const std::uint64_t threshold = (brightest + 1) / 2;
  double weight = 0.0;
  double row_sum = 0.0;
  double col_sum = 0.0;
  for (std::uint32_t r = 0; r < rows; ++r) {
    for (std::uint32_t c = 0; c < cols; ++c) {
      const std::uint64_t value = pattern[std::uint64_t{r} * cols + c];
      if (value < threshold) continue;
      weight += static_cast<double>(value);
      row_sum += static_cast<double>(value) * r;
      col_sum += static_cast<double>(value) * c;
    }
  }
  return {row_sum / weight, col_sum / weight};
}

namespace {

// Calls f(index) for every nonzero byte, skipping zero 8-byte words (a
// bright-field disk selects a tenth of the detector; this runs on every
// masked-sum request).
template <class F>
void for_each_nonzero_byte(const std::uint8_t* bytes, std::size_t count, F f) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    if (word == 0) continue;
    for (std::size_t k = 0; k < 8; ++k)
      if (bytes[i + k] != 0) f(i + k);
  }
  for (; i < count; ++i)
    if (bytes[i] != 0) f(i);
}

}  // namespace

RingMaskSplit split_mask_by_rings(const RingPartition& partition, const std::vector<std::uint8_t>& source_mask) {
  if (source_mask.size() != partition.ring_of_pixel.size()) {
    throw bad_request("split_mask_by_rings: the mask has " + std::to_string(source_mask.size()) +
                      " values for a detector of " + std::to_string(partition.ring_of_pixel.size()) + " pixels");
  }
  const std::uint16_t* ring_of_pixel = partition.ring_of_pixel.data();
  std::vector<std::uint32_t> selected(partition.ring_count(), 0);
  for_each_nonzero_byte(source_mask.data(), source_mask.size(), [&](std::size_t p) { ++selected[ring_of_pixel[p]]; });
  RingMaskSplit split;
  std::vector<std::uint8_t> whole(partition.ring_count(), 0);
  for (std::uint32_t ring = 0; ring < partition.ring_count(); ++ring) {
    if (selected[ring] != 0 && selected[ring] == partition.ring_pixels(ring)) {
      whole[ring] = 1;
      split.whole_rings.push_back(ring);
    }
  }
  split.residual_mask.assign(source_mask.size(), 0);
  std::uint8_t* residual = split.residual_mask.data();
  std::uint64_t residual_pixels = 0;
  for_each_nonzero_byte(source_mask.data(), source_mask.size(), [&](std::size_t p) {
    if (whole[ring_of_pixel[p]] == 0) {
      residual[p] = 1;
      ++residual_pixels;
    }
  });
  split.residual_pixels = residual_pixels;
  return split;
}

}  // namespace quantem::backend
