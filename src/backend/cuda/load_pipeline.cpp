#include "load_pipeline.hpp"

#include <algorithm>
#include <exception>
#include <string>
#include <thread>

#include "quantem/core/clock.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/bitshuffle_lz4.hpp"
#include "quantem/kernels/cuda_error.hpp"
#include "quantem/kernels/device.hpp"

namespace quantem::backend::cuda {
namespace {

using Clock = std::chrono::steady_clock;

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
// the host. Checks: a chunk the GPU found corrupt fails the load
// (CorruptChunk naming frame, scan position and file). Repairs: valid
// bitshuffle data with a block size the GPU decoder does not take is read
// again, decoded on the host and copied into the dense slot on `stream`.
// Returns how many frames it repaired on the host.
std::uint64_t check_and_repair_batch(const BatchCheckSources& sources, const FilledBatch& batch,
                                     const std::uint32_t* statuses, std::uint8_t* d_dense, cudaStream_t stream) {
  std::vector<std::uint64_t> repairs;
  for (std::uint64_t i = 0; i < batch.frame_count; ++i) {
    if (statuses[i] == static_cast<std::uint32_t>(kernels::ChunkStatus::ok)) continue;
    if (statuses[i] == static_cast<std::uint32_t>(kernels::ChunkStatus::unsupported_block_size)) {
      repairs.push_back(batch.first_frame + i);
      continue;
    }
    throw CorruptChunk(describe_undecodable_frame(sources.acquisition, sources.index, batch.first_frame + i) +
                       ": bitshuffle/LZ4 " + kernels::chunk_status_name(static_cast<kernels::ChunkStatus>(statuses[i])));
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
    decode_stored_frame(sources.acquisition, sources.index, frame, stored.data(), decoded.data(), plan.frame_bytes);
    QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_dense + (frame - batch.first_frame) * plan.frame_bytes, decoded.data(),
                                     plan.frame_bytes, cudaMemcpyHostToDevice, stream));
    QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));  // `decoded` is reused
  }
  return repairs.size();
}

int dense_slot_of(std::uint64_t batch) { return static_cast<int>(batch % kDenseSlots); }

}  // namespace

PinnedSlots PinnedSlotPool::pin(std::uint64_t slot_bytes) {
  PinnedSlots slots;
  slots.slot_bytes = slot_bytes;
  for (int i = 0; i < kHostSlots; ++i) slots.slots.emplace_back(slot_bytes);
  return slots;
}

PinnedSlots PinnedSlotPool::take(std::uint64_t slot_bytes) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    filled_.wait(lock, [&] { return !filling_; });
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->slot_bytes >= slot_bytes) {
        PinnedSlots slots = std::move(*it);
        kept_.erase(it);
        return slots;
      }
    }
  }
  return pin(slot_bytes);
}

void PinnedSlotPool::give_back(PinnedSlots slots) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (kept_.size() < 2) kept_.push_back(std::move(slots));
}

void PinnedSlotPool::fill(std::uint64_t slot_bytes, const std::function<void()>& meanwhile) {
  bool fill_here = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fill_here = !filling_;  // otherwise another device's preparation is pinning the set
    if (fill_here) filling_ = true;
  }
  if (!fill_here) {
    if (meanwhile) meanwhile();
    return;
  }
  PinnedSlots slots;
  std::exception_ptr error;
  try {
    std::vector<kernels::HostPages> pages(kHostSlots);
    std::exception_ptr fault_error;
    std::thread faulting([&] {
      try {
        for (auto& slot_pages : pages) slot_pages = kernels::HostPages(slot_bytes, kFaultThreads);
      } catch (...) {
        fault_error = std::current_exception();
      }
    });
    try {
      if (meanwhile) meanwhile();
    } catch (...) {
      faulting.join();
      throw;
    }
    faulting.join();
    if (fault_error) std::rethrow_exception(fault_error);
    slots.slot_bytes = slot_bytes;
    for (auto& slot_pages : pages) slots.slots.emplace_back(std::move(slot_pages));
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    filling_ = false;
    if (!error && kept_.size() < 2) kept_.push_back(std::move(slots));
  }
  filled_.notify_all();
  if (error) std::rethrow_exception(error);
}

