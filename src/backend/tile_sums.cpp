// Tile sums: the grid rule, the prefix table, the per-resident state and the
// background builder (include/quantem/backend/tile_sums.hpp).
#include "quantem/backend/tile_sums.hpp"

#include <pthread.h>

#include <algorithm>
#include <exception>
#include <new>
#include <utility>


#include "quantem/backend/backend.hpp"
#include "quantem/plan/plan.hpp"

namespace quantem::backend {

TileGrid TileGrid::for_scan(std::uint64_t scan_rows, std::uint64_t scan_cols) {
  TileGrid grid;
  grid.scan_rows = scan_rows;
  grid.scan_cols = scan_cols;
  const std::uint64_t longest = std::max(scan_rows, scan_cols);
  grid.tile_side = std::max(kMinTileSide, (longest + kMaxTilesPerAxis - 1) / kMaxTilesPerAxis);
  grid.rows = (scan_rows + grid.tile_side - 1) / grid.tile_side;
  grid.cols = (scan_cols + grid.tile_side - 1) / grid.tile_side;
  return grid;
}

std::uint64_t TileGrid::table_bytes(std::uint64_t frame_pixels) const {
  return worth_a_table() ? tiles() * frame_pixels * sizeof(std::uint64_t) : 0;
}

std::uint64_t TileGrid::tile_end(std::uint64_t i, std::uint64_t length) const {
  return std::min(length, (i + 1) * tile_side);
}

TileSumTable::TileSumTable(TileGrid grid, std::uint64_t frame_pixels, std::vector<std::uint64_t> prefix)
    : grid_(grid), frame_pixels_(frame_pixels), prefix_(std::move(prefix)) {}

std::optional<ScanRectangle> TileSumTable::whole_tiles_inside(const ScanRectangle& r) const {
  const std::uint64_t side = grid_.tile_side;
  // A tile is whole inside [begin, end) when it starts at or after begin and
  // ends at or before end; the last tile of an axis ends at the scan's edge.
  const auto first_tile = [side](std::uint64_t begin) { return (begin + side - 1) / side; };
  const auto end_tile = [side](std::uint64_t end, std::uint64_t length, std::uint64_t tiles) {
    return end >= length ? tiles : end / side;
  };
  const std::uint64_t i0 = first_tile(r.row_begin);
  const std::uint64_t i1 = end_tile(r.row_end, grid_.scan_rows, grid_.rows);
  const std::uint64_t j0 = first_tile(r.col_begin);
  const std::uint64_t j1 = end_tile(r.col_end, grid_.scan_cols, grid_.cols);
  if (i0 >= i1 || j0 >= j1) return std::nullopt;
  return ScanRectangle{grid_.tile_begin(i0), grid_.tile_end(i1 - 1, grid_.scan_rows), grid_.tile_begin(j0),
                       grid_.tile_end(j1 - 1, grid_.scan_cols)};
}

const std::uint64_t* TileSumTable::corner(std::uint64_t tile_row_end, std::uint64_t tile_col_end) const {
  if (tile_row_end == 0 || tile_col_end == 0) return nullptr;  // the empty prefix
  return prefix_.data() + ((tile_row_end - 1) * grid_.cols + (tile_col_end - 1)) * frame_pixels_;
}

void TileSumTable::add_sum(const ScanRectangle& whole, std::uint64_t* native_sum) const {
  const std::uint64_t side = grid_.tile_side;
  const std::uint64_t i0 = whole.row_begin / side, i1 = (whole.row_end + side - 1) / side;
  const std::uint64_t j0 = whole.col_begin / side, j1 = (whole.col_end + side - 1) / side;
  // Inclusion-exclusion in modular uint64 arithmetic: exact because the true sum fits.
  const std::uint64_t* all = corner(i1, j1);
  const std::uint64_t* above = corner(i0, j1);
  const std::uint64_t* left = corner(i1, j0);
  const std::uint64_t* both = corner(i0, j0);
  for (std::uint64_t p = 0; p < frame_pixels_; ++p) {
    std::uint64_t v = all[p];
    if (above) v -= above[p];
    if (left) v -= left[p];
    if (both) v += both[p];
    native_sum[p] += v;
  }
}

const char* tile_sums_state_name(TileSumsState state) noexcept {
  switch (state) {
    case TileSumsState::none: return "none";
    case TileSumsState::queued: return "queued";
    case TileSumsState::building: return "building";
    case TileSumsState::ready: return "ready";
    case TileSumsState::skipped: return "skipped";
    case TileSumsState::cancelled: return "cancelled";
    case TileSumsState::failed: return "failed";
  }
  return "none";
}

std::shared_ptr<const TileSumTable> TileSums::table() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_;
}

TileSumsState TileSums::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

std::string TileSums::reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

std::uint64_t TileSums::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

void TileSums::cancel() {
  cancel_ = true;
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ == TileSumsState::queued) state_ = TileSumsState::cancelled;
  settled_.notify_all();
}

TileSumsState TileSums::wait_settled(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  settled_.wait_for(lock, timeout,
                    [this] { return state_ != TileSumsState::queued && state_ != TileSumsState::building; });
  return state_;
}

void TileSums::set_state(TileSumsState state, std::string reason, std::uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_ = state;
  reason_ = std::move(reason);
  bytes_ = bytes;
  if (state != TileSumsState::ready) table_.reset();
  settled_.notify_all();
}

void TileSums::publish(std::shared_ptr<const TileSumTable> table) {
  std::lock_guard<std::mutex> lock(mutex_);
  bytes_ = table->bytes();
  table_ = std::move(table);
  state_ = TileSumsState::ready;
  reason_.clear();
  settled_.notify_all();
}

