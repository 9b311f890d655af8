// The ring-sum kernels against their CPU reference (frame_ring_sums in
// include/quantem/backend/ring_partition.hpp): per-frame ring sums of dense
// u8/u16/u32 frames, 4- and 8-byte sums, written at an offset of the ring
// table, with the frames' moments in the same pass, and their per-frame
// addition for a list of rings; the per-frame moments table (Σ I, Σ row·I,
// Σ col·I) alone, against a host loop.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "quantem/backend/ring_partition.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/device.hpp"
#include "quantem/kernels/resident_products.hpp"

namespace quantem::kernels {
namespace {

constexpr std::uint64_t first_frame_offset() { return 123; }

// The moments table (rows Σ I, Σ row·I, Σ col·I of `stride` values, poisoned
// with 0x5a bytes first) holds every frame of `host` from first_frame on, and
// nothing just outside the batch.
template <class T>
void expect_frame_moments(const std::vector<T>& host, std::uint64_t pixels, std::uint32_t cols,
                          const std::vector<std::uint64_t>& table, std::uint64_t stride, std::uint64_t first_frame) {
  const std::uint64_t frames = host.size() / pixels;
  for (std::uint64_t f = 0; f < frames; ++f) {
    std::uint64_t total = 0, row_moment = 0, col_moment = 0;
    for (std::uint64_t p = 0; p < pixels; ++p) {
      const std::uint64_t value = host[f * pixels + p];
      total += value;
      row_moment += value * (p / cols);
      col_moment += value * (p % cols);
    }
    ASSERT_EQ(table[first_frame + f], total) << "frame " << f;
    ASSERT_EQ(table[stride + first_frame + f], row_moment) << "frame " << f;
    ASSERT_EQ(table[2 * stride + first_frame + f], col_moment) << "frame " << f;
  }
  EXPECT_EQ(table[first_frame - 1], 0x5a5a5a5a5a5a5a5aull);
  EXPECT_EQ(table[stride + first_frame + frames], 0x5a5a5a5a5a5a5a5aull);
}

template <class T>
void check_ring_sums(DType dtype, std::uint32_t sum_bytes, std::uint64_t largest, std::uint32_t rows = 37,
                     std::uint32_t cols = 45, std::uint64_t frames = 150) {
  const std::uint64_t pixels = std::uint64_t{rows} * cols;
  const std::uint64_t table_frames = first_frame_offset() + frames + 127, first_frame = first_frame_offset();
  const backend::RingPartition partition = backend::make_ring_partition(rows, cols, {rows * 0.4, cols * 0.65});
  std::mt19937_64 random(11 + sum_bytes);
  std::vector<T> host(frames * pixels);
  for (auto& v : host) v = static_cast<T>(random() % (largest + 1));
  for (std::uint64_t p = 0; p < pixels; p += 7) host[p] = static_cast<T>(largest);  // extremes

  DeviceBuffer d_frames(host.size() * sizeof(T));
  copy_to_device(d_frames.data(), host.data(), host.size() * sizeof(T));
  DeviceBuffer d_pixels(pixels * 4), d_rings_sorted(pixels * 2);
  copy_to_device(d_pixels.data(), partition.pixels_by_ring.data(), pixels * 4);
  copy_to_device(d_rings_sorted.data(), partition.ring_of_sorted.data(), pixels * 2);
  const std::uint64_t table_bytes = std::uint64_t{partition.ring_count()} * table_frames * sum_bytes;
  DeviceBuffer d_table(table_bytes);
  DeviceBuffer d_ring_of_pixel(pixels * 2);
  copy_to_device(d_ring_of_pixel.data(), partition.ring_of_pixel.data(), pixels * 2);
  std::vector<std::uint8_t> table(table_bytes);
  // Both passes: in row order with every pixel's ring (used where the frames
  // allow it), and gathering the pixels by ring (without that table).
  for (const bool row_order : {true, false}) {
    SCOPED_TRACE(row_order ? "row-order pass" : "gathering pass");
    std::vector<std::uint8_t> poison(table_bytes, 0xab);
    copy_to_device(d_table.data(), poison.data(), table_bytes);
    // The frames' moments in the same pass, into a poisoned table.
    std::vector<std::uint64_t> moments(3 * table_frames, 0x5a5a5a5a5a5a5a5aull);
    DeviceBuffer d_moments(moments.size() * 8);
    copy_to_device(d_moments.data(), moments.data(), moments.size() * 8);
    dense_ring_sums(d_frames.data(), dtype, frames, static_cast<std::uint32_t>(pixels),
                    static_cast<const std::uint32_t*>(d_pixels.data()),
                    static_cast<const std::uint16_t*>(d_rings_sorted.data()),
                    row_order ? static_cast<const std::uint16_t*>(d_ring_of_pixel.data()) : nullptr,
                    partition.ring_count(), d_table.data(), sum_bytes, table_frames, first_frame, nullptr,
                    FrameMomentsTarget{static_cast<std::uint64_t*>(d_moments.data()), cols, table_frames});
    copy_to_host(moments.data(), d_moments.data(), moments.size() * 8);
    expect_frame_moments(host, pixels, cols, moments, table_frames, first_frame);
    copy_to_host(table.data(), d_table.data(), table_bytes);
    const auto at = [&](std::uint64_t ring, std::uint64_t frame) -> std::uint64_t {
      const std::uint64_t index = ring * table_frames + frame;
      if (sum_bytes == 4) return reinterpret_cast<const std::uint32_t*>(table.data())[index];
      return reinterpret_cast<const std::uint64_t*>(table.data())[index];
    };
    for (std::uint64_t f = 0; f < frames; ++f) {
      const std::vector<std::uint64_t> expected = backend::frame_ring_sums(partition, host.data() + f * pixels);
      for (std::uint32_t r = 0; r < partition.ring_count(); ++r) {
        ASSERT_EQ(at(r, first_frame + f), expected[r]) << "frame " << f << " ring " << r;
      }
    }
  }
  // Outside [first_frame, first_frame + frames) nothing was written.
  EXPECT_EQ(reinterpret_cast<const std::uint32_t*>(table.data())[0], 0xababababu);

  // add_ring_sums: every third ring, added to non-zero sums.
  std::vector<std::uint32_t> rings;
  for (std::uint32_t r = 0; r < partition.ring_count(); r += 3) rings.push_back(r);
  DeviceBuffer d_list(rings.size() * 4), d_sums(frames * 8);
  copy_to_device(d_list.data(), rings.data(), rings.size() * 4);
  std::vector<std::uint64_t> sums(frames);
  for (std::uint64_t f = 0; f < frames; ++f) sums[f] = f * 1000003;
  copy_to_device(d_sums.data(), sums.data(), frames * 8);
  add_ring_sums(d_table.data(), sum_bytes, table_frames, static_cast<const std::uint32_t*>(d_list.data()),
                static_cast<std::uint32_t>(rings.size()), first_frame, frames, static_cast<std::uint64_t*>(d_sums.data()),
                nullptr);
  std::vector<std::uint64_t> got(frames);
  copy_to_host(got.data(), d_sums.data(), frames * 8);
  for (std::uint64_t f = 0; f < frames; ++f) {
    const std::vector<std::uint64_t> expected = backend::frame_ring_sums(partition, host.data() + f * pixels);
    std::uint64_t want = f * 1000003;
    for (const std::uint32_t r : rings) want += expected[r];
    ASSERT_EQ(got[f], want) << "frame " << f;
  }
}

// A moments target that cannot hold the batch is refused before anything
// runs (no device needed): a zero or non-dividing column count, a table too short.
TEST(RingSumsGpu, ABadMomentsTargetIsABadRequest) {
  std::uint32_t pixels_by_ring[1] = {0};
  std::uint16_t ring_of_sorted[1] = {0};
  std::uint64_t moments[3] = {0, 0, 0};
  std::uint32_t sums[1] = {0};
  std::uint16_t frame[12] = {};
  const auto call = [&](FrameMomentsTarget target) {
    dense_ring_sums(frame, DType::uint16, 1, 12, pixels_by_ring, ring_of_sorted, nullptr, 1, sums, 4, 1, 0, nullptr,
                    target);
  };
  for (const FrameMomentsTarget& target : {FrameMomentsTarget{moments, 0, 1}, FrameMomentsTarget{moments, 5, 1},
                                           FrameMomentsTarget{moments, 4, 0}}) {
    try {
      call(target);
      ADD_FAILURE() << "accepted cols " << target.detector_cols << " stride " << target.table_stride;
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::bad_request);
      EXPECT_NE(std::string(error.what()).find("frame moments target"), std::string::npos) << error.what();
    }
  }
}

// Ring tables the 16-byte index loads cannot read aligned are refused before
// anything runs (no device needed).
TEST(RingSumsGpu, MisalignedRingTablesAreABadRequest) {
  alignas(16) std::uint32_t pixels_by_ring[8] = {};
  alignas(16) std::uint16_t ring_of_sorted[8] = {};
  std::uint32_t sums[1] = {0};
  std::uint16_t frame[4] = {};
  const auto kind_of = [&](const std::uint32_t* pixels, const std::uint16_t* rings) {
    try {
      dense_ring_sums(frame, DType::uint16, 1, 4, pixels, rings, nullptr, 1, sums, 4, 1, 0, nullptr);
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("aligned"), std::string::npos) << error.what();
      return error.kind();
    }
    return ErrorKind::internal;  // "did not throw"
  };
  EXPECT_EQ(kind_of(pixels_by_ring + 1, ring_of_sorted), ErrorKind::bad_request);
  EXPECT_EQ(kind_of(pixels_by_ring, ring_of_sorted + 1), ErrorKind::bad_request);
}

