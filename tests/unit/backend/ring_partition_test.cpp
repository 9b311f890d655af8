// The ring partition and the mask split behind the CUDA resident's ring sums:
// every pixel in exactly one ring, whole rings plus residual pixels give back
// the mask exactly, and a disk centred near the ring centre leaves only a
// thin band to decode.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "quantem/backend/ring_partition.hpp"

namespace quantem::backend {
namespace {

std::vector<std::uint8_t> disk(std::uint32_t rows, std::uint32_t cols, double row, double col, double radius) {
  std::vector<std::uint8_t> mask(std::size_t{rows} * cols, 0);
  for (std::uint32_t r = 0; r < rows; ++r)
    for (std::uint32_t c = 0; c < cols; ++c)
      mask[std::size_t{r} * cols + c] = std::hypot(r - row, c - col) <= radius ? 1 : 0;
  return mask;
}

TEST(RingPartition, EveryPixelIsInExactlyOneNonEmptyRing) {
  for (const DetectorPoint centre : {DetectorPoint{47.5, 47.5}, DetectorPoint{10.2, 80.7}, DetectorPoint{0, 0},
                                     DetectorPoint{-5, 500}}) {
    const RingPartition partition = make_ring_partition(96, 90, centre);
    ASSERT_EQ(partition.ring_of_pixel.size(), 96u * 90u);
    ASSERT_EQ(partition.ring_starts.front(), 0u);
    ASSERT_EQ(partition.ring_starts.back(), 96u * 90u);
    EXPECT_LE(partition.ring_count(), max_ring_count(96, 90));
    std::vector<int> seen(partition.ring_of_pixel.size(), 0);
    for (std::uint32_t ring = 0; ring < partition.ring_count(); ++ring) {
      EXPECT_GT(partition.ring_pixels(ring), 0u) << "ring " << ring;
      for (std::uint32_t i = partition.ring_starts[ring]; i < partition.ring_starts[ring + 1]; ++i) {
        const std::uint32_t pixel = partition.pixels_by_ring[i];
        ++seen[pixel];
        EXPECT_EQ(partition.ring_of_pixel[pixel], ring);
        EXPECT_EQ(partition.ring_of_sorted[i], ring);
      }
    }
    for (const int count : seen) ASSERT_EQ(count, 1);
    // Rings grow outwards: a pixel's ring never decreases with its distance to the centre.
    for (std::size_t a = 0; a < seen.size(); a += 37) {
      for (std::size_t b = 0; b < seen.size(); b += 53) {
        const double da = std::hypot(a / 90 - partition.centre.row, a % 90 - partition.centre.col);
        const double db = std::hypot(b / 90 - partition.centre.row, b % 90 - partition.centre.col);
        if (da < db) {
          ASSERT_LE(partition.ring_of_pixel[a], partition.ring_of_pixel[b]);
        }
      }
    }
  }
}

TEST(RingPartition, WholeRingsPlusResidualGiveBackAnyMaskExactly) {
  const RingPartition partition = make_ring_partition(64, 72, {30.3, 33.8});
  std::mt19937 random(7);
  std::vector<std::vector<std::uint8_t>> masks = {
      disk(64, 72, 30.3, 33.8, 12.0), disk(64, 72, 35.0, 20.0, 9.5), disk(64, 72, 30.3, 33.8, 1e9),
      std::vector<std::uint8_t>(64 * 72, 0)};
  std::vector<std::uint8_t> noise(64 * 72);
  for (auto& m : noise) m = static_cast<std::uint8_t>(random() % 2);
  masks.push_back(noise);
  for (const auto& mask : masks) {
    const RingMaskSplit split = split_mask_by_rings(partition, mask);
    std::vector<std::uint8_t> rebuilt = split.residual_mask;
    for (const std::uint32_t ring : split.whole_rings) {
      for (std::uint32_t i = partition.ring_starts[ring]; i < partition.ring_starts[ring + 1]; ++i) {
        ASSERT_EQ(rebuilt[partition.pixels_by_ring[i]], 0) << "a whole ring's pixel is also residual";
        rebuilt[partition.pixels_by_ring[i]] = 1;
      }
    }
    EXPECT_EQ(rebuilt, mask);
    std::uint64_t residual = 0;
    for (const auto m : split.residual_mask) residual += m;
    EXPECT_EQ(residual, split.residual_pixels);
  }
  // The whole detector is every ring, with nothing left to decode.
  EXPECT_EQ(split_mask_by_rings(partition, masks[2]).whole_rings.size(), partition.ring_count());
  EXPECT_EQ(split_mask_by_rings(partition, masks[2]).residual_pixels, 0u);
}

TEST(RingPartition, ADiskOrAnnulusNearTheCentreLeavesOnlyABandToDecode) {
  const RingPartition partition = make_ring_partition(192, 192, {95.2, 97.9});
  const std::vector<std::uint8_t> inner = disk(192, 192, 96.0, 97.0, 20.0);
  const std::vector<std::uint8_t> outer = disk(192, 192, 96.0, 97.0, 60.0);
  std::vector<std::uint8_t> annulus(outer.size());
  std::uint64_t annulus_pixels = 0;
  for (std::size_t p = 0; p < annulus.size(); ++p) {
    annulus[p] = outer[p] != 0 && inner[p] == 0 ? 1 : 0;
    annulus_pixels += annulus[p];
  }
  const RingMaskSplit split = split_mask_by_rings(partition, annulus);
  EXPECT_FALSE(split.whole_rings.empty());
  // Edge bands about 2-3 pixels wide along both circles, far fewer than the annulus' pixels.
  EXPECT_LT(split.residual_pixels * 4, annulus_pixels) << split.residual_pixels << " of " << annulus_pixels;
}

TEST(RingPartition, BrightCentroidFindsTheBrightFieldDisk) {
  std::vector<std::uint64_t> pattern(128 * 100, 3);
  for (std::uint32_t r = 0; r < 128; ++r)
    for (std::uint32_t c = 0; c < 100; ++c)
      if (std::hypot(r - 70.0, c - 41.0) <= 15.0) pattern[std::size_t{r} * 100 + c] = 900;
  const DetectorPoint centre = bright_centroid(pattern, 128, 100);
  EXPECT_NEAR(centre.row, 70.0, 0.05);
  EXPECT_NEAR(centre.col, 41.0, 0.05);
  const DetectorPoint dark = bright_centroid(std::vector<std::uint64_t>(128 * 100, 0), 128, 100);
  EXPECT_DOUBLE_EQ(dark.row, 63.5);
  EXPECT_DOUBLE_EQ(dark.col, 49.5);
}

TEST(RingPartition, FrameRingSumsAddUpToTheFrame) {
  const RingPartition partition = make_ring_partition(40, 50, {12.0, 31.0});
  std::vector<std::uint16_t> frame(40 * 50);
  std::mt19937 random(3);
  std::uint64_t total = 0;
  for (auto& v : frame) total += v = static_cast<std::uint16_t>(random() % 65536);
  const std::vector<std::uint64_t> sums = frame_ring_sums(partition, frame.data());
  std::uint64_t added = 0;
  for (const auto s : sums) added += s;
  EXPECT_EQ(added, total);
  EXPECT_THROW(split_mask_by_rings(partition, std::vector<std::uint8_t>(7, 1)), std::exception);
}

}  // namespace
}  // namespace quantem::backend