namespace {

// Running totals over rows, then over columns: prefix[i][j] = Σ tiles [0, i] x [0, j].
void accumulate_prefix(const TileGrid& grid, std::uint64_t pixels, std::vector<std::uint64_t>& table) {
  const auto at = [&](std::uint64_t i, std::uint64_t j) { return table.data() + (i * grid.cols + j) * pixels; };
  for (std::uint64_t i = 0; i < grid.rows; ++i) {
    for (std::uint64_t j = 1; j < grid.cols; ++j) {
      const std::uint64_t* previous = at(i, j - 1);
      std::uint64_t* current = at(i, j);
      for (std::uint64_t p = 0; p < pixels; ++p) current[p] += previous[p];
    }
  }
  for (std::uint64_t i = 1; i < grid.rows; ++i) {
    for (std::uint64_t j = 0; j < grid.cols; ++j) {
      const std::uint64_t* previous = at(i - 1, j);
      std::uint64_t* current = at(i, j);
      for (std::uint64_t p = 0; p < pixels; ++p) current[p] += previous[p];
    }
  }
}

// The tile's summed pattern at detector bin 1, through the resident's own pattern_sum.
std::vector<std::uint64_t> tile_pattern(Resident& resident, const TileGrid& grid, std::uint64_t i, std::uint64_t j) {
  const catalog::Acquisition& source = resident.source();
  plan::BrowsePlan tile;
  tile.crop = plan::ScanRegion{grid.tile_begin(i), grid.tile_end(i, grid.scan_rows), grid.tile_begin(j),
                               grid.tile_end(j, grid.scan_cols)};
  const plan::PlanGeometry geometry = plan::resolve_plan(tile, source.scan_rows, source.scan_cols,
                                                         source.detector_rows, source.detector_cols);
  return resident.pattern_sum(geometry);
}

enum class BuildEnd { done, gone, cancelled };

// Fills `table` tile by tile; the resident is held only while one tile is summed.
BuildEnd fill_tiles(const std::weak_ptr<Resident>& weak, const ComputeLock& lock_compute, const TileGrid& grid,
                    std::uint64_t pixels, std::vector<std::uint64_t>& table) {
  for (std::uint64_t i = 0; i < grid.rows; ++i) {
    for (std::uint64_t j = 0; j < grid.cols; ++j) {
      // The lock first: a resident evicted while a request computes is not held by the build meanwhile.
      std::unique_lock<std::mutex> compute;
      if (lock_compute) compute = lock_compute();
      const std::shared_ptr<Resident> resident = weak.lock();
      if (!resident) return BuildEnd::gone;
      if (resident->tile_sums().cancel_requested()) return BuildEnd::cancelled;
      const std::vector<std::uint64_t> sum = tile_pattern(*resident, grid, i, j);
      std::copy(sum.begin(), sum.end(), table.begin() + static_cast<std::ptrdiff_t>((i * grid.cols + j) * pixels));
    }
  }
  return BuildEnd::done;
}

}  // namespace

void build_tile_sums(const std::weak_ptr<Resident>& weak, const ComputeLock& lock_compute) {
  TileGrid grid;
  std::uint64_t pixels = 0;
  {
    const std::shared_ptr<Resident> resident = weak.lock();
    if (!resident) return;
    const catalog::Acquisition& source = resident->source();
    grid = TileGrid::for_scan(source.scan_rows, source.scan_cols);
    pixels = source.frame_pixels();
    TileSums& sums = resident->tile_sums();
    if (sums.cancel_requested()) {
      sums.set_state(TileSumsState::cancelled);
      return;
    }
    if (!grid.worth_a_table()) {
      sums.set_state(TileSumsState::skipped, "the scan is a single tile");
      return;
    }
    sums.set_state(TileSumsState::building, {}, grid.table_bytes(pixels));
  }
  try {
    std::vector<std::uint64_t> table(grid.tiles() * pixels, 0);
    const BuildEnd end = fill_tiles(weak, lock_compute, grid, pixels, table);
    const std::shared_ptr<Resident> resident = weak.lock();
    if (!resident) return;
    if (end != BuildEnd::done) {
      resident->tile_sums().set_state(TileSumsState::cancelled);
      return;
    }
    accumulate_prefix(grid, pixels, table);
    resident->tile_sums().publish(std::make_shared<const TileSumTable>(grid, pixels, std::move(table)));
  } catch (const std::bad_alloc&) {
    if (const auto resident = weak.lock()) {
      resident->tile_sums().set_state(TileSumsState::failed, "not enough host memory for the tile sums");
    }
  } catch (const std::exception& error) {
    if (const auto resident = weak.lock()) resident->tile_sums().set_state(TileSumsState::failed, error.what());
  }
}

TileSumsBuilder::TileSumsBuilder() : thread_([this] { run(); }) {}

TileSumsBuilder::~TileSumsBuilder() { shutdown(); }

void TileSumsBuilder::submit(const std::shared_ptr<Resident>& resident, ComputeLock lock_compute) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) {
    resident->tile_sums().set_state(TileSumsState::cancelled);
    return;
  }
  resident->tile_sums().set_state(TileSumsState::queued);
  queue_.push_back(Job{resident, std::move(lock_compute)});
  wake_.notify_all();
}

void TileSumsBuilder::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    for (const Job& job : queue_) {
      if (const auto resident = job.resident.lock()) resident->tile_sums().cancel();
    }
    queue_.clear();
    if (const auto resident = running_.lock()) resident->tile_sums().cancel();
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void TileSumsBuilder::run() {
  pthread_setname_np(pthread_self(), "quantem-tiles");
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    running_ = job.resident;
    lock.unlock();
    build_tile_sums(job.resident, job.lock_compute);
    job = Job{};  // the last hold on an evicted resident may end here
    lock.lock();
    running_.reset();
  }
}

}  // namespace quantem::backend
