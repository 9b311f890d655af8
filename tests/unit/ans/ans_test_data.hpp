#pragma once
// Test frames for the ANS codec suites (CPU and GPU): random and adversarial.
#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quantem/core/dtype.hpp"

namespace quantem::ans_test {

struct TestFrames {
  std::string label;
  DType dtype = DType::uint16;
  std::uint32_t frame_count = 0;
  std::uint32_t rows = 0;
  std::uint32_t cols = 0;
  std::vector<std::uint8_t> bytes;  // little-endian elements
  std::size_t elements() const { return std::size_t{frame_count} * rows * cols; }
};

inline void put(TestFrames& frames, std::size_t index, std::uint32_t value) {
  const std::size_t size = dtype_size(frames.dtype);
  for (std::size_t b = 0; b < size; ++b) frames.bytes[index * size + b] = static_cast<std::uint8_t>(value >> (8 * b));
}

inline std::uint32_t get(const TestFrames& frames, std::size_t index) {
  const std::size_t size = dtype_size(frames.dtype);
  std::uint32_t value = 0;
  for (std::size_t b = 0; b < size; ++b) value |= std::uint32_t{frames.bytes[index * size + b]} << (8 * b);
  return value;
}

// pattern: zero, max, uniform16, uniform32, hot_pixel, sparse, disc, bright, ramp
inline TestFrames make_frames(const std::string& pattern, DType dtype, std::uint32_t frame_count, std::uint32_t rows,
                              std::uint32_t cols, std::uint64_t seed) {
  TestFrames frames;
  frames.label = pattern + "/" + dtype_name(dtype) + "/" + std::to_string(frame_count) + "x" + std::to_string(rows) +
                 "x" + std::to_string(cols);
  frames.dtype = dtype;
  frames.frame_count = frame_count;
  frames.rows = rows;
  frames.cols = cols;
  frames.bytes.assign(frames.elements() * dtype_size(dtype), 0);
  std::mt19937_64 rng(seed);
  const std::uint32_t max_value = dtype_max(dtype);
  std::uniform_int_distribution<std::uint32_t> uniform16(0, std::min<std::uint32_t>(max_value, 0xffffu));
  std::uniform_int_distribution<std::uint32_t> uniform32(0, max_value);
  std::poisson_distribution<std::uint32_t> background(0.05);
  std::poisson_distribution<std::uint32_t> halo(0.6);
  const double centre_row = rows / 2.0;
  const double centre_col = cols / 2.0;
  const double radius = rows / 6.0 + 1.0;
  for (std::uint32_t f = 0; f < frame_count; ++f) {
    std::poisson_distribution<std::uint32_t> bright(20.0 + 10.0 * ((f * 7) % 5));
    for (std::uint32_t r = 0; r < rows; ++r)
      for (std::uint32_t c = 0; c < cols; ++c) {
        const std::size_t index = (std::size_t{f} * rows + r) * cols + c;
        const double dr = r - centre_row;
        const double dc = c - centre_col;
        const double distance = std::sqrt(dr * dr + dc * dc);
        std::uint32_t value = 0;
        if (pattern == "zero") value = 0;
        else if (pattern == "max") value = max_value;
        else if (pattern == "uniform16") value = uniform16(rng);
        else if (pattern == "uniform32") value = uniform32(rng);
        else if (pattern == "hot_pixel") value = (r == rows / 3 && c == cols / 4) ? max_value : 0;
        else if (pattern == "sparse") value = background(rng);
        else if (pattern == "disc") value = distance < radius ? bright(rng) : (distance < 2 * radius ? halo(rng) : background(rng));
        else if (pattern == "bright")  // high-dose disk: classes with raw low bits, some 16-bit escapes
          value = distance < radius ? static_cast<std::uint32_t>(std::max(0.0, 3000.0 + 400.0 * std::sin(f + r) + 60.0 * ((rng() % 1000) / 1000.0 - 0.5)))
                                    : halo(rng);
        else if (pattern == "ramp") value = static_cast<std::uint32_t>((index * 2654435761u) % (std::uint64_t{max_value} + 1));
        put(frames, index, std::min(value, max_value));
      }
  }
  return frames;
}

}  // namespace quantem::ans_test