// Everything the load allocates or creates, destroyed in reverse order of
// declaration on every path (see the header).
struct LoadPipeline::Buffers {
  Buffers(LoadPipeline& pipeline, const CudaLoadPlan& plan, std::size_t sub_batch_count)
      : encode_stream(plan.prioritise_encoder ? Stream::Priority::highest : Stream::Priority::normal),
        pinned{pipeline.pinned_pool_, pipeline.pinned_pool_.take(plan.device_slot_bytes)},
        raw_areas(kHostSlots),
        encoder(pipeline.acquisition_, plan, kDenseSlots, encode_stream.get(), ledger,
                ResidentReservation(&pipeline.reservation_, plan.provisional_resident_bytes)) {
    for (int i = 0; i < kHostSlots; ++i) host_slot_free.emplace_back();
    for (int i = 0; i < kDeviceSlots; ++i) {
      device_slot_copied.emplace_back();
      device_slot_decoded.emplace_back();
    }
    for (int i = 0; i < kDenseSlots; ++i) batch_ready.emplace_back();
    copy_timer.reserve(sub_batch_count);  // no event is created inside the loop
    decode_timer.reserve(sub_batch_count);
  }

  FreeMemoryLowWater low_water;
  std::shared_ptr<Ledger> ledger = std::make_shared<Ledger>();
  Stream copy_stream;     // H2D of the staging slots
  Stream compute_stream;  // decodes (and copies of host-decoded frames) into the dense slots
  Stream encode_stream;   // the encode worker's
  struct PinnedReturn {
    PinnedSlotPool& pool;
    PinnedSlots slots;
    ~PinnedReturn() { pool.give_back(std::move(slots)); }
  } pinned;
  std::vector<std::vector<std::uint8_t>> raw_areas;  // stored chunks of host-decoded sub-batches
  std::vector<Event> host_slot_free;
  std::vector<Event> device_slot_copied;
  std::vector<Event> device_slot_decoded;
  std::vector<Event> batch_ready;  // per dense slot: its batch's last decode or copy
  EventTimer copy_timer;
  EventTimer decode_timer;
  ResidentEncoder encoder;
  std::vector<TrackedBuffer> device_slots;
  TrackedBuffer bslz4_scratch;
  std::unique_ptr<StreamDrain> drain;
  std::unique_ptr<BatchCheckSources> check_sources;
  std::unique_ptr<EncodeWorker> worker;
};

LoadPipeline::LoadPipeline(const catalog::Acquisition& acquisition, std::shared_ptr<const catalog::FrameIndex> index,
                           int device_index, LoadProgress& progress, LoadReservation& reservation,
                           const CudaLoadPlan& plan, ThreadPool& read_pool, PinnedSlotPool& pinned_pool)
    : acquisition_(acquisition),
      device_index_(device_index),
      progress_(progress),
      reservation_(reservation),
      plan_(plan),
      read_pool_(read_pool),
      pinned_pool_(pinned_pool),
      load_start_(Clock::now()),
      kept_index_(std::move(index)),
      index_(*kept_index_),
      schedule_(plan_reads(acquisition, index_, plan)),
      files_(index_.shard_paths),
      batch_span_(std::uint64_t{plan.groups_per_batch} * plan.frames_per_group),
      host_slot_used_(kHostSlots, false) {
  report_.admitted_peak_bytes = plan.admitted_bytes(true);
  report_.dense_bytes = plan.frames * plan.frame_bytes;
  report_.index_seconds = seconds_since(load_start_);
  report_.stored_bytes = schedule_.stored_bytes;
  progress_.bytes_total = schedule_.stored_bytes;
  progress_.bytes_done = 0;
  progress_.stage = LoadStage::decoding;

  buffers_ = std::make_unique<Buffers>(*this, plan, schedule_.sub_batches.size());
  Buffers& b = *buffers_;
  if (plan.gpu_decoder) {
    for (int i = 0; i < kDeviceSlots; ++i) b.device_slots.emplace_back(plan.device_slot_bytes, b.ledger);
    b.bslz4_scratch = TrackedBuffer(plan.bslz4_scratch_bytes, b.ledger);
  }
  b.drain = std::make_unique<StreamDrain>(
      std::vector<cudaStream_t>{b.copy_stream.get(), b.compute_stream.get(), b.encode_stream.get()});
  b.low_water.checkpoint();
  b.check_sources = std::make_unique<BatchCheckSources>(
      BatchCheckSources{acquisition_, index_, plan_, files_, progress_.cancel_requested});
  const BatchCheckSources& sources = *b.check_sources;
  b.worker = std::make_unique<EncodeWorker>(
      device_index_, b.encoder,
      [&sources](const FilledBatch& batch, const std::uint32_t* statuses, std::uint8_t* d_dense, cudaStream_t stream) {
        return check_and_repair_batch(sources, batch, statuses, d_dense, stream);
      },
      b.low_water);
  report_.setup_seconds = seconds_since(load_start_) - report_.index_seconds;
}

