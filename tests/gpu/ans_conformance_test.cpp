// One typed suite for the ANS resident codec, run against the CPU reference
// (src/ans) and the CUDA kernels (kernels/codec/ans_*.cu): exact round trips on
// random and adversarial inputs, masked sums against dense sums, and the two
// implementations writing byte-identical groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../unit/ans/ans_test_data.hpp"
#include "gpu_test_support.hpp"
#include "quantem/ans/ans_codec.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/ans.hpp"
#include "quantem/kernels/device.hpp"

namespace quantem {
namespace {

using ans_test::TestFrames;
using Bytes = std::vector<std::uint8_t>;

std::size_t group_frames(const TestFrames& frames, std::uint32_t frames_per_group, std::size_t group) {
  return std::min<std::size_t>(frames_per_group, frames.frame_count - group * frames_per_group);
}

struct CpuAns {
  static constexpr const char* kName = "cpu";
  static std::vector<Bytes> encode(const TestFrames& frames, std::uint32_t frames_per_group) {
    std::vector<Bytes> blobs;
    const std::size_t frame_bytes = std::size_t{frames.rows} * frames.cols * dtype_size(frames.dtype);
    for (std::size_t g = 0; g * frames_per_group < frames.frame_count; ++g) {
      ans::HostFrames view;
      view.data = frames.bytes.data() + g * frames_per_group * frame_bytes;
      view.dtype = frames.dtype;
      view.frame_count = static_cast<std::uint32_t>(group_frames(frames, frames_per_group, g));
      view.detector_rows = frames.rows;
      view.detector_cols = frames.cols;
      blobs.push_back(ans::encode_group(view));
    }
    return blobs;
  }
  static std::vector<std::uint32_t> decode(const std::vector<Bytes>& blobs, const TestFrames& shape, std::uint32_t) {
    std::vector<std::uint32_t> out;
    for (const Bytes& blob : blobs) {
      const ans::AnsGroupHeader header = ans::read_group_header(blob.data(), blob.size());
      std::vector<std::uint32_t> group(std::size_t{header.frame_count} * shape.rows * shape.cols);
      ans::decode_group(blob.data(), blob.size(), DType::uint32, group.data());
      out.insert(out.end(), group.begin(), group.end());
    }
    return out;
  }
  static std::vector<std::uint64_t> masked_sum(const std::vector<Bytes>& blobs, const TestFrames&, std::uint32_t,
                                               const std::vector<std::uint8_t>& mask) {
    std::vector<std::uint64_t> out;
    for (const Bytes& blob : blobs) {
      const auto sums = ans::masked_sum_group(blob.data(), blob.size(), mask.data());
      out.insert(out.end(), sums.begin(), sums.end());
    }
    return out;
  }
};

// Group blobs laid out in one device buffer, 256-byte aligned.
struct DeviceResident {
  kernels::DeviceBuffer blobs;
  kernels::DeviceBuffer offsets;
  kernels::AnsResidentView view;
};

DeviceResident upload(const std::vector<Bytes>& host_blobs, const TestFrames& shape, std::uint32_t frames_per_group) {
  std::vector<std::uint64_t> offsets;
  std::size_t total = 0;
  for (const Bytes& blob : host_blobs) {
    offsets.push_back(total);
    total += (blob.size() + 255) / 256 * 256;
  }
  DeviceResident resident;
  resident.blobs = kernels::DeviceBuffer(std::max<std::size_t>(total, 1));
  resident.offsets = kernels::DeviceBuffer(offsets.size() * sizeof(std::uint64_t));
  for (std::size_t g = 0; g < host_blobs.size(); ++g)
    kernels::copy_to_device(resident.blobs.as<std::uint8_t>() + offsets[g], host_blobs[g].data(), host_blobs[g].size());
  kernels::copy_to_device(resident.offsets.data(), offsets.data(), resident.offsets.size());
  resident.view.d_blobs = resident.blobs.as<std::uint8_t>();
  resident.view.d_group_offsets = resident.offsets.as<std::uint64_t>();
  resident.view.group_count = host_blobs.size();
  resident.view.frames_per_group = frames_per_group;
  resident.view.total_frames = shape.frame_count;
  resident.view.detector_rows = shape.rows;
  resident.view.detector_cols = shape.cols;
  return resident;
}

struct CudaAns {
  static constexpr const char* kName = "cuda";
  // seek_frames != 0: the measuring pass also writes the seek table, returned
  // in *seek_table (the device table is poisoned with 0xAB first: every value must be written).
  static std::vector<Bytes> encode(const TestFrames& frames, std::uint32_t frames_per_group,
                                   std::uint32_t kept_words_per_frame = kernels::AnsEncodeBatch{}.kept_words_per_frame,
                                   std::uint32_t seek_frames = 0, std::vector<std::uint32_t>* seek_table = nullptr) {
    kernels::DeviceBuffer d_frames(frames.bytes.size());
    kernels::copy_to_device(d_frames.data(), frames.bytes.data(), frames.bytes.size());
    kernels::AnsEncodeBatch batch;
    batch.d_frames = d_frames.data();
    batch.dtype = frames.dtype;
    batch.total_frames = frames.frame_count;
    batch.frames_per_group = frames_per_group;
    batch.detector_rows = frames.rows;
    batch.detector_cols = frames.cols;
    batch.kept_words_per_frame = kept_words_per_frame;
    const ans::AnsGroupLayout layout = ans::ans_group_layout(frames.rows, frames.cols);
    const std::uint64_t seek_words =
        kernels::ans_seek_table_words(kernels::ans_group_count(frames.frame_count, frames_per_group), frames_per_group,
                                   seek_frames, layout.stream_count);
    kernels::DeviceBuffer d_seek(std::max<std::uint64_t>(seek_words * 4, 4));
    if (seek_table != nullptr) {
      kernels::fill_device(d_seek.data(), 0xAB, d_seek.size());
      batch.d_seek_points = d_seek.as<std::uint32_t>();
      batch.frames_per_seek_point = seek_frames;
    }
    kernels::DeviceBuffer scratch(kernels::ans_encode_scratch_bytes(batch));
    kernels::fill_device(scratch.data(), 0x5A, scratch.size());  // the encoder must not rely on zeroed scratch
    const std::vector<std::uint64_t> sizes = kernels::ans_encode_measure(batch, scratch.data(), scratch.size(), nullptr);
    std::vector<std::uint64_t> offsets;
    std::size_t total = 0;
    for (std::uint64_t size : sizes) {
      offsets.push_back(total);
      total += (size + 255) / 256 * 256;
    }
    kernels::DeviceBuffer d_out(total);
    kernels::fill_device(d_out.data(), 0xC3, d_out.size());  // poison: every blob byte must be written
    kernels::DeviceBuffer d_offsets(offsets.size() * sizeof(std::uint64_t));
    kernels::copy_to_device(d_offsets.data(), offsets.data(), d_offsets.size());
    kernels::ans_encode_write(batch, scratch.data(), scratch.size(), d_out.as<std::uint8_t>(), d_offsets.as<std::uint64_t>(),
                           nullptr);
    kernels::synchronize_device();
    std::vector<Bytes> blobs;
    for (std::size_t g = 0; g < sizes.size(); ++g) {
      Bytes blob(sizes[g]);
      kernels::copy_to_host(blob.data(), d_out.as<std::uint8_t>() + offsets[g], blob.size());
      blobs.push_back(std::move(blob));
    }
    if (seek_table != nullptr) {
      seek_table->assign(seek_words, 0);
      kernels::copy_to_host(seek_table->data(), d_seek.data(), seek_words * 4);
    }
    return blobs;
  }
  static std::vector<std::uint32_t> decode(const std::vector<Bytes>& blobs, const TestFrames& shape,
                                           std::uint32_t frames_per_group) {
    DeviceResident resident = upload(blobs, shape, frames_per_group);
    kernels::DeviceBuffer d_out(shape.elements() * sizeof(std::uint32_t));
    kernels::fill_device(d_out.data(), 0xEE, d_out.size());
    kernels::DeviceBuffer d_error(sizeof(std::uint32_t));
    kernels::fill_device(d_error.data(), 0, d_error.size());
    kernels::ans_decode_frames(resident.view, 0, blobs.size(), DType::uint32, d_out.data(), d_error.as<std::uint32_t>(),
                            nullptr);
    kernels::synchronize_device();
    std::uint32_t error = 0;
    kernels::copy_to_host(&error, d_error.data(), sizeof error);
    EXPECT_EQ(error, 0u) << "the GPU decoder reported a malformed stream";
    std::vector<std::uint32_t> out(shape.elements());
    kernels::copy_to_host(out.data(), d_out.data(), d_out.size());
    return out;
  }
  static std::vector<std::uint64_t> masked_sum(const std::vector<Bytes>& blobs, const TestFrames& shape,
                                               std::uint32_t frames_per_group, const std::vector<std::uint8_t>& mask) {
    DeviceResident resident = upload(blobs, shape, frames_per_group);
    const kernels::AnsMaskedStreams streams(mask, shape.rows, shape.cols);
    kernels::DeviceBuffer d_sums(shape.frame_count * sizeof(std::uint64_t));
    kernels::fill_device(d_sums.data(), 0x77, d_sums.size());
    kernels::DeviceBuffer d_error(sizeof(std::uint32_t));
    kernels::fill_device(d_error.data(), 0, d_error.size());
    kernels::ans_masked_sum(resident.view, streams, d_sums.as<std::uint64_t>(), d_error.as<std::uint32_t>(), nullptr);
    kernels::synchronize_device();
    std::uint32_t error = 0;
    kernels::copy_to_host(&error, d_error.data(), sizeof error);
    EXPECT_EQ(error, 0u) << "the GPU masked sum reported a malformed stream";
    std::vector<std::uint64_t> out(shape.frame_count);
    kernels::copy_to_host(out.data(), d_sums.data(), d_sums.size());
    return out;
  }
};

template <class Codec>
class AnsConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    if constexpr (std::is_same_v<Codec, CudaAns>) {
      QUANTEM_REQUIRE_CUDA_DEVICE();
    }
  }
};

