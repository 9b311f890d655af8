// What every backend shares: load stage names, the checking wrappers of the
// Resident primitives, and the load rules (readiness, loadable shape, error
// mapping) that the CPU and CUDA loads run through.
#include "quantem/backend/backend.hpp"

#include <algorithm>
#include <limits>
#include <new>
#include <string>

#include "quantem/catalog/catalog.hpp"
#include "quantem/core/error.hpp"

namespace quantem::backend {

const char* load_stage_name(LoadStage stage) noexcept {
  switch (stage) {
    case LoadStage::queued: return "queued";
    case LoadStage::reading: return "reading";
    case LoadStage::decoding: return "decoding";
    case LoadStage::encoding: return "encoding";
    case LoadStage::done: return "done";
    case LoadStage::failed: return "failed";
    case LoadStage::cancelled: return "cancelled";
  }
  return "unknown";
}

// --- Scan rows held ------------------------------------------------------------

ScanRows scan_rows_of(const plan::PlanGeometry& geometry) {
  return {geometry.region.row_start, geometry.region.row_stop};
}

ScanWindow scan_window_of(const plan::PlanGeometry& geometry) {
  return {scan_rows_of(geometry), ScanColumns{geometry.region.col_start, geometry.region.col_stop}};
}

void HeldRows::begin(std::uint64_t scan_rows, ScanRows first) {
  first.end = std::min(first.end, scan_rows);
  first.first = std::min(first.first, first.end);
  // An empty range anywhere is the ascending order: holds() counts on an empty first_ starting at row 0.
  if (first.count() == 0) first = ScanRows{};
  scan_rows_ = scan_rows;
  first_ = first;
  held_ = 0;
  window_held_ = false;
}

void HeldRows::hold_window(ScanColumns columns) {
  if (window_held_.load()) return;
  window_columns_ = columns;
  window_held_.store(true);  // after the columns: a reader that sees it sees them
}

bool HeldRows::holds(const ScanWindow& window) const {
  if (holds(window.rows)) return true;
  if (!window_held_.load()) return false;
  return window.rows.first >= first_.first && window.rows.end <= first_.end &&
         window.columns.first >= window_columns_.first && window.columns.end <= window_columns_.end;
}

void HeldRows::hold(std::uint64_t rows) {
  rows = std::min(rows, scan_rows_);
  std::uint64_t now = held_.load();
  while (now < rows && !held_.compare_exchange_weak(now, rows)) {
  }
}

void HeldRows::hold_all() { hold(scan_rows_); }

std::uint64_t HeldRows::held() const { return scan_rows_ == 0 ? 0 : held_.load(); }
std::uint64_t HeldRows::total() const { return scan_rows_; }
bool HeldRows::holds_all() const { return scan_rows_ == 0 || held_.load() >= scan_rows_; }

std::uint64_t HeldRows::row_at(std::uint64_t n) const {
  const std::uint64_t first_count = first_.count();
  if (n < first_count) return first_.first + n;
  if (n < first_count + first_.first) return n - first_count;  // the rows before the first ones (lower indices)
  return n;  // the rows after them keep their index
}

bool HeldRows::holds(ScanRows rows) const {
  if (scan_rows_ == 0) return true;
  rows.end = std::min(rows.end, scan_rows_);
  if (rows.count() == 0) return true;
  // The largest position in the load's order among `rows`.
  const std::uint64_t first_count = first_.count();
  std::uint64_t last_position = 0;
  if (rows.first < first_.end && rows.end > first_.first) {
    last_position = std::max(last_position, std::min(rows.end, first_.end) - 1 - first_.first);
  }
  if (rows.first < first_.first) {
    last_position = std::max(last_position, first_count + std::min(rows.end, first_.first) - 1);
  }
  if (rows.end > first_.end) last_position = std::max(last_position, rows.end - 1);
  return held_.load() > last_position;
}

// --- Resident: checked primitives --------------------------------------------

void Resident::check_geometry(const plan::PlanGeometry& geometry) const {
  const catalog::Acquisition& acquisition = source();
  plan::require_resolved_for(geometry, acquisition.scan_rows, acquisition.scan_cols, acquisition.detector_rows,
                             acquisition.detector_cols, acquisition.name);
  const ScanWindow window = scan_window_of(geometry);
  if (!held_rows_.holds(window)) {
    throw internal_error("scan rows [" + std::to_string(window.rows.first) + ", " + std::to_string(window.rows.end) +
                         ") x columns [" + std::to_string(window.columns.first) + ", " +
                         std::to_string(window.columns.end) + ") of " + acquisition.name + " are not resident yet (" +
                         std::to_string(held_rows_.held()) + " of " + std::to_string(held_rows_.total()) +
                         " rows held)");
  }
}

std::vector<std::uint64_t> Resident::pattern_sum(const plan::PlanGeometry& geometry) {
  check_geometry(geometry);
  if (geometry.cropped) {
    const ScanRectangle region{geometry.region.row_start, geometry.region.row_stop, geometry.region.col_start,
                               geometry.region.col_stop};
    if (auto native = native_sum_from_tiles(region)) {
      return plan::bin_detector_sums(std::move(*native), geometry.source_detector_rows,
                                     geometry.source_detector_cols, geometry.detector_bin);
    }
  }
  return compute_pattern_sum(geometry);
}

namespace {

// Source scan positions (global row-major frame indices, ascending) of
// `rectangle` outside `inner`, which lies inside it.
std::vector<std::uint64_t> edge_frames(const ScanRectangle& rectangle, const ScanRectangle& inner,
                                       std::uint64_t source_scan_cols) {
  std::vector<std::uint64_t> frames;
  const auto add_run = [&](std::uint64_t row, std::uint64_t begin, std::uint64_t end) {
    for (std::uint64_t col = begin; col < end; ++col) frames.push_back(row * source_scan_cols + col);
  };
  for (std::uint64_t row = rectangle.row_begin; row < rectangle.row_end; ++row) {
    if (row < inner.row_begin || row >= inner.row_end) {
      add_run(row, rectangle.col_begin, rectangle.col_end);
    } else {
      add_run(row, rectangle.col_begin, inner.col_begin);
      add_run(row, inner.col_end, rectangle.col_end);
    }
  }
  return frames;
}

// The plan-position rectangle [row0, row1) x [col0, col1) that sorted
// positions fill exactly, or nullopt.
std::optional<ScanRectangle> positions_rectangle(const plan::PlanGeometry& geometry,
                                                 const std::vector<std::uint64_t>& sorted) {
  if (sorted.empty()) return std::nullopt;
  const std::uint64_t cols = geometry.scan_cols;
  const std::uint64_t row0 = sorted.front() / cols, col0 = sorted.front() % cols;
  const std::uint64_t row1 = sorted.back() / cols + 1, col1 = sorted.back() % cols + 1;
  if (col1 <= col0) return std::nullopt;
  const std::uint64_t width = col1 - col0;
  if (sorted.size() != (row1 - row0) * width) return std::nullopt;
  for (std::size_t k = 0; k < sorted.size(); ++k) {
    if (sorted[k] != (row0 + k / width) * cols + col0 + k % width) return std::nullopt;
  }
  return ScanRectangle{row0, row1, col0, col1};
}

}  // namespace

std::optional<std::vector<std::uint64_t>> Resident::native_sum_from_tiles(const ScanRectangle& rectangle) {
  const std::shared_ptr<const TileSumTable> table = tile_sums_.table();
  if (!table) return std::nullopt;
  const std::optional<ScanRectangle> whole = table->whole_tiles_inside(rectangle);
  if (!whole) return std::nullopt;
  const catalog::Acquisition& acquisition = source();
  std::vector<std::uint64_t> native(acquisition.frame_pixels(), 0);
  const std::vector<std::uint64_t> edges = edge_frames(rectangle, *whole, acquisition.scan_cols);
  if (!edges.empty()) {
    // Unbinned and uncropped, plan positions are the source's frame indices.
    const plan::PlanGeometry every_frame = plan::resolve_plan({}, acquisition.scan_rows, acquisition.scan_cols,
                                                              acquisition.detector_rows, acquisition.detector_cols);
    native = compute_region_reduce(every_frame, edges, RegionReduce::sum);
  }
  table->add_sum(*whole, native.data());
  return native;
}

std::optional<std::vector<std::uint64_t>> Resident::region_sum_from_tiles(const plan::PlanGeometry& geometry,
                                                                          const std::vector<std::uint64_t>& sorted) {
  if (!tile_sums_.table()) return std::nullopt;
  const std::optional<ScanRectangle> positions = positions_rectangle(geometry, sorted);
  if (!positions) return std::nullopt;
  // Plan position (r, c) covers source rows region.row_start + r * bin up to
  // the next bin, cut at the region's edge (partial edge bins are kept).
  const plan::ScanRegion& region = geometry.region;
  const std::uint64_t bin = geometry.scan_bin;
  const ScanRectangle frames{region.row_start + positions->row_begin * bin,
                             std::min(region.row_stop, region.row_start + positions->row_end * bin),
                             region.col_start + positions->col_begin * bin,
                             std::min(region.col_stop, region.col_start + positions->col_end * bin)};
  auto native = native_sum_from_tiles(frames);
  if (!native) return std::nullopt;
  return plan::bin_detector_sums(std::move(*native), geometry.source_detector_rows, geometry.source_detector_cols,
                                 geometry.detector_bin);
}

void Resident::check_mask(const plan::PlanGeometry& geometry, const std::vector<std::uint8_t>& binned_detector_mask) const {
  check_geometry(geometry);
  if (binned_detector_mask.size() != geometry.detector_pixels()) {
    throw bad_request("detector mask has " + std::to_string(binned_detector_mask.size()) + " values; the plan's " +
                      std::to_string(geometry.detector_rows) + " x " + std::to_string(geometry.detector_cols) +
                      " detector needs " + std::to_string(geometry.detector_pixels()));
  }
}

std::vector<std::uint64_t> Resident::masked_sum(const plan::PlanGeometry& geometry,
                                                const std::vector<std::uint8_t>& binned_detector_mask) {
  check_mask(geometry, binned_detector_mask);
  return compute_masked_sum(geometry, binned_detector_mask);
}

std::optional<std::vector<std::uint32_t>> Resident::masked_sum_u32(const plan::PlanGeometry& geometry,
                                                                   const std::vector<std::uint8_t>& binned_detector_mask) {
  check_mask(geometry, binned_detector_mask);
  return compute_masked_sum_u32(geometry, binned_detector_mask);
}

std::optional<std::vector<std::uint32_t>> Resident::narrowed_to_u32(const std::vector<std::uint64_t>& sums) {
  std::vector<std::uint32_t> narrow(sums.size());
  for (std::size_t p = 0; p < sums.size(); ++p) {
    if (sums[p] > std::numeric_limits<std::uint32_t>::max()) return std::nullopt;
    narrow[p] = static_cast<std::uint32_t>(sums[p]);
  }
  return narrow;
}

std::optional<std::vector<std::uint32_t>> Resident::compute_masked_sum_u32(
    const plan::PlanGeometry& geometry, const std::vector<std::uint8_t>& binned_detector_mask) {
  return narrowed_to_u32(compute_masked_sum(geometry, binned_detector_mask));
}

std::vector<std::optional<std::vector<std::uint32_t>>> Resident::masked_sums_u32(
    const plan::PlanGeometry& geometry, const std::vector<std::vector<std::uint8_t>>& binned_detector_masks) {
  for (const auto& mask : binned_detector_masks) check_mask(geometry, mask);
  if (binned_detector_masks.empty()) check_geometry(geometry);
  return compute_masked_sums_u32(geometry, binned_detector_masks);
}

std::vector<std::optional<std::vector<std::uint32_t>>> Resident::compute_masked_sums_u32(
    const plan::PlanGeometry& geometry, const std::vector<std::vector<std::uint8_t>>& binned_detector_masks) {
  std::vector<std::optional<std::vector<std::uint32_t>>> sums;
  sums.reserve(binned_detector_masks.size());
  for (const auto& mask : binned_detector_masks) sums.push_back(compute_masked_sum_u32(geometry, mask));
  return sums;
}

CenterOfMassSums Resident::center_of_mass_sums(const plan::PlanGeometry& geometry) {
  check_geometry(geometry);
  return compute_center_of_mass_sums(geometry);
}

void Resident::check_position(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                              std::uint64_t scan_col) const {
  check_geometry(geometry);
  if (scan_row >= geometry.scan_rows || scan_col >= geometry.scan_cols) {
    throw bad_request("scan position (" + std::to_string(scan_row) + ", " + std::to_string(scan_col) +
                      ") is outside the plan's " + std::to_string(geometry.scan_rows) + " x " +
                      std::to_string(geometry.scan_cols) + " scan");
  }
}

std::vector<std::uint64_t> Resident::frame(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                           std::uint64_t scan_col) {
  check_position(geometry, scan_row, scan_col);
  return compute_frame(geometry, scan_row, scan_col);
}

std::optional<std::vector<std::uint32_t>> Resident::frame_u32(const plan::PlanGeometry& geometry,
                                                              std::uint64_t scan_row, std::uint64_t scan_col) {
  check_position(geometry, scan_row, scan_col);
  return compute_frame_u32(geometry, scan_row, scan_col);
}

std::optional<std::vector<std::uint32_t>> Resident::compute_frame_u32(const plan::PlanGeometry& geometry,
                                                                      std::uint64_t scan_row, std::uint64_t scan_col) {
  return narrowed_to_u32(compute_frame(geometry, scan_row, scan_col));
}

void Resident::check_positions(const plan::PlanGeometry& geometry, std::uint64_t first_position,
                               std::uint64_t count) const {
  check_geometry(geometry);
  if (first_position > geometry.positions() || count > geometry.positions() - first_position) {
    throw bad_request("plan positions [" + std::to_string(first_position) + ", " +
                      std::to_string(first_position + count) + ") pass the plan's " +
                      std::to_string(geometry.positions()) + " positions");
  }
}

bool Resident::frames_u32(const plan::PlanGeometry& geometry, std::uint64_t first_position, std::uint64_t count,
                          std::vector<std::uint32_t>& out) {
  check_positions(geometry, first_position, count);
  return compute_frames_u32(geometry, first_position, count, out);
}

bool Resident::encode_export_chunks(const plan::PlanGeometry& geometry, std::uint64_t first_position,
                                    std::uint64_t count, std::size_t element_size, EncodedChunks& out) {
  check_positions(geometry, first_position, count);
  if (element_size != 1 && element_size != 2 && element_size != 4)
    throw bad_request("export chunks: element size " + std::to_string(element_size) + " (1, 2 or 4)");
  return compute_export_chunks(geometry, first_position, count, element_size, out);
}

Error binned_value_overflow(std::uint64_t first_position, std::uint64_t count) {
  return conflict("a binned value at plan positions [" + std::to_string(first_position) + ", " +
                  std::to_string(first_position + count) +
                  ") exceeds 2^32 - 1: the export's uint32 cannot hold it exactly");
}

bool Resident::compute_frames_u32(const plan::PlanGeometry& geometry, std::uint64_t first_position,
                                  std::uint64_t count, std::vector<std::uint32_t>& out) {
  const std::uint64_t pixels = geometry.detector_pixels();
  out.resize(count * pixels);
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::uint64_t position = first_position + i;
    const auto frame = compute_frame_u32(geometry, position / geometry.scan_cols, position % geometry.scan_cols);
    if (!frame) return false;
    std::copy(frame->begin(), frame->end(), out.begin() + static_cast<std::ptrdiff_t>(i * pixels));
  }
  return true;
}