LoadPipeline::~LoadPipeline() = default;

std::shared_ptr<Resident> LoadPipeline::run() {
  const std::vector<SubBatch>& sub_batches = schedule_.sub_batches;
  for (std::size_t i = 0; i < sub_batches.size(); ++i) {
    const SubBatch& sub = sub_batches[i];
    if (progress_.cancel_requested) throw LoadCancelled{};
    buffers_->worker->rethrow_if_failed();  // e.g. a corrupt chunk of an earlier batch: stop reading
    const bool opens_batch = i == 0 || sub_batches[i - 1].batch != sub.batch;
    const bool closes_batch = i + 1 == sub_batches.size() || sub_batches[i + 1].batch != sub.batch;
    const int host_slot = static_cast<int>(i % kHostSlots);
    wait_for_host_slot(host_slot);
    read_sub_batch(sub, host_slot);
    if (sub.gpu_decoded) {
      upload_and_decode(sub, host_slot, opens_batch);
    } else {
      upload_host_decoded(sub, host_slot, opens_batch);
    }
    if (closes_batch) submit_batch(sub.batch);
    host_slot_used_[static_cast<std::size_t>(host_slot)] = true;
    report_.sub_batches += 1;
  }
  return finish();
}

void LoadPipeline::wait_for_host_slot(int host_slot) {
  if (!host_slot_used_[static_cast<std::size_t>(host_slot)]) return;
  const Clock::time_point wait_start = Clock::now();
  QUANTEM_CUDA_TRY(cudaEventSynchronize(buffers_->host_slot_free[static_cast<std::size_t>(host_slot)].get()));
  wait_seconds_ += seconds_since(wait_start);
}

// Reads (and, for chunks the GPU decoder does not take, decodes) a sub-batch
// into its pinned host slot.
void LoadPipeline::read_sub_batch(const SubBatch& sub, int host_slot) {
  const Clock::time_point read_start = Clock::now();
  std::uint8_t* slot = buffers_->pinned.slots.slots[static_cast<std::size_t>(host_slot)].as<std::uint8_t>();
  std::uint8_t* read_target = slot;
  if (!sub.gpu_decoded) {
    std::vector<std::uint8_t>& raw = buffers_->raw_areas[static_cast<std::size_t>(host_slot)];
    if (raw.size() < plan_.staging_bytes) raw.resize(plan_.staging_bytes);
    read_target = raw.data();
  }
  // Grain 1: each chunk of the loop is one item [k, k + 1), so the threads take reads and decodes one at a time.
  read_pool_.parallel_for(sub.read_count, 1, [&](std::size_t k, std::size_t, unsigned) {
    const PreadSpan& read = schedule_.reads[sub.first_read + k];
    read_exactly(files_.fd(read.shard), read_target + read.slot_offset, read.bytes, read.file_offset,
                 index_.shard_paths[read.shard], read.first_frame);
  });
  if (!sub.gpu_decoded) {
    read_pool_.parallel_for(sub.frame_count, 1, [&](std::size_t k, std::size_t, unsigned) {
      const std::uint64_t frame = sub.first_frame + k;
      decode_stored_frame(acquisition_, index_, frame, read_target + schedule_.chunk_slot_offsets[frame],
                          slot + k * plan_.frame_bytes, plan_.frame_bytes);
    });
    host_decoded_frames_ += sub.frame_count;
  }
  read_seconds_ += seconds_since(read_start);
  progress_.bytes_done += sub.stored_bytes;
}