using Implementations = ::testing::Types<CpuAns, CudaAns>;
TYPED_TEST_SUITE(AnsConformance, Implementations);

std::vector<std::uint32_t> values_of(const TestFrames& frames) {
  std::vector<std::uint32_t> values(frames.elements());
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = ans_test::get(frames, i);
  return values;
}

TYPED_TEST(AnsConformance, RoundTripsAdversarialAndRandomInputsExactly) {
  std::uint64_t seed = 100;
  for (DType dtype : {DType::uint8, DType::uint16, DType::uint32})
    for (const char* pattern : {"zero", "max", "uniform16", "uniform32", "hot_pixel", "sparse", "disc", "ramp"}) {
      const TestFrames frames = ans_test::make_frames(pattern, dtype, 37, 18, 22, seed++);
      SCOPED_TRACE(frames.label);
      const std::uint32_t frames_per_group = 16;  // three groups, the last one short
      const auto blobs = TypeParam::encode(frames, frames_per_group);
      ASSERT_EQ(blobs.size(), 3u);
      EXPECT_EQ(TypeParam::decode(blobs, frames, frames_per_group), values_of(frames));
    }
}

TYPED_TEST(AnsConformance, RoundTripsOddDetectorShapes) {
  for (auto [rows, cols] : {std::pair{1u, 1u}, std::pair{7u, 1u}, std::pair{1u, 9u}, std::pair{5u, 9u}, std::pair{33u, 31u}})
    for (const char* pattern : {"disc", "uniform32", "hot_pixel"}) {
      const TestFrames frames = ans_test::make_frames(pattern, DType::uint32, 9, rows, cols, rows * 100 + cols);
      SCOPED_TRACE(frames.label);
      const auto blobs = TypeParam::encode(frames, 4);
      EXPECT_EQ(TypeParam::decode(blobs, frames, 4), values_of(frames));
    }
}

