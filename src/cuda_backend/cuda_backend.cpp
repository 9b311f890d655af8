// The CUDA backend: devices, admission estimates, and the file loader that
// turns an acquisition's stored chunks into one ANS resident on one GPU
// (pipeline: include/quantem/backend/cuda_backend.hpp).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "cuda_resident.hpp"
#include "cuda_support.hpp"
#include "encode_worker.hpp"
#include "load_plan.hpp"
#include "read_pool.hpp"
#include "resident_encoder.hpp"
#include "quantem/backend/cuda_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/backend/shard_reader.hpp"
#include "quantem/core/error.hpp"
#include "quantem/cuda/bitshuffle_lz4.hpp"
#include "quantem/cuda/cuda_error.hpp"
#include "quantem/cuda/device.hpp"

namespace quantem::backend {
namespace {

using namespace cuda_detail;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Thrown on the loader's thread or by the encode worker's batch check (and
// rethrown on the loader's thread) when the load is cancelled.
struct LoadCancelled {};

std::string describe_frame(const catalog::Acquisition& acquisition, const catalog::FrameIndex& index,
                           std::uint64_t frame) {
  const catalog::FrameLocation& location = index.frames[frame];
  return "frame " + std::to_string(frame) + " (scan row " + std::to_string(frame / acquisition.scan_cols) +
         ", column " + std::to_string(frame % acquisition.scan_cols) + ") of " + index.shard_paths[location.shard] +
         " does not decode (chunk at byte " + std::to_string(location.file_offset) + ", " +
         std::to_string(location.stored_bytes) + " stored bytes)";
}

// Decodes one frame's chunk on the host (chunks the GPU decoder does not take).
void host_decode(const catalog::Acquisition& acquisition, const catalog::FrameIndex& index, std::uint64_t frame,
                 const std::uint8_t* stored, std::uint8_t* out, std::uint64_t frame_bytes) {
  const catalog::FrameLocation& location = index.frames[frame];
  codec::ChunkFormat format = acquisition.chunk_format;
  if ((location.filter_mask & 1u) != 0) format.filter = codec::ChunkFilter::none;
  try {
    codec::decode_chunk(format, stored, location.stored_bytes, out, frame_bytes);
  } catch (const Error& error) {
    throw CorruptChunk(describe_frame(acquisition, index, frame) + ": " + error.what());
  }
}

// What the encode worker's batch check reads. None of it changes while the
// load runs (the cancel flag is atomic), so through it the worker thread
// shares no mutable state with the loader.
struct BatchCheckSources {
  const catalog::Acquisition& acquisition;
  const catalog::FrameIndex& index;
  const CudaLoadPlan& plan;
  const ShardFiles& files;
  const std::atomic<bool>& cancel_requested;
};

// Runs on the encode worker's thread, once a batch's decode statuses are on
// the host: a chunk the GPU found corrupt fails the load (CorruptChunk naming
// frame, scan position and file); valid bitshuffle data with a block size the
// GPU decoder does not take is decoded on the host and copied into the dense
// slot on `stream`. Returns how many frames it decoded on the host.
std::uint64_t check_decoded_batch(const BatchCheckSources& sources, const FilledBatch& batch,
                                  const std::uint32_t* statuses, std::uint8_t* d_dense, cudaStream_t stream) {
  std::vector<std::uint64_t> repairs;
  for (std::uint64_t i = 0; i < batch.frame_count; ++i) {
    if (statuses[i] == static_cast<std::uint32_t>(cuda::ChunkStatus::ok)) continue;
    if (statuses[i] == static_cast<std::uint32_t>(cuda::ChunkStatus::unsupported_block_size)) {
      repairs.push_back(batch.first_frame + i);
      continue;
    }
    throw CorruptChunk(describe_frame(sources.acquisition, sources.index, batch.first_frame + i) +
                       ": bitshuffle/LZ4 " + cuda::chunk_status_name(static_cast<cuda::ChunkStatus>(statuses[i])));
  }
  if (sources.cancel_requested) throw LoadCancelled{};
  if (repairs.empty()) return 0;
  const CudaLoadPlan& plan = sources.plan;
  std::vector<std::uint8_t> stored(plan.max_stored_chunk_bytes);
  std::vector<std::uint8_t> decoded(plan.frame_bytes);
  for (const std::uint64_t frame : repairs) {
    const catalog::FrameLocation& location = sources.index.frames[frame];
    read_exactly(sources.files.fd(location.shard), stored.data(), location.stored_bytes, location.file_offset,
                 sources.index.shard_paths[location.shard], frame);
    host_decode(sources.acquisition, sources.index, frame, stored.data(), decoded.data(), plan.frame_bytes);
    QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_dense + (frame - batch.first_frame) * plan.frame_bytes, decoded.data(),
                                     plan.frame_bytes, cudaMemcpyHostToDevice, stream));
    QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));  // `decoded` is reused
  }
  return repairs.size();
}

