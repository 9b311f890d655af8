// The synth physics on its own: counting noise statistics, determinism of a
// frame from (seed, frame index), bad pixels, clamping and the probe's path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "quantem/core/error.hpp"
#include "quantem/synth/pattern_model.hpp"

namespace quantem::synth {
namespace {

struct Moments {
  double mean = 0;
  double variance = 0;
};

Moments sample_moments(const PoissonSampler& sampler, double mean, int draws, std::uint64_t seed) {
  SplitMix64 random(seed);
  double sum = 0, sum_squares = 0;
  for (int i = 0; i < draws; ++i) {
    const auto value = static_cast<double>(sampler.sample(mean, random));
    sum += value;
    sum_squares += value * value;
  }
  const double sample_mean = sum / draws;
  return {sample_mean, sum_squares / draws - sample_mean * sample_mean};
}

TEST(PoissonSampler, MatchesPoissonMeanAndVarianceOnBothSidesOfTheInversionLimit) {
  const PoissonSampler sampler;
  const int draws = 200000;
  for (const double mean : {0.05, 0.7, 4.0, 20.0, 31.9, 32.0, 45.0, 500.0, 150000.0}) {
    const Moments moments = sample_moments(sampler, mean, draws, 17);
    // Five standard errors of the mean; the variance within 3 %.
    EXPECT_NEAR(moments.mean, mean, 5.0 * std::sqrt(mean / draws) + 1e-3) << "mean " << mean;
    EXPECT_NEAR(moments.variance, mean, 0.03 * mean + 0.01) << "mean " << mean;
  }
}

TEST(PoissonSampler, SmallMeansFollowThePoissonProbabilities) {
  const PoissonSampler sampler;
  SplitMix64 random(3);
  const double mean = 0.7;
  const int draws = 400000;
  std::vector<int> histogram(8, 0);
  for (int i = 0; i < draws; ++i) ++histogram[std::min<std::uint64_t>(sampler.sample(mean, random), 7)];
  double probability = std::exp(-mean);
  for (int k = 0; k < 5; ++k) {
    const double observed = static_cast<double>(histogram[k]) / draws;
    EXPECT_NEAR(observed, probability, 5.0 * std::sqrt(probability / draws) + 1e-4) << "k " << k;
    probability *= mean / (k + 1);
  }
}

TEST(PoissonSampler, NonPositiveOrNanMeansGiveZero) {
  const PoissonSampler sampler;
  SplitMix64 random(1);
  EXPECT_EQ(sampler.sample(0.0, random), 0u);
  EXPECT_EQ(sampler.sample(-3.0, random), 0u);
  EXPECT_EQ(sampler.sample(std::nan(""), random), 0u);
}

SynthOptions small_options() {
  SynthOptions options;
  options.scan_rows = 6;
  options.scan_cols = 9;
  options.detector_rows = 48;
  options.detector_cols = 56;
  options.seed = 11;
  options.bad_pixels = 5;
  return options;
}

std::vector<std::uint8_t> render(const PatternModel& model, std::uint64_t frame_index) {
  PatternModel::Scratch scratch;
  std::vector<std::uint8_t> frame(model.frame_bytes());
  model.render_frame(frame_index, frame.data(), scratch);
  return frame;
}

TEST(PatternModel, FrameDependsOnlyOnSeedAndFrameIndex) {
  const PatternModel model(small_options());
  PatternModel::Scratch shared_scratch;
  std::vector<std::uint8_t> after_other(model.frame_bytes());
  // Render another frame first with the same scratch: no state may leak.
  model.render_frame(40, after_other.data(), shared_scratch);
  model.render_frame(7, after_other.data(), shared_scratch);
  EXPECT_EQ(after_other, render(model, 7));
  EXPECT_EQ(render(PatternModel(small_options()), 7), render(model, 7));

  SynthOptions other_seed = small_options();
  other_seed.seed = 12;
  EXPECT_NE(render(PatternModel(other_seed), 7), render(model, 7));
  EXPECT_NE(render(model, 8), render(model, 7));
}

TEST(PatternModel, BadPixelsAreDistinctFlaggedAndAllOnesInEveryFrame) {
  const PatternModel model(small_options());
  ASSERT_EQ(model.bad_pixels().size(), 5u);
  std::set<std::pair<std::uint64_t, std::uint64_t>> positions;
  for (const BadPixel& pixel : model.bad_pixels()) {
    EXPECT_TRUE(pixel.mask_bits == pixel_mask_gap || pixel.mask_bits == pixel_mask_dead);
    positions.insert({pixel.row, pixel.col});
  }
  EXPECT_EQ(positions.size(), 5u);

  const std::vector<std::uint32_t> mask = model.pixel_mask();
  EXPECT_EQ(std::count_if(mask.begin(), mask.end(), [](std::uint32_t bits) { return bits != 0; }), 5);
  for (const std::uint64_t frame_index : {0ull, 13ull, 53ull}) {
    const std::vector<std::uint8_t> bytes = render(model, frame_index);
    for (std::size_t i = 0; i < mask.size(); ++i) {
      std::uint16_t value = 0;
      std::memcpy(&value, bytes.data() + 2 * i, 2);
      if (mask[i] != 0) {
        EXPECT_EQ(value, 0xFFFFu) << "frame " << frame_index << " pixel " << i;
      } else {
        EXPECT_LT(value, 0xFFFFu) << "frame " << frame_index << " pixel " << i;
      }
    }
  }
}

TEST(PatternModel, ClampsUint8CountsAt254) {
  SynthOptions options = small_options();
  options.dtype = DType::uint8;
  options.preset = Preset::dense;
  const PatternModel model(options);
  EXPECT_EQ(model.saturation_count(), 254u);
  const std::vector<std::uint32_t> mask = model.pixel_mask();
  const std::vector<std::uint8_t> frame = render(model, 0);
  std::size_t saturated = 0;
  for (std::size_t i = 0; i < frame.size(); ++i) {
    if (mask[i] != 0) continue;
    EXPECT_LE(frame[i], 254u);
    saturated += frame[i] == 254u;
  }
  EXPECT_GT(saturated, 100u);  // the dense bright-field disk saturates
}

TEST(PatternModel, DenseUint32HoldsCountsAboveSixteenBits) {
  SynthOptions options = small_options();
  options.dtype = DType::uint32;
  options.preset = Preset::dense;
  const PatternModel model(options);
  const std::vector<std::uint32_t> mask = model.pixel_mask();
  const std::vector<std::uint8_t> frame = render(model, 0);
  std::uint32_t largest = 0;
  for (std::size_t i = 0; i < mask.size(); ++i) {
    std::uint32_t value = 0;
    std::memcpy(&value, frame.data() + 4 * i, 4);
    if (mask[i] == 0) largest = std::max(largest, value);
  }
  EXPECT_GT(largest, 65535u);
  EXPECT_LT(largest, 0xFFFFFFFFu);
}

TEST(PatternModel, ProbeIsDeflectedByAFewPixelsAroundTheDetectorCentre) {
  SynthOptions options = small_options();
  options.scan_rows = 24;
  options.scan_cols = 24;
  options.detector_rows = 192;
  options.detector_cols = 192;
  const PatternModel model(options);
  EXPECT_NEAR(model.disk_radius(), 31.0, 1.0);
  double min_row = 1e9, max_row = -1e9, min_col = 1e9, max_col = -1e9, min_bf = 1e9, max_bf = 0;
  std::set<std::uint32_t> grains;
  for (std::uint64_t row = 0; row < options.scan_rows; ++row) {
    for (std::uint64_t col = 0; col < options.scan_cols; ++col) {
      const ProbeState state = model.probe_state(row, col);
      min_row = std::min(min_row, state.centre_row);
      max_row = std::max(max_row, state.centre_row);
      min_col = std::min(min_col, state.centre_col);
      max_col = std::max(max_col, state.centre_col);
      min_bf = std::min(min_bf, state.bright_field);
      max_bf = std::max(max_bf, state.bright_field);
      grains.insert(state.grain);
    }
  }
  // Within 5 px of the centre (95.5, 95.5), but moving by more than 2 px.
  EXPECT_GT(min_row, 90.5);
  EXPECT_LT(max_row, 100.5);
  EXPECT_GT(min_col, 90.5);
  EXPECT_LT(max_col, 100.5);
  EXPECT_GT(max_row - min_row, 2.0);
  EXPECT_GT(max_col - min_col, 2.0);
  EXPECT_GT(max_bf / min_bf, 1.2);  // thickness contrast
  EXPECT_GT(grains.size(), 4u);
}

TEST(PatternModel, RejectsInvalidShapesAndTooManyBadPixels) {
  SynthOptions options = small_options();
  options.scan_rows = 0;
  EXPECT_THROW(PatternModel{options}, Error);
  options = small_options();
  options.detector_cols = 0;
  EXPECT_THROW(PatternModel{options}, Error);
  options = small_options();
  options.bad_pixels = options.detector_rows * options.detector_cols;
  try {
    PatternModel model(options);
    ADD_FAILURE() << "expected bad_request";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::bad_request);
  }
}

}  // namespace
}  // namespace quantem::synth