TYPED_TEST(AnsConformance, MaskedSumsEqualDenseSums) {
  for (DType dtype : {DType::uint16, DType::uint32}) {
    const TestFrames frames = ans_test::make_frames(dtype == DType::uint16 ? "disc" : "uniform32", dtype, 45, 41, 39, 5);
    SCOPED_TRACE(frames.label);
    const auto blobs = TypeParam::encode(frames, 20);
    std::vector<std::vector<std::uint8_t>> masks;
    std::vector<std::uint8_t> disc(41 * 39, 0), ring(41 * 39, 0), full(41 * 39, 1), empty(41 * 39, 0),
        single(41 * 39, 0), edge(41 * 39, 0);
    for (int r = 0; r < 41; ++r)
      for (int c = 0; c < 39; ++c) {
        const double d = std::hypot(r - 20.3, c - 18.6);
        disc[static_cast<std::size_t>(r * 39 + c)] = d < 9.5;
        ring[static_cast<std::size_t>(r * 39 + c)] = d > 12 && d < 17;
        edge[static_cast<std::size_t>(r * 39 + c)] = r == 40 || c == 38;
      }
    single[17 * 39 + 23] = 1;
    masks = {disc, ring, full, empty, single, edge};
    for (const auto& mask : masks) {
      std::vector<std::uint64_t> expected(frames.frame_count, 0);
      for (std::uint32_t f = 0; f < frames.frame_count; ++f)
        for (std::size_t p = 0; p < mask.size(); ++p)
          if (mask[p]) expected[f] += ans_test::get(frames, f * mask.size() + p);
      EXPECT_EQ(TypeParam::masked_sum(blobs, frames, 20, mask), expected);
    }
  }
}