void check_loadable_shape(const catalog::Acquisition& acquisition) {
  if (!acquisition.scan_shape_known() || !acquisition.detector_shape_known()) {
    throw unprocessable(acquisition.name + " has no usable 4-D shape (scan " + std::to_string(acquisition.scan_rows) +
                        " x " + std::to_string(acquisition.scan_cols) + ", detector " +
                        std::to_string(acquisition.detector_rows) + " x " + std::to_string(acquisition.detector_cols) +
                        ")");
  }
  if (!acquisition.dtype) throw unprocessable(acquisition.name + " has no supported detector dtype");
  if (acquisition.chunk_format.element_size != dtype_size(*acquisition.dtype)) {
    throw unprocessable(acquisition.name + ": the chunk element size " +
                        std::to_string(acquisition.chunk_format.element_size) + " does not match dtype " +
                        dtype_name(*acquisition.dtype));
  }
  if (!acquisition.pixel_mask.empty() && acquisition.pixel_mask.size() != acquisition.frame_pixels()) {
    throw unprocessable(acquisition.name + ": the pixel mask has " + std::to_string(acquisition.pixel_mask.size()) +
                        " values for a detector of " + std::to_string(acquisition.frame_pixels()) + " pixels");
  }
}

// Pinned host staging slots, kept between loads (pinning memory is slow).
struct PinnedSlots {
  std::uint64_t slot_bytes = 0;
  std::vector<cuda::PinnedBuffer> slots;
};

// Idle release: hands the memory this process caches on the device but no
// longer uses back to the driver. TODO(lead): bind the device and trim its
// memory pool (cudaDeviceGetMemPool + cudaMemPoolTrimTo(pool, 0)) once the
// load allocates from it; until then it returns nothing.
void return_cached_device_memory(int device_index) { (void)device_index; }

class CudaBackendImpl final : public CudaBackend {
 public:
  explicit CudaBackendImpl(const CudaBackendOptions& options) : options_(options) {
    const int count = cuda::device_count();
    if (count == 0) {
      throw unavailable(
          "CUDA unavailable: no CUDA device is visible to this process (cudaGetDeviceCount found none); start with "
          "--backend cpu to serve from the CPU backend explicitly");
    }
    if (!(options.budget_fraction > 0.0 && options.budget_fraction <= 1.0)) {
      throw bad_request("the CUDA device budget fraction must be in (0, 1]");
    }
    std::vector<int> indices = options.device_indices;
    if (indices.empty()) {
      for (int i = 0; i < count; ++i) indices.push_back(i);
    }
    for (const int index : indices) {
      if (index < 0 || index >= count) {
        throw unavailable("CUDA unavailable: GPU " + std::to_string(index) + " was requested but " +
                          std::to_string(count) + " CUDA device" + (count == 1 ? " is" : "s are") +
                          " visible (indices 0.." + std::to_string(count - 1) + ")");
      }
      if (std::find_if(devices_.begin(), devices_.end(), [&](const DeviceInfo& d) { return d.index == index; }) !=
          devices_.end()) {
        continue;
      }
      DeviceInfo info;
      info.index = index;
      cudaDeviceProp properties{};
      QUANTEM_CUDA_TRY(cudaGetDeviceProperties(&properties, index));
      info.name = properties.name;
      info.total_memory_bytes = properties.totalGlobalMem;
      info.budget_bytes = options.budget_bytes != 0
                              ? options.budget_bytes
                              : static_cast<std::uint64_t>(static_cast<double>(info.total_memory_bytes) *
                                                           options.budget_fraction);
      info.budget_fraction = options.budget_bytes != 0 ? 0.0 : options.budget_fraction;
      devices_.push_back(info);
    }
    unsigned threads = options.read_threads;
    if (threads == 0) threads = std::min(32u, std::max(1u, std::thread::hardware_concurrency()));
    pool_ = std::make_unique<ReadPool>(threads);
  }

