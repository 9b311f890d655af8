// GPU codec benchmark (prints JSON): bitshuffle/LZ4 decode GB/s, ANS encode and
// decode throughput, resident / on-disk bytes, a pipelined load to the ANS
// resident (host-to-device, decode, encode; file reads excluded), and a
// full-scan masked sum from the ANS resident against a plain masked sum over
// the same volume held dense on the same GPU.
//
// Frames come from the synth pattern model (quantem::synth::PatternModel):
// --unique-frames distinct frames are rendered on the host and repeated to
// fill the scan (the stored chunks are copied, so every chunk is a distinct
// region of device memory). Usage:
//   bench_gpu_codec [--scan-rows 512] [--scan-cols 512] [--detector 192]
//                   [--dtype uint16|uint32] [--preset realistic|sparse|dense]
//                   [--unique-frames 8192] [--frames-per-group 2048] [--disk-radius 31]
//                   [--repeats 5] [--full-decode 1] [--load-batch-frames 16384] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_gpu_kernels.hpp"
#include "bench_support.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/kernels/ans.hpp"
#include "quantem/kernels/bitshuffle_lz4.hpp"
#include "quantem/kernels/device.hpp"
#include "quantem/synth/pattern_model.hpp"

using namespace quantem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

using bench::median;
using bench::parallel_for;

