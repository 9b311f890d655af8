// Load benchmark of the CUDA backend (prints JSON): an acquisition on disk
// (page cache warm after a first load) loaded to its ANS resident `repeats`
// times; the median load, its stage split, resident / on-disk bytes, the
// admitted transition peak against the measured one, and a full-scan
// bright-field masked sum through the Resident interface.
//
//   cuda_backend_bench MASTER [--repeats N] [--json FILE]
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/backend/cuda_backend.hpp"
#include "quantem/backend/stage_clock.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/kernels/bitshuffle_lz4.hpp"
#include "quantem/kernels/resident_products.hpp"
#include "quantem/plan/plan.hpp"

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace quantem;
  if (argc < 2) {
    std::cerr << "usage: cuda_backend_bench MASTER [--repeats N] [--json FILE] [--frames-per-seek-point K (0: none)]\n"
                 "       [--accumulate-threads 0|512|1024 (0: the per-call rule)] [--decode-tables-at-load 1|0]\n"
                 "       [--bslz4-blocks-per-warp 0..32 (0: the default)] [--bslz4-batched-literals 1|0]\n"
                 "       [--load-only 1 (the loads alone: for a profiler)] [--seek-points-from-encoder 1|0]\n"
                 "       [--frames-per-group N] [--groups-per-batch N] [--sub-batch-frames N] [--staging-mib N] [--prioritise-encoder 1] [--prepare-devices-first 1 (as serve: before run 0)]\n"
                 "       [--keep-frame-index 0|1 (1: loads after the first reuse the kept frame index; 0, the\n"
                 "        default: every load walks the chunk indexes, as a first load does)]\n";
    return 2;
  }
  const std::string master = argv[1];
  int repeats = 5;
  std::string json_path;
  std::uint32_t seek_frames = 0;  // the backend's default
  bool seek_frames_given = false;
  int accumulate_threads = 0;
  int bslz4_blocks_per_warp = 0;
  int bslz4_grid_percent = 0;
  bool bslz4_batched_literals = true;
  bool decode_tables_at_load = true;
  bool load_only = false;
  bool seek_from_encoder = true;
  bool prepare_first = false;
  bool keep_frame_index = false;
  std::uint32_t frames_per_group = 0, groups_per_batch = 0;  // 0: the backend's defaults
  std::uint32_t kept_words_per_frame = 0;                     // 0: the default; 0xffffffff: none
  bool prioritise_encoder = false;
  std::uint32_t sub_batch_frames = 0;                         // 0: the default (chunks per decode launch)
  std::uint64_t staging_mib = 0;                              // 0: the default (per staging slot)
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--frames-per-seek-point") {
      seek_frames = static_cast<std::uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
      seek_frames_given = true;
    }
    if (flag == "--accumulate-threads") accumulate_threads = std::atoi(argv[i + 1]);
    if (flag == "--bslz4-blocks-per-warp") bslz4_blocks_per_warp = std::atoi(argv[i + 1]);
    if (flag == "--bslz4-grid-percent") bslz4_grid_percent = std::atoi(argv[i + 1]);
    if (flag == "--bslz4-batched-literals") bslz4_batched_literals = std::atoi(argv[i + 1]) != 0;
    if (flag == "--decode-tables-at-load") decode_tables_at_load = std::atoi(argv[i + 1]) != 0;
    if (flag == "--kept-words-per-frame") kept_words_per_frame = static_cast<std::uint32_t>(std::atoi(argv[i + 1]));
    if (flag == "--load-only") load_only = std::atoi(argv[i + 1]) != 0;
    if (flag == "--keep-frame-index") keep_frame_index = std::atoi(argv[i + 1]) != 0;
    if (flag == "--prepare-devices-first") prepare_first = std::atoi(argv[i + 1]) != 0;
    if (flag == "--seek-points-from-encoder") seek_from_encoder = std::atoi(argv[i + 1]) != 0;
    if (flag == "--frames-per-group") frames_per_group = static_cast<std::uint32_t>(std::atoi(argv[i + 1]));
    if (flag == "--groups-per-batch") groups_per_batch = static_cast<std::uint32_t>(std::atoi(argv[i + 1]));
    if (flag == "--prioritise-encoder") prioritise_encoder = std::atoi(argv[i + 1]) != 0;
    if (flag == "--sub-batch-frames") sub_batch_frames = static_cast<std::uint32_t>(std::atoi(argv[i + 1]));
    if (flag == "--staging-mib") staging_mib = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--repeats") repeats = std::max(1, std::atoi(argv[i + 1]));
    if (flag == "--json") json_path = argv[i + 1];
  }
  try {
    const catalog::Acquisition acquisition = catalog::inspect_master(master);
    if (!acquisition.status.loadable) {
      std::cerr << master << " is not loadable: " << acquisition.status.reason << "\n";
      return 1;
    }
    backend::CudaBackendOptions options;
    options.device_indices = {0};
    if (seek_frames_given) {
      options.tuning.frames_per_seek_point = seek_frames == 0 ? backend::CudaLoadTuning::kNoSeekPoints : seek_frames;
    }
    options.tuning.decode_tables_at_load = decode_tables_at_load;
    options.tuning.seek_points_from_encoder = seek_from_encoder;
    options.tuning.frames_per_group = frames_per_group;
    options.tuning.kept_words_per_frame = kept_words_per_frame;
    options.tuning.groups_per_batch = groups_per_batch;
    options.tuning.sub_batch_frames = sub_batch_frames;
    options.tuning.prioritise_encoder = prioritise_encoder;
    options.tuning.staging_bytes = staging_mib << 20;
    options.tuning.accumulate_frames_cta_threads = accumulate_threads;
    options.tuning.bslz4_blocks_per_warp = bslz4_blocks_per_warp;
    options.tuning.bslz4_grid_percent = bslz4_grid_percent;
    options.tuning.bslz4_batched_literals = bslz4_batched_literals;
    auto cuda = backend::make_cuda_backend(options);
    const backend::LoadEstimate estimate = cuda->estimate_load(acquisition);
    const auto device = cuda->devices().front();

    if (prepare_first) cuda->prepare_devices();
    std::vector<double> seconds;
    std::vector<backend::CudaLoadReport> reports;
    std::shared_ptr<backend::Resident> resident;
    for (int run = 0; run <= repeats; ++run) {  // run 0 warms the page cache and the runtime
      resident.reset();
      if (!keep_frame_index) cuda->forget_frame_indexes();
      backend::LoadProgress progress;
      resident = cuda->load(acquisition, device.index, progress);
      if (run == 0) continue;
      const backend::CudaLoadReport report = cuda->last_load_report();
      seconds.push_back(report.seconds);
      reports.push_back(report);
    }
    const double median_seconds = median(seconds);
    if (load_only) {  // one line (the backend logs each load's stage split before it); --json: the file too
      const std::string line = nlohmann::json{{"load_seconds", seconds},
                                              {"load_seconds_median", median_seconds},
                                              {"resident_bytes", resident->resident_bytes()}}
                                   .dump();
      std::cout << line << "\n";
      if (!json_path.empty()) std::ofstream(json_path) << line << "\n";
      return 0;
    }
    const auto median_report = *std::min_element(reports.begin(), reports.end(), [&](const auto& a, const auto& b) {
      return std::fabs(a.seconds - median_seconds) < std::fabs(b.seconds - median_seconds);
    });

    // Full-scan BF: a disk of radius 31 at the detector centre, through Resident::masked_sum.
    const plan::PlanGeometry g = plan::resolve_plan({}, acquisition.scan_rows, acquisition.scan_cols,
                                                    acquisition.detector_rows, acquisition.detector_cols);
    std::vector<std::uint8_t> disk(g.detector_pixels());
    std::uint64_t disk_pixels = 0;
    for (std::uint64_t r = 0; r < g.detector_rows; ++r)
      for (std::uint64_t c = 0; c < g.detector_cols; ++c) {
        const double dr = static_cast<double>(r) + 0.5 - static_cast<double>(g.detector_rows) / 2.0;
        const double dc = static_cast<double>(c) + 0.5 - static_cast<double>(g.detector_cols) / 2.0;
        disk[r * g.detector_cols + c] = dr * dr + dc * dc <= 31.0 * 31.0 ? 1 : 0;
        disk_pixels += disk[r * g.detector_cols + c];
      }
    // The first masked sum of a resident just loaded, by stage (what the first
    // BF request on a ready daemon pays beside the load), then twice more.
    nlohmann::ordered_json first_calls = nlohmann::ordered_json::array();
    {
      backend::StageClock clock;
      backend::StageClock::current() = &clock;
      for (int i = 0; i < 3; ++i) {
        clock.start();
        (void)resident->masked_sum_u32(g, disk);
        clock.lap("return");
        nlohmann::ordered_json split;
        for (const auto& [name, ms] : clock.laps()) split[name] = ms;
        first_calls.push_back(split);
      }
      backend::StageClock::current() = nullptr;
    }
    std::vector<double> masked_ms;
    std::uint64_t checksum = 0;
    for (int i = 0; i < 21; ++i) {
      const auto start = std::chrono::steady_clock::now();
      const std::vector<std::uint64_t> image = resident->masked_sum(g, disk);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (i > 0) masked_ms.push_back(ms);
      checksum = 0;
      for (const std::uint64_t v : image) checksum += v;
    }
    // The request primitives in-process (median of 20 after one warm-up),
    // after prepare_devices() as serve calls it at start-up.
    auto primitives = [&]() {
      auto time_ms = [](const std::function<void(int)>& call) {
        std::vector<double> ms;
        for (int i = 0; i < 21; ++i) {
          const auto start = std::chrono::steady_clock::now();
          call(i);
          const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
          if (i > 0) ms.push_back(elapsed);
        }
        return median(ms);
      };
      nlohmann::ordered_json row;
      row["masked_sum_bf"] = time_ms([&](int) { (void)resident->masked_sum(g, disk); });
      row["masked_sum_u32_bf"] = time_ms([&](int) { (void)resident->masked_sum_u32(g, disk); });
      // The fixed cost of the path: no pixel selected (nothing decoded, no
      // ring), and every pixel (every ring whole, nothing decoded).
      const std::vector<std::uint8_t> none(g.detector_pixels(), 0), all(g.detector_pixels(), 1);
      row["masked_sum_u32_empty_mask"] = time_ms([&](int) { (void)resident->masked_sum_u32(g, none); });
      row["masked_sum_u32_full_mask"] = time_ms([&](int) { (void)resident->masked_sum_u32(g, all); });
      // A call's stages (backend::StageClock; median of 20 after one warm-up).
      auto stages_ms = [](const std::function<void(int)>& call) {
        backend::StageClock clock;
        backend::StageClock::current() = &clock;
        std::map<std::string, std::vector<double>> stages;
        for (int i = 0; i < 21; ++i) {
          clock.start();
          call(i);
          clock.lap("return");
          if (i > 0)
            for (const auto& [name, ms] : clock.laps()) stages[name].push_back(ms);
        }
        backend::StageClock::current() = nullptr;
        nlohmann::ordered_json split;
        for (auto& [name, values] : stages) split[name] = median(values);
        return split;
      };
      row["masked_sum_u32_bf_stages"] = stages_ms([&](int) { (void)resident->masked_sum_u32(g, disk); });
      // The masked products of one plan as the viewer asks them (BF, ABF
      // r/2..r, ADF r..3r about the same centre): each alone, then together
      // in one masked_sums_u32 call (one decode pass).
      auto annulus = [&](double inner, double outer) {
        std::vector<std::uint8_t> mask(g.detector_pixels());
        for (std::uint64_t r = 0; r < g.detector_rows; ++r)
          for (std::uint64_t c = 0; c < g.detector_cols; ++c) {
            const double dr = static_cast<double>(r) + 0.5 - static_cast<double>(g.detector_rows) / 2.0;
            const double dc = static_cast<double>(c) + 0.5 - static_cast<double>(g.detector_cols) / 2.0;
            const double d2 = dr * dr + dc * dc;
            mask[r * g.detector_cols + c] = d2 > inner * inner && d2 <= outer * outer ? 1 : 0;
          }
        return mask;
      };
      const std::vector<std::vector<std::uint8_t>> products = {disk, annulus(15.5, 31.0), annulus(31.0, 93.0)};
      row["masked_sum_u32_abf"] = time_ms([&](int) { (void)resident->masked_sum_u32(g, products[1]); });
      row["masked_sum_u32_adf"] = time_ms([&](int) { (void)resident->masked_sum_u32(g, products[2]); });
      row["masked_sums_u32_bf_abf_adf"] = time_ms([&](int) { (void)resident->masked_sums_u32(g, products); });
      row["masked_sums_u32_bf_abf_adf_stages"] = stages_ms([&](int) { (void)resident->masked_sums_u32(g, products); });
      auto new_position = [&](int i) {
        const std::uint64_t k = (static_cast<std::uint64_t>(i) * 7919 + 1000) % (g.scan_rows * g.scan_cols);
        (void)resident->frame(g, k / g.scan_cols, k % g.scan_cols);
      };
      row["frame_new_position"] = time_ms(new_position);
      // A frame that starts a seek segment (column 0 of a 512-wide scan):
      // one frame decoded per stream, so this is the path's fixed cost
      // (decode tables, launch, copies) without the chain to the frame.
      auto segment_start = [&](int i) {
        (void)resident->frame(g, (static_cast<std::uint64_t>(i) * 37 + 5) % g.scan_rows, 0);
      };
      row["frame_at_seek_point"] = time_ms(segment_start);
      row["frame_at_seek_point_stages"] = stages_ms(segment_start);
      row["frame_new_position_stages"] = stages_ms(new_position);
      // A cursor moving along a scan row (the viewer's hover): after the first
      // call, every frame is copied from the recent frames, not decoded.
      auto along_row = [&](int i) {
        const std::uint64_t k = (2000 + static_cast<std::uint64_t>(i + 1)) % (g.scan_rows * g.scan_cols);
        (void)resident->frame_u32(g, k / g.scan_cols, k % g.scan_cols);
      };
      row["frame_u32_along_row"] = time_ms(along_row);
      row["frame_u32_along_row_stages"] = stages_ms(along_row);
      // A fresh crop's pattern sum (what its bright-field fit needs): half the
      // scan in each direction at a new offset each call, as bench_http_viewer's row.
      auto half_crop_pattern = [&](int i) {
        plan::BrowsePlan crop;
        const std::uint64_t rows = acquisition.scan_rows / 2, cols = acquisition.scan_cols / 2;
        const std::uint64_t r = (static_cast<std::uint64_t>(i) * 37 + 3) % (acquisition.scan_rows - rows + 1);
        const std::uint64_t c = (static_cast<std::uint64_t>(i) * 53 + 230) % (acquisition.scan_cols - cols + 1);
        crop.crop = plan::ScanRegion{r, r + rows, c, c + cols};
        const plan::PlanGeometry cropped = plan::resolve_plan(crop, acquisition.scan_rows, acquisition.scan_cols,
                                                              acquisition.detector_rows, acquisition.detector_cols);
        (void)resident->pattern_sum(cropped);
      };
      row["pattern_sum_half_crop"] = time_ms(half_crop_pattern);
      row["pattern_sum_half_crop_stages"] = stages_ms(half_crop_pattern);
      // The same with the resident's tile sums (as the daemon builds them after
      // a load): whole tiles from the table, the edge frames decoded; and a
      // rectangle of 64 x 64 positions at a new place per call (cbed-region).
      const auto tiles_start = std::chrono::steady_clock::now();
      backend::build_tile_sums(resident);
      row["tile_sums_build_ms"] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tiles_start).count();
      row["tile_sums_state"] = backend::tile_sums_state_name(resident->tile_sums().state());
      row["tile_sums_bytes"] = resident->tile_sums().bytes();
      row["pattern_sum_half_crop_with_tile_sums"] = time_ms(half_crop_pattern);
      row["pattern_sum_half_crop_with_tile_sums_stages"] = stages_ms(half_crop_pattern);
      auto rectangle_sum = [&](int i) {
        const std::uint64_t side = std::min<std::uint64_t>(64, std::min(g.scan_rows, g.scan_cols));
        const std::uint64_t r = (static_cast<std::uint64_t>(i) * 29 + 5) % (g.scan_rows - side + 1);
        const std::uint64_t c = (static_cast<std::uint64_t>(i) * 41 + 11) % (g.scan_cols - side + 1);
        std::vector<std::uint64_t> positions;
        positions.reserve(side * side);
        for (std::uint64_t y = r; y < r + side; ++y)
          for (std::uint64_t x = c; x < c + side; ++x) positions.push_back(y * g.scan_cols + x);
        (void)resident->region_reduce_u32(g, positions, backend::RegionReduce::sum);
      };
      row["region_sum_64x64_with_tile_sums"] = time_ms(rectangle_sum);
      return row;
    };
    cuda->prepare_devices();
    const nlohmann::ordered_json request_primitives = primitives();
    std::vector<double> com_ms;
    for (int i = 0; i < 4; ++i) {
      const auto start = std::chrono::steady_clock::now();
      (void)resident->center_of_mass_sums(g);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (i > 0) com_ms.push_back(ms);
    }

    nlohmann::ordered_json out;
    out["master"] = master;
    out["device"] = device.name;
    out["scan"] = {acquisition.scan_rows, acquisition.scan_cols};
    out["detector"] = {acquisition.detector_rows, acquisition.detector_cols};
    out["source_dtype"] = dtype_name(*acquisition.dtype);
    out["resident_dtype"] = dtype_name(resident->resident_dtype());
    out["encoding"] = resident->encoding();
    out["frames_per_seek_point"] = seek_frames_given ? seek_frames : 512;
    out["accumulate_cta_threads"] = accumulate_threads;  // 0: the per-call rule
    out["decode_tables_at_load"] = decode_tables_at_load;
    out["seek_points_from_encoder"] = seek_from_encoder;
    out["frames_per_group"] = frames_per_group;  // 0: the default
    out["kept_words_per_frame"] = kept_words_per_frame;  // 0: the default
    out["bslz4_blocks_per_warp"] = bslz4_blocks_per_warp;  // 0: the default
    out["bslz4_grid_percent"] = bslz4_grid_percent;        // 0: the default (100)
    out["groups_per_batch"] = groups_per_batch;
    out["prioritise_encoder"] = prioritise_encoder;
    out["sub_batch_frames"] = sub_batch_frames;  // 0: the default (4096)
    out["staging_mib"] = staging_mib;            // 0: the default (64)
    out["load_seconds"] = seconds;
    out["load_seconds_median"] = median_seconds;
    out["stage_split_of_median_run"] = {
        {"index_seconds", median_report.index_seconds},
        {"read_seconds_host", median_report.read_seconds},
        {"wait_for_gpu_seconds_host", median_report.wait_seconds},
        {"h2d_seconds_gpu", median_report.gpu_copy_seconds},
        {"decode_seconds_gpu", median_report.gpu_decode_seconds},
        {"encode_seconds_gpu", median_report.gpu_encode_seconds},
        {"batches", median_report.batches},
        {"sub_batches", median_report.sub_batches}};
    out["decode_GBps"] = median_report.gpu_decode_seconds > 0
                             ? static_cast<double>(median_report.dense_bytes) / median_report.gpu_decode_seconds / 1e9
                             : 0.0;
    out["stored_bytes"] = median_report.stored_bytes;
    out["dense_bytes"] = median_report.dense_bytes;
    out["resident_bytes"] = resident->resident_bytes();
    out["resident_over_stored"] =
        static_cast<double>(resident->resident_bytes()) / static_cast<double>(median_report.stored_bytes);
    out["estimate_resident_bytes"] = estimate.resident_bytes;
    out["admitted_peak_bytes"] = estimate.transition_peak_bytes;
    out["reserved_peak_bytes"] = median_report.reserved_peak_bytes;
    out["bound_peak_bytes"] = estimate.max_transition_peak_bytes;
    out["allocated_peak_bytes"] = median_report.allocated_peak_bytes;
    out["measured_peak_bytes_cudaMemGetInfo"] = median_report.measured_peak_bytes;
    out["device_budget_bytes"] = device.budget_bytes;
    out["bf_masked_sum"] = {{"disk_pixels", disk_pixels},
                            {"ms_median_host_inclusive", median(masked_ms)},
                            {"sum_of_image", checksum}};
    out["center_of_mass_sums_ms_median"] = median(com_ms);
    out["request_primitives_ms"] = request_primitives;
    out["first_masked_sums_u32_after_load_stages_ms"] = first_calls;
    const std::string text = out.dump(2);
    std::cout << text << "\n";
    if (!json_path.empty()) std::ofstream(json_path) << text << "\n";
  } catch (const std::exception& error) {
    std::cerr << "cuda_backend_bench: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
