#include "quantem/export/export.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "export_files.hpp"
#include "master_writer.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/error.hpp"
#include "quantem/export/arina_writer.hpp"
#include "quantem/hdf5/error.hpp"
#include "quantem/hdf5/library_lock.hpp"
#include "quantem/export/deferred_raw_writes.hpp"

namespace quantem::exporter {

const char* export_stage_name(ExportStage stage) noexcept {
  switch (stage) {
    case ExportStage::queued: return "queued";
    case ExportStage::writing: return "writing";
    case ExportStage::finishing: return "finishing";
    case ExportStage::done: return "done";
    case ExportStage::failed: return "failed";
    case ExportStage::cancelled: return "cancelled";
  }
  return "unknown";
}

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kDefaultFramesPerFile = 100000;  // as synth
constexpr std::uint64_t kMaxDataFiles = 999999;          // data_NNNNNN has six digits
constexpr std::uint64_t kDefaultPositionsPerBatch = 32;
constexpr std::uint64_t kMaxPositionsPerBatch = 4096;
constexpr unsigned kMaxThreads = 256;
// Free bytes kept while writing, beyond what the next batch needs.
constexpr std::uint64_t kFreeSpaceReserve = 16ull << 20;
constexpr std::uint64_t kMasterBytesAllowance = 1ull << 20;
// Test hook: milliseconds each worker sleeps before each batch (cancel, kill
// and changing-source tests need an export that is still running).
constexpr const char* kBatchDelayTestVariable = "QUANTEM_EXPORT_BATCH_DELAY_MS_FOR_TESTING";
// Benchmark hook: when set (to anything but "" or "0"), the export reads
// frames and encodes on the host even where the resident has a device encoder
// (the baseline beside the device path, measured in the same run).
constexpr const char* kHostEncoderTestVariable = "QUANTEM_EXPORT_HOST_ENCODER_FOR_TESTING";

// Test hook: at most this many plan positions per batch on any path (a device
// export of a small scan is otherwise one batch; kill and cancel tests need several).
constexpr const char* kBatchPositionsTestVariable = "QUANTEM_EXPORT_BATCH_POSITIONS_FOR_TESTING";

bool host_encoder_forced() {
  const char* value = std::getenv(kHostEncoderTestVariable);
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}

struct ExportCancelled {};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

unsigned worker_count(unsigned requested) {
  if (requested != 0) return requested;
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 ? 1 : cores;
}

std::uint64_t positions_per_batch(const ExportRequest& request) {
  return request.positions_per_batch == 0 ? kDefaultPositionsPerBatch : request.positions_per_batch;
}

std::string data_file_name(const std::string& name, std::uint64_t file_number) {
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "_data_%06llu.h5", static_cast<unsigned long long>(file_number));
  return name + suffix;
}

// The stored chunks of one batch of plan positions, in position order.
struct EncodedBatch {
  std::uint64_t first_position = 0;
  std::uint64_t count = 0;
  backend::Resident::EncodedChunks chunks;  // chunk i: chunks.bytes[offsets[i], offsets[i + 1])
  bool ready = false;
};

// How the export is cut: the resident's device encoder's shape when it has
// one, else the request's (host path).
struct BatchShape {
  std::uint64_t positions = 0;
  unsigned workers = 0;
};

BatchShape batch_shape(const backend::Resident& resident, const ExportLayout& layout, const ExportRequest& request) {
  const auto device = resident.export_batch_shape(layout.geometry, dtype_size(layout.dtype));
  BatchShape shape{positions_per_batch(request), worker_count(request.threads)};
  if (device.positions != 0 && !host_encoder_forced()) shape = {device.positions, std::max(1u, device.workers)};
  if (const char* cap = std::getenv(kBatchPositionsTestVariable)) {
    shape.positions = std::clamp<std::uint64_t>(std::strtoull(cap, nullptr, 10), 1, shape.positions);
  }
  return shape;
}

