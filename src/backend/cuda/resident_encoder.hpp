#pragma once
// Internal: turns dense batches of frames on the device into one CudaResident.
// A batch is groups_per_batch ANS groups of consecutive frames, held in one of
// the encoder's dense slots (two during a load from files, so that one is
// decoded into while the other is encoded); for each one
// the encoder zeroes masked pixels (and tracks the largest count), measures
// every group's encoded size — the measuring pass also adds the batch to the
// acquisition's pattern sum (the resident keeps it for uncropped plans) and
// writes the batch's seek points — then, in one more pass over the frames,
// adds their exact ring sums to the resident's ring table (rings around the
// bright-field centre of the first batch: ring_partition.hpp) and their
// moments to the moments table, checks the running total against the plan's
// bound, allocates one exactly sized piece, writes the groups into it and
// builds their decode tables.
// Used by the file loader and by make_cuda_resident (dense host counts).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cuda_resident.hpp"
#include "cuda_support.hpp"
#include "cuda_load_plan.hpp"
#include "quantem/backend/ring_partition.hpp"
#include "quantem/catalog/acquisition.hpp"

namespace quantem::backend::cuda {

// The part of a load's reservation that covers the resident itself: admission
// reserved `provisional_bytes` of it; each allocation of the resident (a
// batch's piece, the ring table, the group table) is taken from it, and the
// reservation grows first when an allocation would go past what is held.
// Without a LoadReservation (dense counts: make_cuda_resident) it only counts.
class ResidentReservation {
 public:
  ResidentReservation(LoadReservation* reservation, std::uint64_t provisional_bytes)
      : reservation_(reservation), held_(provisional_bytes) {}
  // Before allocating `bytes` (counted in whole allocation granules).
  void take(std::uint64_t bytes);
  std::uint64_t taken_bytes() const { return taken_; }

 private:
  LoadReservation* reservation_;
  std::uint64_t held_;
  std::uint64_t taken_ = 0;
};

class ResidentEncoder {
 public:
  // Allocates `dense_slots` dense batches, each with its status array, the
  // encoder scratch and the masked-pixel list (throws kernels::OutOfDeviceMemory),
  // and enqueues their initialisation on `stream`, the stream every encode runs
  // on. The device must be bound.
  ResidentEncoder(const catalog::Acquisition& source, const CudaLoadPlan& plan, int dense_slots, cudaStream_t stream,
                  std::shared_ptr<Ledger> ledger, ResidentReservation reservation);
  ~ResidentEncoder();
  ResidentEncoder(const ResidentEncoder&) = delete;
  ResidentEncoder& operator=(const ResidentEncoder&) = delete;

  // plan(), stream(), dense_slots(), dense_batch() and batch_statuses() do not
  // change between construction and finish(): any thread may call them.
  const CudaLoadPlan& plan() const { return plan_; }
  cudaStream_t stream() const { return stream_; }
  int dense_slots() const { return static_cast<int>(slots_.size()); }
  // Device: plan.batch_frames frames of the source dtype, and one status per frame, of slot `slot`.
  std::uint8_t* dense_batch(int slot) const {
    return slots_.at(static_cast<std::size_t>(slot)).frames.as<std::uint8_t>();
  }
  std::uint32_t* batch_statuses(int slot) const {
    return slots_.at(static_cast<std::size_t>(slot)).statuses.as<std::uint32_t>();
  }

  // Encodes the frames [first_frame, first_frame + frame_count) now held in
  // dense slot `slot` (first_frame a multiple of frames_per_group, batches in
  // frame order), on stream(). Blocks the calling thread until the sizes are
  // known; the write itself stays asynchronous on the stream, so the slot is
  // free once work enqueued on stream() after this call has run.
  // Throws Error(payload_too_large) when the encoded acquisition would exceed
  // plan.resident_bound_bytes, kernels::OutOfDeviceMemory when allocation fails,
  // and what the reservation's grow() throws (payload_too_large, unavailable).
  // Not thread-safe: one thread at a time (during a load, the encode worker).
  void encode_batch(int slot, std::uint64_t first_frame, std::uint64_t frame_count);

