#pragma once
// Summed patterns over scan tiles, kept beside a resident, so that the summed
// pattern of any scan rectangle is whole tiles (a 2-D prefix table: four
// lookups per detector pixel) plus the decoded frames of its edge
// (docs/decisions/0018-tile-sums-beside-the-resident.md).
//
// The table is computed after the resident is published, in the background,
// from the resident's own primitives, so every backend has it without code of
// its own. Until it is ready, a request takes the path that decodes every
// frame of its crop; both paths give the same exact uint64 sums.
//
// Tile rule (TileGrid::for_scan): square tiles of side
// max(16, ceil(longest scan axis / 32)) scan positions, so the grid is at most
// 32 x 32 tiles; tiles at the scan's bottom and right edges may be partial.
// The table holds one uint64 per unbinned detector pixel per tile: at most
// 1024 frames' worth, about 8 / (256 x bytes per count) of the counts (3 % for
// 8-bit, 1.6 % for 16-bit sources) plus the partial tiles. A scan of one tile
// has no table (its only whole-tile rectangle is the full scan, whose summed
// pattern every resident already keeps).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace quantem::backend {

class Resident;

struct TileGrid {
  static constexpr std::uint64_t kMinTileSide = 16;
  static constexpr std::uint64_t kMaxTilesPerAxis = 32;

  std::uint64_t scan_rows = 0, scan_cols = 0;
  std::uint64_t tile_side = 0;
  std::uint64_t rows = 0, cols = 0;  // tiles per axis (ceiling division)

  static TileGrid for_scan(std::uint64_t scan_rows, std::uint64_t scan_cols);
  std::uint64_t tiles() const { return rows * cols; }
  bool worth_a_table() const { return tiles() >= 2; }
  std::uint64_t table_bytes(std::uint64_t frame_pixels) const;
  // Source scan rows (or columns) of tile i along an axis of `length` positions: [first, end).
  std::uint64_t tile_begin(std::uint64_t i) const { return i * tile_side; }
  std::uint64_t tile_end(std::uint64_t i, std::uint64_t length) const;
};

// A half-open rectangle of source scan positions.
struct ScanRectangle {
  std::uint64_t row_begin = 0, row_end = 0, col_begin = 0, col_end = 0;
};

// The prefix table: prefix[(i * grid.cols + j) * pixels + p] = Σ of the
// tiles [0, i] x [0, j] at unbinned detector pixel p. Immutable once built.
class TileSumTable {
 public:
  TileSumTable(TileGrid grid, std::uint64_t frame_pixels, std::vector<std::uint64_t> prefix);
  const TileGrid& grid() const { return grid_; }
  std::uint64_t bytes() const { return prefix_.size() * sizeof(std::uint64_t); }

  // The largest rectangle of whole tiles inside `rectangle` (tiles at the
  // scan edge count whole when the rectangle reaches the edge); nullopt when
  // it holds none.
  std::optional<ScanRectangle> whole_tiles_inside(const ScanRectangle& rectangle) const;
  // Adds the summed pattern of `whole_tiles` (a result of whole_tiles_inside)
  // to native_sum (frame_pixels values).
  void add_sum(const ScanRectangle& whole_tiles, std::uint64_t* native_sum) const;

 private:
  const std::uint64_t* corner(std::uint64_t tile_row_end, std::uint64_t tile_col_end) const;
  TileGrid grid_;
  std::uint64_t frame_pixels_;
  std::vector<std::uint64_t> prefix_;
};

enum class TileSumsState { none, queued, building, ready, skipped, cancelled, failed };
const char* tile_sums_state_name(TileSumsState state) noexcept;

// The tile sums of one resident (Resident::tile_sums()): its state and, once
// ready, its table. Thread-safe.
class TileSums {
 public:
  TileSums() = default;
  TileSums(const TileSums&) = delete;
  TileSums& operator=(const TileSums&) = delete;

  // The table when ready; null otherwise (the caller decodes every frame).
  std::shared_ptr<const TileSumTable> table() const;
  TileSumsState state() const;
  std::string reason() const;  // why skipped or failed; empty otherwise
  // Bytes held: the table's when ready, the bytes being filled while building.
  std::uint64_t bytes() const;

  // Stops a queued or running build at its next tile (eviction, shutdown).
  void cancel();
  bool cancel_requested() const { return cancel_.load(); }
  // Waits until the state is none of queued / building (tests, benchmarks);
  // returns the state then, or the current state after the timeout.
  TileSumsState wait_settled(std::chrono::milliseconds timeout) const;

  // Transitions, by the builder.
  void set_state(TileSumsState state, std::string reason = {}, std::uint64_t bytes = 0);
  void publish(std::shared_ptr<const TileSumTable> table);

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable settled_;
  TileSumsState state_ = TileSumsState::none;
  std::string reason_;
  std::uint64_t bytes_ = 0;
  std::shared_ptr<const TileSumTable> table_;
  std::atomic<bool> cancel_{false};
};

// Holds the resident's compute lock while one tile is summed (the residency
// manager's one-compute-at-a-time rule); an empty function takes no lock.
using ComputeLock = std::function<std::unique_lock<std::mutex>()>;

// Builds the table of one resident on the calling thread, one tile at a time:
// the resident is held (weak_ptr locked) only while a tile is summed, so an
// evicted resident is freed by its last user and the build stops. Sets the
// resident's TileSums state (ready, skipped for a one-tile scan, cancelled,
// failed with the error's text). Never throws.
void build_tile_sums(const std::weak_ptr<Resident>& resident, const ComputeLock& lock_compute = {});

// One background thread that builds queued residents' tables in order.
class TileSumsBuilder {
 public:
  TileSumsBuilder();
  ~TileSumsBuilder();  // shutdown()
  TileSumsBuilder(const TileSumsBuilder&) = delete;
  TileSumsBuilder& operator=(const TileSumsBuilder&) = delete;

  // Marks the resident's tile sums queued and queues its build.
  void submit(const std::shared_ptr<Resident>& resident, ComputeLock lock_compute);
  // Cancels every queued and running build and joins the thread; later submits are marked cancelled.
  void shutdown();

 private:
  struct Job {
    std::weak_ptr<Resident> resident;
    ComputeLock lock_compute;
  };
  void run();
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  std::weak_ptr<Resident> running_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace quantem::backend