template <class Out>
void narrow_frame(const std::uint32_t* values, std::size_t count, std::vector<std::uint8_t>& out) {
  out.resize(count * sizeof(Out));
  Out* target = reinterpret_cast<Out*>(out.data());
  std::uint32_t largest = 0;
  for (std::size_t i = 0; i < count; ++i) {
    largest = std::max(largest, values[i]);
    target[i] = static_cast<Out>(values[i]);
  }
  if (largest > std::numeric_limits<Out>::max()) {
    throw internal_error("export: an unbinned value exceeds the source's dtype");
  }
}

// Reads, converts and encodes plan positions in batches on worker threads and
// hands the batches to the calling thread in order; at most `window` batches
// are in flight, which bounds the working memory.
class BatchPipeline {
 public:
  BatchPipeline(backend::Resident& resident, const ExportLayout& layout, const ExportRequest& request,
                ExportProgress& progress, const std::function<std::unique_lock<std::mutex>()>& lock_compute)
      : resident_(resident),
        layout_(layout),
        progress_(progress),
        lock_compute_(lock_compute),
        shape_(batch_shape(resident, layout, request)),
        batch_positions_(shape_.positions),
        batches_((layout.geometry.positions() + batch_positions_ - 1) / batch_positions_),
        threads_(static_cast<unsigned>(std::min<std::uint64_t>(shape_.workers, batches_))),
        window_(threads_ + 2),
        slots_(window_) {
    if (const char* delay = std::getenv(kBatchDelayTestVariable)) delay_ms_ = std::strtoull(delay, nullptr, 10);
  }

  ~BatchPipeline() { stop(); }