TEST(RingSumsGpu, MatchTheCpuReferenceForEveryDtypeAndWidth) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  check_ring_sums<std::uint8_t>(DType::uint8, 4, 0xff);
  check_ring_sums<std::uint16_t>(DType::uint16, 4, 0xffff);
  check_ring_sums<std::uint32_t>(DType::uint32, 8, 0xffffffffu);
  // Frames too large to stage in shared memory (210 x 210 x 4 bytes) take the global-memory path.
  check_ring_sums<std::uint32_t>(DType::uint32, 8, 0xffffffffu, 210, 210, 6);
  check_ring_sums<std::uint16_t>(DType::uint16, 4, 0xffff, 300, 290, 5);
  // Columns a multiple of a 16-byte load's values: the moments 16 bytes at a time.
  check_ring_sums<std::uint8_t>(DType::uint8, 4, 0xff, 24, 48, 40);
  check_ring_sums<std::uint16_t>(DType::uint16, 4, 0xffff, 64, 40, 30);
  check_ring_sums<std::uint16_t>(DType::uint16, 4, 0xffff, 192, 192, 6);  // the realistic detector
  check_ring_sums<std::uint32_t>(DType::uint32, 8, 0xffffffffu, 33, 36, 20);
  check_ring_sums<std::uint32_t>(DType::uint32, 8, 0xffffffffu, 256, 256, 3);  // not staged
}

