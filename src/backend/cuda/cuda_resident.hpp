#pragma once
// Internal: the CUDA resident. One acquisition as ANS groups (docs/kernels.md)
// on one device, in a few exactly sized device pieces (one per load batch).
// A device table holds each group's address as an offset from the lowest
// piece, so one AnsResidentView spans every piece and one launch serves the
// whole scan. Every primitive binds the resident's device on the calling
// thread, works on that thread's per-thread stream with stream-ordered
// scratch, copies results back through the resident's pinned staging, and
// decodes only what it needs:
//   masked_sum           the ring sums of the rings the mask holds whole, plus
//                        the streams its other pixels touch, of the groups the region touches;
//   center_of_mass_sums  nothing at detector bin 1 (the per-frame moments table);
//                        otherwise every stream of those groups, three weighted sums per frame;
//   frame                a frame of the seek segment held in the recent frames: nothing
//                        (a copy); otherwise that segment from its seek point up to
//                        kRecentFramesLookahead frames past the frame, kept as the recent frames;
//   region sums, cropped pattern sums
//                        the groups holding the frames, each up to its last needed frame;
//   region max           the same, per position (scan-binned frames built in slots).
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "quantem/backend/backend.hpp"
#include "quantem/backend/ring_partition.hpp"
#include "quantem/kernels/ans.hpp"
#include "quantem/kernels/device.hpp"
#include "quantem/kernels/resident_products.hpp"
#include "quantem/kernels/scratch_layout.hpp"

namespace quantem::backend::cuda {

// The resident's exact per-frame ring sums (ring_partition.hpp), filled
// during the load: d_ring_sums[ring * frames + frame], sum_bytes each.
struct CudaRingTable {
  RingPartition partition;
  std::uint32_t sum_bytes = 4;
  TrackedBuffer d_ring_sums;
};

// The resident's stream seek points (kernels::ans_record_seek_points), filled
// during the load: decodes start at the nearest point before the first frame
// they need, and a masked sum decodes each group as several shorter chains.
struct CudaSeekTable {
  std::uint32_t frames_per_point = 0;  // 0: none
  TrackedBuffer d_points;
};

// Room for the decoded frames of one seek segment (CudaLoadTuning::
// recent_frames_max_bytes), allocated at load: `capacity` frames of the
// resident's held dtype.
struct CudaRecentFrames {
  std::uint64_t capacity = 0;  // frames; 0: none kept
  TrackedBuffer d_frames;
};

// Frames decoded past the requested one when a frame request fills the
// recent frames (a cursor moving along the row finds the next ones held).
inline constexpr std::uint32_t kRecentFramesLookahead = 64;

// 4 (uint32) when no ring sum of `dtype` values can reach 2^32, else 8.
std::uint32_t ring_sum_bytes_for(const RingPartition& partition, DType dtype);

class CudaResident final : public Resident {
 public:
  CudaResident(catalog::Acquisition source, DType resident_dtype, std::string encoding, int device_index,
               std::uint32_t frames_per_group, std::vector<TrackedBuffer> pieces, TrackedBuffer group_offsets,
               const std::uint8_t* base, CudaRingTable rings, TrackedBuffer frame_moments, CudaSeekTable seek,
               TrackedBuffer decode_tables, CudaRecentFrames recent, std::vector<std::uint64_t> full_pattern,
               int accumulate_frames_cta_threads);
  // Binds the resident's device so its pieces are freed there (on whichever thread drops it).
  ~CudaResident() override;

  int device_index() const override { return device_index_; }
  std::uint64_t resident_bytes() const override { return resident_bytes_; }
  std::string encoding() const override { return encoding_; }
  DType resident_dtype() const override { return resident_dtype_; }
  const catalog::Acquisition& source() const override { return source_; }

  // Pinned host staging of `bytes` or more as the products grow it (a power of two, 1 MiB at least).
  static std::size_t host_staging_bytes(std::size_t bytes);
  // What a product over every scan position of `source` stages (its uint64
  // per frame, the mask's entries): the load pins this much beforehand
  // (ResidentEncoder), so the first request after a load allocates nothing.
  static std::size_t first_product_staging_bytes(const catalog::Acquisition& source);
  // Takes pinned host staging prepared off the request path (kept when larger than the current one).
  void adopt_host_staging(kernels::PinnedBuffer staging);