std::uint8_t* LoadPipeline::dense_target(const SubBatch& sub) {
  const std::uint64_t first_in_batch = sub.first_frame - sub.batch * batch_span_;
  return buffers_->encoder.dense_batch(dense_slot_of(sub.batch)) + first_in_batch * plan_.frame_bytes;
}

// The sub-batch's stored chunks to a device staging slot (copy stream), then
// the GPU bitshuffle/LZ4 decode into the dense slot (compute stream).
void LoadPipeline::upload_and_decode(const SubBatch& sub, int host_slot, bool opens_batch) {
  Buffers& b = *buffers_;
  const cudaStream_t copy = b.copy_stream.get();
  const cudaStream_t compute = b.compute_stream.get();
  std::uint8_t* slot = b.pinned.slots.slots[static_cast<std::size_t>(host_slot)].as<std::uint8_t>();
  const std::size_t device_slot = static_cast<std::size_t>(gpu_sub_batches_++ % kDeviceSlots);
  auto* offsets = reinterpret_cast<std::uint64_t*>(slot + plan_.table_offset);
  const std::uint64_t sizes_offset = (sub.frame_count * 8 + 15) / 16 * 16;
  auto* sizes = reinterpret_cast<std::uint32_t*>(slot + plan_.table_offset + sizes_offset);
  for (std::uint64_t k = 0; k < sub.frame_count; ++k) {
    offsets[k] = schedule_.chunk_slot_offsets[sub.first_frame + k];
    sizes[k] = static_cast<std::uint32_t>(index_.frames[sub.first_frame + k].stored_bytes);
  }
  std::uint8_t* d_slot = b.device_slots[device_slot].as<std::uint8_t>();
  QUANTEM_CUDA_TRY(cudaStreamWaitEvent(copy, b.device_slot_decoded[device_slot].get(), 0));
  b.copy_timer.start(copy);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_slot, slot, sub.slot_bytes, cudaMemcpyHostToDevice, copy));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_slot + plan_.table_offset, slot + plan_.table_offset,
                                   sizes_offset + sub.frame_count * 4, cudaMemcpyHostToDevice, copy));
  b.copy_timer.stop(copy);
  QUANTEM_CUDA_TRY(cudaEventRecord(b.device_slot_copied[device_slot].get(), copy));
  QUANTEM_CUDA_TRY(cudaEventRecord(b.host_slot_free[static_cast<std::size_t>(host_slot)].get(), copy));

  if (opens_batch) begin_batch(sub.batch);  // after the copy is enqueued: it does not touch the dense slot
  QUANTEM_CUDA_TRY(cudaStreamWaitEvent(compute, b.device_slot_copied[device_slot].get(), 0));
  const std::uint64_t first_in_batch = sub.first_frame - sub.batch * batch_span_;
  kernels::BitshuffleLz4Batch decode;
  decode.d_stored = d_slot;
  decode.stored_bytes = sub.slot_bytes;
  decode.d_chunk_offsets = reinterpret_cast<const std::uint64_t*>(d_slot + plan_.table_offset);
  decode.d_chunk_sizes = reinterpret_cast<const std::uint32_t*>(d_slot + plan_.table_offset + sizes_offset);
  decode.chunk_count = sub.frame_count;
  decode.element_size = dtype_size(plan_.source_dtype);
  decode.elements_per_chunk = plan_.frame_pixels;
  decode.d_decoded = dense_target(sub);
  decode.d_status = b.encoder.batch_statuses(dense_slot_of(sub.batch)) + first_in_batch;
  b.decode_timer.start(compute);
  kernels::decode_bitshuffle_lz4(decode, b.bslz4_scratch.data(), b.bslz4_scratch.size(), compute, plan_.bslz4_tuning);
  b.decode_timer.stop(compute);
  QUANTEM_CUDA_TRY(cudaEventRecord(b.device_slot_decoded[device_slot].get(), compute));
}

