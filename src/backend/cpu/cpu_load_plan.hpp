#pragma once
// Internal: the byte accounting of a CPU load (computed before anything is
// allocated, from the acquisition alone) and its read schedule (from the
// frame index): consecutive chunks of a shard are coalesced into large preads.
#include <cstdint>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/catalog/acquisition.hpp"

namespace quantem::backend::cpu {

// Largest coalesced read (a single larger chunk gets a read of its own).
constexpr std::uint64_t kReadBatchBytes = std::uint64_t{4} << 20;
// A hole between two chunks of at most this many bytes is read through.
constexpr std::uint64_t kReadGapBytes = std::uint64_t{64} << 10;

struct LoadPlan {
  unsigned threads = 1;
  std::uint64_t max_stored_chunk_bytes = 0;     // a larger chunk is corrupt
  unsigned reading_threads = 1;                 // threads that read: min(threads, frame groups)
  std::uint64_t staging_bytes_per_thread = 0;   // one read buffer per reading thread: the largest batch
  std::uint64_t staging_bytes() const { return std::uint64_t{reading_threads} * staging_bytes_per_thread; }
  std::uint64_t frame_index_bytes = 0;          // the catalog's frame index and the read schedule
  // Admitted before the load: the first pass (uint32 sources held as 16-bit codes).
  std::uint64_t resident_bytes = 0;             // the first pass's resident (exact unless it widens)
  std::uint64_t transition_peak_bytes = 0;      // everything the first pass holds at once
  // A uint32 source whose masked counts exceed 65535 is built again with
  // 32-bit codes after the first pass is freed: the load grows its reservation
  // by the difference (0 for 8/16-bit sources).
  std::uint64_t wide_pass_growth_bytes = 0;
  std::uint64_t max_transition_peak_bytes = 0;  // transition_peak_bytes + wide_pass_growth_bytes
};
LoadPlan plan_load(const catalog::Acquisition& acquisition, unsigned threads);

struct ReadBatch {
  std::uint32_t shard = 0;
  std::uint64_t file_offset = 0;  // first byte read
  std::uint64_t bytes = 0;        // bytes read (chunks and the small holes between them)
  std::uint64_t first_frame = 0;
  std::uint64_t frame_count = 0;
  std::uint64_t stored_bytes = 0;  // Σ chunk sizes (progress)
};
// A batch never spans two frame groups of the resident (kGroupFrames), so each
// group's batches are consecutive and a group is one unit of work.
// Throws CorruptChunk (naming frame and file) for a chunk larger than the
// plan allows or a shard index out of range, Error(conflict) when the index
// holds fewer frames than the scan needs.
std::vector<ReadBatch> plan_reads(const catalog::Acquisition& acquisition, const catalog::FrameIndex& index,
                                  const LoadPlan& plan);

// The order a load builds its frame groups in: those holding `first_rows`
// first (a region-first load), then every other group ascending; and, as
// groups finish in any order, how many rows of the same order (HeldRows) are
// whole. With `first_columns` too (window-first), the groups holding a frame
// of the window first_rows x first_columns come before the rest of the first
// rows' groups. finish_group may be called from any thread.
class GroupOrder {
 public:
  GroupOrder(const catalog::Acquisition& acquisition, std::optional<ScanRows> first_rows,
             std::optional<ScanColumns> first_columns = std::nullopt);
  std::uint64_t groups() const { return order_.size(); }
  std::uint64_t group_at(std::uint64_t n) const { return order_[n]; }
  // The window's columns, clamped to the scan, when the order has a window.
  std::optional<ScanColumns> window_columns() const { return window_columns_; }
  // Marks a group built. When more rows of `held`'s order (held.begin() was
  // called with the same scan and first rows) are whole now, calls
  // more_rows(rows whole) before returning, under a lock: one call at a time,
  // with counts that only grow. When the window's last group is built, calls
  // window_whole() first, once.
  template <class MoreRows>
  void finish_group(std::uint64_t group, const HeldRows& held, MoreRows&& more_rows) {
    finish_group(group, held, std::forward<MoreRows>(more_rows), [] {});
  }
  template <class MoreRows, class WindowWhole>
  void finish_group(std::uint64_t group, const HeldRows& held, MoreRows&& more_rows, WindowWhole&& window_whole) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Built built = mark_built(group, held);
    if (built.window_now_whole) window_whole();
    if (built.whole_rows > 0) more_rows(built.whole_rows);
  }

 private:
  struct Built {
    std::uint64_t whole_rows = 0;  // the rows whole now when more than before, else 0
    bool window_now_whole = false;
  };
  bool row_whole(std::uint64_t row) const;  // every group holding a frame of it is built
  Built mark_built(std::uint64_t group, const HeldRows& held);  // with the lock held

  std::uint64_t scan_rows_;
  std::uint64_t scan_cols_;
  std::vector<std::uint64_t> order_;
  std::optional<ScanColumns> window_columns_;
  std::vector<bool> in_window_;  // by group; empty without a window
  std::uint64_t window_groups_left_ = 0;
  std::mutex mutex_;
  std::vector<bool> built_;  // by group
  std::uint64_t whole_rows_ = 0;
};

}  // namespace quantem::backend::cpu
