#include "quantem/synth/synth.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "quantem/export/arina_writer.hpp"
#include "quantem/hdf5/error.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/clock.hpp"
#include "quantem/core/error.hpp"
#include "quantem/synth/pattern_model.hpp"

namespace quantem::synth {

std::optional<Preset> preset_from_name(const std::string& name) {
  if (name == "sparse") return Preset::sparse;
  if (name == "realistic") return Preset::realistic;
  if (name == "dense") return Preset::dense;
  return std::nullopt;
}

namespace {

constexpr std::uint64_t kDefaultFramesPerShard = 100000;
constexpr std::uint64_t kMaxShards = 999999;  // data_NNNNNN has six digits
constexpr unsigned kMaxThreads = 1024;

std::uint64_t frames_per_shard(const SynthOptions& options) {
  return options.frames_per_shard == 0 ? kDefaultFramesPerShard : options.frames_per_shard;
}

void validate(const SynthOptions& options) {
  if (options.output_dir.empty()) throw bad_request("synth: the output folder is empty");
  if (options.prefix.empty() || options.prefix.find_first_of(std::string("/\\\0", 3)) != std::string::npos ||
      options.prefix == "." || options.prefix == "..") {
    throw bad_request("synth: the prefix must be a plain file name, got '" + options.prefix + "'");
  }
  if (options.scan_rows == 0 || options.scan_cols == 0) throw bad_request("synth: the scan shape must be positive");
  if (options.scan_rows > (1ull << 32) / options.scan_cols) throw bad_request("synth: the scan has too many frames");
  const std::uint64_t frames = options.scan_rows * options.scan_cols;
  const std::uint64_t per_shard = frames_per_shard(options);
  if ((frames + per_shard - 1) / per_shard > kMaxShards) {
    throw bad_request("synth: more than " + std::to_string(kMaxShards) + " data files; raise --frames-per-shard");
  }
  if (options.threads > kMaxThreads) throw bad_request("synth: at most " + std::to_string(kMaxThreads) + " threads");
  for (const auto& [name, value] : {std::pair{"scan_sampling_A", options.scan_sampling_A},
                                    std::pair{"k_pixel_size_mrad", options.k_pixel_size_mrad},
                                    std::pair{"high_tension_V", options.high_tension_V},
                                    std::pair{"camera_length_m", options.camera_length_m}}) {
    if (value && !(std::isfinite(*value) && *value > 0.0)) {
      throw bad_request(std::string("synth: ") + name + " must be a positive finite number");
    }
  }
}

std::string data_file_name(const std::string& prefix, std::uint64_t shard_number) {
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "_data_%06llu.h5", static_cast<unsigned long long>(shard_number));
  return prefix + suffix;
}

// Encoded frames travel from the workers to the one writer in frame order.
// Workers claim frame numbers in increasing order but at most `window` ahead of
// the writer, so memory stays bounded however slow the disk is.
class OrderedChunkQueue {
 public:
  OrderedChunkQueue(std::uint64_t frames, std::size_t window) : frames_(frames), slots_(window) {}

  // Next frame for a worker; false when every frame is claimed or the run stops.
  bool claim(std::uint64_t& frame) {
    std::unique_lock lock(mutex_);
    space_.wait(lock, [&] { return stopped_ || next_claim_ >= frames_ || next_claim_ < next_take_ + slots_.size(); });
    if (stopped_ || next_claim_ >= frames_) return false;
    frame = next_claim_++;
    return true;
  }

  void publish(std::uint64_t frame, std::vector<std::uint8_t> chunk) {
    std::lock_guard lock(mutex_);
    Slot& slot = slots_[frame % slots_.size()];
    slot.chunk = std::move(chunk);
    slot.ready = true;
    ready_.notify_one();
  }

  // Stops the run; the first error is the one take() rethrows.
  void stop(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    if (error && !error_) error_ = std::move(error);
    stopped_ = true;
    space_.notify_all();
    ready_.notify_all();
  }

  // The writer's next frame (frames are taken in order 0, 1, 2, ...).
  std::vector<std::uint8_t> take(std::uint64_t frame) {
    std::unique_lock lock(mutex_);
    Slot& slot = slots_[frame % slots_.size()];
    ready_.wait(lock, [&] { return slot.ready || error_ || stopped_; });
    if (error_) std::rethrow_exception(error_);
    if (!slot.ready) throw internal_error("synth: the frame pipeline stopped early");
    slot.ready = false;
    next_take_ = frame + 1;
    space_.notify_all();
    return std::move(slot.chunk);
  }

 private:
  struct Slot {
    std::vector<std::uint8_t> chunk;
    bool ready = false;
  };
  std::mutex mutex_;
  std::condition_variable ready_;
  std::condition_variable space_;
  const std::uint64_t frames_;
  std::vector<Slot> slots_;
  std::uint64_t next_claim_ = 0;
  std::uint64_t next_take_ = 0;
  bool stopped_ = false;
  std::exception_ptr error_;
};

// Renders and encodes frames on `threads` workers; joins them on destruction.
class FrameWorkers {
 public:
  FrameWorkers(const PatternModel& model, OrderedChunkQueue& queue, unsigned threads) : queue_(queue) {
    workers_.reserve(threads);
    for (unsigned t = 0; t < threads; ++t) {
      workers_.emplace_back([&model, &queue] {
        try {
          PatternModel::Scratch scratch;
          std::vector<std::uint8_t> frame(model.frame_bytes());
          const std::size_t element_size = dtype_size(model.dtype());
          std::uint64_t frame_index = 0;
          while (queue.claim(frame_index)) {
            model.render_frame(frame_index, frame.data(), scratch);
            queue.publish(frame_index,
                          codec::encode_bitshuffle_lz4(frame.data(), model.frame_elements(), element_size));
          }
        } catch (...) {
          queue.stop(std::current_exception());
        }
      });
    }
  }
  FrameWorkers(const FrameWorkers&) = delete;
  FrameWorkers& operator=(const FrameWorkers&) = delete;
  ~FrameWorkers() {
    queue_.stop(nullptr);
    for (std::thread& worker : workers_) worker.join();
  }