// Several masks in one pass (the products of one plan): each mask's sums equal
// its dense sums, whether its streams are shared with other masks (BF's edge
// is ABF's), its own, or none; one mask through the arrays takes the same path.
TEST(AnsCudaMaskSets, SeveralMasksInOnePassEqualEachMaskAlone) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  for (DType dtype : {DType::uint16, DType::uint32}) {
    const TestFrames frames = ans_test::make_frames(dtype == DType::uint16 ? "disc" : "uniform32", dtype, 45, 41, 39, 5);
    SCOPED_TRACE(frames.label);
    const auto blobs = CudaAns::encode(frames, 20);
    DeviceResident resident = upload(blobs, frames, 20);
    const std::size_t pixels = 41 * 39;
    std::vector<std::uint8_t> disc(pixels, 0), annulus(pixels, 0), outside(pixels, 0), full(pixels, 1),
        empty(pixels, 0), single(pixels, 0);
    for (int r = 0; r < 41; ++r)
      for (int c = 0; c < 39; ++c) {
        const double d = std::hypot(r - 20.3, c - 18.6);
        disc[static_cast<std::size_t>(r * 39 + c)] = d < 9.5;
        annulus[static_cast<std::size_t>(r * 39 + c)] = d >= 4.7 && d < 9.5;
        outside[static_cast<std::size_t>(r * 39 + c)] = d >= 9.5;
      }
    single[17 * 39 + 23] = 1;
    const std::vector<std::vector<std::vector<std::uint8_t>>> passes = {
        {disc, annulus, outside, single}, {full, empty}, {annulus}, {empty, single, disc}};
    for (const auto& masks : passes) {
      const kernels::AnsMaskSetEntries set = kernels::ans_mask_set_entries(masks, frames.rows, frames.cols);
      ASSERT_EQ(set.streams.size(), set.quads.size());
      ASSERT_TRUE(std::is_sorted(set.streams.begin(), set.streams.end()));
      const std::uint32_t count = static_cast<std::uint32_t>(set.streams.size());
      kernels::DeviceBuffer d_streams(std::max<std::size_t>(count, 1) * 4), d_quads(std::max<std::size_t>(count, 1) * 4);
      if (count != 0) {
        kernels::copy_to_device(d_streams.data(), set.streams.data(), count * 4);
        kernels::copy_to_device(d_quads.data(), set.quads.data(), count * 4);
      }
      kernels::DeviceBuffer d_sums(masks.size() * frames.frame_count * sizeof(std::uint64_t));
      kernels::fill_device(d_sums.data(), 0x77, d_sums.size());
      kernels::DeviceBuffer d_error(sizeof(std::uint32_t));
      kernels::fill_device(d_error.data(), 0, d_error.size());
      kernels::ans_masked_sums(resident.view, d_streams.as<std::uint32_t>(), d_quads.as<std::uint32_t>(), count,
                               static_cast<std::uint32_t>(masks.size()), d_sums.as<std::uint64_t>(),
                               d_error.as<std::uint32_t>(), nullptr);
      kernels::synchronize_device();
      std::uint32_t error = 1;
      kernels::copy_to_host(&error, d_error.data(), sizeof error);
      EXPECT_EQ(error, 0u);
      std::vector<std::uint64_t> sums(masks.size() * frames.frame_count);
      kernels::copy_to_host(sums.data(), d_sums.data(), d_sums.size());
      for (std::size_t m = 0; m < masks.size(); ++m) {
        std::vector<std::uint64_t> expected(frames.frame_count, 0);
        for (std::uint32_t f = 0; f < frames.frame_count; ++f)
          for (std::size_t p = 0; p < pixels; ++p)
            if (masks[m][p]) expected[f] += ans_test::get(frames, f * pixels + p);
        EXPECT_EQ(std::vector<std::uint64_t>(sums.begin() + m * frames.frame_count,
                                             sums.begin() + (m + 1) * frames.frame_count),
                  expected)
            << "pass of " << masks.size() << " masks, mask " << m;
      }
    }
  }
  EXPECT_THROW(kernels::ans_mask_set_entries(std::vector<std::vector<std::uint8_t>>(5, std::vector<std::uint8_t>(4, 1)), 2, 2),
               quantem::Error);
}