  // Calls consume(batch) for every batch in order on the calling thread.
  template <class Consume>
  void run(Consume&& consume) {
    for (unsigned t = 0; t < threads_; ++t) workers_.emplace_back([this] { work(); });
    for (std::uint64_t k = 0; k < batches_; ++k) {
      EncodedBatch batch;
      {
        const auto wait_start = Clock::now();
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return error_ || slots_[k % window_].ready; });
        waiting_seconds_ += seconds_since(wait_start);
        if (error_) break;
        batch = std::move(slots_[k % window_]);
        slots_[k % window_] = EncodedBatch{};
      }
      try {
        consume(batch);
      } catch (...) {
        fail(std::current_exception());
        break;
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        consumed_ = k + 1;
        spare_.push_back(std::move(batch.chunks));  // its pages are reused by a later batch
      }
      room_.notify_all();
    }
    stop();
    if (error_) std::rethrow_exception(error_);
  }

  const char* encoder() const { return resident_encoded_ ? resident_.export_encoder() : "host"; }
  double read_seconds() const { return read_ns_ * 1e-9; }
  // How long the calling thread waited for batches (the writer starved).
  double waiting_seconds() const { return waiting_seconds_; }
  double encode_seconds() const { return encode_ns_ * 1e-9; }

 private:
  void work() {
    WorkerScratch scratch;  // reused across batches: no fresh pages per batch
    for (;;) {
      std::uint64_t k = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        room_.wait(lock, [&] { return error_ || next_ >= batches_ || next_ < consumed_ + window_; });
        if (error_ || next_ >= batches_) return;
        k = next_++;
      }
      try {
        if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
        if (progress_.cancel_requested.load()) throw ExportCancelled{};
        EncodedBatch batch;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (!spare_.empty()) {
            batch.chunks = std::move(spare_.back());
            spare_.pop_back();
          }
        }
        produce(k, scratch, batch);
        {
          std::lock_guard<std::mutex> lock(mutex_);
          slots_[k % window_] = std::move(batch);
        }
        ready_.notify_all();
      } catch (...) {
        fail(std::current_exception());
        return;
      }
    }
  }

  struct WorkerScratch {
    std::vector<std::uint32_t> values;
    std::vector<std::uint8_t> narrowed;
  };

  void produce(std::uint64_t k, WorkerScratch& scratch, EncodedBatch& batch) {
    const plan::PlanGeometry& g = layout_.geometry;
    batch.first_position = k * batch_positions_;
    batch.count = std::min(batch_positions_, g.positions() - batch.first_position);
    batch.ready = true;
    const std::size_t element_size = dtype_size(layout_.dtype);
    const auto start = Clock::now();
    if (!host_only_ && resident_.encode_export_chunks(g, batch.first_position, batch.count, element_size, batch.chunks)) {
      resident_encoded_ = true;
      encode_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
      return;
    }
    std::vector<std::uint32_t>& values = scratch.values;
    {
      std::unique_lock<std::mutex> compute;
      if (lock_compute_) compute = lock_compute_();
      if (!resident_.frames_u32(g, batch.first_position, batch.count, values)) {
        throw backend::binned_value_overflow(batch.first_position, batch.count);
      }
    }
    const auto encode_start = Clock::now();
    read_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(encode_start - start).count();
    encode_on_host(values, batch, scratch.narrowed);
    encode_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - encode_start).count();
  }

  // The batch's frames (uint32 values) narrowed to the export dtype and encoded with the CPU codec.
  void encode_on_host(const std::vector<std::uint32_t>& values, EncodedBatch& batch,
                      std::vector<std::uint8_t>& narrowed) const {
    const std::uint64_t pixels = layout_.geometry.detector_pixels();
    const std::size_t element_size = dtype_size(layout_.dtype);
    std::vector<std::uint8_t>& bytes = batch.chunks.bytes;
    std::vector<std::uint64_t>& offsets = batch.chunks.offsets;
    bytes.clear();
    offsets.assign(1, 0);
    for (std::uint64_t i = 0; i < batch.count; ++i) {
      const std::uint32_t* frame = values.data() + i * pixels;
      const std::uint8_t* elements = reinterpret_cast<const std::uint8_t*>(frame);
      if (layout_.dtype == DType::uint8) {
        narrow_frame<std::uint8_t>(frame, pixels, narrowed);
        elements = narrowed.data();
      } else if (layout_.dtype == DType::uint16) {
        narrow_frame<std::uint16_t>(frame, pixels, narrowed);
        elements = narrowed.data();
      }
      const auto chunk = codec::encode_bitshuffle_lz4(elements, pixels, element_size);
      bytes.insert(bytes.end(), chunk.begin(), chunk.end());
      offsets.push_back(bytes.size());
    }
  }

  void fail(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = error;
    }
    ready_.notify_all();
    room_.notify_all();
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_ && consumed_ < batches_) error_ = std::make_exception_ptr(ExportCancelled{});
    }
    ready_.notify_all();
    room_.notify_all();
    for (auto& worker : workers_) {
      if (worker.joinable()) worker.join();
    }
    workers_.clear();
  }

  backend::Resident& resident_;
  const ExportLayout& layout_;
  ExportProgress& progress_;
  const std::function<std::unique_lock<std::mutex>()>& lock_compute_;
  const BatchShape shape_;
  const std::uint64_t batch_positions_;
  const std::uint64_t batches_;
  const unsigned threads_;
  const std::uint64_t window_;
  std::uint64_t delay_ms_ = 0;
  const bool host_only_ = host_encoder_forced();

  std::mutex mutex_;
  std::condition_variable ready_;  // a batch became ready, or an error
  std::condition_variable room_;   // a batch was consumed, or an error
  std::vector<EncodedBatch> slots_;
  std::vector<backend::Resident::EncodedChunks> spare_;  // buffers of consumed batches
  std::uint64_t next_ = 0;
  std::uint64_t consumed_ = 0;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
  std::atomic<std::int64_t> read_ns_{0};
  std::atomic<std::int64_t> encode_ns_{0};
  double waiting_seconds_ = 0.0;  // the calling thread's only
  std::atomic<bool> resident_encoded_{false};  // some batch came from encode_export_chunks
};

// Writes the data files from the pipeline's batches, one chunk per frame.
// The chunks' bytes go to the files on a writer thread (arina::
// DeferredRawWrites) while libhdf5 indexes the next batch's; a batch's buffer
// is kept until its writes are done and then handed back for reuse.
class DataFileWriter {
 public:
  DataFileWriter(const ExportLayout& layout, const std::string& folder, ExportProgress& progress)
      : layout_(layout), folder_(folder), progress_(progress) {}