std::vector<std::uint64_t> Resident::region_reduce(const plan::PlanGeometry& geometry,
                                                   const std::vector<std::uint64_t>& positions,
                                                   RegionReduce reduce) {
  check_geometry(geometry);
  const std::vector<std::uint64_t> sorted = plan::sorted_distinct_positions(geometry, positions);
  if (reduce == RegionReduce::sum) {
    if (auto sums = region_sum_from_tiles(geometry, sorted)) return std::move(*sums);
  }
  return compute_region_reduce(geometry, sorted, reduce);
}

std::optional<std::vector<std::uint32_t>> Resident::region_reduce_u32(const plan::PlanGeometry& geometry,
                                                                      const std::vector<std::uint64_t>& positions,
                                                                      RegionReduce reduce) {
  check_geometry(geometry);
  const std::vector<std::uint64_t> sorted = plan::sorted_distinct_positions(geometry, positions);
  if (reduce == RegionReduce::sum) {
    if (auto sums = region_sum_from_tiles(geometry, sorted)) return narrowed_to_u32(*sums);
  }
  return compute_region_reduce_u32(geometry, sorted, reduce);
}

std::optional<std::vector<std::uint32_t>> Resident::compute_region_reduce_u32(
    const plan::PlanGeometry& geometry, const std::vector<std::uint64_t>& sorted_positions, RegionReduce reduce) {
  return narrowed_to_u32(compute_region_reduce(geometry, sorted_positions, reduce));
}