TEST(AnsCudaEncoder, WritesTheCpuReferenceBytes) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  std::uint64_t seed = 7;
  for (DType dtype : {DType::uint8, DType::uint16, DType::uint32})
    for (const char* pattern : {"zero", "max", "uniform32", "hot_pixel", "disc", "ramp"})
      for (auto [frame_count, rows, cols, per_group] :
           {std::tuple{37u, 18u, 22u, 16u}, std::tuple{5u, 7u, 3u, 8u}, std::tuple{64u, 48u, 48u, 64u}}) {
        const TestFrames frames = ans_test::make_frames(pattern, dtype, frame_count, rows, cols, seed++);
        SCOPED_TRACE(frames.label);
        const auto cpu = CpuAns::encode(frames, per_group);
        // The write pass copies the words the measuring pass kept, or encodes a
        // stream again when they did not fit: 0 and 1 word per frame force the
        // second path for all or the busier streams.
        for (std::uint32_t kept_words_per_frame : {2u, 1u, 0u}) {
          SCOPED_TRACE("kept words per frame " + std::to_string(kept_words_per_frame));
          const auto gpu = CudaAns::encode(frames, per_group, kept_words_per_frame);
          ASSERT_EQ(cpu.size(), gpu.size());
          for (std::size_t g = 0; g < cpu.size(); ++g) EXPECT_TRUE(cpu[g] == gpu[g]) << "group " << g << " differs";
        }
      }
}

// Corrupt stream offsets are reported by the frame decoder and the masked sum,
// and (compute-sanitizer memcheck: scripts/device/run.sh memcheck) read no stray
// memory, also where the corrupt stream's classes read words in every frame
// (uniform 16-bit noise).
TEST(AnsCudaDecoder, ReportsMalformedStreams) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  for (const char* pattern : {"disc", "uniform16"}) {
    SCOPED_TRACE(pattern);
    const TestFrames frames = ans_test::make_frames(pattern, DType::uint16, 16, 16, 16, 3);
    auto blobs = CpuAns::encode(frames, 16);
    const ans::AnsGroupHeader header = ans::read_group_header(blobs[0].data(), blobs[0].size());
    // Swap two stream offsets: streams now end before they start; misalign another.
    std::uint32_t* offsets = reinterpret_cast<std::uint32_t*>(blobs[0].data() + header.stream_offsets_offset);
    std::swap(offsets[3], offsets[4]);
    offsets[9] += 8;
    DeviceResident resident = upload(blobs, frames, 16);
    kernels::DeviceBuffer d_out(frames.elements() * sizeof(std::uint16_t));
    kernels::DeviceBuffer d_error(sizeof(std::uint32_t));
    kernels::fill_device(d_error.data(), 0, d_error.size());
    kernels::ans_decode_frames(resident.view, 0, 1, DType::uint16, d_out.data(), d_error.as<std::uint32_t>(), nullptr);
    kernels::synchronize_device();
    std::uint32_t error = 0;
    kernels::copy_to_host(&error, d_error.data(), sizeof error);
    EXPECT_NE(error, 0u) << "frame decoder";

    const kernels::AnsMaskedStreams every_pixel(std::vector<std::uint8_t>(16 * 16, 1), 16, 16);
    kernels::DeviceBuffer d_sums(16 * sizeof(std::uint64_t));
    kernels::fill_device(d_error.data(), 0, d_error.size());
    kernels::ans_masked_sum(resident.view, every_pixel, d_sums.as<std::uint64_t>(), d_error.as<std::uint32_t>(), nullptr);
    kernels::synchronize_device();
    error = 0;
    kernels::copy_to_host(&error, d_error.data(), sizeof error);
    EXPECT_NE(error, 0u) << "masked sum";
  }
}