 protected:
  std::vector<std::uint64_t> compute_pattern_sum(const plan::PlanGeometry& geometry) override;
  std::vector<std::uint64_t> compute_masked_sum(const plan::PlanGeometry& geometry,
                                                const std::vector<std::uint8_t>& binned_detector_mask) override;
  std::optional<std::vector<std::uint32_t>> compute_masked_sum_u32(
      const plan::PlanGeometry& geometry, const std::vector<std::uint8_t>& binned_detector_mask) override;
  // One pass over the resident per kernels::kAnsMasksPerPass masks (masked_sums.cpp).
  std::vector<std::optional<std::vector<std::uint32_t>>> compute_masked_sums_u32(
      const plan::PlanGeometry& geometry, const std::vector<std::vector<std::uint8_t>>& binned_detector_masks) override;
  CenterOfMassSums compute_center_of_mass_sums(const plan::PlanGeometry& geometry) override;
  std::vector<std::uint64_t> compute_frame(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                           std::uint64_t scan_col) override;
  std::optional<std::vector<std::uint32_t>> compute_frame_u32(const plan::PlanGeometry& geometry,
                                                              std::uint64_t scan_row, std::uint64_t scan_col) override;
  std::vector<std::uint64_t> compute_region_reduce(const plan::PlanGeometry& geometry,
                                                   const std::vector<std::uint64_t>& sorted_positions,
                                                   RegionReduce reduce) override;
  std::optional<std::vector<std::uint32_t>> compute_region_reduce_u32(const plan::PlanGeometry& geometry,
                                                                      const std::vector<std::uint64_t>& sorted_positions,
                                                                      RegionReduce reduce) override;
  // export_chunks.cpp: the plan's frames decoded, binned and bitshuffle/LZ4-encoded on the device.
  bool compute_export_chunks(const plan::PlanGeometry& geometry, std::uint64_t first_position, std::uint64_t count,
                             std::size_t element_size, EncodedChunks& out) override;

 public:
  ExportBatchShape export_batch_shape(const plan::PlanGeometry& geometry, std::size_t element_size) const override;
  const char* export_encoder() const override { return "device"; }

 private:
  // The decode runs (kernels::FrameRun) that write the source frames of plan
  // rows [first_plan_row, end_plan_row) into a window of whole rows: the
  // region's columns of each source row those plan rows bin, row-major, each
  // run inside one seek segment of one group.
  std::vector<kernels::FrameRun> export_window_runs(const plan::PlanGeometry& geometry, std::uint64_t first_plan_row,
                                                 std::uint64_t end_plan_row) const;
  // The frames from a region's first to its last (row-major source order) and the groups holding them.
  struct RegionSpan {
    std::uint64_t first_frame = 0;
    std::uint64_t last_frame = 0;  // inclusive
    std::uint64_t first_group = 0;
    std::uint64_t end_group = 0;   // exclusive
  };
  RegionSpan region_span(const plan::PlanGeometry& geometry) const;
  kernels::AnsResidentView view() const;
  // The groups [first_group, end_group) as a view of their own (frame 0 = first_group's first frame).
  kernels::AnsResidentView view_of_groups(std::uint64_t first_group, std::uint64_t end_group) const;
  void bind_device() const;
  // Σ per native pixel over the given frames (sorted, distinct global indices); maxima too when wanted.
  std::vector<std::uint64_t> native_sum(const std::vector<std::uint64_t>& frames,
                                        std::vector<std::uint32_t>* maxima);
  // native_sum narrowed to uint32 on the device (only those 4 bytes per pixel
  // come back), or nullopt when some sum exceeds 2^32 - 1.
  std::optional<std::vector<std::uint32_t>> native_sum_u32(const std::vector<std::uint64_t>& frames);
  // The work of both: sums (wide, or narrowed into *narrow with `overflow`
  // set when one does not fit), maxima when asked.
  std::vector<std::uint64_t> accumulate_native(const std::vector<std::uint64_t>& frames,
                                               std::vector<std::uint32_t>* maxima, std::vector<std::uint32_t>* narrow,
                                               bool* overflow);
  // The native frame `frame` (a global index) as uint32 in `out`
  // (frame_pixels values), from the recent frames: copied when they hold it,
  // else its seek segment decoded into them first. false (nothing done) when
  // the resident keeps no recent frames or another request is using them.
  bool recent_frame(std::uint64_t frame, std::uint32_t* out);
  // The plan position's one native frame, when the plan has one frame per position.
  std::optional<std::uint64_t> single_frame_at(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                               std::uint64_t scan_col) const;
  std::vector<std::uint64_t> binned_position_max(const plan::PlanGeometry& geometry,
                                                 const std::vector<std::uint64_t>& positions);
  // masked_sums.cpp. The masks of one masked-sum pass at source resolution:
  // the rings each holds whole (added from the ring table) and the stream
  // entries of every other selected pixel, decoded once for all of them.
  struct MaskPass {
    std::vector<std::uint32_t> rings;        // every mask's whole rings, one mask after the other
    std::vector<std::uint32_t> ring_starts;  // mask m: rings[ring_starts[m], ring_starts[m + 1])
    kernels::AnsMaskSetEntries entries;
    std::uint32_t masks() const { return static_cast<std::uint32_t>(ring_starts.size() - 1); }
    // The words uploaded: the entries' streams, their quads, the rings.
    std::size_t upload_words() const { return 2 * entries.streams.size() + rings.size(); }
  };
  // A pass's device parts: mask m's per-frame sums at sums + m * frames.
  struct MaskPassDevice {
    std::uint64_t* sums = nullptr;
    std::uint32_t* uploads = nullptr;  // upload_words() values
    std::uint32_t* error = nullptr;    // the decode error flag
  };
  MaskPass mask_pass(const plan::PlanGeometry& geometry,
                     const std::vector<const std::vector<std::uint8_t>*>& binned_masks) const;
  // Uploads the pass (through host_uploads, pinned) and enqueues its per-frame sums over `groups`.
  void enqueue_mask_pass(const MaskPass& pass, const kernels::AnsResidentView& groups, std::uint64_t base_frame,
                         const MaskPassDevice& device, std::uint32_t* host_uploads, cudaStream_t stream);
  // The pass's images gathered, binned and narrowed on the device, appended to
  // `images` (nullopt for a mask with a sum past 2^32 - 1).
  void narrow_mask_pass(const plan::PlanGeometry& geometry, const MaskPass& pass,
                        std::vector<std::optional<std::vector<std::uint32_t>>>& images);
  // Centre-of-mass sums at detector bin 1, read from frame_moments_ (no decode).
  CenterOfMassSums center_of_mass_from_table(const plan::PlanGeometry& geometry);
  // The region's per-position sums from per-frame arrays whose index 0 is `base_frame`.
  CenterOfMassSums region_moments(const plan::PlanGeometry& geometry, const std::uint64_t* total,
                                  const std::uint64_t* row_moment, const std::uint64_t* col_moment,
                                  std::uint64_t base_frame) const;

