#include "quantem/synth/pattern_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "quantem/core/error.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "synth writes frames as host-order elements");

namespace quantem::synth {

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr std::uint64_t kMaxDetectorSide = 4096;
constexpr std::uint32_t kGrainCount = 10;

std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A stream for the acquisition's structure, distinct from every frame stream.
std::uint64_t structure_seed(std::uint64_t seed) noexcept {
  return mix64(mix64(seed ^ 0x5354525543545552ull) + 0x9E3779B97F4A7C15ull);
}

double uniform_between(SplitMix64& random, double low, double high) noexcept {
  return low + (high - low) * random.uniform();
}

}  // namespace

std::uint64_t frame_seed(std::uint64_t seed, std::uint64_t frame_index) noexcept {
  return mix64(seed ^ mix64(frame_index + 0x632BE59BD9B4E019ull));
}

// ---------------------------------------------------------------------------
// PoissonSampler

PoissonSampler::PoissonSampler() : inverse_count_(kMaxInversionCount + 1, 0.0) {
  for (int k = 1; k <= kMaxInversionCount; ++k) inverse_count_[k] = 1.0 / k;
}

std::uint64_t PoissonSampler::sample(double mean, double exp_minus_mean, SplitMix64& random) const noexcept {
  if (!(mean > 0.0)) return 0;
  if (mean < kInversionLimit) {
    const double u = random.uniform();
    if (u < exp_minus_mean) return 0;  // the common case outside the disk
    double probability = exp_minus_mean;
    double cumulative = probability;
    int count = 0;
    while (u >= cumulative && count < kMaxInversionCount) {
      ++count;
      probability *= mean * inverse_count_[count];
      cumulative += probability;
    }
    return static_cast<std::uint64_t>(count);
  }
  // Box-Muller with u1 in (0, 1].
  const double u1 = 1.0 - random.uniform();
  const double u2 = random.uniform();
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
  const double value = std::floor(mean + std::sqrt(mean) * z + 0.5);
  return value > 0.0 ? static_cast<std::uint64_t>(value) : 0;
}

// ---------------------------------------------------------------------------
// Presets

PresetDose preset_dose(Preset preset) noexcept {
  switch (preset) {
    case Preset::sparse: return {1.2, 0.5, 3.0, 0.0};
    case Preset::realistic: return {22.0, 12.0, 36.0, 0.0};
    case Preset::dense: return {2500.0, 600.0, 5000.0, 150000.0};
  }
  return {};
}

// ---------------------------------------------------------------------------
// PatternModel

PatternModel::PatternModel(const SynthOptions& options)
    : seed_(options.seed),
      scan_rows_(options.scan_rows),
      scan_cols_(options.scan_cols),
      detector_rows_(static_cast<std::size_t>(options.detector_rows)),
      detector_cols_(static_cast<std::size_t>(options.detector_cols)),
      dtype_(options.dtype),
      dose_(preset_dose(options.preset)) {
  if (options.scan_rows == 0 || options.scan_cols == 0) throw bad_request("synth: the scan shape must be positive");
  if (options.detector_rows == 0 || options.detector_cols == 0 || options.detector_rows > kMaxDetectorSide ||
      options.detector_cols > kMaxDetectorSide) {
    throw bad_request("synth: detector rows and cols must be in 1.." + std::to_string(kMaxDetectorSide));
  }
  const std::uint64_t pixels = options.detector_rows * options.detector_cols;
  if (options.bad_pixels > pixels / 2) {
    throw bad_request("synth: at most half of the " + std::to_string(pixels) + " detector pixels can be bad, got " +
                      std::to_string(options.bad_pixels));
  }

  const double rows = static_cast<double>(detector_rows_);
  const double cols = static_cast<double>(detector_cols_);
  const double side = std::min(rows, cols);
  disk_radius_ = side / 6.2;
  deflection_amplitude_ = 0.07 * disk_radius_;
  bragg_radius_ = 1.75 * disk_radius_;
  bragg_sigma_ = std::max(0.8, 0.045 * disk_radius_);
  central_spot_sigma_ = std::max(0.7, 0.04 * disk_radius_);

  SplitMix64 structure(structure_seed(options.seed));
  for (double& phase : field_phase_) phase = uniform_between(structure, 0.0, 2.0 * kPi);
  const double tilt = 0.025 * disk_radius_;
  grains_.resize(kGrainCount);
  for (Grain& grain : grains_) {
    grain.u = structure.uniform();
    grain.v = structure.uniform();
    grain.tilt_row = uniform_between(structure, -tilt, tilt);
    grain.tilt_col = uniform_between(structure, -tilt, tilt);
    grain.thickness_offset = uniform_between(structure, -0.08, 0.08);
    grain.bragg_strength = uniform_between(structure, 0.2, 1.0);
    grain.bragg_angle = uniform_between(structure, 0.0, kPi / 3.0);
  }

  std::set<std::pair<std::uint64_t, std::uint64_t>> taken;
  while (bad_pixels_.size() < options.bad_pixels) {
    const std::uint64_t row = structure.next() % options.detector_rows;
    const std::uint64_t col = structure.next() % options.detector_cols;
    if (!taken.insert({row, col}).second) continue;
    const std::uint32_t bits = bad_pixels_.size() % 2 == 0 ? pixel_mask_gap : pixel_mask_dead;
    bad_pixels_.push_back({row, col, bits});
  }

  // Radial profiles long enough for the farthest corner from a deflected centre.
  const double max_radius = std::hypot(rows, cols) + 4.0 * (deflection_amplitude_ + tilt) + 4.0;
  const auto samples = static_cast<std::size_t>(std::ceil(max_radius * kRadialSteps)) + 2;
  disk_profile_.resize(samples);
  diffuse_profile_.resize(samples);
  const double edge_width = std::max(0.5, 0.035 * disk_radius_);
  const double halo_radius = 0.7 * disk_radius_;
  for (std::size_t i = 0; i < samples; ++i) {
    const double r = static_cast<double>(i) / kRadialSteps;
    disk_profile_[i] = static_cast<float>(1.0 / (1.0 + std::exp((r - disk_radius_) / edge_width)));
    const double q = r / halo_radius;
    diffuse_profile_[i] = static_cast<float>(std::pow(1.0 + q * q, -1.0));
  }
}

