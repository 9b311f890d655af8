#pragma once
// The physics behind `quantem-gpu synth`: a deterministic 4D-STEM pattern model
// and its counting noise (host only, no HDF5, no threads).
//
// One frame per scan position (frame_index = scan_row * scan_cols + scan_col).
// The sample is a set of grains (a Voronoi tessellation of the scan) on a
// smoothly varying thickness:
//  - a bright-field disk of radius min(detector_rows, detector_cols) / 6.2 with a
//    soft (logistic) edge, centred on the detector and deflected by a few pixels
//    by a smooth field plus a per-grain tilt, so centre-of-mass images show
//    structure; its intensity falls as exp(-thickness) (BF contrast);
//  - diffuse scattering around the disk centre, growing with thickness and falling
//    off as (1 + (r/r_h)^2)^-1.5 (ADF contrast);
//  - twelve Bragg spots (two hexagonal orders) whose orientation and strength
//    change from grain to grain;
//  - for the dense preset only, a very bright focused spot in the disk centre
//    (peak 150 000 counts: the uint32 path then holds counts above 65 535);
//  - Poisson counting noise.
// Counts are clamped to 2^bits - 2 (254 for uint8, 65 534 for uint16): the
// all-ones value 2^bits - 1 is reserved for the bad pixels of pixel_mask, which
// hold it in every frame (Arina's convention for masked pixels).
//
// Determinism: the acquisition's structure (grains, fields, bad pixels) depends
// only on the seed and the shapes, and each frame draws its noise from its own
// stream seeded from (seed, frame_index), so a frame's bytes do not depend on
// which thread renders it or in which order.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quantem/core/dtype.hpp"
#include "quantem/synth/synth.hpp"

namespace quantem::synth {

// splitmix64 (Steele, Lea, Flood 2014): one 64-bit add and a finaliser per draw.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) noexcept : state_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

// The seed of one frame's noise stream: a hash of (seed, frame_index).
std::uint64_t frame_seed(std::uint64_t seed, std::uint64_t frame_index) noexcept;

// Poisson counts for a mean. Means below kInversionLimit are sampled exactly by
// sequential inversion of the CDF (one uniform, one exp, about mean + 1 steps);
// larger means use the normal approximation floor(mean + sqrt(mean) * z + 1/2)
// (Box-Muller z, clamped at 0), whose mean and variance match Poisson's to
// within a few per cent of one count.
class PoissonSampler {
 public:
  static constexpr double kInversionLimit = 32.0;

  PoissonSampler();

  // One draw. A non-positive or NaN mean gives 0.
  std::uint64_t sample(double mean, SplitMix64& random) const noexcept {
    return sample(mean, std::exp(-mean), random);
  }
  // The same draw given exp(-mean) precomputed (the frame renderer shares one
  // exp per radial sample instead of one per pixel).
  std::uint64_t sample(double mean, double exp_minus_mean, SplitMix64& random) const noexcept;

 private:
  static constexpr int kMaxInversionCount = 256;
  std::vector<double> inverse_count_;  // 1 / k
};

// The mask bit a bad pixel carries in pixel_mask (NXdetector's pixel_mask bits).
enum PixelMaskBit : std::uint32_t { pixel_mask_gap = 1u << 0, pixel_mask_dead = 1u << 1 };

struct BadPixel {
  std::uint64_t row = 0;
  std::uint64_t col = 0;
  std::uint32_t mask_bits = 0;
};

// The noise-free state of the probe at one scan position.
struct ProbeState {
  double centre_row = 0;         // bright-field disk centre, detector pixels
  double centre_col = 0;
  double thickness = 0;          // in inelastic mean free paths
  double bright_field = 0;       // mean counts per pixel inside the disk
  double diffuse = 0;            // scale of the diffuse halo, counts per pixel
  double bragg_peak = 0;         // peak mean counts of a first-order Bragg spot
  double bragg_angle = 0;        // radians, orientation of the grain's lattice
  std::uint32_t grain = 0;       // index of the grain under the probe
};

// Mean doses per preset, in counts per pixel at zero thickness.
struct PresetDose {
  double bright_field = 0;
  double diffuse = 0;
  double bragg_peak = 0;
  double central_spot = 0;  // dense only
};
PresetDose preset_dose(Preset preset) noexcept;

class PatternModel {
 public:
  // Throws quantem::Error (bad_request) on invalid shapes or too many bad pixels.
  explicit PatternModel(const SynthOptions& options);

  std::uint64_t frame_count() const noexcept { return scan_rows_ * scan_cols_; }
  std::size_t frame_elements() const noexcept { return detector_rows_ * detector_cols_; }
  std::size_t frame_bytes() const noexcept { return frame_elements() * dtype_size(dtype_); }
  DType dtype() const noexcept { return dtype_; }
  double disk_radius() const noexcept { return disk_radius_; }
  // The largest count a non-masked pixel can hold: 2^bits - 2.
  std::uint32_t saturation_count() const noexcept { return dtype_max(dtype_) - 1; }

  const std::vector<BadPixel>& bad_pixels() const noexcept { return bad_pixels_; }
  // pixel_mask as stored in the master: uint32[detector_rows][detector_cols].
  std::vector<std::uint32_t> pixel_mask() const;

  ProbeState probe_state(std::uint64_t scan_row, std::uint64_t scan_col) const noexcept;

  // Per-thread working memory, reused from frame to frame.
  struct Scratch {
    std::vector<float> means;                   // frame_elements()
    std::vector<float> zero_probabilities;      // exp(-means)
    std::vector<float> radial;                  // the frame's radial profile
    std::vector<float> radial_zero_probability; // exp(-radial)
  };

  // Mean counts of one frame (no noise, no clamping, no bad pixels) into
  // scratch.means (resized to frame_elements(), row-major), and exp(-mean)
  // into scratch.zero_probabilities.
  void render_means(std::uint64_t frame_index, Scratch& scratch) const;

  // One frame of counts as little-endian elements of dtype() into `out`
  // (frame_bytes() bytes).
  void render_frame(std::uint64_t frame_index, std::uint8_t* out, Scratch& scratch) const;

 private:
  struct Grain {
    double u = 0, v = 0;            // position in the unit scan square
    double tilt_row = 0, tilt_col = 0;
    double thickness_offset = 0;
    double bragg_strength = 0;
    double bragg_angle = 0;
  };

  template <typename Element>
  void sample_frame(std::uint64_t frame_index, const Scratch& scratch, std::uint8_t* out) const;

  std::uint64_t seed_;
  std::uint64_t scan_rows_, scan_cols_;
  std::size_t detector_rows_, detector_cols_;
  DType dtype_;
  PresetDose dose_;
  double disk_radius_ = 0;
  double deflection_amplitude_ = 0;
  double bragg_radius_ = 0;
  double bragg_sigma_ = 0;
  double central_spot_sigma_ = 0;
  double field_phase_[4] = {};
  std::vector<Grain> grains_;
  std::vector<BadPixel> bad_pixels_;
  // Radial profiles sampled every 1/kRadialSteps pixel.
  static constexpr int kRadialSteps = 16;
  std::vector<float> disk_profile_;     // logistic edge, 1 inside, 0 outside
  std::vector<float> diffuse_profile_;  // (1 + (r/r_h)^2)^-1.5
  PoissonSampler sampler_;
};

}  // namespace quantem::synth
