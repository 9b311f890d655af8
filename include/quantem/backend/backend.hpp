#pragma once
// One interface, two implementations: `cpu` (explicit, exact, first-class;
// quantem/backend/cpu_backend.hpp) and `cuda` (quantem/backend/cuda_backend.hpp).
// A backend owns devices (real GPUs or CPU virtual devices), says how many
// bytes a load needs before anything is allocated (plan -> admit -> run),
// and loads one acquisition into one Resident on one device.
//
// A Resident answers exact integer primitives for any PlanGeometry of its
// acquisition; the products module builds every protocol product from them.
// All sums are accumulated in uint64 and are identical for any thread count or
// launch shape. Primitives on one Resident may be called concurrently.
// Every primitive throws quantem::Error(internal) when the geometry was not
// resolved for this resident's source shape, and Error(bad_request) for a plan
// position or mask size out of range.
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "quantem/backend/derived_cache.hpp"
#include "quantem/backend/tile_sums.hpp"
#include "quantem/core/error.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/frame_index_cache.hpp"
#include "quantem/plan/plan.hpp"

namespace quantem::backend {

struct DeviceInfo {
  int index = 0;                       // CUDA ordinal, or virtual CPU device number
  std::string name;                    // "NVIDIA H200", "CPU virtual device 0"
  std::uint64_t total_memory_bytes = 0;
  std::uint64_t budget_bytes = 0;      // data-cache budget used by admission
  double budget_fraction = 0.0;        // the configured fraction of memory behind budget_bytes; 0: a byte count was given
};

enum class LoadStage : int { queued, reading, decoding, encoding, done, failed, cancelled };
const char* load_stage_name(LoadStage stage) noexcept;

// A half-open range of source scan rows.
struct ScanRows {
  std::uint64_t first = 0;
  std::uint64_t end = 0;
  std::uint64_t count() const { return end > first ? end - first : 0; }
  bool operator==(const ScanRows& o) const { return first == o.first && end == o.end; }
};
// The source scan rows whose frames a plan's positions read (its region's rows).
ScanRows scan_rows_of(const plan::PlanGeometry& geometry);
// A half-open range of source scan columns; by default every column.
struct ScanColumns {
  std::uint64_t first = 0;
  std::uint64_t end = std::numeric_limits<std::uint64_t>::max();
  bool covers(std::uint64_t scan_cols) const { return first == 0 && end >= scan_cols; }
};
// The scan positions a request reads: a window of rows and columns (every
// column when made from rows alone).
struct ScanWindow {
  ScanWindow(ScanRows rows_in = {}, ScanColumns columns_in = {}) : rows(rows_in), columns(columns_in) {}
  ScanRows rows;
  ScanColumns columns;
};
// The window of a plan: its region.
ScanWindow scan_window_of(const plan::PlanGeometry& geometry);

// The scan rows a resident holds. A resident published before its load ends
// (a region-first load, LoadProgress::first_rows) holds its load's first rows
// first, then every other row in ascending order; the load moves the count of
// rows held along that order (never back). A window-first load
// (LoadProgress::first_columns too) holds the window of its first rows and
// those columns before any row is whole. Every other resident holds every
// row. Thread-safe once published: begin() is called before.
class HeldRows {
 public:
  // A load over `scan_rows` rows that holds `first` first (clamped to the
  // scan; empty: ascending from row 0); no row held yet.
  void begin(std::uint64_t scan_rows, ScanRows first);
  // The first `rows` rows of the load's order are held (an equal or smaller count is ignored).
  void hold(std::uint64_t rows);
  // Every row held (the load finished).
  void hold_all();
  bool holds(ScanRows rows) const;
  // The first rows' `columns` are held (a window-first load, once the window is whole).
  void hold_window(ScanColumns columns);
  // Whether every position of `window` is held: its rows, or the held window holds it.
  bool holds(const ScanWindow& window) const;
  bool holds_all() const;
  std::uint64_t held() const;  // rows held, in the load's order
  std::uint64_t total() const;  // the scan's rows; 0 for a resident that never began (every row held)
  // The n-th row (0-based) of the load's order.
  std::uint64_t row_at(std::uint64_t n) const;