std::vector<std::uint32_t> PatternModel::pixel_mask() const {
  std::vector<std::uint32_t> mask(frame_elements(), 0u);
  for (const BadPixel& pixel : bad_pixels_) mask[pixel.row * detector_cols_ + pixel.col] |= pixel.mask_bits;
  return mask;
}

ProbeState PatternModel::probe_state(std::uint64_t scan_row, std::uint64_t scan_col) const noexcept {
  const double u = (static_cast<double>(scan_col) + 0.5) / static_cast<double>(scan_cols_);
  const double v = (static_cast<double>(scan_row) + 0.5) / static_cast<double>(scan_rows_);

  std::uint32_t nearest = 0;
  double nearest_distance = std::numeric_limits<double>::infinity();
  for (std::uint32_t g = 0; g < grains_.size(); ++g) {
    const double du = u - grains_[g].u;
    const double dv = v - grains_[g].v;
    const double distance = du * du + dv * dv;
    if (distance < nearest_distance) {
      nearest_distance = distance;
      nearest = g;
    }
  }
  const Grain& grain = grains_[nearest];

  ProbeState state;
  state.grain = nearest;
  const double two_pi = 2.0 * kPi;
  state.centre_row = (static_cast<double>(detector_rows_) - 1.0) / 2.0 +
                     deflection_amplitude_ * std::sin(two_pi * (1.3 * u + 0.4 * v) + field_phase_[0]) + grain.tilt_row;
  state.centre_col = (static_cast<double>(detector_cols_) - 1.0) / 2.0 +
                     deflection_amplitude_ * std::cos(two_pi * (0.6 * u - 1.1 * v) + field_phase_[1]) + grain.tilt_col;
  const double thickness = 0.55 + 0.2 * std::sin(two_pi * (0.9 * u + 0.35 * v) + field_phase_[2]) + 0.15 * (v - 0.5) +
                           0.05 * std::sin(two_pi * (4.1 * u - 3.3 * v) + field_phase_[3]) + grain.thickness_offset;
  state.thickness = std::clamp(thickness, 0.05, 1.5);
  const double transmitted = std::exp(-state.thickness);
  state.bright_field = dose_.bright_field * transmitted;
  state.diffuse = dose_.diffuse * (1.0 - transmitted);
  // Kinematic-like: grows with thickness, then absorbed; 1 at thickness 1.
  state.bragg_peak = dose_.bragg_peak * grain.bragg_strength * state.thickness * std::exp(1.0 - state.thickness);
  state.bragg_angle = grain.bragg_angle;
  return state;
}

namespace {

// Adds amplitude * exp(-d^2 / (2 sigma^2)) around (centre_row, centre_col) over a
// window of +-4 sigma clipped to the detector, keeping zero_probabilities =
// exp(-means) up to date.
void add_gaussian_spot(std::vector<float>& means, std::vector<float>& zero_probabilities, std::size_t rows,
                       std::size_t cols, double centre_row, double centre_col, double sigma, double amplitude) {
  if (amplitude <= 0.0) return;
  const double reach = 4.0 * sigma;
  const double row_low = std::max(0.0, std::ceil(centre_row - reach));
  const double row_high = std::min(static_cast<double>(rows) - 1.0, std::floor(centre_row + reach));
  const double col_low = std::max(0.0, std::ceil(centre_col - reach));
  const double col_high = std::min(static_cast<double>(cols) - 1.0, std::floor(centre_col + reach));
  if (row_low > row_high || col_low > col_high) return;
  const double inverse_two_variance = 1.0 / (2.0 * sigma * sigma);
  for (auto row = static_cast<std::size_t>(row_low); row <= static_cast<std::size_t>(row_high); ++row) {
    const double dy = static_cast<double>(row) - centre_row;
    float* line = means.data() + row * cols;
    float* zero_line = zero_probabilities.data() + row * cols;
    for (auto col = static_cast<std::size_t>(col_low); col <= static_cast<std::size_t>(col_high); ++col) {
      const double dx = static_cast<double>(col) - centre_col;
      const double added = amplitude * std::exp(-(dx * dx + dy * dy) * inverse_two_variance);
      line[col] = static_cast<float>(line[col] + added);
      zero_line[col] = static_cast<float>(std::exp(-static_cast<double>(line[col])));
    }
  }
}

}  // namespace