  // Writes the batch's chunks; on return batch.chunks holds a buffer whose
  // writes are done (the previous batch's), free to reuse.
  void write(EncodedBatch& batch) {
    const auto start = Clock::now();
    const auto& bytes = batch.chunks.bytes;
    const auto& offsets = batch.chunks.offsets;
    check_free_space(bytes.size());
    try {
      const auto index_start = Clock::now();
      for (std::uint64_t i = 0; i < batch.count; ++i) {
        const std::uint64_t position = batch.first_position + i;
        const std::uint64_t file_index = position / layout_.frames_per_file;
        if (!shard_ || file_index != file_index_) open_file(file_index);
        const std::uint64_t size = offsets[i + 1] - offsets[i];
        shard_->write_chunk(position - file_index * layout_.frames_per_file, bytes.data() + offsets[i], size);
        stored_bytes_ += size;
        progress_.bytes_written += size;
        ++progress_.frames_done;
      }
      index_seconds_ += seconds_since(index_start);
      // This batch's writes go to the writer thread; the previous batch's are
      // waited for, and its buffer goes back.
      const std::uint64_t ticket = raw_writes_.flush();
      raw_writes_.wait_for(previous_ticket_);
      previous_ticket_ = ticket;
    } catch (...) {
      drain();  // the caller frees this batch's buffer: no write may still read it
      throw;
    }
    std::swap(in_flight_, batch.chunks);
    seconds_ += seconds_since(start);
  }

  void close() {
    const auto start = Clock::now();
    raw_writes_.wait_for_all();
    if (shard_) shard_->close();
    shard_.reset();
    seconds_ += seconds_since(start);
  }

  const std::vector<std::string>& file_names() const { return file_names_; }
  // Waits for every chunk write, dropping their errors (the export failed already).
  void drain() noexcept {
    try {
      raw_writes_.wait_for_all();
    } catch (...) {
    }
  }
  std::uint64_t stored_bytes() const { return stored_bytes_; }
  double seconds() const { return seconds_; }
  double index_seconds() const { return index_seconds_; }

 private:
  void open_file(std::uint64_t file_index) {
    if (shard_) shard_->close();
    shard_.reset();
    const std::uint64_t first = file_index * layout_.frames_per_file;
    const std::uint64_t frames = std::min(layout_.frames_per_file, layout_.geometry.positions() - first);
    file_names_.push_back(data_file_name(layout_.name, file_index + 1));
    shard_ = std::make_unique<arina::ShardFile>(folder_ + "/" + file_names_.back(), first + 1, frames,
                                                layout_.geometry.detector_rows, layout_.geometry.detector_cols,
                                                layout_.dtype, &raw_writes_, arina::ChunkIndex::fixed_array);
    file_index_ = file_index;
  }

  // statvfs before every batch: cheap beside the batch's writes, and the
  // folder may be filling from elsewhere meanwhile.
  void check_free_space(std::uint64_t batch_bytes) {
    const std::uint64_t free = detail::free_bytes(folder_);
    if (free < batch_bytes + kFreeSpaceReserve) {
      throw payload_too_large("the export folder ran out of free space while writing " + layout_.name + ": " +
                              std::to_string(free) + " bytes free, the next frames need " +
                              std::to_string(batch_bytes) + " plus a reserve of " +
                              std::to_string(kFreeSpaceReserve));
    }
  }

  const ExportLayout& layout_;
  const std::string folder_;
  ExportProgress& progress_;
  // Declared before the files: destroyed after them, so no write still reads a freed buffer.
  backend::Resident::EncodedChunks in_flight_;
  arina::DeferredRawWrites raw_writes_;
  std::uint64_t previous_ticket_ = 0;
  std::unique_ptr<arina::ShardFile> shard_;
  std::uint64_t file_index_ = 0;
  std::vector<std::string> file_names_;
  std::uint64_t stored_bytes_ = 0;
  double seconds_ = 0.0;
  double index_seconds_ = 0.0;  // libhdf5 indexing the chunks (part of seconds_)
};

void check_room(const ExportLayout& layout, const std::string& folder) {
  const std::uint64_t free = detail::free_bytes(folder);
  const std::uint64_t needed = layout.estimated_output_bytes + kFreeSpaceReserve;
  if (free < needed) {
    throw payload_too_large("not enough free space in the export folder for " + layout.name + ": it needs about " +
                            std::to_string(needed) + " bytes, " + std::to_string(free) + " are free");
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0 &&
      layout.working_bytes > static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size)) {
    throw payload_too_large("not enough host memory for the export's working memory (" +
                            std::to_string(layout.working_bytes) + " bytes)");
  }
}

