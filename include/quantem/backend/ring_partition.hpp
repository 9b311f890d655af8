#pragma once
// Detector pixels partitioned into one-pixel-wide rings around a centre, for
// annular products whose cost does not grow with the aperture
// (docs/kernels.md, "Ring sums"). A resident that holds exact per-frame sums
// of every ring answers a masked sum as
//
//   Σ_mask I = Σ_{rings wholly inside the mask} ring_sum + Σ_{other masked pixels} I,
//
// which is exact for ANY mask and ANY centre: the centre only decides how many
// pixels are left to decode (a disk or annulus centred near the ring centre
// leaves a band about two pixels wide along each edge). CUDA-free: the CUDA
// resident builds its device tables from it.
#include <cstdint>
#include <vector>

namespace quantem::backend {

struct DetectorPoint {
  double row = 0.0;
  double col = 0.0;
};

struct RingPartition {
  std::uint32_t rows = 0;
  std::uint32_t cols = 0;
  DetectorPoint centre;
  std::vector<std::uint16_t> ring_of_pixel;     // per detector pixel (row-major): floor(distance to the centre)
  std::vector<std::uint32_t> pixels_by_ring;    // detector pixels sorted by (ring, pixel index)
  std::vector<std::uint16_t> ring_of_sorted;    // ring_of_pixel[pixels_by_ring[i]]
  std::vector<std::uint32_t> ring_starts;       // ring r is pixels_by_ring[ring_starts[r], ring_starts[r + 1])

  std::uint32_t ring_count() const { return static_cast<std::uint32_t>(ring_starts.size() - 1); }
  std::uint32_t ring_pixels(std::uint32_t ring) const { return ring_starts[ring + 1] - ring_starts[ring]; }
};

// Rings of a rows x cols detector around `centre` (clamped into the detector).
// Every ring 0..ring_count()-1 holds at least one pixel.
RingPartition make_ring_partition(std::uint32_t rows, std::uint32_t cols, DetectorPoint centre);

// At most this many rings for any centre inside a rows x cols detector (admission bound).
std::uint32_t max_ring_count(std::uint32_t rows, std::uint32_t cols);

// The centroid of the pixels at or above half the brightest value of a
// pattern (one value per detector pixel): the bright-field disk of a
// diffraction pattern. The detector centre when the pattern is all zero.
DetectorPoint bright_centroid(const std::vector<std::uint64_t>& pattern, std::uint32_t rows, std::uint32_t cols);

// A source-resolution 0/1 mask split into the rings it holds whole and the
// selected pixels of every other ring.
struct RingMaskSplit {
  std::vector<std::uint32_t> whole_rings;     // ascending
  std::vector<std::uint8_t> residual_mask;    // 0/1 per pixel: selected, and its ring is not whole
  std::uint64_t residual_pixels = 0;
};
RingMaskSplit split_mask_by_rings(const RingPartition& partition, const std::vector<std::uint8_t>& source_mask);

// The CPU reference of the ring-sum kernel: Σ of one frame's values per ring.
template <class T>
std::vector<std::uint64_t> frame_ring_sums(const RingPartition& partition, const T* frame) {
  std::vector<std::uint64_t> sums(partition.ring_count(), 0);
  for (std::size_t p = 0; p < partition.ring_of_pixel.size(); ++p) sums[partition.ring_of_pixel[p]] += frame[p];
  return sums;
}

}  // namespace quantem::backend
