// bench_synth: how fast `quantem-gpu synth` writes, as one JSON object.
//
//   bench_synth [--scan RxC] [--detector RxC] [--dtype uint16] [--preset realistic]
//               [--threads T] [--out DIR] [--keep] [--sample-frames N]
//
// Runs write_acquisition once into DIR (default: a fresh folder under /tmp,
// removed afterwards unless --keep), and separately times, on one thread, the
// two per-frame parallel stages (PatternModel::render_frame and
// codec::encode_bitshuffle_lz4) over N sample frames, in thread CPU time (the
// development machine is shared, so wall time there mostly measures the
// neighbours). From those it extrapolates 512x512 frames at 16 threads:
//   max(512^2 * (render + encode) / 16, 512^2 * writer_seconds_per_frame),
// i.e. perfect scaling of the workers, bounded by the serial HDF5 writer.
// The run's process CPU time per frame is printed too, as a cross-check that
// includes the pipeline's own overhead.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/dtype.hpp"
#include "quantem/synth/pattern_model.hpp"
#include "quantem/synth/synth.hpp"

namespace {

using quantem::synth::PatternModel;
using quantem::synth::SynthOptions;

bool parse_pair(const std::string& text, std::uint64_t& first, std::uint64_t& second) {
  return std::sscanf(text.c_str(), "%llux%llu", reinterpret_cast<unsigned long long*>(&first),
                     reinterpret_cast<unsigned long long*>(&second)) == 2 &&
         first > 0 && second > 0;
}

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "bench_synth: " << why
            << "\nusage: bench_synth [--scan RxC] [--detector RxC] [--dtype uint8|uint16|uint32]"
               " [--preset sparse|realistic|dense] [--threads T] [--out DIR] [--keep] [--sample-frames N]\n";
  std::exit(2);
}

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  SynthOptions options;
  options.scan_rows = 64;
  options.scan_cols = 64;
  options.detector_rows = 192;
  options.detector_cols = 192;
  options.threads = 0;
  std::string out_dir;
  bool keep = false;
  std::uint64_t sample_frames = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--scan") {
      if (!parse_pair(value(), options.scan_rows, options.scan_cols)) usage("bad --scan");
    } else if (arg == "--detector") {
      if (!parse_pair(value(), options.detector_rows, options.detector_cols)) usage("bad --detector");
    } else if (arg == "--dtype") {
      const auto dtype = quantem::dtype_from_name(value());
      if (!dtype) usage("bad --dtype");
      options.dtype = *dtype;
    } else if (arg == "--preset") {
      const auto preset = quantem::synth::preset_from_name(value());
      if (!preset) usage("bad --preset");
      options.preset = *preset;
    } else if (arg == "--threads") {
      options.threads = static_cast<unsigned>(std::stoul(value()));
    } else if (arg == "--out") {
      out_dir = value();
    } else if (arg == "--keep") {
      keep = true;
    } else if (arg == "--sample-frames") {
      sample_frames = std::stoull(value());
    } else {
      usage("unknown argument " + arg);
    }
  }
  if (out_dir.empty()) {
    std::string pattern = (std::filesystem::temp_directory_path() / "bench-synth-XXXXXX").string();
    if (!mkdtemp(pattern.data())) usage("cannot create a temporary folder");
    out_dir = pattern;
  }
  options.output_dir = out_dir;

  // One thread, the two parallel stages, over frames spread across the scan.
  const PatternModel model(options);
  PatternModel::Scratch scratch;
  std::vector<std::uint8_t> frame(model.frame_bytes());
  const std::uint64_t samples = std::max<std::uint64_t>(1, std::min(sample_frames, model.frame_count()));
  const std::uint64_t stride = model.frame_count() / samples;
  double render_seconds = 0, encode_seconds = 0;
  std::uint64_t sample_stored = 0;
  for (std::uint64_t s = 0; s < samples; ++s) {
    const double render_started = thread_cpu_seconds();
    model.render_frame(s * stride, frame.data(), scratch);
    const double encode_started = thread_cpu_seconds();
    const auto chunk = quantem::codec::encode_bitshuffle_lz4(frame.data(), model.frame_elements(),
                                                             quantem::dtype_size(options.dtype));
    encode_seconds += thread_cpu_seconds() - encode_started;
    render_seconds += encode_started - render_started;
    sample_stored += chunk.size();
  }
  const double render_ms = 1e3 * render_seconds / static_cast<double>(samples);
  const double encode_ms = 1e3 * encode_seconds / static_cast<double>(samples);

  const double cpu_before = process_cpu_seconds();
  const quantem::synth::SynthReport report = quantem::synth::write_acquisition(options);
  const double run_cpu_seconds = process_cpu_seconds() - cpu_before;
  if (!keep) std::filesystem::remove_all(out_dir);

  const double frames = static_cast<double>(report.frames);
  const double writer_ms = 1e3 * report.writer_seconds / frames;
  // The target: 512x512 frames of the measured detector, 16 threads.
  const double target_frames = 512.0 * 512.0;
  const double target_parallel = target_frames * (render_ms + encode_ms) * 1e-3 / 16.0;
  const double target_serial = target_frames * writer_ms * 1e-3;

  nlohmann::json out = {
      {"benchmark", "synth"},
      {"scan", {options.scan_rows, options.scan_cols}},
      {"detector", {options.detector_rows, options.detector_cols}},
      {"dtype", quantem::dtype_name(options.dtype)},
      {"preset", options.preset == quantem::synth::Preset::sparse      ? "sparse"
                 : options.preset == quantem::synth::Preset::realistic ? "realistic"
                                                                        : "dense"},
      {"threads", options.threads},
      {"hardware_threads", std::thread::hardware_concurrency()},
      {"frames", report.frames},
      {"seconds", report.seconds},
      {"frames_per_second", frames / report.seconds},
      {"dense_bytes", report.dense_bytes},
      {"stored_bytes", report.stored_bytes},
      {"compression_ratio", static_cast<double>(report.dense_bytes) / static_cast<double>(report.stored_bytes)},
      {"writer_seconds", report.writer_seconds},
      {"process_cpu_ms_per_frame", 1e3 * run_cpu_seconds / frames},
      {"single_thread_sample",
       {{"frames", samples},
        {"render_ms_per_frame", render_ms},
        {"encode_ms_per_frame", encode_ms},
        {"writer_ms_per_frame", writer_ms},
        {"compression_ratio",
         static_cast<double>(samples * model.frame_bytes()) / static_cast<double>(sample_stored)}}},
      {"extrapolated_512x512_16_threads",
       {{"parallel_seconds", target_parallel},
        {"serial_writer_seconds", target_serial},
        {"seconds", std::max(target_parallel, target_serial)},
        {"target_seconds", 60}}},
      {"output_dir", keep ? out_dir : ""},
  };
  std::cout << out.dump(2) << "\n";
  return 0;
}