  // Frees the working buffers, builds the group table, waits for the stream.
  // `note` (may be empty) is appended to the encoding, e.g. how many chunks the host decoded.
  std::shared_ptr<CudaResident> finish(int device_index, const std::string& note);

  std::uint64_t encoded_bytes() const { return encoded_bytes_; }
  // Granule-rounded bytes of the resident's allocations so far (each one taken from the reservation first).
  std::uint64_t reserved_resident_bytes() const { return reservation_.taken_bytes(); }

 private:
  // On the first batch: the ring partition around the batch's bright-field
  // centre, its device tables and the resident's ring table (blocks on the stream).
  void set_up_rings();  // from d_pattern_ after the first batch
  // Enqueues the ring sums and moments of the batch's frames (the partition set up).
  void enqueue_ring_pass(const void* d_frames, std::uint64_t first_frame, std::uint64_t frame_count);
  // The steps of encode_batch, in order. Where the batch's seek points go
  // (nullptr: no seek points); the encoder's view of the batch.
  std::uint32_t* batch_seek_points(std::uint64_t first_group) const;
  kernels::AnsEncodeBatch encode_batch_shape(void* d_frames, std::uint64_t frame_count, std::uint32_t* seek_points) const;
  // The measuring pass and the ring pass; blocks until the groups' encoded sizes are known.
  std::vector<std::uint64_t> measure_batch(const kernels::AnsEncodeBatch& batch, std::uint64_t first_frame);
  // The groups' offsets in host_offsets_, the bound checked, the piece allocated.
  TrackedBuffer place_piece(const std::vector<std::uint64_t>& sizes, std::uint64_t end_frame);
  // What the load derives from the written groups: decode tables, seek points by decoding.
  void enqueue_derived_tables(const kernels::AnsResidentView& written, std::uint64_t first_group,
                              std::uint32_t* seek_points);

  struct DenseSlot {
    TrackedBuffer frames;
    TrackedBuffer statuses;
  };

  // The resident's pinned host staging for its first product
  // (CudaResident::first_product_staging_bytes), allocated and pinned on
  // staging_thread_ while the load runs; handed over by finish().
  void prepare_host_staging();
  void join_host_staging() noexcept;

  catalog::Acquisition source_;
  CudaLoadPlan plan_;
  cudaStream_t stream_;
  std::shared_ptr<Ledger> ledger_;
  std::uint32_t masked_count_ = 0;
  TrackedBuffer masked_;
  std::vector<DenseSlot> slots_;
  TrackedBuffer misc_;     // max value | the batch's group offsets
  TrackedBuffer scratch_;  // ANS encoder scratch
  kernels::PinnedBuffer host_offsets_;  // the batch's group offsets, staged for the copy
  kernels::PinnedBuffer host_sizes_;    // the batch's blob sizes, as the measuring pass copies them back
  Event measured_;                   // recorded after each batch's measuring pass
  std::vector<TrackedBuffer> pieces_;
  std::vector<const std::uint8_t*> group_addresses_;
  std::uint64_t encoded_bytes_ = 0;
  std::uint64_t encoded_frames_ = 0;

  ResidentReservation reservation_;
  std::optional<RingPartition> rings_;
  std::uint32_t ring_sum_bytes_ = 0;
  TrackedBuffer d_pattern_;         // load only: Σ of every frame so far (uint64 per pixel)
  TrackedBuffer d_seek_points_;     // the streams' seek points, kept by the resident
  TrackedBuffer d_decode_tables_;   // every group's decode tables, kept by the resident
  TrackedBuffer d_pixels_by_ring_;  // load only
  TrackedBuffer d_ring_of_sorted_;  // load only
  TrackedBuffer d_ring_of_pixel_;   // load only
  TrackedBuffer d_ring_sums_;       // [ring][frame], kept by the resident
  TrackedBuffer d_frame_moments_;   // [Σ I | Σ row·I | Σ col·I][frame], kept by the resident
  std::thread staging_thread_;
  kernels::PinnedBuffer host_staging_;  // written by staging_thread_ until joined
};

}  // namespace quantem::backend::cuda