  catalog::Acquisition source_;
  DType resident_dtype_;
  std::string encoding_;
  int device_index_;
  std::uint32_t frames_per_group_;
  std::uint64_t group_count_;
  std::vector<TrackedBuffer> pieces_;
  TrackedBuffer group_offsets_;
  const std::uint8_t* base_;
  CudaRingTable rings_;
  // Per-frame Σ I, Σ row·I, Σ col·I at native detector coordinates, filled
  // during the load: [k * frames + frame]. The centre of mass of any plan at
  // detector bin 1 is read from it; other bins decode.
  TrackedBuffer frame_moments_;
  CudaSeekTable seek_;
  // Every group's decode tables (kernels::ans_build_decode_tables, at load;
  // empty when the tuning turned them off): decoders copy, not build, them.
  TrackedBuffer decode_tables_;
  CudaRecentFrames recent_;
  int accumulate_frames_cta_threads_;  // CudaLoadTuning::accumulate_frames_cta_threads
  std::uint64_t resident_bytes_;
  // The global frames [recent_first_, recent_end_) lie in recent_ (frame
  // recent_first_ first); empty when equal. Guarded by recent_mutex_.
  std::mutex recent_mutex_;
  std::uint64_t recent_first_ = 0;
  std::uint64_t recent_end_ = 0;

  // Pinned host memory for the device<->host copies of a product, kept between
  // requests and grown when a product needs more: a copy through pageable
  // memory goes via the driver's bounce buffer and faults fresh pages in on
  // every request. One product call holds it at a time (HostStaging).
  class HostStaging {
   public:
    HostStaging(CudaResident& resident, std::size_t bytes);  // locks, then grows when needed
    template <class T>
    T* part(std::size_t offset) const {
      return kernels::scratch_part<T>(base_, offset);
    }

   private:
    std::unique_lock<std::mutex> lock_;
    void* base_ = nullptr;
  };
  std::mutex staging_mutex_;
  kernels::PinnedBuffer staging_;

  std::mutex full_pattern_mutex_;
  // Σ over every frame (uncropped plans): summed from the dense batches during
  // the load, so the first bright-field fit decodes nothing.
  std::optional<std::vector<std::uint64_t>> full_pattern_;
};

}  // namespace quantem::backend::cuda