 private:
  OrderedChunkQueue& queue_;
  std::vector<std::thread> workers_;
};

void remove_if_present(const std::filesystem::path& path) {
  std::error_code error;
  std::filesystem::remove(path, error);
  if (error) throw IoError("synth: cannot remove " + path.string() + ": " + error.message());
}

void create_output_folder(const std::filesystem::path& folder) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error || !std::filesystem::is_directory(folder)) {
    throw IoError("synth: cannot create the output folder " + folder.string() +
                  (error ? ": " + error.message() : ": not a directory"));
  }
}

// Encodes the frames on `threads` workers and writes them, in order, into
// data files of `per_shard` frames; returns the files' names and adds the
// stored bytes and the writer's time to `report`.
std::vector<std::string> write_data_files(const SynthOptions& options, const PatternModel& model,
                                          const std::filesystem::path& folder, SynthReport& report) {
  const unsigned threads =
      options.threads != 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  const std::uint64_t frames = model.frame_count();
  const std::uint64_t per_shard = frames_per_shard(options);
  std::vector<std::string> shard_names;
  OrderedChunkQueue queue(frames, std::max<std::size_t>(8, 4 * static_cast<std::size_t>(threads)));
  FrameWorkers workers(model, queue, threads);
  for (std::uint64_t first = 0; first < frames; first += per_shard) {
    const std::uint64_t count = std::min(per_shard, frames - first);
    shard_names.push_back(data_file_name(options.prefix, shard_names.size() + 1));
    arina::ShardFile shard((folder / shard_names.back()).string(), first + 1, count, options.detector_rows,
                            options.detector_cols, options.dtype);
    for (std::uint64_t local = 0; local < count; ++local) {
      const std::vector<std::uint8_t> chunk = queue.take(first + local);
      const auto write_started = std::chrono::steady_clock::now();
      shard.write_chunk(local, chunk.data(), chunk.size());
      report.writer_seconds += seconds_since(write_started);
      report.stored_bytes += chunk.size();
    }
    const auto close_started = std::chrono::steady_clock::now();
    shard.close();
    report.writer_seconds += seconds_since(close_started);
  }
  return shard_names;
}

// What the sidecar `<prefix>.h5` says of the microscope (synth's options, else plausible defaults).
arina::StemMetadata microscope_of(const SynthOptions& options) {
  arina::StemMetadata microscope;
  microscope.scan_rows = options.scan_rows;
  microscope.scan_cols = options.scan_cols;
  if (options.high_tension_V) microscope.high_tension_V = *options.high_tension_V;
  if (options.camera_length_m) microscope.camera_length_m = *options.camera_length_m;
  return microscope;
}

// The master of the data files, written aside and renamed: it appears
// complete or not at all.
void write_master_file(const SynthOptions& options, const PatternModel& model,
                       const std::vector<std::string>& shard_names, const std::filesystem::path& master_path) {
  arina::MasterContents master;
  master.shard_basenames = shard_names;
  master.scan_rows = options.scan_rows;
  master.scan_cols = options.scan_cols;
  master.detector_rows = options.detector_rows;
  master.detector_cols = options.detector_cols;
  master.dtype = options.dtype;
  master.saturation_count = model.saturation_count();
  master.pixel_mask = model.pixel_mask();
  master.excluded_pixels = static_cast<std::uint32_t>(model.bad_pixels().size());
  master.scan_sampling_A = options.scan_sampling_A;
  master.k_pixel_size_mrad = options.k_pixel_size_mrad;
  // An electron's energy in eV is the high tension in V.
  master.photon_energy_eV = microscope_of(options).high_tension_V;
  const std::filesystem::path partial_master_path = master_path.string() + ".partial";
  try {
    arina::write_master(partial_master_path.string(), master);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial_master_path, ignored);
    throw;
  }
  std::error_code rename_error;
  std::filesystem::rename(partial_master_path, master_path, rename_error);
  if (rename_error) {
    throw IoError("synth: cannot rename " + partial_master_path.string() + ": " + rename_error.message());
  }
}

}  // namespace

SynthReport write_acquisition(const SynthOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  validate(options);
  const PatternModel model(options);

  const std::filesystem::path folder(options.output_dir);
  create_output_folder(folder);
  const std::filesystem::path master_path = folder / (options.prefix + "_master.h5");
  // A master left by an earlier run must not point at half-rewritten shards.
  remove_if_present(master_path);

  SynthReport report;
  report.master_path = master_path.string();
  report.frames = model.frame_count();
  report.dense_bytes = report.frames * model.frame_bytes();

  hdf5::ErrorSilencer silence_hdf5;
  arina::BitshuffleFilterRegistration filter_registration;
  const std::vector<std::string> shard_names = write_data_files(options, model, folder, report);
  arina::write_stem_metadata((folder / (options.prefix + ".h5")).string(), microscope_of(options));
  write_master_file(options, model, shard_names, master_path);

  report.seconds = seconds_since(started);
  spdlog::debug("synth: {} frames in {} data files, {:.2f} s, compression {:.2f}x", report.frames, shard_names.size(),
                report.seconds,
                report.stored_bytes ? static_cast<double>(report.dense_bytes) / report.stored_bytes : 0.0);
  return report;
}

}  // namespace quantem::synth
