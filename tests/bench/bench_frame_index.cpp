// Frame-index benchmark: times catalog::build_frame_index (every shard's chunk
// index read from the file) on a synthesized acquisition, plus a split of its
// two parts measured separately: the HDF5 opens (file, dataset, storage
// description) and the raw chunk-index walk (RawFile + layout + visit_chunks).
// Prints one JSON document.
//
// usage: bench_frame_index [folder [scan_rows scan_cols detector_rows detector_cols [frames_per_shard [repeats]]]]
//   defaults: a fresh temporary folder (removed at exit), 256 512 192 192,
//   50000 frames per shard, 5 repeats. An existing folder with
//   bench_master.h5 of the same shape is reused (nothing is written).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "chunk_index.hpp"
#include "dataset_storage.hpp"
#include "quantem/hdf5/error.hpp"
#include "quantem/hdf5/read.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/synth/synth.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Runs `call` `repeats` times; {min, median} in seconds.
nlohmann::json timings(int repeats, const std::function<void()>& call) {
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    const auto start = Clock::now();
    call();
    seconds.push_back(seconds_since(start));
  }
  std::sort(seconds.begin(), seconds.end());
  return {{"min_s", seconds.front()}, {"median_s", seconds[seconds.size() / 2]}, {"repeats", repeats}};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace quantem;
  std::string folder = argc > 1 ? argv[1] : "";
  std::uint64_t shape[4] = {256, 512, 192, 192};
  for (int i = 0; i < 4 && i + 2 < argc; ++i) shape[i] = std::strtoull(argv[i + 2], nullptr, 10);
  const std::uint64_t frames_per_shard = argc > 6 ? std::strtoull(argv[6], nullptr, 10) : 50000;
  const int repeats = argc > 7 ? std::max(1, std::atoi(argv[7])) : 5;
  const bool temporary = folder.empty();
  if (temporary) {
    folder = (std::filesystem::temp_directory_path() / ("quantem-bench-index-" + std::to_string(::getpid()))).string();
  }
  std::filesystem::create_directories(folder);

  nlohmann::json report;
  report["benchmark"] = "frame_index";
  report["shape"] = {shape[0], shape[1], shape[2], shape[3]};
  report["hardware_threads"] = std::thread::hardware_concurrency();
  int status = 0;
  try {
    const std::string master = folder + "/bench_master.h5";
    catalog::Acquisition acquisition = catalog::inspect_master(master);
    if (!acquisition.status.loadable || acquisition.scan_rows != shape[0] || acquisition.scan_cols != shape[1] ||
        acquisition.detector_rows != shape[2] || acquisition.detector_cols != shape[3]) {
      synth::SynthOptions options;
      options.output_dir = folder;
      options.prefix = "bench";
      options.scan_rows = shape[0];
      options.scan_cols = shape[1];
      options.detector_rows = shape[2];
      options.detector_cols = shape[3];
      options.frames_per_shard = frames_per_shard;
      options.preset = synth::Preset::realistic;
      const synth::SynthReport written = synth::write_acquisition(options);
      report["synth"] = {{"seconds", written.seconds}, {"stored_bytes", written.stored_bytes}};
      acquisition = catalog::inspect_master(written.master_path);
    }
    if (!acquisition.status.loadable) throw std::runtime_error("not loadable: " + acquisition.status.reason);

    catalog::FrameIndex index;
    report["build_frame_index"] = timings(repeats, [&] { index = catalog::build_frame_index(acquisition); });
    report["chunks"] = index.frames.size();
    report["shards"] = index.shard_paths.size();
    report["stored_bytes"] = index.stored_bytes_total;

    // The split, serial, one shard after the other (as build_frame_index did
    // before it walked shards in parallel): HDF5 opens, then the raw walk.
    struct Opened {
      catalog::detail::FileAddressing addressing;
      std::uint64_t header_address = 0;
      std::vector<std::uint64_t> dims, max_dims;
    };
    std::vector<Opened> opened(acquisition.shards.size());
    report["hdf5_open"] = timings(repeats, [&] {
      for (std::size_t s = 0; s < acquisition.shards.size(); ++s) {
        const auto& shard = acquisition.shards[s];
        const auto file = quantem::hdf5::File::open_read_only(shard.file_path);
        const auto dataset = quantem::hdf5::open_dataset(file.id(), shard.dataset_path);
        const auto dims = dataset.space().dims();
        hsize_t max_dims[H5S_MAX_RANK];
        H5Sget_simple_extent_dims(dataset.space().id(), nullptr, max_dims);
        (void)catalog::detail::describe_storage(dataset, dtype_size(acquisition.dtype.value()));
        opened[s].addressing = {file.offset_size(), file.length_size(), file.user_block_size()};
        opened[s].header_address = dataset.object_header_address();
        opened[s].dims.assign(dims.begin(), dims.end());
        opened[s].max_dims.assign(max_dims, max_dims + dims.size());
      }
    });
    std::uint64_t visited = 0;
    report["chunk_visit_serial"] = timings(repeats, [&] {
      visited = 0;
      for (std::size_t s = 0; s < acquisition.shards.size(); ++s) {
        const catalog::detail::RawFile raw(acquisition.shards[s].file_path, opened[s].addressing);
        const auto layout = catalog::detail::read_data_layout(raw, opened[s].header_address);
        catalog::detail::visit_chunks(raw, layout, opened[s].dims, opened[s].max_dims,
                                      [&](const std::uint64_t*, std::uint64_t, std::uint64_t, std::uint32_t) {
                                        ++visited;
                                      });
      }
    });
    report["chunks_visited"] = visited;
  } catch (const std::exception& e) {
    report["error"] = e.what();
    status = 1;
  }
  if (temporary) std::filesystem::remove_all(folder);
  std::cout << report.dump(2) << std::endl;
  return status;
}
