#pragma once
// Internal: the encode side of a CUDA load from files, on its own host thread
// and its own stream, so that encoding batch b overlaps reading, copying and
// decoding batch b + 1 (docs/decisions/0007-overlapped-load-pipeline.md).
//
// The loader (its "main" thread) decodes batch b into dense slot
// b % encoder.dense_slots() on its compute stream, records the batch's `ready`
// event there and submit()s it. The worker, per batch, in order:
//   1. makes its stream wait for `ready` (device side);
//   2. copies the slot's statuses to the host and runs the loader's
//      BatchCheck (typed CorruptChunk, host decodes of chunks the GPU decoder
//      does not take, cancellation);
//   3. ResidentEncoder::encode_batch: measure (blocks this thread only),
//      allocate the piece, enqueue the write;
//   4. records the slot's `free` event on its stream, then counts the batch as
//      released under the mutex and notifies.
// Before the loader decodes batch b + slots into the same slot it calls
// acquire_slot(): the host waits only until batch b is released, i.e. until
// its `free` event has been RECORDED (not until the GPU has run the write),
// then the compute stream waits for that event on the device. The host
// handshake is needed because cudaStreamWaitEvent on an event that has not
// been recorded yet waits for nothing.
//
// Why events are never re-recorded under a reader: slot s's `free` event is
// recorded again only for batch b + slots, which the worker gets only after
// the loader's acquire_slot() for it has enqueued its wait; the loader
// re-records slot s's `ready` event only after that acquire_slot(), i.e. after
// the worker's stream wait for batch b was enqueued.
//
// Shared state: the worker thread and the loader share only the members under
// mutex_ (queue, counts, stop flag, first error). The encoder, the worker's
// stream, its timer and its counters belong to the worker from construction
// until finish() returns (the mutex orders both hand-overs); the BatchCheck
// must only read data that stays unchanged during the load.
//
// Errors: the first exception of the worker is kept and rethrown unchanged
// (same type) on the loader's thread by submit(), acquire_slot(),
// rethrow_if_failed() and finish(); the worker takes no batch after it.
// The destructor stops and joins the thread, then waits for the worker's
// stream: destroy the worker before any buffer its stream uses (declare it
// after them, and after the loader's StreamDrain).
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda_support.hpp"
#include "resident_encoder.hpp"

namespace quantem::backend::cuda {

// A dense slot the loader has filled with one batch.
struct FilledBatch {
  std::uint64_t number = 0;       // batch index: 0, 1, 2, ... in submission order
  int slot = 0;                   // dense slot of the encoder
  std::uint64_t first_frame = 0;
  std::uint64_t frame_count = 0;
  cudaEvent_t ready = nullptr;    // recorded on the loader's stream after the batch's last decode or copy
};

// Runs on the worker thread once the batch's statuses are on the host
// (`statuses`, one per frame of the batch) and before the batch is encoded.
// Throws to fail the load; may rewrite frames of the dense slot `d_dense` on
// `stream` (and must finish reading its host sources before returning);
// returns how many frames it rewrote.
using BatchCheck = std::function<std::uint64_t(const FilledBatch& batch, const std::uint32_t* statuses,
                                               std::uint8_t* d_dense, cudaStream_t stream)>;

class EncodeWorker {
 public:
  // Starts the thread. `encoder` (its stream is the worker's stream) and
  // `low_water` must outlive the worker; the device index is bound on the thread.
  EncodeWorker(int device_index, ResidentEncoder& encoder, BatchCheck check, FreeMemoryLowWater& low_water);
  ~EncodeWorker();
  EncodeWorker(const EncodeWorker&) = delete;
  EncodeWorker& operator=(const EncodeWorker&) = delete;

  // Loader thread only, for all of the following.
  // Hands a filled batch to the worker (its `ready` event already recorded).
  void submit(const FilledBatch& batch);
  // Before batch `batch_number` is written into `slot`: waits on the host until
  // the slot's previous batch is released, then makes `stream` wait for its
  // `free` event. Returns the seconds the host waited.
  double acquire_slot(std::uint64_t batch_number, int slot, cudaStream_t stream);
  void rethrow_if_failed();
  // Waits until every submitted batch is released (its write enqueued on the
  // encoder's stream). Returns the seconds the host waited. The encoder, the
  // timer and the counters are the loader's again afterwards.
  double finish();

  // After finish(), and once the encoder's stream has finished (ResidentEncoder::finish):
  double encode_seconds() const { return encode_timer_.seconds(); }
  std::uint64_t rewritten_frames() const { return rewritten_frames_; }

 private:
  void run() noexcept;
  void encode(const FilledBatch& batch);
  // With mutex_ held: the worker's error, if any.
  void rethrow_locked() const;

  const int device_index_;
  ResidentEncoder& encoder_;
  const cudaStream_t stream_;
  const BatchCheck check_;
  FreeMemoryLowWater& low_water_;

  // The worker's (the loader reads the timer and the count after finish()).
  kernels::PinnedBuffer host_statuses_;
  std::vector<Event> slot_free_;  // recorded by the worker; the loader's stream waits on them (acquire_slot)
  EventTimer encode_timer_;
  std::uint64_t rewritten_frames_ = 0;

  // Shared, under mutex_.
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<FilledBatch> queue_;
  std::uint64_t submitted_ = 0;  // batches handed over
  std::uint64_t released_ = 0;   // batches whose slot-free event is recorded (in order)
  bool stopping_ = false;
  std::exception_ptr error_;

  std::thread thread_;  // last: starts once every member above exists
};

}  // namespace quantem::backend::cuda