 private:
  std::uint64_t scan_rows_ = 0;  // 0: every row held
  ScanRows first_;
  std::atomic<std::uint64_t> held_{0};
  ScanColumns window_columns_;             // written before window_held_ is set
  std::atomic<bool> window_held_{false};
};

class Resident;

// Shared between a running load and observers (residency route, cancellation).
struct LoadProgress {
  std::atomic<std::uint64_t> bytes_done{0};
  std::atomic<std::uint64_t> bytes_total{0};
  std::atomic<LoadStage> stage{LoadStage::queued};
  std::atomic<bool> cancel_requested{false};
  // Region-first (set before the load starts): the scan rows to read, decode
  // and hold first. A backend that can publishes its resident before the load
  // ends through rows_held; one that cannot ignores both and is published whole.
  std::optional<ScanRows> first_rows;
  // With first_rows, window-first: only these columns of the first rows come
  // first (HeldRows::hold_window), then the rest of those rows, then the others.
  std::optional<ScanColumns> first_columns;
  // Called by a load that publishes early, from its threads one at a time,
  // each time more rows of its order are held (resident->held_rows()): the
  // resident is the very object the load will return, and answers exactly any
  // plan whose rows it holds. Set before the load starts; may be empty.
  std::function<void(const std::shared_ptr<Resident>& resident)> rows_held;
};

// Byte accounting computed before allocation: what admission reserves before
// the load starts (docs/admission.md, '1. What is admitted'). A load whose real needs are only
// known as it proceeds (an encoded resident) starts from a provisional
// resident size and grows its LoadReservation before each allocation beyond it.
struct LoadEstimate {
  std::uint64_t resident_bytes = 0;         // provisional size of the finished resident (the load grows past it first)
  std::uint64_t transition_peak_bytes = 0;  // reserved before the load starts: provisional resident + staging + scratch
  // The most the reservation can ever grow to (reported, never admitted);
  // 0: the load never grows past transition_peak_bytes.
  std::uint64_t max_transition_peak_bytes = 0;
  std::uint64_t peak_bound() const {
    return max_transition_peak_bytes > transition_peak_bytes ? max_transition_peak_bytes : transition_peak_bytes;
  }
};

// The bytes a running load holds in reservation on its device. Admission
// reserves LoadEstimate::transition_peak_bytes before Backend::load is called;
// the load keeps "allocated <= reserved" at every moment by growing the
// reservation BEFORE it allocates beyond it, and may hand back bytes it has
// freed. When the load returns, the reservation becomes the resident's
// resident_bytes(). Called only from the thread running the load.
class LoadReservation {
 public:
  virtual ~LoadReservation() = default;
  virtual int device_index() const = 0;
  virtual std::uint64_t reserved_bytes() const = 0;
  // Reserves `bytes` more on this device. May evict residents that no request
  // uses (least recently used first, on this device only, never the active
  // acquisition the admission preserved). Throws quantem::Error
  // payload_too_large when the bytes cannot be had (the reservation is
  // unchanged) and unavailable when the load was cancelled: the load then
  // frees everything it took and rethrows.
  virtual void grow(std::uint64_t bytes) = 0;
  // Hands back `bytes` the load has already freed (at most reserved_bytes()).
  virtual void release(std::uint64_t bytes) = 0;
};

// A reservation outside admission (tools, benchmarks, backend tests): grows
// up to an optional limit and remembers the largest reservation it reached.
class LocalLoadReservation final : public LoadReservation {
 public:
  LocalLoadReservation(int device_index, std::uint64_t initial_bytes,
                       std::optional<std::uint64_t> limit_bytes = std::nullopt);
  int device_index() const override { return device_index_; }
  std::uint64_t reserved_bytes() const override { return reserved_; }
  void grow(std::uint64_t bytes) override;  // payload_too_large above the limit
  void release(std::uint64_t bytes) override;
  std::uint64_t largest_reserved_bytes() const { return largest_; }
  std::uint64_t grow_calls() const { return grow_calls_; }