// --- shared load rules ---------------------------------------------------------

void check_loadable_shape(const catalog::Acquisition& acquisition, std::uint64_t max_detector_axis,
                          const std::string& backend_name) {
  if (!acquisition.scan_shape_known() || !acquisition.detector_shape_known()) {
    throw unprocessable(acquisition.name + " has no usable 4-D shape (scan " + std::to_string(acquisition.scan_rows) +
                        " x " + std::to_string(acquisition.scan_cols) + ", detector " +
                        std::to_string(acquisition.detector_rows) + " x " + std::to_string(acquisition.detector_cols) +
                        ")");
  }
  if (!acquisition.dtype) throw unprocessable(acquisition.name + " has no supported detector dtype");
  if (acquisition.chunk_format.element_size != dtype_size(*acquisition.dtype)) {
    throw unprocessable(acquisition.name + ": the chunk element size " +
                        std::to_string(acquisition.chunk_format.element_size) + " does not match dtype " +
                        dtype_name(*acquisition.dtype));
  }
  if (max_detector_axis != 0 &&
      (acquisition.detector_rows > max_detector_axis || acquisition.detector_cols > max_detector_axis)) {
    throw unprocessable(acquisition.name + ": detector axes above " + std::to_string(max_detector_axis) +
                        " pixels are not supported by the " + backend_name + " backend");
  }
  if (!acquisition.pixel_mask.empty() && acquisition.pixel_mask.size() != acquisition.frame_pixels()) {
    throw unprocessable(acquisition.name + ": the pixel mask has " + std::to_string(acquisition.pixel_mask.size()) +
                        " values for a detector of " + std::to_string(acquisition.frame_pixels()) + " pixels");
  }
}

