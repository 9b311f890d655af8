// The dense peers of the viewer's request benchmark (prints
// JSON): every product row of bench_http_viewer computed by plain CUDA kernels
// (dense_peer_kernels.cu) over the acquisition held dense on the GPU, so each
// product of the ANS resident has a dense ratio. Per product, median of
// --repeats runs after one warm-up:
//   kernel_ms  CUDA events around the product's kernels only;
//   host_ms    wall time of the whole product as a server would run it: mask
//              built on the host, copied to the device, kernels, the result
//              copied to the host (and, for the fresh plan, the pattern copied
//              back and the bright-field fit run on the host in between).
// Each product's warm-up result is checked against a host computation over
// the same frames (a few positions, whole patterns and frames): "exact".
//
// The volume: --unique-frames frames rendered by the synth pattern model on the
// host and copied to the device, then repeated on the device to fill the scan
// (frame f holds unique frame f mod U), so a 512x512x192x192 uint16 volume
// (19.3 GB) is made in seconds. The host reference reads the unique frames.
// Parameters follow bench_http_viewer: a float parameter moves by 1e-7 per
// request, the fresh-plan rows take a new half-scan crop per request, cbed a
// new position, cbed-region a shifted centre. The BF fit of the full plan is
// computed once (the daemon caches it per plan), from the dense pattern sum.
//
//   bench_dense_peers [--scan-rows 512] [--scan-cols 512] [--detector 192] [--preset realistic]
//                     [--unique-frames 8192] [--repeats 15] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_gpu_kernels.hpp"
#include "bench_support.hpp"
#include "dense_peer_kernels.hpp"
#include "quantem/kernels/device.hpp"
#include "quantem/products/products.hpp"
#include "quantem/synth/pattern_model.hpp"

using namespace quantem;
using bench::ScanRegion;
using Clock = std::chrono::steady_clock;

namespace {

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

using bench::median;
using bench::parallel_for;

// Python's max(a, b), as products.cpp uses it for the annulus radii.
double python_max(double a, double b) { return b > a ? b : a; }

// Detector pixels selected by keep(d²) with d² from integer pixel centres, as products.cpp builds its masks.
std::vector<std::uint8_t> detector_mask(std::uint32_t rows, std::uint32_t cols, double center_row, double center_col,
                                        const std::function<bool(double)>& keep) {
  std::vector<std::uint8_t> mask(std::size_t{rows} * cols);
  for (std::uint32_t r = 0; r < rows; ++r) {
    const double dr = static_cast<double>(r) - center_row;
    for (std::uint32_t c = 0; c < cols; ++c) {
      const double dc = static_cast<double>(c) - center_col;
      mask[std::size_t{r} * cols + c] = keep(dr * dr + dc * dc) ? 1 : 0;
    }
  }
  return mask;
}

// Realspace mask of a BF / ABF / ADF request (inner, outer: fractions of the fitted radius), as products.cpp.
std::vector<std::uint8_t> realspace_mask(std::uint32_t rows, std::uint32_t cols,
                                         const products::BrightFieldGeometry& fit, bool disk, double inner,
                                         double outer) {
  const double inner_px = python_max(0.0, inner * fit.radius);
  const double outer_px = python_max(inner_px + 1.0, outer * fit.radius);
  const double inner_squared = inner_px * inner_px;
  const double outer_squared = outer_px * outer_px;
  return detector_mask(rows, cols, fit.center_row, fit.center_col, [&](double d2) {
    return disk ? d2 <= outer_squared : (d2 >= inner_squared && d2 <= outer_squared);
  });
}

struct Timings {
  std::vector<double> kernel_ms;
  std::vector<double> host_ms;
};

// The dense acquisition: on the device, and its unique frames on the host.
struct DenseVolume {
  std::uint64_t scan_rows = 0;
  std::uint64_t scan_cols = 0;
  std::uint32_t detector_rows = 0;
  std::uint32_t detector_cols = 0;
  std::uint64_t unique = 0;
  std::vector<std::uint16_t> host_unique;  // unique x pixels
  kernels::DeviceBuffer device;               // frames x pixels

