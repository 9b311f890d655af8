// CPU reference of the ANS resident codec: exact round trips on random and
// adversarial inputs, masked sums, layout invariants and corrupt blobs.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ans_test_data.hpp"
#include "quantem/ans/ans_codec.hpp"
#include "quantem/ans/ans_model.hpp"
#include "quantem/core/error.hpp"

namespace quantem {
namespace {

using ans_test::TestFrames;

std::vector<std::uint8_t> encode(const TestFrames& frames) {
  ans::HostFrames view;
  view.data = frames.bytes.data();
  view.dtype = frames.dtype;
  view.frame_count = frames.frame_count;
  view.detector_rows = frames.rows;
  view.detector_cols = frames.cols;
  return ans::encode_group(view);
}

void expect_round_trip(const TestFrames& frames) {
  SCOPED_TRACE(frames.label);
  const std::vector<std::uint8_t> blob = encode(frames);
  const ans::AnsGroupHeader header = ans::read_group_header(blob.data(), blob.size());
  EXPECT_EQ(header.total_bytes, blob.size());
  std::vector<std::uint8_t> decoded(frames.bytes.size());
  ans::decode_group(blob.data(), blob.size(), frames.dtype, decoded.data());
  EXPECT_TRUE(decoded == frames.bytes);
  // Wider output holds the same values.
  std::vector<std::uint32_t> wide(frames.elements());
  ans::decode_group(blob.data(), blob.size(), DType::uint32, wide.data());
  for (std::size_t i = 0; i < wide.size(); ++i) ASSERT_EQ(wide[i], ans_test::get(frames, i)) << "element " << i;
}

TEST(AnsCodec, RoundTripsAdversarialAndRandomInputsExactly) {
  std::uint64_t seed = 1;
  for (DType dtype : {DType::uint8, DType::uint16, DType::uint32})
    for (const char* pattern : {"zero", "max", "uniform16", "uniform32", "hot_pixel", "sparse", "disc", "ramp"})
      expect_round_trip(ans_test::make_frames(pattern, dtype, 24, 20, 22, seed++));
}

TEST(AnsCodec, RoundTripsOddShapesAndSingleFrames) {
  for (auto [frames, rows, cols] : {std::tuple{1u, 1u, 1u}, std::tuple{3u, 1u, 7u}, std::tuple{5u, 7u, 1u},
                                    std::tuple{2u, 5u, 9u}, std::tuple{1u, 64u, 64u}})
    for (const char* pattern : {"zero", "max", "disc", "uniform32"})
      expect_round_trip(ans_test::make_frames(pattern, DType::uint32, frames, rows, cols, rows * 31 + cols));
}

TEST(AnsCodec, ThirtyTwoBitValuesUseTwoRawWordsOnlyWhenNeeded) {
  const TestFrames small = ans_test::make_frames("uniform16", DType::uint32, 4, 8, 8, 5);
  const TestFrames large = ans_test::make_frames("uniform32", DType::uint32, 4, 8, 8, 5);
  const auto small_blob = encode(small);
  const auto large_blob = encode(large);
  EXPECT_EQ(ans::read_group_header(small_blob.data(), small_blob.size()).raw_words, 1u);
  EXPECT_EQ(ans::read_group_header(large_blob.data(), large_blob.size()).raw_words, 2u);
  std::vector<std::uint16_t> narrow(small.elements());
  ans::decode_group(small_blob.data(), small_blob.size(), DType::uint16, narrow.data());
  for (std::size_t i = 0; i < narrow.size(); ++i) ASSERT_EQ(narrow[i], ans_test::get(small, i));
  std::vector<std::uint16_t> too_narrow(large.elements());
  EXPECT_THROW(ans::decode_group(large_blob.data(), large_blob.size(), DType::uint16, too_narrow.data()), Error);
}

TEST(AnsCodec, MaskedSumMatchesTheDenseSum) {
  const TestFrames frames = ans_test::make_frames("disc", DType::uint16, 40, 30, 30, 11);
  const auto blob = encode(frames);
  std::vector<std::uint8_t> mask(30 * 30, 0);
  for (std::uint32_t r = 0; r < 30; ++r)
    for (std::uint32_t c = 0; c < 30; ++c)
      mask[r * 30 + c] = ((r - 15.0) * (r - 15.0) + (c - 14.0) * (c - 14.0) < 49.0) ? 1 : 0;  // odd-edged disc
  const std::vector<std::uint64_t> sums = ans::masked_sum_group(blob.data(), blob.size(), mask.data());
  ASSERT_EQ(sums.size(), 40u);
  for (std::uint32_t f = 0; f < 40; ++f) {
    std::uint64_t expected = 0;
    for (std::size_t p = 0; p < mask.size(); ++p)
      if (mask[p]) expected += ans_test::get(frames, f * mask.size() + p);
    EXPECT_EQ(sums[f], expected) << "frame " << f;
  }
}

TEST(AnsCodec, CompressesSparseCountsWellBelowTheirDenseSize) {
  const TestFrames frames = ans_test::make_frames("disc", DType::uint16, 256, 64, 64, 3);
  const auto blob = encode(frames);
  const ans::AnsGroupHeader header = ans::read_group_header(blob.data(), blob.size());
  const double bits_per_pixel = 8.0 * static_cast<double>(header.stream_data_bytes) / static_cast<double>(frames.elements());
  EXPECT_LT(bits_per_pixel, 2.0) << "stream data should be near the counts' entropy";
  const TestFrames zeros = ans_test::make_frames("zero", DType::uint16, 256, 64, 64, 3);
  const auto zero_blob = encode(zeros);
  EXPECT_EQ(ans::read_group_header(zero_blob.data(), zero_blob.size()).stream_data_bytes, 16u * 32 * 32)
      << "an all-zero stream is its four 4-byte states (16 bytes)";
}

TEST(AnsCodec, RejectsCorruptBlobs) {
  const TestFrames frames = ans_test::make_frames("disc", DType::uint16, 16, 16, 16, 2);
  const auto blob = encode(frames);
  std::vector<std::uint16_t> out(frames.elements());
  auto truncated = blob;
  truncated.resize(blob.size() - 2);
  EXPECT_THROW(ans::decode_group(truncated.data(), truncated.size(), DType::uint16, out.data()), CorruptChunk);
  auto bad_magic = blob;
  bad_magic[0] ^= 1;
  EXPECT_THROW(ans::decode_group(bad_magic.data(), bad_magic.size(), DType::uint16, out.data()), CorruptChunk);
  auto bad_table = blob;
  const ans::AnsGroupHeader header = ans::read_group_header(blob.data(), blob.size());
  bad_table[header.freq_table_offset] ^= 0x40;  // class 0's frequencies no longer sum to the scale
  EXPECT_THROW(ans::decode_group(bad_table.data(), bad_table.size(), DType::uint16, out.data()), CorruptChunk);
  int detected = 0;
  for (std::size_t at = header.stream_data_offset; at < blob.size(); at += 7) {
    auto flipped = blob;
    flipped[at] ^= 0x10;
    try {
      ans::decode_group(flipped.data(), flipped.size(), DType::uint16, out.data());
    } catch (const CorruptChunk&) {
      ++detected;
    }
  }
  EXPECT_GT(detected, 0);
}

TEST(AnsModel, NormalizedFrequenciesSumToTheScaleAndKeepEverySymbol) {
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 200; ++trial) {
    std::uint64_t counts[ans::kAnsAlphabetSize] = {};
    const int used = 1 + static_cast<int>(rng() % 256);
    for (int i = 0; i < used; ++i) counts[rng() % 256] += (trial % 2 ? 1 : rng() % 1000000);
    std::uint16_t frequencies[ans::kAnsAlphabetSize];
    ans::normalize_frequencies(counts, frequencies);
    std::uint32_t sum = 0;
    for (std::uint32_t s = 0; s < ans::kAnsAlphabetSize; ++s) {
      sum += frequencies[s];
      EXPECT_EQ(counts[s] > 0, frequencies[s] > 0) << "symbol " << s;
    }
    EXPECT_EQ(sum, ans::kAnsProbabilityScale);
  }
}

TEST(AnsModel, ReciprocalEncodeStepEqualsTheDivisionForEveryFrequency) {
  // The GPU encoder replaces state / frequency by a multiply; it must be exact
  // for every frequency and every state the encoder can hold.
  std::mt19937_64 rng(11);
  for (std::uint32_t frequency = 1; frequency <= ans::kAnsProbabilityScale; ++frequency) {
    const std::uint64_t reciprocal = ans::frequency_reciprocal(frequency);
    std::vector<std::uint32_t> states = {ans::kAnsStateLower, ans::kAnsStateLower + 1, 0xffffffffu, 0xfffffffeu};
    for (std::uint32_t k : {1u, 2u, 1000u, 65535u}) {  // multiples of the frequency and their neighbours
      const std::uint64_t multiple = std::uint64_t{frequency} * k * 4096;
      for (std::int64_t d = -1; d <= 1; ++d)
        if (multiple + d >= ans::kAnsStateLower && multiple + d <= 0xffffffffull)
          states.push_back(static_cast<std::uint32_t>(multiple + d));
    }
    for (int i = 0; i < 64; ++i) states.push_back(ans::kAnsStateLower + static_cast<std::uint32_t>(rng() % (0xffffffffull - ans::kAnsStateLower)));
    for (const std::uint32_t start : states) {
      for (std::uint32_t x : {start, start >> 16}) {  // also the quotient's own range after renormalisation
        if (x == 0) continue;
        ASSERT_EQ(ans::frequency_quotient(x, frequency, reciprocal), x / frequency) << x << " / " << frequency;
      }
      const std::uint32_t cdf = (ans::kAnsProbabilityScale - frequency) / 2;
      std::uint32_t by_division = start;
      std::uint32_t by_reciprocal = start;
      const std::uint32_t word_division = ans::encode_symbol(by_division, frequency, cdf);
      const std::uint32_t word_reciprocal = ans::encode_symbol_reciprocal(by_reciprocal, frequency, cdf, reciprocal);
      ASSERT_EQ(word_division, word_reciprocal) << start << " f " << frequency;
      ASSERT_EQ(by_division, by_reciprocal) << start << " f " << frequency;
    }
  }
}

TEST(AnsModel, SixteenBitValueEncodeEqualsTheGeneralOne) {
  // The GPU encoder encodes 8- and 16-bit data with encode_value<false> (no
  // escape32 test); for every value up to 0xffff and every class shift it must
  // give the symbol, the words and the state of the general encode_value.
  const auto step = [](std::uint32_t& x, std::uint32_t symbol) {
    return ans::encode_symbol(x, 1 + symbol % 97, (symbol * 13) % 3000);
  };
  for (std::uint32_t shift = 0; shift <= ans::kAnsMaxClassShift; ++shift) {
    for (std::uint32_t value = 0; value <= 0xffffu; value += (value < 600 ? 1 : 97)) {
      ASSERT_EQ(ans::value_symbol<false>(value, shift), ans::value_symbol(value, shift)) << value << " >> " << shift;
      for (std::uint32_t start : {ans::kAnsStateLower, 0x12345678u, 0xfffffff0u}) {
        std::uint32_t general = start, sixteen = start;
        std::vector<std::uint32_t> general_words, sixteen_words;
        ans::encode_value(general, value, shift, step, [&](std::uint32_t w) { general_words.push_back(w); });
        ans::encode_value<false>(sixteen, value, shift, step, [&](std::uint32_t w) { sixteen_words.push_back(w); });
        ASSERT_EQ(general, sixteen) << value << " shift " << shift;
        ASSERT_EQ(general_words, sixteen_words) << value << " shift " << shift;
      }
    }
  }
  EXPECT_EQ(ans::value_symbol(0x10000u, 0), ans::kAnsEscape32);  // what the general form keeps
}

TEST(AnsModel, IntegerSquareRootIsExact) {
  for (std::uint64_t n : {0ull, 1ull, 2ull, 3ull, 4ull, 15ull, 16ull, 17ull, (1ull << 40) - 1, 1ull << 40, (1ull << 61) + 12345})
    {
    const std::uint64_t r = ans::isqrt_u64(n);
    EXPECT_LE(r * r, n);
    EXPECT_GT((r + 1) * (r + 1), n);
  }
}

}  // namespace
}  // namespace quantem