  std::string name() const override { return "cuda"; }
  std::vector<DeviceInfo> devices() const override { return devices_; }

  std::optional<std::uint64_t> free_bytes(int device_index) const override {
    check_device(device_index);
    cuda::set_device(device_index);
    return memory_info().free_bytes;
  }

  LoadEstimate estimate_load(const catalog::Acquisition& acquisition) const override {
    check_loadable_shape(acquisition);
    const CudaLoadPlan plan = plan_cuda_load(acquisition, options_.tuning);
    return {plan.resident_bytes_bound(), plan.transition_peak_bytes(true)};
  }

  using Backend::load;
  // TODO(lead): grow `reservation` before allocating beyond the admitted estimate (LoadReservation).
  std::shared_ptr<Resident> load(const catalog::Acquisition& acquisition, int device_index, LoadProgress& progress,
                                 LoadReservation& reservation) override {
    (void)reservation;
    check_device(device_index);
    try {
      auto resident = load_checked(acquisition, device_index, progress);
      progress.stage = LoadStage::done;
      return resident;
    } catch (const LoadCancelled&) {
      progress.stage = LoadStage::cancelled;
      throw unavailable("loading " + acquisition.name + " was cancelled");
    } catch (const cuda::OutOfDeviceMemory& error) {
      progress.stage = LoadStage::failed;
      throw payload_too_large("not enough device memory on GPU " + std::to_string(device_index) + " to load " +
                              acquisition.name + ": " + error.what());
    } catch (const std::bad_alloc&) {
      progress.stage = LoadStage::failed;
      throw payload_too_large("not enough host memory to stage the load of " + acquisition.name);
    } catch (...) {
      progress.stage = LoadStage::failed;
      throw;
    }
  }

  void trim_device_memory(int device_index) override {
    check_device(device_index);
    return_cached_device_memory(device_index);
  }

  CudaLoadReport last_load_report() const override {
    std::lock_guard<std::mutex> lock(report_mutex_);
    return report_;
  }

 private:
  void check_device(int device_index) const {
    for (const DeviceInfo& device : devices_) {
      if (device.index == device_index) return;
    }
    throw bad_request("GPU " + std::to_string(device_index) + " is not one of this backend's CUDA devices");
  }

  PinnedSlots take_pinned(std::uint64_t slot_bytes) {
    {
      std::lock_guard<std::mutex> lock(pinned_mutex_);
      for (auto it = pinned_.begin(); it != pinned_.end(); ++it) {
        if (it->slot_bytes >= slot_bytes) {
          PinnedSlots slots = std::move(*it);
          pinned_.erase(it);
          return slots;
        }
      }
    }
    PinnedSlots slots;
    slots.slot_bytes = slot_bytes;
    for (int i = 0; i < kHostSlots; ++i) slots.slots.emplace_back(slot_bytes);
    return slots;
  }

  void give_back_pinned(PinnedSlots slots) {
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    if (pinned_.size() < 2) pinned_.push_back(std::move(slots));
  }

  std::shared_ptr<Resident> load_checked(const catalog::Acquisition& acquisition, int device_index,
                                         LoadProgress& progress);

  CudaBackendOptions options_;
  std::vector<DeviceInfo> devices_;
  std::unique_ptr<ReadPool> pool_;
  std::mutex pinned_mutex_;
  std::vector<PinnedSlots> pinned_;
  mutable std::mutex report_mutex_;
  CudaLoadReport report_;
};

