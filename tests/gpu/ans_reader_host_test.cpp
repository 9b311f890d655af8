// The GPU stream reader (kernels/codec/ans_stream_reader.cuh) compiled for the
// host and run over groups written by the CPU reference encoder: every value,
// the clean end of every stream, and malformed streams. Needs no GPU.
#include <gtest/gtest.h>

#include <cmath>

#include <functional>

#include <array>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../../kernels/codec/ans_stream_reader.cuh"
#include "../unit/ans/ans_test_data.hpp"
#include "quantem/ans/ans_codec.hpp"
#include "quantem/ans/ans_model.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/ans.hpp"
#include "quantem/kernels/resident_products.hpp"

namespace quantem {
namespace {

using ans_test::TestFrames;

// The tables build_decode_tables makes on the device, built here on the host.
// The neutral entry of absent positions follows the class tables, as on the device.
std::vector<std::uint32_t> decode_tables(const std::vector<std::uint8_t>& blob, const ans::AnsGroupHeader& header) {
  std::vector<std::uint32_t> table(kernels::device::ans_device::kNeutralTableOffset + 1, 0);
  table.back() = kernels::device::ans_device::kNeutralEntry;
  for (std::uint32_t c = 0; c < ans::kAnsClassCount; ++c) {
    std::uint32_t cdf = 0;
    for (std::uint32_t s = 0; s < ans::kAnsAlphabetSize; ++s) {
      std::uint16_t f;
      std::memcpy(&f, blob.data() + header.freq_table_offset + 2 * (c * ans::kAnsAlphabetSize + s), 2);
      for (std::uint32_t slot = cdf; slot < cdf + f; ++slot)
        table[c * ans::kAnsProbabilityScale + slot] = kernels::device::ans_device::make_decode_entry(s, f, slot - cdf);
      cdf += f;
    }
  }
  return table;
}

// Decodes every stream as decode_frames_kernel does; returns the values, frame-major.
std::vector<std::uint32_t> decode_with_reader(const std::vector<std::uint8_t>& blob, int& unclean_streams) {
  const ans::AnsGroupHeader header = ans::read_group_header(blob.data(), blob.size());
  const std::vector<std::uint32_t> table = decode_tables(blob, header);
  const std::uint32_t rows = header.detector_rows;
  const std::uint32_t cols = header.detector_cols;
  const ans::AnsGroupLayout layout = ans::ans_group_layout(rows, cols);
  std::vector<std::uint32_t> out(std::size_t{header.frame_count} * rows * cols, 0xdeadbeef);
  unclean_streams = 0;
  for (std::uint32_t stream = 0; stream < header.stream_count; ++stream) {
    kernels::device::ans_device::StreamReader reader;
    reader.open(blob.data() + header.stream_data_offset,
                reinterpret_cast<const std::uint32_t*>(blob.data() + header.stream_offsets_offset), stream,
                header.stream_count, header.stream_data_bytes);
    const std::uint32_t row = 2 * (stream / layout.quad_cols);
    const std::uint32_t col = 2 * (stream % layout.quad_cols);
    std::uint32_t class_offset[4];
    std::uint32_t shift[4];
    std::uint32_t pixel[4];
    std::uint32_t present = 0;
    bool raw_bits = false;
    for (std::uint32_t k = 0; k < 4; ++k) {
      const std::uint32_t r = row + k / 2;
      const std::uint32_t c = col + k % 2;
      const bool here = r < rows && c < cols;
      pixel[k] = r * cols + c;
      const std::uint32_t cls = here ? blob[header.class_map_offset + pixel[k]] : 0u;
      class_offset[k] = here ? cls * ans::kAnsProbabilityScale : kernels::device::ans_device::kNeutralTableOffset;
      shift[k] = here ? ans::class_shift(cls, header.class_scale) : 0u;
      raw_bits = raw_bits || shift[k] != 0;
      if (here) present |= 1u << k;
    }
    // Alternate the raw-bits promise where it is allowed: false only when no shift is set.
    raw_bits = raw_bits || stream % 2 == 0;
    for (std::uint32_t f = 0; f < header.frame_count; ++f) {
      reader.top_up();
      std::uint32_t values[4];
      reader.decode_frame(table.data(), class_offset, shift, raw_bits, values);
      for (std::uint32_t k = 0; k < 4; ++k)
        if ((present >> k) & 1u) out[std::size_t{f} * rows * cols + pixel[k]] = values[k];
    }
    if (!reader.finished_cleanly()) ++unclean_streams;
  }
  return out;
}

std::vector<std::uint8_t> encode(const TestFrames& frames) {
  ans::HostFrames view{frames.bytes.data(), frames.dtype, frames.frame_count, frames.rows, frames.cols};
  return ans::encode_group(view);
}

TEST(AnsStreamReaderHost, DecodesEveryValueAndEndsCleanly) {
  std::uint64_t seed = 40;
  for (DType dtype : {DType::uint8, DType::uint16, DType::uint32})
    for (const char* pattern : {"zero", "max", "uniform16", "uniform32", "hot_pixel", "sparse", "disc", "bright", "ramp"})
      for (auto [rows, cols] : {std::pair{20u, 22u}, std::pair{5u, 9u}}) {
        const TestFrames frames = ans_test::make_frames(pattern, dtype, 33, rows, cols, seed++);
        SCOPED_TRACE(frames.label);
        const auto blob = encode(frames);
        int unclean = 0;
        const std::vector<std::uint32_t> values = decode_with_reader(blob, unclean);
        EXPECT_EQ(unclean, 0);
        for (std::size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], ans_test::get(frames, i)) << "element " << i;
      }
}

// A reader moved with seek() to the states and word index another reader had
// before frame f decodes frames f.. exactly as that reader did and ends
// cleanly (what ans_record_seek_points stores and the kernels rely on).
TEST(AnsStreamReaderHost, SeekingToARecordedPointContinuesExactly) {
  std::uint64_t seed = 70;
  for (DType dtype : {DType::uint16, DType::uint32})
    for (const char* pattern : {"zero", "uniform16", "uniform32", "hot_pixel", "bright", "disc"}) {
      const TestFrames frames = ans_test::make_frames(pattern, dtype, 29, 9, 11, seed++);
      SCOPED_TRACE(frames.label);
      const auto blob = encode(frames);
      const ans::AnsGroupHeader header = ans::read_group_header(blob.data(), blob.size());
      const std::vector<std::uint32_t> table = decode_tables(blob, header);
      const ans::AnsGroupLayout layout = ans::ans_group_layout(frames.rows, frames.cols);
      const auto* offsets = reinterpret_cast<const std::uint32_t*>(blob.data() + header.stream_offsets_offset);
      for (std::uint32_t stream = 0; stream < header.stream_count; ++stream) {
        std::uint32_t class_offset[4], shift[4];
        for (std::uint32_t k = 0; k < 4; ++k) {
          const std::uint32_t r = 2 * (stream / layout.quad_cols) + k / 2;
          const std::uint32_t c = 2 * (stream % layout.quad_cols) + k % 2;
          const bool here = r < frames.rows && c < frames.cols;
          const std::uint32_t cls = here ? blob[header.class_map_offset + r * frames.cols + c] : 0u;
          class_offset[k] = here ? cls * ans::kAnsProbabilityScale : kernels::device::ans_device::kNeutralTableOffset;
          shift[k] = here ? ans::class_shift(cls, header.class_scale) : 0u;
        }
        auto open = [&](kernels::device::ans_device::StreamReader& reader) {
          reader.open(blob.data() + header.stream_data_offset, offsets, stream, header.stream_count,
                      header.stream_data_bytes);
        };
        kernels::device::ans_device::StreamReader whole;
        open(whole);
        std::vector<std::array<std::uint32_t, 5>> points;  // before each frame: states, word index
        std::vector<std::array<std::uint32_t, 4>> values;
        for (std::uint32_t f = 0; f < frames.frame_count; ++f) {
          points.push_back({whole.state[0], whole.state[1], whole.state[2], whole.state[3], whole.word_index()});
          whole.top_up();
          std::array<std::uint32_t, 4> v{};
          whole.decode_frame(table.data(), class_offset, shift, true, v.data());
          values.push_back(v);
        }
        ASSERT_TRUE(whole.finished_cleanly());
        for (std::uint32_t start : {1u, 6u, 13u, 28u}) {
          kernels::device::ans_device::StreamReader resumed;
          open(resumed);
          resumed.seek(points[start].data(), points[start][4]);
          for (std::uint32_t f = start; f < frames.frame_count; ++f) {
            resumed.top_up();
            std::array<std::uint32_t, 4> v{};
            resumed.decode_frame(table.data(), class_offset, shift, true, v.data());
            ASSERT_EQ(v, values[f]) << "stream " << stream << " from frame " << start << ", frame " << f;
          }
          EXPECT_TRUE(resumed.finished_cleanly()) << "stream " << stream << " from frame " << start;
        }
      }
    }
}

TEST(AnsStreamReaderHost, BrightClassesSendRawLowBits) {
  const TestFrames frames = ans_test::make_frames("bright", DType::uint16, 64, 32, 32, 9);
  const auto blob = encode(frames);
  const ans::AnsGroupHeader header = ans::read_group_header(blob.data(), blob.size());
  std::uint32_t max_shift = 0;
  for (std::uint32_t p = 0; p < 32 * 32; ++p)
    max_shift = std::max(max_shift, ans::class_shift(blob[header.class_map_offset + p], header.class_scale));
  EXPECT_GT(max_shift, 0u) << "the bright pattern must exercise the raw-bits path";
}

// A stream whose offsets are corrupt still decodes (garbage) until the end,
// reading only valid memory, and is reported. Uniform 16-bit noise: every
// class reads words in every frame.
TEST(AnsStreamReaderHost, CorruptOffsetsOfAStreamThatReadsWordsAreReportedWithoutStrayReads) {
  const TestFrames frames = ans_test::make_frames("uniform16", DType::uint16, 40, 12, 12, 5);
  auto blob = encode(frames);
  const ans::AnsGroupHeader header = ans::read_group_header(blob.data(), blob.size());
  auto* offsets = reinterpret_cast<std::uint32_t*>(blob.data() + header.stream_offsets_offset);
  std::swap(offsets[2], offsets[3]);  // stream 2 ends before it starts
  offsets[7] += 8;                    // stream 7 starts off its 16-byte alignment
  int unclean = 0;
  const std::vector<std::uint32_t> values = decode_with_reader(blob, unclean);
  EXPECT_GE(unclean, 2);
  EXPECT_EQ(values.size(), std::size_t{40} * 12 * 12);
}

TEST(AnsStreamReaderHost, FlagsMalformedStreams) {
  const TestFrames frames = ans_test::make_frames("disc", DType::uint16, 16, 16, 16, 3);
  auto blob = encode(frames);
  const ans::AnsGroupHeader header = ans::read_group_header(blob.data(), blob.size());
  auto* offsets = reinterpret_cast<std::uint32_t*>(blob.data() + header.stream_offsets_offset);
  std::swap(offsets[5], offsets[6]);  // stream 5 now ends before it starts; stream 6 reads two streams
  int unclean = 0;
  decode_with_reader(blob, unclean);
  EXPECT_GE(unclean, 2);
  auto flipped = encode(frames);
  flipped[header.stream_data_offset + 20] ^= 0x5a;  // inside stream 0's words
  decode_with_reader(flipped, unclean);
  EXPECT_GE(unclean, 1);
}

// The masked sum's stream entries (host code, no GPU): one entry per stream
// with a masked pixel, `stream | quad mask << 28`, against the quad layout of
// ans_format.hpp computed with plain index arithmetic, on even and odd shapes.
TEST(AnsMaskEntries, EqualThePlainQuadArithmetic) {
  // Dense and sparse masks (a thin ring, a lone pixel: the words of zeros the
  // builder skips), even and odd widths below, at and above its 8-byte step.
  const auto pattern = [](std::uint32_t, std::uint32_t, std::size_t i) { return (i * 5 + i / 3) % 4 == 0; };
  const auto thin_ring = [](std::uint32_t r, std::uint32_t c, std::size_t) {
    const double d = std::hypot(r - 20.3, c - 18.7);
    return d >= 9.0 && d < 10.5;
  };
  const auto lone_pixel = [](std::uint32_t r, std::uint32_t c, std::size_t) { return r == 7 && c == 15; };
  const std::vector<std::function<bool(std::uint32_t, std::uint32_t, std::size_t)>> masks = {pattern, thin_ring,
                                                                                             lone_pixel};
  for (auto [rows, cols] : {std::pair{1u, 1u}, std::pair{4u, 6u}, std::pair{5u, 9u}, std::pair{41u, 39u},
                            std::pair{8u, 3u}, std::pair{40u, 64u}, std::pair{33u, 17u}, std::pair{9u, 192u}}) {
    for (std::size_t m = 0; m < masks.size(); ++m) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " mask " + std::to_string(m));
      std::vector<std::uint8_t> mask(std::size_t{rows} * cols);
      for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = masks[m](i / cols, i % cols, i) ? 2 : 0;
      const ans::AnsGroupLayout layout = ans::ans_group_layout(rows, cols);
      std::vector<std::uint32_t> expected;
      for (std::uint32_t stream = 0; stream < layout.stream_count; ++stream) {
        std::uint32_t bits = 0;
        for (std::uint32_t k = 0; k < 4; ++k) {
          const std::uint32_t r = 2 * (stream / layout.quad_cols) + k / 2;
          const std::uint32_t c = 2 * (stream % layout.quad_cols) + k % 2;
          if (r < rows && c < cols && mask[std::size_t{r} * cols + c] != 0) bits |= 1u << k;
        }
        if (bits != 0) expected.push_back(stream | (bits << 28));
      }
      EXPECT_EQ(kernels::ans_mask_entries(mask, rows, cols), expected);
      if (m == 0) {
        EXPECT_FALSE(expected.empty());
      }
    }
  }
}

TEST(AccumulateFramesWidth, WideCtasOnlyWhenEverySmStillGetsOne) {
  // A frame of a 192 x 192 detector: 9,216 streams, one job -> 18 CTAs of 512.
  EXPECT_EQ(kernels::ans_accumulate_frames_threads_for(1, 9216, 132), 512);
  // Ten jobs: 90 CTAs of 1024 would leave SMs idle.
  EXPECT_EQ(kernels::ans_accumulate_frames_threads_for(10, 9216, 132), 512);
  // A half crop's 256 jobs: 2,304 CTAs of 1024.
  EXPECT_EQ(kernels::ans_accumulate_frames_threads_for(256, 9216, 132), 1024);
  EXPECT_EQ(kernels::ans_accumulate_frames_threads_for(15, 9216, 132), 1024);
  EXPECT_THROW(kernels::check_ans_accumulate_frames_cta_threads(128), Error);
  EXPECT_NO_THROW(kernels::check_ans_accumulate_frames_cta_threads(0));
}

}  // namespace
}  // namespace quantem