  std::uint64_t frames() const { return scan_rows * scan_cols; }
  std::uint32_t pixels() const { return detector_rows * detector_cols; }
  const std::uint16_t* d_frames() const { return device.as<std::uint16_t>(); }
  const std::uint16_t* host_frame(std::uint64_t frame) const {
    return host_unique.data() + (frame % unique) * pixels();
  }
  ScanRegion full() const { return {scan_cols, 0, 0, scan_rows, scan_cols}; }
};

std::uint64_t frame_at(const ScanRegion& region, std::uint64_t position) {
  return (region.first_row + position / region.cols) * region.scan_cols + region.first_col + position % region.cols;
}

// Host references over the unique frames.
std::uint64_t host_masked_sum(const DenseVolume& volume, std::uint64_t frame, const std::vector<std::uint8_t>& mask) {
  const std::uint16_t* values = volume.host_frame(frame);
  std::uint64_t sum = 0;
  for (std::size_t p = 0; p < mask.size(); ++p) sum += mask[p] != 0 ? values[p] : 0u;
  return sum;
}

std::vector<std::uint64_t> host_pattern_sum(const DenseVolume& volume, const std::vector<std::uint64_t>& frames) {
  std::vector<std::uint64_t> copies(volume.unique, 0);  // how often each unique frame occurs
  for (const std::uint64_t frame : frames) ++copies[frame % volume.unique];
  const std::uint32_t pixels = volume.pixels();
  std::vector<std::uint64_t> pattern(pixels, 0);
  const std::uint32_t span = 512;
  parallel_for((pixels + span - 1) / span, [&](std::size_t block) {
    const std::uint32_t begin = static_cast<std::uint32_t>(block) * span;
    const std::uint32_t end = std::min(pixels, begin + span);
    for (std::uint64_t u = 0; u < volume.unique; ++u) {
      if (copies[u] == 0) continue;
      const std::uint16_t* values = volume.host_unique.data() + u * pixels;
      for (std::uint32_t p = begin; p < end; ++p) pattern[p] += copies[u] * values[p];
    }
  });
  return pattern;
}

std::vector<std::uint64_t> region_frames(const ScanRegion& region) {
  std::vector<std::uint64_t> frames(region.positions());
  for (std::uint64_t p = 0; p < frames.size(); ++p) frames[p] = frame_at(region, p);
  return frames;
}

// Positions checked against the host: the first, the second, one a row down, the middle, the last.
std::vector<std::uint64_t> check_positions(std::uint64_t positions, std::uint64_t cols) {
  std::vector<std::uint64_t> picked = {0, 1, cols + 3, positions / 2, positions - 1};
  picked.erase(std::remove_if(picked.begin(), picked.end(), [&](std::uint64_t p) { return p >= positions; }),
               picked.end());
  std::sort(picked.begin(), picked.end());
  picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
  return picked;
}

// One product: run(i) does the whole request i (i < 0: the warm-up) and
// returns its kernel milliseconds; the caller's wall clock gives host_ms.
struct Product {
  std::string name;
  std::function<double(int)> run;
  std::function<bool(std::string&)> check;  // the warm-up's result against the host; describes what it checked
};

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args = {{"scan-rows", "512"},      {"scan-cols", "512"}, {"detector", "192"},
                                             {"preset", "realistic"},   {"unique-frames", "8192"},
                                             {"repeats", "15"},         {"json", ""}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (key.rfind("--", 0) != 0 || !args.count(key.substr(2))) {
      std::cerr << "unknown argument " << key << "\n";
      return 2;
    }
    args[key.substr(2)] = argv[i + 1];
  }
  try {
    if (kernels::device_count() == 0) {
      std::cerr << "bench_dense_peers: no CUDA device\n";
      return 1;
    }
    DenseVolume volume;
    volume.scan_rows = std::stoull(args["scan-rows"]);
    volume.scan_cols = std::stoull(args["scan-cols"]);
    volume.detector_rows = static_cast<std::uint32_t>(std::stoul(args["detector"]));
    volume.detector_cols = volume.detector_rows;
    volume.unique = std::min<std::uint64_t>(std::stoull(args["unique-frames"]), volume.frames());
    const int repeats = std::max(1, std::stoi(args["repeats"]));
    const std::uint64_t frames = volume.frames();
    const std::uint32_t pixels = volume.pixels();
    const std::uint32_t det_rows = volume.detector_rows;
    const std::uint32_t det_cols = volume.detector_cols;
    const std::size_t frame_bytes = std::size_t{pixels} * 2;

    nlohmann::json report;
    report["device"] = kernels::device_name(0);
    report["shape"] = {volume.scan_rows, volume.scan_cols, det_rows, det_cols};
    report["dtype"] = "uint16";
    report["preset"] = args["preset"];
    report["unique_frames"] = volume.unique;
    report["repeats"] = repeats;

    // 1. The volume: unique frames from the pattern model, repeated on the device.
    auto start = Clock::now();
    synth::SynthOptions options;
    options.scan_rows = volume.scan_rows;
    options.scan_cols = volume.scan_cols;
    options.detector_rows = det_rows;
    options.detector_cols = det_cols;
    options.dtype = DType::uint16;
    const auto preset = synth::preset_from_name(args["preset"]);
    if (!preset) throw std::runtime_error("unknown preset " + args["preset"]);
    options.preset = *preset;
    options.bad_pixels = 0;
    const synth::PatternModel model(options);
    volume.host_unique.resize(volume.unique * pixels);
    parallel_for(volume.unique, [&](std::size_t i) {
      thread_local synth::PatternModel::Scratch scratch;
      // Spread the unique frames over the scan so they sample its structure.
      const std::uint64_t frame_index = (i * 2654435761ull) % frames;
      model.render_frame(frame_index, reinterpret_cast<std::uint8_t*>(volume.host_unique.data() + i * pixels), scratch);
    });
    report["host_render_seconds"] = milliseconds_since(start) / 1e3;
    start = Clock::now();
    volume.device = kernels::DeviceBuffer(frames * frame_bytes);
    kernels::copy_to_device(volume.device.data(), volume.host_unique.data(), volume.unique * frame_bytes);
    for (std::uint64_t first = volume.unique; first < frames; first += volume.unique) {
      const std::uint64_t count = std::min(volume.unique, frames - first);
      bench::copy_within_device(volume.device.as<std::uint8_t>() + first * frame_bytes, volume.device.data(),
                                count * frame_bytes);
    }
    report["device_fill_seconds"] = milliseconds_since(start) / 1e3;
    report["dense_bytes"] = frames * frame_bytes;

    // Device buffers of the products' inputs and results (allocated once, as a server's pool would).
    kernels::DeviceBuffer d_entries(std::size_t{pixels} / 2 * 4);
    kernels::DeviceBuffer d_sums(frames * 8);
    kernels::DeviceBuffer d_binned(frames * 8);
    kernels::DeviceBuffer d_row_moment(frames * 8);
    kernels::DeviceBuffer d_col_moment(frames * 8);
    kernels::DeviceBuffer d_pattern(std::size_t{pixels} * 8);
    kernels::DeviceBuffer d_positions(frames * 8);
    bench::EventTimer timer;

    // 2. The full plan's BF fit (cached per plan by the daemon: computed once here), checked on the host.
    std::vector<std::uint64_t> full_pattern(pixels);
    bench::dense_pattern_sum(volume.d_frames(), pixels, volume.full(), d_pattern.as<std::uint64_t>(), nullptr);
    kernels::copy_to_host(full_pattern.data(), d_pattern.data(), d_pattern.size());
    const bool full_pattern_exact = full_pattern == host_pattern_sum(volume, region_frames(volume.full()));
    const products::BrightFieldGeometry fit = products::fit_bright_field(full_pattern, frames, det_rows, det_cols);
    report["bright_field_fit"] = {{"center_row", fit.center_row},
                                  {"center_col", fit.center_col},
                                  {"radius", fit.radius},
                                  {"pattern_sum_exact", full_pattern_exact}};

    // Shared steps of the products.
    auto upload_mask = [&](const std::vector<std::uint8_t>& mask) {
      const std::vector<std::uint32_t> entries = bench::mask_word_entries(mask);
      if (!entries.empty()) kernels::copy_to_device(d_entries.data(), entries.data(), entries.size() * 4);
      return static_cast<std::uint32_t>(entries.size());
    };
    auto tiny = [](int i) { return (i + 1000) * 1e-7; };
    auto crop = [&](int i) {  // bench_http_viewer's crop grid: half the scan, shifted per request
      const std::uint64_t crop_rows = std::max<std::uint64_t>(1, volume.scan_rows / 2);
      const std::uint64_t crop_cols = std::max<std::uint64_t>(1, volume.scan_cols / 2);
      const std::uint64_t span_rows = volume.scan_rows - crop_rows + 1, span_cols = volume.scan_cols - crop_cols + 1;
      const std::uint64_t k = static_cast<std::uint64_t>(i + 1000) % (span_rows * span_cols);
      return ScanRegion{volume.scan_cols, k / span_cols, k % span_cols, crop_rows, crop_cols};
    };

    // The warm-up's inputs and results, kept for the checks.
    struct MaskedResult {
      ScanRegion region;
      std::vector<std::uint8_t> mask;
      std::vector<std::uint64_t> sums;
    };
    std::map<std::string, MaskedResult> masked_results;
    auto masked_product = [&](const std::string& name, const std::function<std::vector<std::uint8_t>(int)>& mask_of) {
      return Product{
          name,
          [&, name, mask_of](int i) {
            const std::vector<std::uint8_t> mask = mask_of(i);
            const std::uint32_t entries = upload_mask(mask);
            const ScanRegion region = volume.full();
            timer.start(nullptr);
            bench::dense_masked_sums(volume.d_frames(), pixels, region, d_entries.as<std::uint32_t>(), entries,
                                     d_sums.as<std::uint64_t>(), nullptr);
            const double kernel_ms = timer.stop_ms(nullptr);
            std::vector<std::uint64_t> sums(region.positions());
            kernels::copy_to_host(sums.data(), d_sums.data(), sums.size() * 8);
            if (i < 0) masked_results[name] = {region, mask, std::move(sums)};
            return kernel_ms;
          },
          [&, name](std::string& what) {
            const MaskedResult& result = masked_results.at(name);
            const auto positions = check_positions(result.region.positions(), result.region.cols);
            what = std::to_string(positions.size()) + " positions";
            return std::all_of(positions.begin(), positions.end(), [&](std::uint64_t p) {
              return result.sums[p] == host_masked_sum(volume, frame_at(result.region, p), result.mask);
            });
          }};
    };

    std::vector<Product> all;
    all.push_back(masked_product(
        "BF", [&](int i) { return realspace_mask(det_rows, det_cols, fit, true, 0.0, 1.0 + tiny(i)); }));
    all.push_back(masked_product(
        "ABF", [&](int i) { return realspace_mask(det_rows, det_cols, fit, false, 0.5 + tiny(i), 1.0); }));
    all.push_back(masked_product(
        "ADF", [&](int i) { return realspace_mask(det_rows, det_cols, fit, false, 1.0 + tiny(i), 3.0); }));
    all.push_back(masked_product("annulus shape", [&](int i) {
      const double inner = 20.0 + tiny(i), outer = 60.0;
      return detector_mask(det_rows, det_cols, det_rows / 2.0, det_cols / 2.0,
                           [&](double d2) { return d2 >= inner * inner && d2 <= outer * outer; });
    }));

    // BF at scan_bin 2: per-frame sums, then 2x2 blocks.
    MaskedResult binned_result;
    all.push_back(Product{
        "BF scan_bin 2",
        [&](int i) {
          const std::vector<std::uint8_t> mask = realspace_mask(det_rows, det_cols, fit, true, 0.0, 1.0 + tiny(i));
          const std::uint32_t entries = upload_mask(mask);
          const ScanRegion region = volume.full();
          timer.start(nullptr);
          bench::dense_masked_sums(volume.d_frames(), pixels, region, d_entries.as<std::uint32_t>(), entries,
                                   d_sums.as<std::uint64_t>(), nullptr);
          bench::bin_scan_sums(d_sums.as<std::uint64_t>(), region.rows, region.cols, 2, d_binned.as<std::uint64_t>(),
                               nullptr);
          const double kernel_ms = timer.stop_ms(nullptr);
          std::vector<std::uint64_t> binned(((region.rows + 1) / 2) * ((region.cols + 1) / 2));
          kernels::copy_to_host(binned.data(), d_binned.data(), binned.size() * 8);
          if (i < 0) binned_result = {region, mask, std::move(binned)};
          return kernel_ms;
        },
        [&](std::string& what) {
          const std::uint64_t binned_rows = (volume.scan_rows + 1) / 2, binned_cols = (volume.scan_cols + 1) / 2;
          const auto positions = check_positions(binned_rows * binned_cols, binned_cols);
          what = std::to_string(positions.size()) + " binned positions";
          return std::all_of(positions.begin(), positions.end(), [&](std::uint64_t p) {
            const std::uint64_t row0 = p / binned_cols * 2, col0 = p % binned_cols * 2;
            std::uint64_t sum = 0;
            for (std::uint64_t r = row0; r < std::min(volume.scan_rows, row0 + 2); ++r)
              for (std::uint64_t c = col0; c < std::min(volume.scan_cols, col0 + 2); ++c)
                sum += host_masked_sum(volume, r * volume.scan_cols + c, binned_result.mask);
            return binned_result.sums[p] == sum;
          });
        }});

    // Centre of mass: exact moments on the device, the float map on the host.
    struct MomentsResult {
      ScanRegion region;
      std::vector<std::uint64_t> total, row_moment, col_moment;
      std::vector<float> map;
    };
    std::map<std::string, MomentsResult> moments_results;
    auto moments_product = [&](const std::string& name, bool columns, const std::function<ScanRegion(int)>& region_of) {
      return Product{
          name,
          [&, name, columns, region_of](int i) {
            const ScanRegion region = region_of(i);
            timer.start(nullptr);
            bench::dense_moments(volume.d_frames(), det_rows, det_cols, region, d_sums.as<std::uint64_t>(),
                                 d_row_moment.as<std::uint64_t>(), d_col_moment.as<std::uint64_t>(), nullptr);
            const double kernel_ms = timer.stop_ms(nullptr);
            MomentsResult result;
            result.region = region;
            const std::uint64_t n = region.positions();
            result.total.resize(n);
            result.row_moment.resize(n);
            result.col_moment.resize(n);
            kernels::copy_to_host(result.total.data(), d_sums.data(), n * 8);
            kernels::copy_to_host(result.row_moment.data(), d_row_moment.data(), n * 8);
            kernels::copy_to_host(result.col_moment.data(), d_col_moment.data(), n * 8);
            const std::vector<std::uint64_t>& moment = columns ? result.col_moment : result.row_moment;
            result.map.resize(n);
            for (std::uint64_t p = 0; p < n; ++p) {
              result.map[p] = result.total[p] == 0
                                  ? 0.0f
                                  : static_cast<float>(static_cast<double>(moment[p]) /
                                                       static_cast<double>(result.total[p]));
            }
            if (i < 0) moments_results[name] = std::move(result);
            return kernel_ms;
          },
          [&, name](std::string& what) {
            const MomentsResult& result = moments_results.at(name);
            const auto positions = check_positions(result.region.positions(), result.region.cols);
            what = std::to_string(positions.size()) + " positions (sum, row and column moments)";
            return std::all_of(positions.begin(), positions.end(), [&](std::uint64_t p) {
              const std::uint16_t* values = volume.host_frame(frame_at(result.region, p));
              std::uint64_t total = 0, rows = 0, cols = 0;
              for (std::uint32_t r = 0; r < det_rows; ++r)
                for (std::uint32_t c = 0; c < det_cols; ++c) {
                  const std::uint64_t value = values[std::size_t{r} * det_cols + c];
                  total += value;
                  rows += r * value;
                  cols += c * value;
                }
              return result.total[p] == total && result.row_moment[p] == rows && result.col_moment[p] == cols;
            });
          }};
    };
    all.push_back(moments_product("CoMx (computed plan)", true, [&](int) { return volume.full(); }));
    all.push_back(moments_product("CoMy (computed plan)", false, [&](int) { return volume.full(); }));

    // BF on a fresh plan: the crop's pattern sum, the same fit, the BF disk, the masked sum.
    struct FreshResult {
      ScanRegion region;
      std::vector<std::uint64_t> pattern;
      products::BrightFieldGeometry fit;
      std::vector<std::uint8_t> mask;
      std::vector<std::uint64_t> sums;
    };
    FreshResult fresh_result;
    all.push_back(Product{
        "BF fresh plan (new crop)",
        [&](int i) {
          FreshResult result;
          result.region = crop(i);
          timer.start(nullptr);
          bench::dense_pattern_sum(volume.d_frames(), pixels, result.region, d_pattern.as<std::uint64_t>(), nullptr);
          double kernel_ms = timer.stop_ms(nullptr);
          result.pattern.resize(pixels);
          kernels::copy_to_host(result.pattern.data(), d_pattern.data(), std::size_t{pixels} * 8);
          result.fit = products::fit_bright_field(result.pattern, result.region.positions(), det_rows, det_cols);
          result.mask = realspace_mask(det_rows, det_cols, result.fit, true, 0.0, 1.0);
          const std::uint32_t entries = upload_mask(result.mask);
          timer.start(nullptr);
          bench::dense_masked_sums(volume.d_frames(), pixels, result.region, d_entries.as<std::uint32_t>(), entries,
                                   d_sums.as<std::uint64_t>(), nullptr);
          kernel_ms += timer.stop_ms(nullptr);
          result.sums.resize(result.region.positions());
          kernels::copy_to_host(result.sums.data(), d_sums.data(), result.sums.size() * 8);
          if (i < 0) fresh_result = std::move(result);
          return kernel_ms;
        },
        [&](std::string& what) {
          const FreshResult& result = fresh_result;
          const auto positions = check_positions(result.region.positions(), result.region.cols);
          what = "the crop's whole pattern sum, its fit and " + std::to_string(positions.size()) + " positions";
          const std::vector<std::uint64_t> pattern = host_pattern_sum(volume, region_frames(result.region));
          const products::BrightFieldGeometry host_fit =
              products::fit_bright_field(pattern, result.region.positions(), det_rows, det_cols);
          const bool same_fit = host_fit.center_row == result.fit.center_row &&
                                host_fit.center_col == result.fit.center_col && host_fit.radius == result.fit.radius;
          return pattern == result.pattern && same_fit &&
                 std::all_of(positions.begin(), positions.end(), [&](std::uint64_t p) {
                   return result.sums[p] == host_masked_sum(volume, frame_at(result.region, p), result.mask);
                 });
        }});
    all.push_back(moments_product("CoMx fresh plan (new crop)", true, [&](int i) { return crop(i + 5000); }));

    // cbed: one frame of the dense volume to the host (widened to the products' uint64 counts).
    std::uint64_t cbed_frame = 0;
    std::vector<std::uint64_t> cbed_counts;
    std::vector<std::uint16_t> cbed_staging(pixels);
    all.push_back(Product{
        "cbed new position",
        [&](int i) {
          const std::uint64_t frame = static_cast<std::uint64_t>(i + 1000) % frames;
          timer.start(nullptr);
          kernels::copy_to_host(cbed_staging.data(), volume.d_frames() + frame * pixels, frame_bytes);
          const double kernel_ms = timer.stop_ms(nullptr);
          std::vector<std::uint64_t> counts(cbed_staging.begin(), cbed_staging.end());
          if (i < 0) {
            cbed_frame = frame;
            cbed_counts = std::move(counts);
          }
          return kernel_ms;
        },
        [&](std::string& what) {
          what = "the whole frame";
          const std::uint16_t* values = volume.host_frame(cbed_frame);
          return cbed_counts == std::vector<std::uint64_t>(values, values + pixels);
        }});

    // cbed-region mean r=5: the frames of the scan disk summed per pixel (the divisor is the count).
    std::vector<std::uint64_t> region_positions;
    std::vector<std::uint64_t> region_sum;
    all.push_back(Product{
        "cbed-region mean r=5",
        [&](int i) {
          products::RegionRequest request;
          request.shape = products::ScanRoiShape::circle;
          request.radius = 5.0;
          request.center_col = volume.scan_cols / 2.0 + tiny(i);
          request.center_row = volume.scan_rows / 2.0;
          request.reduce = products::RegionRequest::Reduce::mean;
          const std::vector<std::uint64_t> positions =
              products::scan_roi_positions(request, volume.scan_rows, volume.scan_cols);
          kernels::copy_to_device(d_positions.data(), positions.data(), positions.size() * 8);
          timer.start(nullptr);
          bench::dense_frames_sum(volume.d_frames(), pixels, d_positions.as<std::uint64_t>(),
                                  static_cast<std::uint32_t>(positions.size()), d_pattern.as<std::uint64_t>(),
                                  nullptr);
          const double kernel_ms = timer.stop_ms(nullptr);
          std::vector<std::uint64_t> sum(pixels);
          kernels::copy_to_host(sum.data(), d_pattern.data(), std::size_t{pixels} * 8);
          if (i < 0) {
            region_positions = positions;
            region_sum = std::move(sum);
          }
          return kernel_ms;
        },
        [&](std::string& what) {
          what = "the whole pattern over " + std::to_string(region_positions.size()) + " positions";
          return !region_positions.empty() && region_sum == host_pattern_sum(volume, region_positions);
        }});

    // 3. Run every product: one warm-up (checked), then `repeats` timed requests.
    bool all_exact = full_pattern_exact;
    nlohmann::json results = nlohmann::json::object();
    for (const Product& product : all) {
      Timings timings;
      for (int i = -1; i < repeats; ++i) {
        const Clock::time_point request_start = Clock::now();
        const double kernel_ms = product.run(i);
        const double host_ms = milliseconds_since(request_start);
        if (i < 0) continue;
        timings.kernel_ms.push_back(kernel_ms);
        timings.host_ms.push_back(host_ms);
      }
      std::string checked;
      const bool exact = product.check(checked);
      all_exact = all_exact && exact;
      results[product.name] = {{"kernel_ms", median(timings.kernel_ms)},
                               {"host_ms", median(timings.host_ms)},
                               {"kernel_ms_min", *std::min_element(timings.kernel_ms.begin(), timings.kernel_ms.end())},
                               {"host_ms_min", *std::min_element(timings.host_ms.begin(), timings.host_ms.end())},
                               {"exact", exact},
                               {"checked", checked}};
      std::fprintf(stderr, "%-28s kernel %9.3f ms  host %9.3f ms  %s (%s)\n", product.name.c_str(),
                   median(timings.kernel_ms), median(timings.host_ms), exact ? "exact" : "MISMATCH", checked.c_str());
    }
    report["products"] = results;
    report["all_exact"] = all_exact;
    const std::string text = report.dump(2);
    std::cout << text << "\n";
    if (!args["json"].empty()) std::ofstream(args["json"]) << text << "\n";
    return all_exact ? 0 : 3;
  } catch (const std::exception& error) {
    std::cerr << "bench_dense_peers: " << error.what() << "\n";
    return 1;
  }
}