template <class T>
void check_frame_moments(DType dtype, std::uint64_t largest, std::uint32_t rows, std::uint32_t cols,
                         std::uint64_t frames) {
  const std::uint64_t pixels = std::uint64_t{rows} * cols;
  const std::uint64_t first_frame = 17, stride = first_frame + frames + 9;
  std::mt19937_64 random(rows * 131 + cols);
  std::vector<T> host(frames * pixels);
  for (auto& v : host) v = static_cast<T>(random() % (largest + 1));
  for (std::uint64_t p = 0; p < host.size(); p += 5) host[p] = static_cast<T>(largest);  // extremes
  DeviceBuffer d_frames(host.size() * sizeof(T)), d_table(3 * stride * 8);
  copy_to_device(d_frames.data(), host.data(), host.size() * sizeof(T));
  std::vector<std::uint64_t> table(3 * stride, 0x5a5a5a5a5a5a5a5aull);
  copy_to_device(d_table.data(), table.data(), table.size() * 8);
  dense_frame_moments(d_frames.data(), dtype, frames, rows, cols, static_cast<std::uint64_t*>(d_table.data()), stride,
                      first_frame, nullptr);
  copy_to_host(table.data(), d_table.data(), table.size() * 8);
  expect_frame_moments(host, pixels, cols, table, stride, first_frame);
}

TEST(RingSumsGpu, FrameMomentsMatchTheHostForEveryDtypeAndShape) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  check_frame_moments<std::uint8_t>(DType::uint8, 0xff, 37, 45, 40);
  check_frame_moments<std::uint8_t>(DType::uint8, 0xff, 20, 32, 10);  // 16 values per load
  check_frame_moments<std::uint16_t>(DType::uint16, 0xffff, 192, 192, 12);
  check_frame_moments<std::uint32_t>(DType::uint32, 0xffffffffu, 7, 300, 20);    // rows wider than a CTA
  check_frame_moments<std::uint32_t>(DType::uint32, 0xffffffffu, 300, 1, 20);    // one column
  check_frame_moments<std::uint16_t>(DType::uint16, 0xffff, 256, 256, 3);
}

}  // namespace
}  // namespace quantem::kernels