std::shared_ptr<Resident> CudaBackendImpl::load_checked(const catalog::Acquisition& acquisition, int device_index,
                                                        LoadProgress& progress) {
  const Clock::time_point load_start = Clock::now();
  if (!acquisition.status.loadable) {
    throw conflict(acquisition.status.reason.empty() ? acquisition.name + " is not ready to load"
                                                     : acquisition.status.reason);
  }
  check_loadable_shape(acquisition);
  if (progress.cancel_requested) throw LoadCancelled{};
  progress.stage = LoadStage::reading;
  cuda::set_device(device_index);  // this thread's CUDA work goes to the load's device

  CudaLoadReport report;
  const CudaLoadPlan plan = plan_cuda_load(acquisition, options_.tuning);
  report.admitted_peak_bytes = plan.transition_peak_bytes(true);
  report.dense_bytes = plan.frames * plan.frame_bytes;
  const catalog::FrameIndex index = catalog::build_frame_index(acquisition);
  const ReadSchedule schedule = plan_reads(acquisition, index, plan);
  ShardFiles files(index.shard_paths);
  report.index_seconds = seconds_since(load_start);
  report.stored_bytes = schedule.stored_bytes;
  progress.bytes_total = schedule.stored_bytes;
  progress.bytes_done = 0;
  progress.stage = LoadStage::decoding;

  FreeMemoryLowWater low_water;

  // Everything the load allocates. Destroyed in reverse order on every path:
  // the encode worker first (stopped, joined, its stream drained), then
  // StreamDrain waits for all three streams, then the buffers are freed.
  auto ledger = std::make_shared<Ledger>();
  Stream copy_stream;     // H2D of the staging slots
  Stream compute_stream;  // decodes (and copies of host-decoded frames) into the dense slots
  Stream encode_stream;   // the encode worker's
  struct PinnedReturn {
    CudaBackendImpl& backend;
    PinnedSlots slots;
    ~PinnedReturn() { backend.give_back_pinned(std::move(slots)); }
  } pinned{*this, take_pinned(plan.device_slot_bytes)};
  std::vector<std::vector<std::uint8_t>> raw_areas(kHostSlots);  // stored chunks of host-decoded sub-batches
  std::vector<Event> host_slot_free;
  std::vector<Event> device_slot_copied;
  std::vector<Event> device_slot_decoded;
  std::vector<Event> batch_ready;  // per dense slot: its batch's last decode or copy
  for (int i = 0; i < kHostSlots; ++i) host_slot_free.emplace_back();
  for (int i = 0; i < kDeviceSlots; ++i) {
    device_slot_copied.emplace_back();
    device_slot_decoded.emplace_back();
  }
  for (int i = 0; i < kDenseSlots; ++i) batch_ready.emplace_back();
  EventTimer copy_timer;
  EventTimer decode_timer;
  copy_timer.reserve(schedule.sub_batches.size());  // no event is created inside the loop
  decode_timer.reserve(schedule.sub_batches.size());
  ResidentEncoder encoder(acquisition, plan, kDenseSlots, encode_stream.get(), ledger);
  std::vector<TrackedBuffer> device_slots;
  TrackedBuffer bslz4_scratch;
  if (plan.gpu_decoder) {
    for (int i = 0; i < kDeviceSlots; ++i) device_slots.emplace_back(plan.device_slot_bytes, ledger);
    bslz4_scratch = TrackedBuffer(plan.bslz4_scratch_bytes, ledger);
  }
  StreamDrain drain({copy_stream.get(), compute_stream.get(), encode_stream.get()});
  low_water.checkpoint();

  const BatchCheckSources check_sources{acquisition, index, plan, files, progress.cancel_requested};
  EncodeWorker worker(
      device_index, encoder,
      [&check_sources](const FilledBatch& batch, const std::uint32_t* statuses, std::uint8_t* d_dense,
                       cudaStream_t stream) {
        return check_decoded_batch(check_sources, batch, statuses, d_dense, stream);
      },
      low_water);

  const cudaStream_t copy = copy_stream.get();
  const cudaStream_t compute = compute_stream.get();
  const std::uint64_t batch_span = std::uint64_t{plan.groups_per_batch} * plan.frames_per_group;
  const auto dense_slot_of = [](std::uint64_t batch) { return static_cast<int>(batch % kDenseSlots); };
  const std::size_t element = dtype_size(plan.source_dtype);
  std::uint64_t host_decoded = 0;
  double read_seconds = 0.0;
  double wait_seconds = 0.0;

  // Before batch b's first decode or copy into its dense slot: the slot's
  // previous batch (b - 2) must have been taken by the worker (host
  // handshake) and its encode must run before anything below (device wait).
  const auto begin_batch = [&](std::uint64_t batch) {
    const int slot = dense_slot_of(batch);
    wait_seconds += worker.acquire_slot(batch, slot, compute);
    QUANTEM_CUDA_TRY(cudaMemsetAsync(encoder.batch_statuses(slot), 0, plan.batch_statuses_bytes, compute));
  };
  // After batch b's last decode or copy: hand the slot to the worker. The
  // slot's `ready` event is recorded again only after the next begin_batch of
  // this slot, by which time the worker has enqueued its wait on this record.
  const auto submit_batch = [&](std::uint64_t batch) {
    FilledBatch filled;
    filled.number = batch;
    filled.slot = dense_slot_of(batch);
    filled.first_frame = batch * batch_span;
    filled.frame_count = std::min(batch_span, plan.frames - filled.first_frame);
    filled.ready = batch_ready[static_cast<std::size_t>(filled.slot)].get();
    QUANTEM_CUDA_TRY(cudaEventRecord(filled.ready, compute));
    worker.submit(filled);
    report.batches += 1;
  };

  const std::vector<SubBatch>& sub_batches = schedule.sub_batches;
  std::vector<bool> host_slot_used(kHostSlots, false);
  std::uint64_t gpu_sub_batches = 0;
  for (std::size_t i = 0; i < sub_batches.size(); ++i) {
    const SubBatch& sub = sub_batches[i];
    if (progress.cancel_requested) throw LoadCancelled{};
    worker.rethrow_if_failed();  // e.g. a corrupt chunk of an earlier batch: stop reading
    const bool opens_batch = i == 0 || sub_batches[i - 1].batch != sub.batch;
    const bool closes_batch = i + 1 == sub_batches.size() || sub_batches[i + 1].batch != sub.batch;
    const int host_slot = static_cast<int>(i % kHostSlots);
    std::uint8_t* slot = pinned.slots.slots[static_cast<std::size_t>(host_slot)].as<std::uint8_t>();
    if (host_slot_used[static_cast<std::size_t>(host_slot)]) {
      const Clock::time_point wait_start = Clock::now();
      QUANTEM_CUDA_TRY(cudaEventSynchronize(host_slot_free[static_cast<std::size_t>(host_slot)].get()));
      wait_seconds += seconds_since(wait_start);
    }

    // Read (and for host-decoded chunks, decode) into the pinned slot.
    const Clock::time_point read_start = Clock::now();
    std::uint8_t* read_target = slot;
    if (!sub.gpu_decoded) {
      std::vector<std::uint8_t>& raw = raw_areas[static_cast<std::size_t>(host_slot)];
      if (raw.size() < plan.staging_bytes) raw.resize(plan.staging_bytes);
      read_target = raw.data();
    }
    pool_->run(sub.read_count, [&](std::size_t k, unsigned) {
      const PreadSpan& read = schedule.reads[sub.first_read + k];
      read_exactly(files.fd(read.shard), read_target + read.slot_offset, read.bytes, read.file_offset,
                   index.shard_paths[read.shard], read.first_frame);
    });
    if (!sub.gpu_decoded) {
      pool_->run(sub.frame_count, [&](std::size_t k, unsigned) {
        const std::uint64_t frame = sub.first_frame + k;
        host_decode(acquisition, index, frame, read_target + schedule.chunk_slot_offsets[frame],
                    slot + k * plan.frame_bytes, plan.frame_bytes);
      });
      host_decoded += sub.frame_count;
    }
    read_seconds += seconds_since(read_start);
    progress.bytes_done += sub.stored_bytes;

    const int dense_slot = dense_slot_of(sub.batch);
    const std::uint64_t first_in_batch = sub.first_frame - sub.batch * batch_span;
    std::uint8_t* dense_target = encoder.dense_batch(dense_slot) + first_in_batch * plan.frame_bytes;
    if (sub.gpu_decoded) {
      const std::size_t device_slot = static_cast<std::size_t>(gpu_sub_batches++ % kDeviceSlots);
      auto* offsets = reinterpret_cast<std::uint64_t*>(slot + plan.table_offset);
      const std::uint64_t sizes_offset = (sub.frame_count * 8 + 15) / 16 * 16;
      auto* sizes = reinterpret_cast<std::uint32_t*>(slot + plan.table_offset + sizes_offset);
      for (std::uint64_t k = 0; k < sub.frame_count; ++k) {
        offsets[k] = schedule.chunk_slot_offsets[sub.first_frame + k];
        sizes[k] = static_cast<std::uint32_t>(index.frames[sub.first_frame + k].stored_bytes);
      }
      std::uint8_t* d_slot = device_slots[device_slot].as<std::uint8_t>();
      QUANTEM_CUDA_TRY(cudaStreamWaitEvent(copy, device_slot_decoded[device_slot].get(), 0));
      copy_timer.start(copy);
      QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_slot, slot, sub.slot_bytes, cudaMemcpyHostToDevice, copy));
      QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_slot + plan.table_offset, slot + plan.table_offset,
                                       sizes_offset + sub.frame_count * 4, cudaMemcpyHostToDevice, copy));
      copy_timer.stop(copy);
      QUANTEM_CUDA_TRY(cudaEventRecord(device_slot_copied[device_slot].get(), copy));
      QUANTEM_CUDA_TRY(cudaEventRecord(host_slot_free[static_cast<std::size_t>(host_slot)].get(), copy));

      if (opens_batch) begin_batch(sub.batch);  // after the copy is enqueued: it does not touch the dense slot
      QUANTEM_CUDA_TRY(cudaStreamWaitEvent(compute, device_slot_copied[device_slot].get(), 0));
      cuda::BitshuffleLz4Batch decode;
      decode.d_stored = d_slot;
      decode.stored_bytes = sub.slot_bytes;
      decode.d_chunk_offsets = reinterpret_cast<const std::uint64_t*>(d_slot + plan.table_offset);
      decode.d_chunk_sizes = reinterpret_cast<const std::uint32_t*>(d_slot + plan.table_offset + sizes_offset);
      decode.chunk_count = sub.frame_count;
      decode.element_size = element;
      decode.elements_per_chunk = plan.frame_pixels;
      decode.d_decoded = dense_target;
      decode.d_status = encoder.batch_statuses(dense_slot) + first_in_batch;
      decode_timer.start(compute);
      cuda::decode_bitshuffle_lz4(decode, bslz4_scratch.data(), bslz4_scratch.size(), compute);
      decode_timer.stop(compute);
      QUANTEM_CUDA_TRY(cudaEventRecord(device_slot_decoded[device_slot].get(), compute));
    } else {
      if (opens_batch) begin_batch(sub.batch);
      copy_timer.start(compute);
      QUANTEM_CUDA_TRY(cudaMemcpyAsync(dense_target, slot, sub.frame_count * plan.frame_bytes, cudaMemcpyHostToDevice,
                                       compute));
      copy_timer.stop(compute);
      QUANTEM_CUDA_TRY(cudaEventRecord(host_slot_free[static_cast<std::size_t>(host_slot)].get(), compute));
    }
    if (closes_batch) submit_batch(sub.batch);
    host_slot_used[static_cast<std::size_t>(host_slot)] = true;
    report.sub_batches += 1;
  }
  wait_seconds += worker.finish();  // rethrows the worker's error; the encoder is this thread's again
  if (progress.cancel_requested) throw LoadCancelled{};
  host_decoded += worker.rewritten_frames();

  std::string note;
  if (host_decoded != 0) {
    note = std::to_string(host_decoded) + " of " + std::to_string(plan.frames) + " chunks decoded on the host";
  }
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(copy));
  // On the encode stream, which waited for the last batch's decodes: every stream is idle afterwards.
  auto resident = encoder.finish(device_index, note);
  low_water.checkpoint();

  report.valid = true;
  report.read_seconds = read_seconds;
  report.wait_seconds = wait_seconds;
  report.gpu_copy_seconds = copy_timer.seconds();
  report.gpu_decode_seconds = decode_timer.seconds();
  report.gpu_encode_seconds = worker.encode_seconds();
  report.resident_bytes = resident->resident_bytes();
  report.host_decoded_chunks = host_decoded;
  report.allocated_peak_bytes = ledger->peak();
  report.measured_peak_bytes = low_water.peak_used_bytes();
  report.seconds = seconds_since(load_start);
  {
    std::lock_guard<std::mutex> lock(report_mutex_);
    report_ = report;
  }
  return resident;
}

}  // namespace