// The longest file name an export writes is its hidden incomplete folder's.
void check_name_length(const std::string& name, const std::string& output_folder) {
  const long limit = ::pathconf(output_folder.c_str(), _PC_NAME_MAX);
  const std::size_t name_max = limit > 0 ? static_cast<std::size_t>(limit) : 255;
  const std::size_t longest = 1 + name.size() + std::char_traits<char>::length(kIncompleteSuffix);
  if (longest > name_max) {
    throw bad_request("export: the export name " + name + " has " + std::to_string(name.size()) +
                      " characters; its files' longest name (." + name + kIncompleteSuffix + ", " +
                      std::to_string(longest) + " characters) exceeds the export folder's limit of " +
                      std::to_string(name_max) + " characters per name: at most " +
                      std::to_string(name_max - (longest - name.size())) +
                      " characters fit (the source's stem and the plan make the name)");
  }
}

}  // namespace

std::string export_name(const std::string& source_stem, const plan::PlanGeometry& g) {
  std::string name;
  for (const char c : source_stem) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                       c == '_' || c == '.';
    name += plain ? c : '_';
  }
  while (!name.empty() && (name.front() == '.' || name.front() == '_')) name.erase(name.begin());
  if (name.empty()) name = "acquisition";
  const auto text = [](std::uint64_t value) { return std::to_string(value); };
  if (g.cropped) {
    name += "_crop" + text(g.region.row_start) + "-" + text(g.region.row_stop) + "x" + text(g.region.col_start) + "-" +
            text(g.region.col_stop);
  }
  if (g.scan_bin > 1) name += "_scanbin" + text(g.scan_bin);
  if (g.detector_bin > 1) name += "_detbin" + text(g.detector_bin);
  if (!g.cropped && g.scan_bin == 1 && g.detector_bin == 1) name += "_full";
  return name;
}

ExportLayout plan_export(const catalog::Acquisition& source, const ExportRequest& request) {
  if (!source.dtype || !source.scan_shape_known() || !source.detector_shape_known()) {
    throw unprocessable("export: " + source.name + " has no usable 4-D shape and dtype");
  }
  if (request.threads > kMaxThreads) throw bad_request("export: at most " + std::to_string(kMaxThreads) + " threads");
  const std::uint64_t batch = positions_per_batch(request);
  if (batch > kMaxPositionsPerBatch) {
    throw bad_request("export: at most " + std::to_string(kMaxPositionsPerBatch) + " positions per batch");
  }
  ExportLayout layout;
  layout.geometry = plan::resolve_plan(request.plan, source.scan_rows, source.scan_cols, source.detector_rows,
                                       source.detector_cols);
  const plan::PlanGeometry& g = layout.geometry;
  const bool binned = g.scan_bin > 1 || g.detector_bin > 1;
  layout.dtype = binned ? DType::uint32 : *source.dtype;
  layout.name = export_name(source.stem, g);
  check_name_length(layout.name, request.output_folder);
  layout.frames_per_file = request.frames_per_file == 0 ? kDefaultFramesPerFile : request.frames_per_file;
  layout.data_files = g.positions() / layout.frames_per_file + (g.positions() % layout.frames_per_file != 0);
  if (layout.data_files > kMaxDataFiles) {
    throw bad_request("export: more than " + std::to_string(kMaxDataFiles) + " data files; raise --frames-per-file");
  }

  const std::uint64_t out_element = dtype_size(layout.dtype);
  const std::uint64_t source_element = dtype_size(*source.dtype);
  const std::uint64_t threads = worker_count(request.threads);
  const std::uint64_t window = threads + 2;
  // A worker holds its batch as uint32 frames plus one narrowed frame and the
  // source-resolution sums a frame read builds; finished batches hold their
  // chunks (at most the raw frame plus LZ4's bound).
  const std::uint64_t pixels = g.detector_pixels();
  const std::uint64_t source_pixels = source.frame_pixels();
  layout.working_bytes = threads * (batch * pixels * 4 + pixels * out_element + source_pixels * 16) +
                         window * batch * (pixels * out_element + pixels * out_element / 255 + 64);
  const double kept = static_cast<double>(g.positions()) / static_cast<double>(source.frame_count());
  layout.estimated_output_bytes =
      static_cast<std::uint64_t>(static_cast<double>(source.size_bytes) * kept * static_cast<double>(out_element) /
                                 static_cast<double>(source_element) / static_cast<double>(g.detector_bin)) +
      kMasterBytesAllowance;
  return layout;
}