 private:
  int device_index_;
  std::uint64_t reserved_;
  std::uint64_t largest_;
  std::optional<std::uint64_t> limit_;
  std::uint64_t grow_calls_ = 0;
};

enum class RegionReduce { sum, max };

// Per-position centre-of-mass moments, exact integers in binned detector coordinates.
struct CenterOfMassSums {
  std::vector<std::uint64_t> total;       // Σ I over the (binned) frame
  std::vector<std::uint64_t> row_moment;  // Σ (r / detector_bin) · I   (source row r)
  std::vector<std::uint64_t> col_moment;  // Σ (c / detector_bin) · I
};

// The export's error for a binned value of plan positions [first_position,
// first_position + count) that does not fit its uint32 (conflict).
Error binned_value_overflow(std::uint64_t first_position, std::uint64_t count);

class Resident {
 public:
  virtual ~Resident() = default;
  virtual int device_index() const = 0;
  virtual std::uint64_t resident_bytes() const = 0;  // bytes actually held on the device
  virtual std::string encoding() const = 0;          // e.g. "dense-u16", "ans-u16"
  virtual DType resident_dtype() const = 0;          // type of the held codes (u32 narrowed to u16 when lossless)
  virtual const catalog::Acquisition& source() const = 0;

  // The primitives. Each checks what every backend requires (the geometry was
  // resolved for this resident's source shape: else Error(internal); mask
  // size, scan position and position lists: else Error(bad_request)) and then
  // calls the backend's implementation below.

  // Σ over every plan position of the binned frame: one uint64 per binned
  // detector pixel (row-major, geometry.detector_pixels() values).
  std::vector<std::uint64_t> pattern_sum(const plan::PlanGeometry& geometry);
  // Per plan position (row-major, geometry.positions() values): Σ over binned
  // detector pixels whose mask byte is non-zero. mask has detector_pixels() bytes.
  std::vector<std::uint64_t> masked_sum(const plan::PlanGeometry& geometry,
                                        const std::vector<std::uint8_t>& binned_detector_mask);
  // masked_sum narrowed to uint32 (the wire's dtype), or nullopt when some
  // position's exact sum exceeds 2^32 - 1 (the caller reports the overflow;
  // nothing is ever wrapped). The same checks as masked_sum.
  std::optional<std::vector<std::uint32_t>> masked_sum_u32(const plan::PlanGeometry& geometry,
                                                           const std::vector<std::uint8_t>& binned_detector_mask);
  // masked_sum_u32 of each mask, in order, computed together (several
  // products of one plan): one walk over the resident where the backend has
  // one (the CPU resident), else one walk per mask. Element i is nullopt when
  // some sum of mask i exceeds 2^32 - 1 (never wrapped). The same checks as
  // masked_sum, for every mask.
  std::vector<std::optional<std::vector<std::uint32_t>>> masked_sums_u32(
      const plan::PlanGeometry& geometry, const std::vector<std::vector<std::uint8_t>>& binned_detector_masks);
  CenterOfMassSums center_of_mass_sums(const plan::PlanGeometry& geometry);
  // The binned frame at a plan position (scan bin sums up to bin² frames).
  std::vector<std::uint64_t> frame(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                   std::uint64_t scan_col);
  // frame narrowed to uint32 (the wire's dtype), or nullopt when some binned
  // value exceeds 2^32 - 1 (the caller then uses frame). The same checks.
  std::optional<std::vector<std::uint32_t>> frame_u32(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                                      std::uint64_t scan_col);
  // frame_u32 of the `count` plan positions first_position,
  // first_position + 1, ... (row-major), one after the other in `out`
  // (resized to count * detector_pixels() values). false when some value
  // exceeds 2^32 - 1 (`out` is then unspecified; nothing is wrapped).
  // Error(bad_request) when the range passes the plan's last position.
  bool frames_u32(const plan::PlanGeometry& geometry, std::uint64_t first_position, std::uint64_t count,
                  std::vector<std::uint32_t>& out);
  // Sum or max over the binned frames at the given plan positions (distinct
  // row-major flat indices; a repeated index is a bad_request).
  std::vector<std::uint64_t> region_reduce(const plan::PlanGeometry& geometry,
                                           const std::vector<std::uint64_t>& positions, RegionReduce reduce);
  // region_reduce narrowed to uint32 (the wire's dtype), or nullopt when some
  // value exceeds 2^32 - 1 (the caller then uses region_reduce). The same checks.
  std::optional<std::vector<std::uint32_t>> region_reduce_u32(const plan::PlanGeometry& geometry,
                                                              const std::vector<std::uint64_t>& positions,
                                                              RegionReduce reduce);