// The measuring pass adds each pixel's sum over the batch to a pattern sum
// (what the load's bright-field centre and fits read): exact, on top of what
// the pattern held, for every dtype and a short last group.
TEST(AnsCudaEncode, MeasureAddsThePatternSum) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  std::uint64_t seed = 17;
  for (DType dtype : {DType::uint8, DType::uint16, DType::uint32})
    for (const char* pattern : {"disc", "uniform32", "max"}) {
      const TestFrames frames = ans_test::make_frames(pattern, dtype, 45, 13, 11, seed++);
      SCOPED_TRACE(frames.label);
      const std::uint64_t pixels = std::uint64_t{frames.rows} * frames.cols;
      kernels::DeviceBuffer d_frames(frames.bytes.size());
      kernels::copy_to_device(d_frames.data(), frames.bytes.data(), frames.bytes.size());
      std::vector<std::uint64_t> pattern_sum(pixels);
      for (std::uint64_t p = 0; p < pixels; ++p) pattern_sum[p] = p * 1000003;  // what earlier batches left
      kernels::DeviceBuffer d_pattern(pixels * 8);
      kernels::copy_to_device(d_pattern.data(), pattern_sum.data(), pixels * 8);
      kernels::AnsEncodeBatch batch;
      batch.d_frames = d_frames.data();
      batch.dtype = frames.dtype;
      batch.total_frames = frames.frame_count;
      batch.frames_per_group = 20;
      batch.detector_rows = frames.rows;
      batch.detector_cols = frames.cols;
      batch.d_pattern_sum = d_pattern.as<std::uint64_t>();
      kernels::DeviceBuffer scratch(kernels::ans_encode_scratch_bytes(batch));
      (void)kernels::ans_encode_measure(batch, scratch.data(), scratch.size(), nullptr);
      std::vector<std::uint64_t> got(pixels);
      kernels::copy_to_host(got.data(), d_pattern.data(), pixels * 8);
      for (std::uint64_t p = 0; p < pixels; ++p) {
        std::uint64_t want = p * 1000003;
        for (std::uint32_t f = 0; f < frames.frame_count; ++f) want += ans_test::get(frames, f * pixels + p);
        ASSERT_EQ(got[p], want) << "pixel " << p;
      }
    }
}

// The seek table the encoder's measuring pass writes from its own states
// equals, value for value, the one a decoder records (ans_record_seek_points)
// from the encoded groups: every kept-words mode (copied or re-encoded
// streams), escapes (uint32), a short last group, a point count of 1 and 3.
TEST(AnsCudaSeekPoints, EncoderWritesTheTableADecoderRecords) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  std::uint64_t seed = 91;
  for (DType dtype : {DType::uint8, DType::uint16, DType::uint32})
    for (const char* pattern : {"disc", "uniform32", "hot_pixel", "sparse", "zero"})
      for (auto [frames_per_group, seek_frames] : {std::pair{20u, 6u}, std::pair{16u, 8u}, std::pair{33u, 32u}}) {
        const TestFrames frames = ans_test::make_frames(pattern, dtype, 45, 13, 11, seed++);
        for (std::uint32_t kept : {2u, 0u}) {
          SCOPED_TRACE(frames.label + " group " + std::to_string(frames_per_group) + " seek every " +
                       std::to_string(seek_frames) + " kept " + std::to_string(kept));
          std::vector<std::uint32_t> from_encoder;
          const auto blobs = CudaAns::encode(frames, frames_per_group, kept, seek_frames, &from_encoder);
          EXPECT_EQ(blobs, CudaAns::encode(frames, frames_per_group, kept)) << "the blobs do not depend on the table";
          DeviceResident resident = upload(blobs, frames, frames_per_group);
          kernels::DeviceBuffer d_points(from_encoder.size() * 4);
          kernels::fill_device(d_points.data(), 0xAB, d_points.size());
          kernels::DeviceBuffer d_error(sizeof(std::uint32_t));
          kernels::fill_device(d_error.data(), 0, d_error.size());
          kernels::ans_record_seek_points(resident.view, seek_frames, d_points.as<std::uint32_t>(),
                                       d_error.as<std::uint32_t>(), nullptr);
          kernels::synchronize_device();
          std::uint32_t error = 1;
          kernels::copy_to_host(&error, d_error.data(), sizeof error);
          ASSERT_EQ(error, 0u);
          std::vector<std::uint32_t> from_decoder(from_encoder.size());
          kernels::copy_to_host(from_decoder.data(), d_points.data(), d_points.size());
          ASSERT_FALSE(from_encoder.empty());
          EXPECT_EQ(from_encoder, from_decoder);
        }
      }
}

