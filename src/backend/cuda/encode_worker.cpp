#include "encode_worker.hpp"

#include <chrono>
#include <string>

#include "quantem/core/clock.hpp"
#include "quantem/core/error.hpp"

namespace quantem::backend::cuda {
namespace {

using Clock = std::chrono::steady_clock;


}  // namespace

EncodeWorker::EncodeWorker(int device_index, ResidentEncoder& encoder, BatchCheck check,
                           FreeMemoryLowWater& low_water)
    : device_index_(device_index),
      encoder_(encoder),
      stream_(encoder.stream()),
      check_(std::move(check)),
      low_water_(low_water),
      host_statuses_(encoder.plan().batch_frames * 4) {
  for (int slot = 0; slot < encoder.dense_slots(); ++slot) slot_free_.emplace_back();
  encode_timer_.reserve(encoder.plan().batches);
  thread_ = std::thread([this] { run(); });
}

EncodeWorker::~EncodeWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();  // the batch in hand, if any, is finished first
  // The worker's events and pinned statuses may still be used by its stream.
  QUANTEM_CUDA_TRY_NOTHROW(cudaStreamSynchronize(stream_));
}

void EncodeWorker::rethrow_locked() const {
  if (error_) std::rethrow_exception(error_);
}

void EncodeWorker::rethrow_if_failed() {
  std::lock_guard<std::mutex> lock(mutex_);
  rethrow_locked();
}

void EncodeWorker::submit(const FilledBatch& batch) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rethrow_locked();
    if (batch.number != submitted_ || batch.slot < 0 || batch.slot >= encoder_.dense_slots()) {
      throw internal_error("CUDA load: batch " + std::to_string(batch.number) + " in slot " +
                           std::to_string(batch.slot) + " handed to the encoder out of order");
    }
    queue_.push_back(batch);
    ++submitted_;
  }
  changed_.notify_all();
}

double EncodeWorker::acquire_slot(std::uint64_t batch_number, int slot, cudaStream_t stream) {
  const auto slots = static_cast<std::uint64_t>(encoder_.dense_slots());
  if (static_cast<std::uint64_t>(slot) != batch_number % slots) {
    throw internal_error("CUDA load: batch " + std::to_string(batch_number) + " does not go to slot " +
                         std::to_string(slot));
  }
  if (batch_number < slots) {  // first use of the slot: nothing to wait for
    rethrow_if_failed();
    return 0.0;
  }
  const Clock::time_point wait_start = Clock::now();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t previous = batch_number - slots;  // the batch now in the slot
    if (previous >= submitted_) {  // it would never be released: the loader skipped a submit
      throw internal_error("CUDA load: slot " + std::to_string(slot) + " reused for batch " +
                           std::to_string(batch_number) + " before batch " + std::to_string(previous) +
                           " was handed to the encoder");
    }
    changed_.wait(lock, [&] { return released_ > previous || error_; });
    rethrow_locked();
  }
  // Recorded (released_ > previous) and not recorded again before this
  // loader submits batch_number: the wait orders exactly after batch
  // `previous`'s write.
  QUANTEM_CUDA_TRY(cudaStreamWaitEvent(stream, slot_free_[static_cast<std::size_t>(slot)].get(), 0));
  return seconds_since(wait_start);
}

double EncodeWorker::finish() {
  const Clock::time_point wait_start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return released_ == submitted_ || error_; });
  rethrow_locked();
  return seconds_since(wait_start);
}

void EncodeWorker::run() noexcept {
  try {
    kernels::set_device(device_index_);  // before any CUDA call of this thread
    for (;;) {
      FilledBatch batch;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        batch = queue_.front();
        queue_.pop_front();
      }
      encode(batch);  // records the slot's free event
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++released_;
      }
      changed_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    changed_.notify_all();
  }
}

void EncodeWorker::encode(const FilledBatch& batch) {
  QUANTEM_CUDA_TRY(cudaStreamWaitEvent(stream_, batch.ready, 0));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(host_statuses_.data(), encoder_.batch_statuses(batch.slot), batch.frame_count * 4,
                                   cudaMemcpyDeviceToHost, stream_));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream_));  // blocks this thread only
  rewritten_frames_ +=
      check_(batch, host_statuses_.as<std::uint32_t>(), encoder_.dense_batch(batch.slot), stream_);
  encode_timer_.start(stream_);
  encoder_.encode_batch(batch.slot, batch.first_frame, batch.frame_count);
  encode_timer_.stop(stream_);
  low_water_.checkpoint();  // the batch's piece is allocated
  QUANTEM_CUDA_TRY(cudaEventRecord(slot_free_[static_cast<std::size_t>(batch.slot)].get(), stream_));
}

}  // namespace quantem::backend::cuda