  // The stored chunks (bitshuffle/LZ4, HDF5 filter 32008, `element_size`
  // bytes per value: the plan's export dtype) of the binned frames at plan
  // positions [first_position, first_position + count), encoded where the
  // resident lives (decision 0023): chunk i is out.bytes[out.offsets[i],
  // out.offsets[i + 1]) (out's vectors are resized, their capacity reused).
  // false when this backend has no such encoder (the export then reads
  // frames_u32 and encodes on the host). Error(conflict) when a binned value
  // exceeds 2^32 - 1 (binned_value_overflow; nothing is wrapped); the same
  // checks as frames_u32, and element_size must be 1, 2 or 4.
  struct EncodedChunks {
    std::vector<std::uint8_t> bytes;
    std::vector<std::uint64_t> offsets;  // count + 1 values
  };
  bool encode_export_chunks(const plan::PlanGeometry& geometry, std::uint64_t first_position, std::uint64_t count,
                            std::size_t element_size, EncodedChunks& out);
  // How an export from this resident is best cut: plan positions per
  // encode_export_chunks call and calls in flight at once. positions 0: the
  // export's defaults (the host path).
  struct ExportBatchShape {
    std::uint64_t positions = 0;
    unsigned workers = 0;
  };
  virtual ExportBatchShape export_batch_shape(const plan::PlanGeometry& geometry, std::size_t element_size) const {
    (void)geometry, (void)element_size;
    return {};
  }
  // Where encode_export_chunks encodes: "device" (the resident's GPU) or "host".
  virtual const char* export_encoder() const { return "host"; }

  // Values derived from this resident by higher layers (per-plan BF fit, CoM
  // maps); they are dropped with the resident. Thread-safe.
  DerivedCache& derived_cache() const { return derived_cache_; }

  // Summed patterns over scan tiles (tile_sums.hpp), built in the background
  // after the resident is published (ResidencyManager, or build_tile_sums).
  // Once ready, pattern_sum of a cropped plan and region_reduce sums over a
  // rectangle of plan positions add whole tiles from the table and decode only
  // the rectangle's edge frames; the values are the same exact sums. Dropped
  // with the resident. Thread-safe.
  TileSums& tile_sums() const { return tile_sums_; }

  // The scan rows this resident holds (HeldRows): every row, except while a
  // load that published it early is still running. Every primitive refuses
  // (Error internal) a plan whose rows it does not hold; the residency hands
  // a request such a resident only once its rows are held.
  HeldRows& held_rows() const { return held_rows_; }