// Seek points: recorded on the GPU for groups of 20 frames every 6 frames
// (segments [0,6) [6,12) [12,18) [18,20); the last group holds 5 frames, fewer
// than one segment), a masked sum that starts every segment at its point
// equals the dense sums; a tampered point is reported, never summed silently.
TEST(AnsCudaSeekPoints, MaskedSumsFromSeekPointsEqualDenseSums) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  for (DType dtype : {DType::uint16, DType::uint32}) {
    const TestFrames frames = ans_test::make_frames(dtype == DType::uint16 ? "disc" : "uniform32", dtype, 45, 41, 39, 7);
    SCOPED_TRACE(frames.label);
    const std::uint32_t frames_per_group = 20;
    const std::uint32_t seek_frames = 6;
    const auto blobs = CudaAns::encode(frames, frames_per_group);
    DeviceResident resident = upload(blobs, frames, frames_per_group);
    const ans::AnsGroupLayout layout = ans::ans_group_layout(frames.rows, frames.cols);
    const std::uint64_t words = kernels::ans_seek_table_words(blobs.size(), frames_per_group, seek_frames, layout.stream_count);
    ASSERT_EQ(words, std::uint64_t{3} * 3 * 5 * layout.stream_count);
    kernels::DeviceBuffer d_points(words * 4);
    kernels::DeviceBuffer d_error(sizeof(std::uint32_t));
    kernels::fill_device(d_error.data(), 0, d_error.size());
    kernels::ans_record_seek_points(resident.view, seek_frames, d_points.as<std::uint32_t>(), d_error.as<std::uint32_t>(),
                                 nullptr);
    kernels::synchronize_device();
    std::uint32_t error = 1;
    kernels::copy_to_host(&error, d_error.data(), sizeof error);
    ASSERT_EQ(error, 0u);
    resident.view.d_seek_points = d_points.as<std::uint32_t>();
    resident.view.frames_per_seek_point = seek_frames;

    std::vector<std::uint8_t> disc(41 * 39, 0), full(41 * 39, 1);
    for (int r = 0; r < 41; ++r)
      for (int c = 0; c < 39; ++c) disc[static_cast<std::size_t>(r * 39 + c)] = std::hypot(r - 20.3, c - 18.6) < 9.5;
    auto sums_of = [&](const std::vector<std::uint8_t>& mask, std::uint32_t& reported) {
      const kernels::AnsMaskedStreams streams(mask, frames.rows, frames.cols);
      kernels::DeviceBuffer d_sums(frames.frame_count * sizeof(std::uint64_t));
      kernels::fill_device(d_error.data(), 0, d_error.size());
      kernels::ans_masked_sum(resident.view, streams, d_sums.as<std::uint64_t>(), d_error.as<std::uint32_t>(), nullptr);
      kernels::synchronize_device();
      kernels::copy_to_host(&reported, d_error.data(), sizeof reported);
      std::vector<std::uint64_t> out(frames.frame_count);
      kernels::copy_to_host(out.data(), d_sums.data(), d_sums.size());
      return out;
    };
    for (const auto& mask : {disc, full}) {
      std::vector<std::uint64_t> expected(frames.frame_count, 0);
      for (std::uint32_t f = 0; f < frames.frame_count; ++f)
        for (std::size_t p = 0; p < mask.size(); ++p)
          if (mask[p]) expected[f] += ans_test::get(frames, f * mask.size() + p);
      std::uint32_t reported = 1;
      EXPECT_EQ(sums_of(mask, reported), expected);
      EXPECT_EQ(reported, 0u);
    }
    // Group 1, point 2 (frame 12), stream 3's first state changed: the
    // segment before it no longer ends where the table says.
    std::uint32_t* tampered = d_points.as<std::uint32_t>() + (std::uint64_t{1} * 3 + 1) * 5 * layout.stream_count + 3;
    std::uint32_t state = 0;
    kernels::copy_to_host(&state, tampered, 4);
    state ^= 0x100u;
    kernels::copy_to_device(tampered, &state, 4);
    std::uint32_t reported = 0;
    sums_of(full, reported);
    EXPECT_NE(reported, 0u) << "a wrong seek point must be reported";
  }
}

}  // namespace
}  // namespace quantem