std::unique_ptr<CudaBackend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackendImpl>(options);
}

int cuda_device_count() noexcept { return cuda::device_count(); }

std::uint64_t cuda_resident_bytes_in_use() noexcept { return process_bytes_in_use().load(); }

std::shared_ptr<Resident> make_cuda_resident(const catalog::Acquisition& acquisition, const void* counts,
                                             std::size_t count_bytes, const CudaResidentOptions& options) {
  if (!acquisition.dtype) throw bad_request("the acquisition's dtype is unknown");
  if (!acquisition.scan_shape_known() || !acquisition.detector_shape_known()) {
    throw bad_request("the acquisition's scan and detector shapes must be known");
  }
  if (!acquisition.pixel_mask.empty() && acquisition.pixel_mask.size() != acquisition.frame_pixels()) {
    throw bad_request("the pixel mask has " + std::to_string(acquisition.pixel_mask.size()) +
                      " values; the detector has " + std::to_string(acquisition.frame_pixels()));
  }
  const std::uint64_t frame_bytes = acquisition.frame_pixels() * dtype_size(*acquisition.dtype);
  if (count_bytes != acquisition.frame_count() * frame_bytes) {
    throw bad_request("dense counts hold " + std::to_string(count_bytes) + " bytes; the acquisition needs " +
                      std::to_string(acquisition.frame_count() * frame_bytes));
  }
  if (cuda::device_count() == 0) {
    throw unavailable("CUDA unavailable: no CUDA device is visible to this process");
  }
  cuda::set_device(options.device_index);
  try {
    const CudaLoadPlan plan = plan_cuda_load(acquisition, options.tuning);
    Stream stream;
    // Synchronous, from one dense slot: each encode_batch returns once the
    // sizes are known, and the next copy into the slot is ordered after the
    // write on the same stream.
    ResidentEncoder encoder(acquisition, plan, /*dense_slots=*/1, stream.get(), std::make_shared<Ledger>());
    StreamDrain drain({stream.get()});
    const auto* bytes = static_cast<const std::uint8_t*>(counts);
    for (std::uint64_t first = 0; first < plan.frames; first += plan.batch_frames) {
      const std::uint64_t count = std::min(plan.batch_frames, plan.frames - first);
      QUANTEM_CUDA_TRY(cudaMemcpyAsync(encoder.dense_batch(0), bytes + first * frame_bytes, count * frame_bytes,
                                       cudaMemcpyHostToDevice, stream.get()));
      encoder.encode_batch(0, first, count);
    }
    return encoder.finish(options.device_index, "");
  } catch (const cuda::OutOfDeviceMemory& error) {
    throw payload_too_large("not enough device memory on GPU " + std::to_string(options.device_index) + " to hold " +
                            acquisition.name + ": " + error.what());
  }
}

}  // namespace quantem::backend