 protected:
  // The backend's implementations, called with checked arguments only.
  virtual std::vector<std::uint64_t> compute_pattern_sum(const plan::PlanGeometry& geometry) = 0;
  virtual std::vector<std::uint64_t> compute_masked_sum(const plan::PlanGeometry& geometry,
                                                        const std::vector<std::uint8_t>& binned_detector_mask) = 0;
  // By default masked_sum narrowed on the host; a device backend narrows
  // where the sums are (the CUDA resident: only 4 bytes per position come back).
  virtual std::optional<std::vector<std::uint32_t>> compute_masked_sum_u32(
      const plan::PlanGeometry& geometry, const std::vector<std::uint8_t>& binned_detector_mask);
  // By default compute_masked_sum_u32 per mask (the CUDA resident's device
  // narrowing included); the CPU resident reads each code once for all masks.
  virtual std::vector<std::optional<std::vector<std::uint32_t>>> compute_masked_sums_u32(
      const plan::PlanGeometry& geometry, const std::vector<std::vector<std::uint8_t>>& binned_detector_masks);
  virtual CenterOfMassSums compute_center_of_mass_sums(const plan::PlanGeometry& geometry) = 0;
  virtual std::vector<std::uint64_t> compute_frame(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                                   std::uint64_t scan_col) = 0;
  // By default compute_frame narrowed on the host; the CUDA resident answers
  // a frame it decoded recently without decoding (CudaResident::RecentFrames).
  virtual std::optional<std::vector<std::uint32_t>> compute_frame_u32(const plan::PlanGeometry& geometry,
                                                                      std::uint64_t scan_row, std::uint64_t scan_col);
  // By default compute_frame_u32 per position; the CPU resident copies the
  // unbinned frames of one group at once (the export's read).
  virtual bool compute_frames_u32(const plan::PlanGeometry& geometry, std::uint64_t first_position,
                                  std::uint64_t count, std::vector<std::uint32_t>& out);
  // By default no device encoder (false).
  virtual bool compute_export_chunks(const plan::PlanGeometry& geometry, std::uint64_t first_position,
                                     std::uint64_t count, std::size_t element_size, EncodedChunks& out) {
    (void)geometry, (void)first_position, (void)count, (void)element_size, (void)out;
    return false;
  }
  // sorted_positions: ascending, distinct, inside the plan.
  virtual std::vector<std::uint64_t> compute_region_reduce(const plan::PlanGeometry& geometry,
                                                           const std::vector<std::uint64_t>& sorted_positions,
                                                           RegionReduce reduce) = 0;
  // By default compute_region_reduce narrowed on the host; the CUDA resident
  // narrows on the device (half the bytes come back).
  virtual std::optional<std::vector<std::uint32_t>> compute_region_reduce_u32(
      const plan::PlanGeometry& geometry, const std::vector<std::uint64_t>& sorted_positions, RegionReduce reduce);
  // The exact sums as uint32, or nullopt when one does not fit (never wrapped).
  static std::optional<std::vector<std::uint32_t>> narrowed_to_u32(const std::vector<std::uint64_t>& sums);

 private:
  void check_geometry(const plan::PlanGeometry& geometry) const;
  void check_mask(const plan::PlanGeometry& geometry, const std::vector<std::uint8_t>& binned_detector_mask) const;
  void check_position(const plan::PlanGeometry& geometry, std::uint64_t scan_row, std::uint64_t scan_col) const;
  void check_positions(const plan::PlanGeometry& geometry, std::uint64_t first_position, std::uint64_t count) const;
  // The native (detector bin 1) summed pattern of a rectangle of source scan
  // positions from the tile table: whole tiles plus the edge frames through
  // compute_region_reduce. nullopt when the table is not ready or the
  // rectangle holds no whole tile (the caller decodes every frame).
  std::optional<std::vector<std::uint64_t>> native_sum_from_tiles(const ScanRectangle& rectangle);
  // The same for plan positions (sorted) that form a whole rectangle of the plan, binned for the plan.
  std::optional<std::vector<std::uint64_t>> region_sum_from_tiles(const plan::PlanGeometry& geometry,
                                                                  const std::vector<std::uint64_t>& sorted_positions);
  mutable DerivedCache derived_cache_;
  mutable TileSums tile_sums_;
  mutable HeldRows held_rows_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu" or "cuda"
  virtual std::vector<DeviceInfo> devices() const = 0;
  // Live free memory of a device, nullopt when unknown.
  virtual std::optional<std::uint64_t> free_bytes(int device_index) const = 0;
  virtual LoadEstimate estimate_load(const catalog::Acquisition& acquisition) const = 0;
  // Loads a loadable acquisition onto one device, growing `reservation`
  // before every allocation beyond it (see LoadReservation). Never leaves
  // anything allocated on failure; progress.stage ends as done, failed or
  // cancelled. Throws quantem::Error:
  //   bad_request        the device index is not one of this backend's;
  //   conflict           the acquisition is not ready to load (its readiness reason);
  //   unprocessable      no usable 4-D shape or dtype, a chunk element size that does
  //                      not match the dtype, a pixel mask of the wrong size, or a
  //                      shape this backend cannot hold (check_loadable_shape);
  //   corrupt_data       a bad chunk (the message names frame, scan position and file);
  //   io                 a read failure, a shard shorter than its index says;
  //   conflict           the files changed while loading (signature mismatch);
  //   payload_too_large  the device or the host ran out of memory, or the
  //                      reservation could not grow;
  //   unavailable        progress.cancel_requested was set (the load was cancelled).
  virtual std::shared_ptr<Resident> load(const catalog::Acquisition& acquisition, int device_index,
                                         LoadProgress& progress, LoadReservation& reservation) = 0;
  // A load outside admission (tools, tests, benchmarks): an unlimited
  // LocalLoadReservation starting at estimate_load().transition_peak_bytes.
  std::shared_ptr<Resident> load(const catalog::Acquisition& acquisition, int device_index, LoadProgress& progress);