std::size_t align_up(std::size_t value, std::size_t alignment) { return (value + alignment - 1) / alignment * alignment; }

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args = {
      {"scan-rows", "512"},  {"scan-cols", "512"},      {"detector", "192"},       {"dtype", "uint16"},
      {"preset", "realistic"}, {"unique-frames", "8192"}, {"frames-per-group", "2048"}, {"disk-radius", "31"},
      {"repeats", "5"},      {"full-decode", "1"},      {"load-batch-frames", "16384"}, {"json", ""}};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0 || !args.count(key.substr(2))) {
      std::cerr << "unknown argument " << key << "\n";
      return 2;
    }
    args[key.substr(2)] = argv[i + 1];
  }
  try {
    if (kernels::device_count() == 0) {
      std::cerr << "bench_gpu_codec: no CUDA device\n";
      return 1;
    }
    const std::uint64_t scan_rows = std::stoull(args["scan-rows"]);
    const std::uint64_t scan_cols = std::stoull(args["scan-cols"]);
    const std::uint32_t detector = static_cast<std::uint32_t>(std::stoul(args["detector"]));
    const DType dtype = *dtype_from_name(args["dtype"]);
    const std::size_t element_size = dtype_size(dtype);
    const std::uint64_t frames = scan_rows * scan_cols;
    const std::uint64_t unique = std::min<std::uint64_t>(std::stoull(args["unique-frames"]), frames);
    const std::uint32_t frames_per_group = static_cast<std::uint32_t>(std::stoul(args["frames-per-group"]));
    const int repeats = std::stoi(args["repeats"]);
    const double disk_radius = std::stod(args["disk-radius"]);
    const std::uint32_t pixels = detector * detector;
    const std::size_t frame_bytes = std::size_t{pixels} * element_size;
    nlohmann::json report;
    report["device"] = kernels::device_name(0);
    report["shape"] = {scan_rows, scan_cols, detector, detector};
    report["dtype"] = dtype_name(dtype);
    report["preset"] = args["preset"];
    report["unique_frames"] = unique;
    report["frames_per_group"] = frames_per_group;

    // 1. Frames on the host (synth pattern model), bitshuffle/LZ4 chunks.
    auto start = Clock::now();
    synth::SynthOptions options;
    options.scan_rows = scan_rows;
    options.scan_cols = scan_cols;
    options.detector_rows = detector;
    options.detector_cols = detector;
    options.dtype = dtype;
    options.preset = *synth::preset_from_name(args["preset"]);
    options.bad_pixels = 0;
    const synth::PatternModel model(options);
    std::vector<std::uint8_t> unique_frames(unique * frame_bytes);
    std::vector<std::vector<std::uint8_t>> unique_chunks(unique);
    parallel_for(unique, [&](std::size_t i) {
      thread_local synth::PatternModel::Scratch scratch;
      // Spread the unique frames over the scan so they sample its structure.
      const std::uint64_t frame_index = (i * 2654435761ull) % frames;
      model.render_frame(frame_index, unique_frames.data() + i * frame_bytes, scratch);
      unique_chunks[i] = codec::encode_bitshuffle_lz4(unique_frames.data() + i * frame_bytes, pixels, element_size);
    });
    report["host_generate_seconds"] = seconds_since(start);

    std::vector<std::uint64_t> offsets(frames);
    std::vector<std::uint32_t> sizes(frames);
    std::uint64_t stored_bytes = 0;
    for (std::uint64_t f = 0; f < frames; ++f) {
      offsets[f] = stored_bytes;
      sizes[f] = static_cast<std::uint32_t>(unique_chunks[f % unique].size());
      stored_bytes += sizes[f];
    }
    start = Clock::now();
    kernels::PinnedBuffer pinned(stored_bytes);
    parallel_for(frames, [&](std::size_t f) {
      std::memcpy(pinned.as<std::uint8_t>() + offsets[f], unique_chunks[f % unique].data(), sizes[f]);
    });
    report["host_stage_seconds"] = seconds_since(start);
    report["stored_bytes"] = stored_bytes;
    report["dense_bytes"] = frames * frame_bytes;
    report["stored_bytes_per_frame"] = static_cast<double>(stored_bytes) / static_cast<double>(frames);

    // 2. Host-to-device copy of the stored chunks (pinned, one copy).
    kernels::DeviceBuffer d_stored(stored_bytes);
    kernels::DeviceBuffer d_offsets(frames * sizeof(std::uint64_t));
    kernels::DeviceBuffer d_sizes(frames * sizeof(std::uint32_t));
    kernels::copy_to_device(d_offsets.data(), offsets.data(), d_offsets.size());
    kernels::copy_to_device(d_sizes.data(), sizes.data(), d_sizes.size());
    bench::EventTimer timer;
    {
      std::vector<double> times;
      for (int r = 0; r < 3; ++r) {
        start = Clock::now();
        kernels::copy_to_device(d_stored.data(), pinned.data(), stored_bytes);
        times.push_back(seconds_since(start));
      }
      report["h2d_seconds"] = median(times);
      report["h2d_GBps"] = static_cast<double>(stored_bytes) / median(times) / 1e9;
    }

    // 3. bitshuffle/LZ4 decode of every frame into a dense volume.
    kernels::DeviceBuffer d_dense(frames * frame_bytes);
    kernels::DeviceBuffer d_status(frames * sizeof(std::uint32_t));
    kernels::BitshuffleLz4Batch batch;
    batch.d_stored = d_stored.as<std::uint8_t>();
    batch.stored_bytes = stored_bytes;
    batch.d_chunk_offsets = d_offsets.as<std::uint64_t>();
    batch.d_chunk_sizes = d_sizes.as<std::uint32_t>();
    batch.chunk_count = frames;
    batch.element_size = element_size;
    batch.elements_per_chunk = pixels;
    batch.d_decoded = d_dense.as<std::uint8_t>();
    batch.d_status = d_status.as<std::uint32_t>();
    kernels::DeviceBuffer d_decode_scratch(kernels::bitshuffle_lz4_scratch_bytes(batch));
    {
      std::vector<double> times;
      for (int r = 0; r < repeats + 1; ++r) {
        timer.start(nullptr);
        kernels::decode_bitshuffle_lz4(batch, d_decode_scratch.data(), d_decode_scratch.size(), nullptr);
        const double ms = timer.stop_ms(nullptr);
        if (r > 0) times.push_back(ms / 1e3);  // the first run warms up
      }
      std::vector<std::uint32_t> status(frames);
      kernels::copy_to_host(status.data(), d_status.data(), d_status.size());
      const auto failed = std::count_if(status.begin(), status.end(), [](std::uint32_t s) { return s != 0; });
      std::vector<std::uint8_t> check(unique * frame_bytes);
      kernels::copy_to_host(check.data(), d_dense.data(), check.size());
      report["bslz4_decode"] = {
          {"seconds_median", median(times)},
          {"seconds_all", times},
          {"decoded_GBps", static_cast<double>(frames * frame_bytes) / median(times) / 1e9},
          {"stored_GBps", static_cast<double>(stored_bytes) / median(times) / 1e9},
          {"frames_per_second", static_cast<double>(frames) / median(times)},
          {"failed_chunks", failed},
          {"matches_host_frames", check == unique_frames}};
    }

    // 4. ANS encode of the whole dense volume (one batch of groups).
    kernels::AnsEncodeBatch encode;
    encode.d_frames = d_dense.data();
    encode.dtype = dtype;
    encode.total_frames = frames;
    encode.frames_per_group = frames_per_group;
    encode.detector_rows = detector;
    encode.detector_cols = detector;
    kernels::DeviceBuffer d_encode_scratch(kernels::ans_encode_scratch_bytes(encode));
    std::vector<std::uint64_t> group_sizes = kernels::ans_encode_measure(encode, d_encode_scratch.data(), d_encode_scratch.size(), nullptr);
    std::vector<std::uint64_t> group_offsets(group_sizes.size());
    std::uint64_t resident_bytes = 0;
    for (std::size_t g = 0; g < group_sizes.size(); ++g) {
      group_offsets[g] = resident_bytes;
      resident_bytes += align_up(group_sizes[g], 256);
    }
    kernels::DeviceBuffer d_resident(resident_bytes);
    kernels::DeviceBuffer d_group_offsets(group_offsets.size() * sizeof(std::uint64_t));
    kernels::copy_to_device(d_group_offsets.data(), group_offsets.data(), d_group_offsets.size());
    {
      std::vector<double> measure_times, write_times;
      for (int r = 0; r < std::max(1, repeats / 2); ++r) {
        start = Clock::now();
        kernels::ans_encode_measure(encode, d_encode_scratch.data(), d_encode_scratch.size(), nullptr);
        measure_times.push_back(seconds_since(start));
        timer.start(nullptr);
        kernels::ans_encode_write(encode, d_encode_scratch.data(), d_encode_scratch.size(), d_resident.as<std::uint8_t>(),
                               d_group_offsets.as<std::uint64_t>(), nullptr);
        write_times.push_back(timer.stop_ms(nullptr) / 1e3);
      }
      const double total = median(measure_times) + median(write_times);
      report["ans_encode"] = {{"measure_seconds", median(measure_times)},
                              {"write_seconds", median(write_times)},
                              {"seconds", total},
                              {"dense_GBps", static_cast<double>(frames * frame_bytes) / total / 1e9},
                              {"groups", group_sizes.size()}};
      report["resident_bytes"] = resident_bytes;
      report["resident_over_stored"] = static_cast<double>(resident_bytes) / static_cast<double>(stored_bytes);
      report["resident_over_dense"] = static_cast<double>(resident_bytes) / static_cast<double>(frames * frame_bytes);
      report["resident_bits_per_pixel"] = 8.0 * static_cast<double>(resident_bytes) / static_cast<double>(frames * pixels);
    }
    kernels::AnsResidentView resident;
    resident.d_blobs = d_resident.as<std::uint8_t>();
    resident.d_group_offsets = d_group_offsets.as<std::uint64_t>();
    resident.group_count = group_sizes.size();
    resident.frames_per_group = frames_per_group;
    resident.total_frames = frames;
    resident.detector_rows = detector;
    resident.detector_cols = detector;
    kernels::DeviceBuffer d_error(sizeof(std::uint32_t));
    kernels::fill_device(d_error.data(), 0, d_error.size());

    // 5. ANS full decode back to dense, compared with the bitshuffle/LZ4 decode.
    if (args["full-decode"] != "0") {
      kernels::DeviceBuffer d_dense2(frames * frame_bytes);
      std::vector<double> times;
      for (int r = 0; r < repeats + 1; ++r) {
        timer.start(nullptr);
        kernels::ans_decode_frames(resident, 0, resident.group_count, dtype, d_dense2.data(), d_error.as<std::uint32_t>(),
                                nullptr);
        const double ms = timer.stop_ms(nullptr);
        if (r > 0) times.push_back(ms / 1e3);
      }
      report["ans_decode"] = {
          {"seconds_median", median(times)},
          {"dense_GBps", static_cast<double>(frames * frame_bytes) / median(times) / 1e9},
          {"symbols_per_second", static_cast<double>(frames * pixels) / median(times)},
          {"differing_bytes", bench::count_differences(d_dense.as<std::uint8_t>(), d_dense2.as<std::uint8_t>(), d_dense.size())}};
    }

    // 6. Masked sum: BF disk from the ANS resident vs dense.
    std::vector<std::uint8_t> mask(pixels, 0);
    std::vector<std::uint32_t> mask_pixels;
    for (std::uint32_t r = 0; r < detector; ++r)
      for (std::uint32_t c = 0; c < detector; ++c) {
        const double dr = r + 0.5 - detector / 2.0;
        const double dc = c + 0.5 - detector / 2.0;
        if (dr * dr + dc * dc <= disk_radius * disk_radius) {
          mask[r * detector + c] = 1;
          mask_pixels.push_back(r * detector + c);
        }
      }
    std::vector<std::uint32_t> word_entries;  // 32-bit words holding masked pixels, with a 2-bit pixel mask
    for (std::uint32_t w = 0; w < pixels / 2; ++w) {
      const std::uint32_t bits = (mask[2 * w] ? 1u : 0u) | (mask[2 * w + 1] ? 2u : 0u);
      if (bits) word_entries.push_back(w | (bits << 30));
    }
    const kernels::AnsMaskedStreams masked(mask, detector, detector);
    kernels::DeviceBuffer d_ans_sums(frames * sizeof(std::uint64_t));
    kernels::DeviceBuffer d_dense_sums(frames * sizeof(std::uint64_t));
    kernels::DeviceBuffer d_word_entries(word_entries.size() * sizeof(std::uint32_t));
    kernels::copy_to_device(d_word_entries.data(), word_entries.data(), d_word_entries.size());
    std::vector<double> ans_times, dense_times;
    for (int r = 0; r < 4 * repeats + 1; ++r) {
      timer.start(nullptr);
      kernels::ans_masked_sum(resident, masked, d_ans_sums.as<std::uint64_t>(), d_error.as<std::uint32_t>(), nullptr);
      const double ans_ms = timer.stop_ms(nullptr);
      double dense_ms = 0;
      if (dtype == DType::uint16) {
        timer.start(nullptr);
        bench::dense_masked_sum_u16(d_dense.as<std::uint16_t>(), frames, pixels, d_word_entries.as<std::uint32_t>(),
                                    static_cast<std::uint32_t>(word_entries.size()), d_dense_sums.as<std::uint64_t>(),
                                    nullptr);
        dense_ms = timer.stop_ms(nullptr);
      }
      if (r > 0) {
        ans_times.push_back(ans_ms);
        dense_times.push_back(dense_ms);
      }
    }
    std::vector<std::uint64_t> ans_sums(frames), dense_sums(frames);
    kernels::copy_to_host(ans_sums.data(), d_ans_sums.data(), d_ans_sums.size());
    kernels::copy_to_host(dense_sums.data(), d_dense_sums.data(), d_dense_sums.size());
    std::uint32_t error = 0;
    kernels::copy_to_host(&error, d_error.data(), sizeof error);
    nlohmann::json masked_report = {{"disk_radius", disk_radius},
                                    {"mask_pixels", mask_pixels.size()},
                                    {"dense_words_read_per_frame", word_entries.size()},
                                    {"active_streams", masked.active_streams()},
                                    {"decoded_pixels_per_frame", 4 * masked.active_streams()},
                                    {"ans_ms_median", median(ans_times)},
                                    {"ans_ms_all", ans_times},
                                    {"ans_masked_symbols_per_second",
                                     static_cast<double>(frames) * 4 * masked.active_streams() / (median(ans_times) / 1e3)},
                                    {"decode_error_flag", error}};
    if (dtype == DType::uint16) {
      masked_report["dense_ms_median"] = median(dense_times);
      masked_report["dense_ms_all"] = dense_times;
      masked_report["ans_over_dense"] = median(ans_times) / median(dense_times);
      masked_report["sums_identical"] = ans_sums == dense_sums;
      masked_report["sum_of_sums"] = std::accumulate(ans_sums.begin(), ans_sums.end(), std::uint64_t{0});
    }
    report["masked_sum"] = masked_report;

    // 7. Pipelined load to a resident: per batch of frames, H2D (pinned) ->
    //    decode -> measure -> write, on one stream; file reads excluded.
    {
      const std::uint64_t batch_frames =
          std::max<std::uint64_t>(frames_per_group, std::stoull(args["load-batch-frames"]) / frames_per_group * frames_per_group);
      std::uint64_t max_batch_stored = 0;
      for (std::uint64_t first = 0; first < frames; first += batch_frames) {
        const std::uint64_t last = std::min(frames, first + batch_frames);
        max_batch_stored = std::max(max_batch_stored, (last < frames ? offsets[last] : stored_bytes) - offsets[first]);
      }
      const kernels::DeviceMemoryInfo before = kernels::device_memory_info();
      kernels::DeviceBuffer d_stage(max_batch_stored);
      kernels::DeviceBuffer d_batch_offsets(batch_frames * sizeof(std::uint64_t));
      kernels::DeviceBuffer d_batch_dense(batch_frames * frame_bytes);
      kernels::DeviceBuffer d_batch_status(batch_frames * sizeof(std::uint32_t));
      kernels::BitshuffleLz4Batch load_batch = batch;
      load_batch.chunk_count = batch_frames;
      kernels::DeviceBuffer d_batch_decode_scratch(kernels::bitshuffle_lz4_scratch_bytes(load_batch));
      kernels::AnsEncodeBatch load_encode = encode;
      load_encode.total_frames = batch_frames;
      kernels::DeviceBuffer d_batch_encode_scratch(kernels::ans_encode_scratch_bytes(load_encode));
      kernels::DeviceBuffer d_load_resident(resident_bytes + 256 * group_sizes.size());
      kernels::DeviceBuffer d_batch_group_offsets((batch_frames / frames_per_group + 1) * sizeof(std::uint64_t));
      const kernels::DeviceMemoryInfo during = kernels::device_memory_info();
      double h2d = 0, decode = 0, encode_seconds = 0;
      std::uint64_t written = 0;
      std::vector<std::uint64_t> batch_offsets(batch_frames);
      const auto load_start = Clock::now();
      for (std::uint64_t first = 0; first < frames; first += batch_frames) {
        const std::uint64_t count = std::min(batch_frames, frames - first);
        const std::uint64_t begin = offsets[first];
        const std::uint64_t end = first + count < frames ? offsets[first + count] : stored_bytes;
        for (std::uint64_t i = 0; i < count; ++i) batch_offsets[i] = offsets[first + i] - begin;
        auto t = Clock::now();
        kernels::copy_to_device(d_stage.data(), pinned.as<std::uint8_t>() + begin, end - begin);
        kernels::copy_to_device(d_batch_offsets.data(), batch_offsets.data(), count * sizeof(std::uint64_t));
        h2d += seconds_since(t);
        load_batch.d_stored = d_stage.as<std::uint8_t>();
        load_batch.stored_bytes = end - begin;
        load_batch.d_chunk_offsets = d_batch_offsets.as<std::uint64_t>();
        load_batch.d_chunk_sizes = d_sizes.as<std::uint32_t>() + first;
        load_batch.chunk_count = count;
        load_batch.d_decoded = d_batch_dense.as<std::uint8_t>();
        load_batch.d_status = d_batch_status.as<std::uint32_t>();
        t = Clock::now();
        kernels::decode_bitshuffle_lz4(load_batch, d_batch_decode_scratch.data(), d_batch_decode_scratch.size(), nullptr);
        kernels::synchronize_stream(nullptr);
        decode += seconds_since(t);
        t = Clock::now();
        load_encode.d_frames = d_batch_dense.data();
        load_encode.total_frames = count;
        const auto sizes_here = kernels::ans_encode_measure(load_encode, d_batch_encode_scratch.data(),
                                                         d_batch_encode_scratch.size(), nullptr);
        std::vector<std::uint64_t> here(sizes_here.size());
        for (std::size_t g = 0; g < sizes_here.size(); ++g) {
          here[g] = written;
          written += align_up(sizes_here[g], 256);
        }
        if (written > d_load_resident.size()) throw std::runtime_error("load resident arena too small");
        kernels::copy_to_device(d_batch_group_offsets.data(), here.data(), here.size() * sizeof(std::uint64_t));
        kernels::ans_encode_write(load_encode, d_batch_encode_scratch.data(), d_batch_encode_scratch.size(),
                               d_load_resident.as<std::uint8_t>(), d_batch_group_offsets.as<std::uint64_t>(), nullptr);
        kernels::synchronize_stream(nullptr);
        encode_seconds += seconds_since(t);
      }
      const double total = seconds_since(load_start);
      report["pipelined_load"] = {
          {"batch_frames", batch_frames},
          {"seconds", total},
          {"h2d_seconds", h2d},
          {"decode_seconds", decode},
          {"encode_seconds", encode_seconds},
          {"resident_bytes", written},
          {"transition_bytes_beyond_resident",
           d_stage.size() + d_batch_offsets.size() + d_batch_dense.size() + d_batch_status.size() +
               d_batch_decode_scratch.size() + d_batch_encode_scratch.size() + d_batch_group_offsets.size()},
          {"device_bytes_taken_by_load", before.free_bytes - during.free_bytes},
          {"note", "serial stages on one stream, no overlap; file reads excluded; resident arena sized from section 4"}};
    }
    const std::string text = report.dump(2);
    std::cout << text << std::endl;
    if (!args["json"].empty()) std::ofstream(args["json"]) << text << "\n";
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "bench_gpu_codec: " << error.what() << "\n";
    return 1;
  }
}