ExportReport export_plan(backend::Resident& resident, const catalog::Acquisition& source, const ExportLayout& layout,
                         const ExportRequest& request, ExportProgress& progress,
                         const std::function<std::unique_lock<std::mutex>()>& lock_compute) {
  const auto start = Clock::now();
  progress.frames_total = layout.geometry.positions();
  progress.stage = ExportStage::writing;
  try {
    if (resident.source().signature != source.signature || resident.source().master_path != source.master_path) {
      throw conflict("export: the resident of " + source.name + " is not of these files (they changed); retry");
    }
    plan::require_resolved_for(layout.geometry, source.scan_rows, source.scan_cols, source.detector_rows,
                               source.detector_cols, source.name);
    if (progress.cancel_requested.load()) throw ExportCancelled{};
    remove_abandoned_exports(request.output_folder);

    // HDF5 is not thread-safe here: one export writes at a time per process,
    // and no reader calls HDF5 meanwhile (the one lock of libhdf5).
    const hdf5::LibraryLock hdf5_turn;
    detail::IncompleteFolder folder(request.output_folder, layout.name);
    check_room(layout, folder.path());

    ExportReport report;
    report.name = layout.name;
    report.folder = folder.final_path();
    report.master_path = report.folder + "/" + layout.name + "_master.h5";
    {
      hdf5::ErrorSilencer silence_hdf5;
      arina::BitshuffleFilterRegistration filter_registration;
      DataFileWriter writer(layout, folder.path(), progress);
      BatchPipeline pipeline(resident, layout, request, progress, lock_compute);
      pipeline.run([&](EncodedBatch& batch) { writer.write(batch); });
      writer.close();
      report.encoder = pipeline.encoder();
      report.seconds.read = pipeline.read_seconds();
      report.seconds.encode = pipeline.encode_seconds();
      report.seconds.write = writer.seconds();
      report.seconds.write_index = writer.index_seconds();
      report.seconds.write_starved = pipeline.waiting_seconds();
      report.stored_bytes = writer.stored_bytes();

      progress.stage = ExportStage::finishing;
      const auto finish_start = Clock::now();
      detail::MasterFacts facts{source, layout, request, writer.file_names(), report.encoder};
      detail::write_export_master(folder.path() + "/" + layout.name + "_master.h5", facts);
      if (catalog::restat_signature(source.signature) != source.signature) {
        throw conflict("export: the files of " + source.name +
                       " changed during the export; nothing was written (export again)");
      }
      if (progress.cancel_requested.load()) throw ExportCancelled{};
      report.output_bytes = detail::folder_file_bytes(folder.path());
      folder.commit();
      report.seconds.finish = seconds_since(finish_start);
    }
    report.frames = layout.geometry.positions();
    report.data_files = report.frames == 0 ? 0 : layout.data_files;
    report.dtype = layout.dtype;
    report.scan_rows = layout.geometry.scan_rows;
    report.scan_cols = layout.geometry.scan_cols;
    report.detector_rows = layout.geometry.detector_rows;
    report.detector_cols = layout.geometry.detector_cols;
    report.source_bytes = source.size_bytes;
    report.dense_bytes = report.frames * layout.geometry.detector_pixels() * dtype_size(layout.dtype);
    report.seconds.total = seconds_since(start);
    progress.stage = ExportStage::done;
    return report;
  } catch (const ExportCancelled&) {
    progress.stage = ExportStage::cancelled;
    throw unavailable("the export of " + layout.name + " was cancelled; nothing was written");
  } catch (...) {
    progress.stage = ExportStage::failed;
    throw;
  }
}

}  // namespace quantem::exporter