  // Returns memory the device keeps cached for this process but no longer
  // uses (a CUDA memory pool's free blocks) to the driver. Called after idle
  // residents were released, from any thread; binds the device itself. No-op by default.
  virtual void trim_device_memory(int device_index) { (void)device_index; }
  // Does once, at start-up, the work every device's first load would
  // otherwise pay for (CUDA: pinned staging slots, the kernels' modules).
  // The daemon runs it beside the first catalog build and turns ready after
  // both. Thread-safe; no-op by default.
  virtual void prepare_devices() {}
  // Whether a device's budget is host memory (the CPU backend's virtual
  // devices): then host-side data kept beside a resident, such as its tile
  // sums, is admitted against that budget. false by default (device memory).
  virtual bool budgets_host_memory() const { return false; }

  // Host-side work a load of `acquisition` needs that touches no device: its
  // frame index, built into this backend's FrameIndexCache. The residency
  // calls it on the thread of a request that waits for the resident, before
  // admission, so that a request that then waits for its device (a daemon
  // still preparing it) finds it done. Never throws: the load reports the
  // errors.
  void prepare_load(const catalog::Acquisition& acquisition) noexcept { frame_indexes_.prefetch(acquisition); }
  // Forgets the kept frame indexes (benchmarks: a load that walks the chunk indexes again).
  void forget_frame_indexes() noexcept { frame_indexes_.clear(); }

 protected:
  // The frame index a load reads by: kept across loads of unchanged files
  // (catalog::FrameIndexCache), built otherwise. Throws what
  // catalog::build_frame_index throws.
  std::shared_ptr<const catalog::FrameIndex> frame_index(const catalog::Acquisition& acquisition) {
    return frame_indexes_.get(acquisition);
  }

 private:
  catalog::FrameIndexCache frame_indexes_;
};

// --- Rules every backend's load shares (src/backend/backend.cpp) -------------

// Thrown inside a load (on any of its threads) when progress.cancel_requested
// is seen; run_load turns it into Error(unavailable).
struct LoadCancelled {};

// Error(unprocessable) unless the acquisition has a usable 4-D shape, a
// supported dtype whose size matches the chunks' element size, and a pixel
// mask of the detector's size (or none); `max_detector_axis` (0: no limit) is
// the longest detector axis the backend can hold.
void check_loadable_shape(const catalog::Acquisition& acquisition, std::uint64_t max_detector_axis,
                          const std::string& backend_name);

// Error(bad_request) unless `count_bytes` dense counts of the acquisition's
// dtype hold exactly its 4-D shape (the dense resident factories' input).
void check_dense_counts(const catalog::Acquisition& acquisition, std::size_t count_bytes,
                        std::uint64_t max_detector_axis);

// Runs a backend's load body with the shared rules: refuses an acquisition
// that is not ready (conflict) or not loadable, honours a cancel requested
// before it starts, sets progress.stage to done / failed / cancelled, and maps
// LoadCancelled to Error(unavailable) and std::bad_alloc to
// Error(payload_too_large) naming the host memory (`host_memory_context`
// completes "not enough host memory to ...").
std::shared_ptr<Resident> run_load(const catalog::Acquisition& acquisition, LoadProgress& progress,
                                   std::uint64_t max_detector_axis, const std::string& backend_name,
                                   const std::string& host_memory_context,
                                   const std::function<std::shared_ptr<Resident>()>& body);

}  // namespace quantem::backend
