#pragma once
// Internal: one CUDA load from files, as a pipeline object
// (docs/decisions/0007-overlapped-load-pipeline.md). Its members are the
// load's streams, events, staging slots and timers; its methods are the
// stages, run in order by run():
//
//   for each sub-batch (a slice of one dense batch, sized for one pinned slot):
//     read_sub_batch            coalesced preads into a pinned host slot (on the
//                               read pool); chunks the GPU decoder does not take
//                               are decoded on the host there;
//     upload_and_decode         H2D copy into a device staging slot (copy stream),
//                               then the GPU bitshuffle/LZ4 decode into the
//                               batch's dense slot (compute stream); or
//     upload_host_decoded       H2D copy of host-decoded frames into the dense slot;
//     begin_batch / submit_batch  the dense slot's hand-over to the encode worker,
//                               which checks statuses (check_and_repair_batch), then
//                               ANS-encodes the batch on its own thread and stream;
//   finish                      the worker's last batch, the resident, the report.
//
// Destruction order is the declaration order reversed: the encode worker
// first (stopped, joined, its stream drained), then the StreamDrain waits for
// all three streams, then buffers are freed and the pinned slots returned.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_support.hpp"
#include "encode_worker.hpp"
#include "cuda_load_plan.hpp"
#include "quantem/backend/thread_pool.hpp"
#include "resident_encoder.hpp"
#include "quantem/backend/backend.hpp"
#include "quantem/backend/cuda_load.hpp"
#include "quantem/backend/shard_reader.hpp"
#include "quantem/catalog/acquisition.hpp"

namespace quantem::backend::cuda {

// Pinned host staging slots, kept between loads (pinning memory is slow).
struct PinnedSlots {
  std::uint64_t slot_bytes = 0;
  std::vector<kernels::PinnedBuffer> slots;
};

// Keeps up to two sets of pinned slots for the next loads. Thread-safe.
class PinnedSlotPool {
 public:
  PinnedSlots take(std::uint64_t slot_bytes);
  void give_back(PinnedSlots slots);
  // Start-up: pins one set of slots for the pool. A take() meanwhile waits for
  // that set rather than pin a second one beside it (a daemon's first request
  // often arrives while the devices are being prepared: pinning 192 MiB twice
  // at once costs the first load more than waiting for the one in progress).
  // `meanwhile` (creating the device's context) runs on the calling thread
  // while another faults the slots' pages in (kernels::HostPages); the calling
  // thread then registers them, so it needs a device bound by then.
  void fill(std::uint64_t slot_bytes, const std::function<void()>& meanwhile = {});

 private:
  static PinnedSlots pin(std::uint64_t slot_bytes);

  std::mutex mutex_;
  std::condition_variable filled_;
  bool filling_ = false;
  std::vector<PinnedSlots> kept_;
};

class LoadPipeline {
 public:
  // `index` is the acquisition's frame index (Backend::frame_index); `plan`
  // comes from plan_cuda_load(acquisition, ...); the device is bound on the
  // calling thread, which runs run().
  // `reservation` holds plan.admitted_bytes(true); the encoder grows it
  // before resident allocations beyond plan.provisional_resident_bytes.
  LoadPipeline(const catalog::Acquisition& acquisition, std::shared_ptr<const catalog::FrameIndex> index,
               int device_index, LoadProgress& progress, LoadReservation& reservation, const CudaLoadPlan& plan,
               ThreadPool& read_pool, PinnedSlotPool& pinned_pool);
  ~LoadPipeline();
  LoadPipeline(const LoadPipeline&) = delete;
  LoadPipeline& operator=(const LoadPipeline&) = delete;

  // Runs every stage; throws LoadCancelled, CorruptChunk, IoError,
  // kernels::OutOfDeviceMemory, ... (the caller maps them).
  std::shared_ptr<Resident> run();

  // Timings and byte counts of the finished load.
  const CudaLoadReport& report() const { return report_; }

 private:
  struct Buffers;  // everything allocated for the load, in destruction order

  void read_sub_batch(const SubBatch& sub, int host_slot);
  void upload_and_decode(const SubBatch& sub, int host_slot, bool opens_batch);
  void upload_host_decoded(const SubBatch& sub, int host_slot, bool opens_batch);
  void begin_batch(std::uint64_t batch);
  void submit_batch(std::uint64_t batch);
  void wait_for_host_slot(int host_slot);
  std::uint8_t* dense_target(const SubBatch& sub);
  std::shared_ptr<Resident> finish();

  const catalog::Acquisition& acquisition_;
  const int device_index_;
  LoadProgress& progress_;
  LoadReservation& reservation_;
  const CudaLoadPlan& plan_;
  ThreadPool& read_pool_;
  PinnedSlotPool& pinned_pool_;
  const std::chrono::steady_clock::time_point load_start_;
  const std::shared_ptr<const catalog::FrameIndex> kept_index_;
  const catalog::FrameIndex& index_;
  const ReadSchedule schedule_;
  ShardFiles files_;
  const std::uint64_t batch_span_;  // frames per dense batch

  CudaLoadReport report_;
  std::uint64_t host_decoded_frames_ = 0;
  std::uint64_t gpu_sub_batches_ = 0;
  double read_seconds_ = 0.0;
  double wait_seconds_ = 0.0;
  std::vector<bool> host_slot_used_;

  std::unique_ptr<Buffers> buffers_;
};

}  // namespace quantem::backend::cuda