void check_dense_counts(const catalog::Acquisition& acquisition, std::size_t count_bytes,
                        std::uint64_t max_detector_axis) {
  if (!acquisition.dtype) throw bad_request("the acquisition's dtype is unknown");
  if (!acquisition.scan_shape_known() || !acquisition.detector_shape_known()) {
    throw bad_request("the acquisition's scan and detector shapes must be known");
  }
  if (max_detector_axis != 0 &&
      (acquisition.detector_rows > max_detector_axis || acquisition.detector_cols > max_detector_axis)) {
    throw bad_request("detector axes above " + std::to_string(max_detector_axis) + " pixels are not supported");
  }
  if (!acquisition.pixel_mask.empty() && acquisition.pixel_mask.size() != acquisition.frame_pixels()) {
    throw bad_request("the pixel mask has " + std::to_string(acquisition.pixel_mask.size()) +
                      " values; the detector has " + std::to_string(acquisition.frame_pixels()));
  }
  const std::uint64_t needed = acquisition.frame_count() * acquisition.frame_pixels() * dtype_size(*acquisition.dtype);
  if (count_bytes != needed) {
    throw bad_request("dense counts hold " + std::to_string(count_bytes) + " bytes; the acquisition needs " +
                      std::to_string(needed));
  }
}

std::shared_ptr<Resident> run_load(const catalog::Acquisition& acquisition, LoadProgress& progress,
                                   std::uint64_t max_detector_axis, const std::string& backend_name,
                                   const std::string& host_memory_context,
                                   const std::function<std::shared_ptr<Resident>()>& body) {
  try {
    if (!acquisition.status.loadable) {
      throw conflict(acquisition.status.reason.empty() ? acquisition.name + " is not ready to load"
                                                       : acquisition.status.reason);
    }
    check_loadable_shape(acquisition, max_detector_axis, backend_name);
    if (progress.cancel_requested) throw LoadCancelled{};
    progress.stage = LoadStage::reading;
    auto resident = body();
    progress.stage = LoadStage::done;
    return resident;
  } catch (const LoadCancelled&) {
    progress.stage = LoadStage::cancelled;
    throw unavailable("loading " + acquisition.name + " was cancelled");
  } catch (const std::bad_alloc&) {
    progress.stage = LoadStage::failed;
    throw payload_too_large("not enough host memory to " + host_memory_context);
  } catch (...) {
    progress.stage = LoadStage::failed;
    throw;
  }
}