// Frames decoded on the host go straight into the dense slot (compute stream).
void LoadPipeline::upload_host_decoded(const SubBatch& sub, int host_slot, bool opens_batch) {
  Buffers& b = *buffers_;
  const cudaStream_t compute = b.compute_stream.get();
  std::uint8_t* slot = b.pinned.slots.slots[static_cast<std::size_t>(host_slot)].as<std::uint8_t>();
  if (opens_batch) begin_batch(sub.batch);
  b.copy_timer.start(compute);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(dense_target(sub), slot, sub.frame_count * plan_.frame_bytes,
                                   cudaMemcpyHostToDevice, compute));
  b.copy_timer.stop(compute);
  QUANTEM_CUDA_TRY(cudaEventRecord(b.host_slot_free[static_cast<std::size_t>(host_slot)].get(), compute));
}

// Before batch b's first decode or copy into its dense slot: the slot's
// previous batch (b - 2) must have been taken by the worker (host handshake)
// and its encode must run before anything below (device wait).
void LoadPipeline::begin_batch(std::uint64_t batch) {
  Buffers& b = *buffers_;
  const int slot = dense_slot_of(batch);
  wait_seconds_ += b.worker->acquire_slot(batch, slot, b.compute_stream.get());
  QUANTEM_CUDA_TRY(
      cudaMemsetAsync(b.encoder.batch_statuses(slot), 0, plan_.batch_statuses_bytes, b.compute_stream.get()));
}

// After batch b's last decode or copy: hand the slot to the worker. The slot's
// `ready` event is recorded again only after the next begin_batch of this
// slot, by which time the worker has enqueued its wait on this record.
void LoadPipeline::submit_batch(std::uint64_t batch) {
  Buffers& b = *buffers_;
  FilledBatch filled;
  filled.number = batch;
  filled.slot = dense_slot_of(batch);
  filled.first_frame = batch * batch_span_;
  filled.frame_count = std::min(batch_span_, plan_.frames - filled.first_frame);
  filled.ready = b.batch_ready[static_cast<std::size_t>(filled.slot)].get();
  QUANTEM_CUDA_TRY(cudaEventRecord(filled.ready, b.compute_stream.get()));
  b.worker->submit(filled);
  report_.batches += 1;
}

std::shared_ptr<Resident> LoadPipeline::finish() {
  Buffers& b = *buffers_;
  wait_seconds_ += b.worker->finish();  // rethrows the worker's error; the encoder is this thread's again
  if (progress_.cancel_requested) throw LoadCancelled{};
  host_decoded_frames_ += b.worker->rewritten_frames();

  std::string note;
  if (host_decoded_frames_ != 0) {
    note = std::to_string(host_decoded_frames_) + " of " + std::to_string(plan_.frames) + " chunks decoded on the host";
  }
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(b.copy_stream.get()));
  const Clock::time_point finish_start = Clock::now();
  // On the encode stream, which waited for the last batch's decodes: every stream is idle afterwards.
  auto resident = b.encoder.finish(device_index_, note);
  b.low_water.checkpoint();

  report_.valid = true;
  report_.read_seconds = read_seconds_;
  report_.wait_seconds = wait_seconds_;
  report_.gpu_copy_seconds = b.copy_timer.seconds();
  report_.gpu_decode_seconds = b.decode_timer.seconds();
  report_.gpu_encode_seconds = b.worker->encode_seconds();
  report_.resident_bytes = resident->resident_bytes();
  report_.host_decoded_chunks = host_decoded_frames_;
  report_.allocated_peak_bytes = b.ledger->peak();
  report_.measured_peak_bytes = b.low_water.peak_used_bytes();
  report_.reserved_peak_bytes =
      plan_.working_bytes(true) + std::max(plan_.provisional_resident_bytes, b.encoder.reserved_resident_bytes());
  report_.finish_seconds = seconds_since(finish_start);
  report_.seconds = seconds_since(load_start_);
  return resident;
}

}  // namespace quantem::backend::cuda