void PatternModel::render_means(std::uint64_t frame_index, Scratch& scratch) const {
  const std::uint64_t scan_row = frame_index / scan_cols_;
  const std::uint64_t scan_col = frame_index % scan_cols_;
  const ProbeState state = probe_state(scan_row, scan_col);

  const std::size_t samples = disk_profile_.size();
  scratch.radial.resize(samples);
  scratch.radial_zero_probability.resize(samples);
  const auto bright_field = static_cast<float>(state.bright_field);
  const auto diffuse = static_cast<float>(state.diffuse);
  for (std::size_t i = 0; i < samples; ++i) {
    scratch.radial[i] = bright_field * disk_profile_[i] + diffuse * diffuse_profile_[i];
    scratch.radial_zero_probability[i] = static_cast<float>(std::exp(-static_cast<double>(scratch.radial[i])));
  }

  scratch.means.resize(frame_elements());
  scratch.zero_probabilities.resize(frame_elements());
  const auto centre_row = static_cast<float>(state.centre_row);
  const auto centre_col = static_cast<float>(state.centre_col);
  const float* radial = scratch.radial.data();
  const float* radial_zero = scratch.radial_zero_probability.data();
  const auto last = static_cast<std::int32_t>(samples - 1);
  for (std::size_t row = 0; row < detector_rows_; ++row) {
    const float dy = static_cast<float>(row) - centre_row;
    const float dy2 = dy * dy;
    float* line = scratch.means.data() + row * detector_cols_;
    float* zero_line = scratch.zero_probabilities.data() + row * detector_cols_;
    for (std::size_t col = 0; col < detector_cols_; ++col) {
      const float dx = static_cast<float>(col) - centre_col;
      const float r = std::sqrt(dx * dx + dy2);
      const auto index = std::min(static_cast<std::int32_t>(r * kRadialSteps + 0.5f), last);
      line[col] = radial[index];
      zero_line[col] = radial_zero[index];
    }
  }

  // Two hexagonal orders of Bragg spots around the (deflected) transmitted beam.
  const auto add_spot = [&](double row, double col, double sigma, double amplitude) {
    add_gaussian_spot(scratch.means, scratch.zero_probabilities, detector_rows_, detector_cols_, row, col, sigma,
                      amplitude);
  };
  const double second_order_radius = bragg_radius_ * std::sqrt(3.0);
  for (int k = 0; k < 6; ++k) {
    const double first = state.bragg_angle + k * kPi / 3.0;
    add_spot(state.centre_row + bragg_radius_ * std::sin(first), state.centre_col + bragg_radius_ * std::cos(first),
             bragg_sigma_, state.bragg_peak);
    const double second = first + kPi / 6.0;
    add_spot(state.centre_row + second_order_radius * std::sin(second),
             state.centre_col + second_order_radius * std::cos(second), bragg_sigma_, 0.3 * state.bragg_peak);
  }
  // Dense preset only: a focused spot bright enough to need 32-bit counts.
  add_spot(state.centre_row, state.centre_col, central_spot_sigma_, dose_.central_spot * std::exp(-state.thickness));
}

template <typename Element>
void PatternModel::sample_frame(std::uint64_t frame_index, const Scratch& scratch, std::uint8_t* out) const {
  SplitMix64 random(frame_seed(seed_, frame_index));
  const std::uint64_t saturation = saturation_count();
  const std::size_t elements = frame_elements();
  const float* means = scratch.means.data();
  const float* zero_probabilities = scratch.zero_probabilities.data();
  for (std::size_t i = 0; i < elements; ++i) {
    const std::uint64_t count = std::min(sampler_.sample(means[i], zero_probabilities[i], random), saturation);
    const auto value = static_cast<Element>(count);
    std::memcpy(out + i * sizeof(Element), &value, sizeof(Element));  // little-endian host
  }
  const auto all_ones = static_cast<Element>(dtype_max(dtype_));
  for (const BadPixel& pixel : bad_pixels_) {
    std::memcpy(out + (pixel.row * detector_cols_ + pixel.col) * sizeof(Element), &all_ones, sizeof(Element));
  }
}

void PatternModel::render_frame(std::uint64_t frame_index, std::uint8_t* out, Scratch& scratch) const {
  render_means(frame_index, scratch);
  switch (dtype_) {
    case DType::uint8: sample_frame<std::uint8_t>(frame_index, scratch, out); break;
    case DType::uint16: sample_frame<std::uint16_t>(frame_index, scratch, out); break;
    case DType::uint32: sample_frame<std::uint32_t>(frame_index, scratch, out); break;
  }
}

}  // namespace quantem::synth