LocalLoadReservation::LocalLoadReservation(int device_index, std::uint64_t initial_bytes,
                                           std::optional<std::uint64_t> limit_bytes)
    : device_index_(device_index), reserved_(initial_bytes), largest_(initial_bytes), limit_(limit_bytes) {}

void LocalLoadReservation::grow(std::uint64_t bytes) {
  ++grow_calls_;
  if (limit_ && (bytes > *limit_ || reserved_ > *limit_ - bytes)) {
    throw payload_too_large("the load needs " + catalog::format_size(reserved_ + bytes) + " on device " +
                            std::to_string(device_index_) + " but its reservation is limited to " +
                            catalog::format_size(*limit_));
  }
  reserved_ += bytes;
  largest_ = std::max(largest_, reserved_);
}

void LocalLoadReservation::release(std::uint64_t bytes) { reserved_ -= std::min(bytes, reserved_); }

std::shared_ptr<Resident> Backend::load(const catalog::Acquisition& acquisition, int device_index,
                                        LoadProgress& progress) {
  std::uint64_t admitted = 0;  // an acquisition the estimate refuses is refused by load() with the same error
  try {
    admitted = estimate_load(acquisition).transition_peak_bytes;
  } catch (const Error&) {
  }
  LocalLoadReservation reservation(device_index, admitted);
  return load(acquisition, device_index, progress, reservation);
}

}  // namespace quantem::backend
