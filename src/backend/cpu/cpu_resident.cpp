#include "cpu/cpu_resident.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "quantem/backend/cpu_resident.hpp"
#include "quantem/core/error.hpp"

namespace quantem::backend::cpu {
namespace {

static_assert(sizeof(std::uint16_t) == 2 && sizeof(std::uint32_t) == 4, "fixed-width codes");

// A run of consecutive pixels inside one frame. Runs of 8/16-bit codes are at
// most 65536 long so their sum fits the 32-bit accumulator of sum_run.
struct PixelRun {
  std::uint32_t offset = 0;
  std::uint32_t length = 0;
};
constexpr std::uint32_t kMaxRunLength = 65536;

template <class Code>
inline std::uint64_t sum_run(const Code* values, std::uint32_t length) {
  if constexpr (sizeof(Code) < 4) {
    std::uint32_t sum = 0;  // ≤ 65536 · 65535 < 2^32
    for (std::uint32_t i = 0; i < length; ++i) sum += values[i];
    return sum;
  } else {
    std::uint64_t sum = 0;
    for (std::uint32_t i = 0; i < length; ++i) sum += values[i];
    return sum;
  }
}

template <class Code>
inline std::uint64_t sum_runs(const Code* frame, const std::vector<PixelRun>& runs) {
  std::uint64_t sum = 0;
  for (const PixelRun& run : runs) sum += sum_run(frame + run.offset, run.length);
  return sum;
}

// Runs of the pixels whose `selected` byte equals `wanted`, merged across rows.
std::vector<PixelRun> pixel_runs(const std::vector<std::uint8_t>& selected, std::uint8_t wanted) {
  std::vector<PixelRun> runs;
  const std::size_t pixels = selected.size();
  std::size_t i = 0;
  while (i < pixels) {
    while (i < pixels && selected[i] != wanted) ++i;
    const std::size_t begin = i;
    while (i < pixels && selected[i] == wanted) ++i;
    for (std::size_t start = begin; start < i; start += kMaxRunLength) {
      const std::size_t length = std::min<std::size_t>(kMaxRunLength, i - start);
      runs.push_back({static_cast<std::uint32_t>(start), static_cast<std::uint32_t>(length)});
    }
  }
  return runs;
}

// out[r / bin][c / bin] += native[r][c]; out has ceil(rows/bin) x ceil(cols/bin) values.
void bin_detector(const std::uint64_t* native, std::uint64_t rows, std::uint64_t cols, std::uint64_t bin,
                  std::uint64_t* out) {
  const std::uint64_t out_cols = (cols + bin - 1) / bin;
  const std::uint64_t out_rows = (rows + bin - 1) / bin;
  if (bin == 1) {
    std::copy(native, native + rows * cols, out);
    return;
  }
  std::fill(out, out + out_rows * out_cols, 0);
  for (std::uint64_t r = 0; r < rows; ++r) {
    std::uint64_t* out_row = out + (r / bin) * out_cols;
    const std::uint64_t* in_row = native + r * cols;
    for (std::uint64_t c = 0; c < cols; ++c) out_row[c / bin] += in_row[c];
  }
}

// The source frames of one plan position: a block of scan_bin x scan_bin
// (cut at the region's edge) inside the region.
struct Block {
  std::uint64_t row_begin, row_end, col_begin, col_end;
};
Block block_of(const plan::PlanGeometry& g, std::uint64_t position) {
  const std::uint64_t i = position / g.scan_cols;
  const std::uint64_t j = position % g.scan_cols;
  Block block;
  block.row_begin = g.region.row_start + i * g.scan_bin;
  block.row_end = std::min(g.region.row_stop, block.row_begin + g.scan_bin);
  block.col_begin = g.region.col_start + j * g.scan_bin;
  block.col_end = std::min(g.region.col_stop, block.col_begin + g.scan_bin);
  return block;
}

// Sums per-frame values of the region (row-major over the region) into plan positions.
std::vector<std::uint64_t> bin_scan(const plan::PlanGeometry& g, std::vector<std::uint64_t> per_frame) {
  if (g.scan_bin == 1) return per_frame;
  const std::uint64_t region_cols = g.region.col_stop - g.region.col_start;
  const std::uint64_t region_rows = g.region.row_stop - g.region.row_start;
  std::vector<std::uint64_t> out(g.positions(), 0);
  for (std::uint64_t r = 0; r < region_rows; ++r) {
    std::uint64_t* out_row = out.data() + (r / g.scan_bin) * g.scan_cols;
    const std::uint64_t* in_row = per_frame.data() + r * region_cols;
    for (std::uint64_t c = 0; c < region_cols; ++c) out_row[c / g.scan_bin] += in_row[c];
  }
  return out;
}

// Frames handed to one task: enough work to amortise scheduling, small enough to balance.
constexpr std::size_t kFramesPerTask = 64;

}  // namespace

// ---------------------------------------------------------------------------
// CpuResident

CpuResident::CpuResident(catalog::Acquisition source, DType code_dtype, HostBuffer codes,
                         std::vector<std::uint64_t> pattern_sum, std::vector<std::uint64_t> frame_totals,
                         std::shared_ptr<ThreadPool> pool, int device_index)
    : source_(std::move(source)),
      code_dtype_(code_dtype),
      codes_(std::move(codes)),
      frame_pixels_(source_.frame_pixels()),
      pattern_sum_(std::move(pattern_sum)),
      frame_totals_(std::move(frame_totals)),
      pool_(std::move(pool)),
      device_index_(device_index) {}

std::uint64_t CpuResident::resident_bytes() const {
  return codes_.size() + (pattern_sum_.size() + frame_totals_.size()) * sizeof(std::uint64_t);
}

std::string CpuResident::encoding() const {
  switch (code_dtype_) {
    case DType::uint8: return "dense-u8";
    case DType::uint16: return "dense-u16";
    case DType::uint32: return "dense-u32";
  }
  return "dense";
}

template <class Visit>
decltype(auto) CpuResident::with_code_type(Visit&& visit) const {
  switch (code_dtype_) {
    case DType::uint8: return visit(std::uint8_t{});
    case DType::uint16: return visit(std::uint16_t{});
    case DType::uint32: break;
  }
  return visit(std::uint32_t{});
}

void CpuResident::check_geometry(const plan::PlanGeometry& geometry) const {
  plan::BrowsePlan plan;
  if (geometry.cropped) plan.crop = geometry.region;
  plan.scan_bin = geometry.scan_bin;
  plan.detector_bin = geometry.detector_bin;
  bool consistent = false;
  try {
    consistent = plan::resolve_plan(plan, source_.scan_rows, source_.scan_cols, source_.detector_rows,
                                    source_.detector_cols) == geometry;
  } catch (const Error&) {
    consistent = false;
  }
  if (!consistent) {
    throw internal_error("plan geometry (" + plan::to_string(geometry) + ") was not resolved for the resident " +
                         source_.name + " (" + std::to_string(source_.scan_rows) + "x" +
                         std::to_string(source_.scan_cols) + " scan, " + std::to_string(source_.detector_rows) +
                         "x" + std::to_string(source_.detector_cols) + " detector)");
  }
}

// --- masked sums -----------------------------------------------------------

template <class Code>
std::vector<std::uint64_t> CpuResident::masked_frame_sums(const plan::PlanGeometry& g,
                                                          const std::vector<std::uint8_t>& binned_mask) {
  const std::uint64_t rows = source_.detector_rows;
  const std::uint64_t cols = source_.detector_cols;
  // The mask at native resolution: a source pixel belongs to its detector bin.
  std::vector<std::uint8_t> native(frame_pixels_);
  std::uint64_t selected = 0;
  for (std::uint64_t r = 0; r < rows; ++r) {
    const std::uint8_t* mask_row = binned_mask.data() + (r / g.detector_bin) * g.detector_cols;
    for (std::uint64_t c = 0; c < cols; ++c) {
      const std::uint8_t in = mask_row[c / g.detector_bin] != 0 ? 1 : 0;
      native[r * cols + c] = in;
      selected += in;
    }
  }
  // A mask covering most of the detector is summed as total − complement (exact).
  const bool complement = selected * 2 > frame_pixels_;
  const std::vector<PixelRun> runs = pixel_runs(native, complement ? 0 : 1);

  const std::uint64_t region_cols = g.region.col_stop - g.region.col_start;
  const std::uint64_t region_frames = (g.region.row_stop - g.region.row_start) * region_cols;
  std::vector<std::uint64_t> sums(region_frames);
  pool_->parallel_for(region_frames, kFramesPerTask, [&](std::size_t begin, std::size_t end, unsigned) {
    for (std::size_t k = begin; k < end; ++k) {
      const std::uint64_t frame =
          (g.region.row_start + k / region_cols) * source_.scan_cols + g.region.col_start + k % region_cols;
      const std::uint64_t sum = sum_runs(frame_codes<Code>(frame), runs);
      sums[k] = complement ? frame_totals_[frame] - sum : sum;
    }
  });
  return sums;
}

std::vector<std::uint64_t> CpuResident::masked_sum(const plan::PlanGeometry& geometry,
                                                   const std::vector<std::uint8_t>& binned_detector_mask) {
  check_geometry(geometry);
  if (binned_detector_mask.size() != geometry.detector_pixels()) {
    throw bad_request("detector mask has " + std::to_string(binned_detector_mask.size()) + " values; the plan's " +
                      std::to_string(geometry.detector_rows) + " x " + std::to_string(geometry.detector_cols) +
                      " detector needs " + std::to_string(geometry.detector_pixels()));
  }
  auto per_frame = with_code_type([&](auto code) {
    return masked_frame_sums<decltype(code)>(geometry, binned_detector_mask);
  });
  return bin_scan(geometry, std::move(per_frame));
}

// --- pattern sum -------------------------------------------------------------

template <class Code>
std::vector<std::uint64_t> CpuResident::cropped_pattern_sum(const plan::PlanGeometry& g) {
  const std::uint64_t region_cols = g.region.col_stop - g.region.col_start;
  const std::uint64_t region_frames = (g.region.row_stop - g.region.row_start) * region_cols;
  std::vector<std::vector<std::uint64_t>> partial(pool_->size());
  std::mutex merge_mutex;
  std::vector<std::uint64_t> total(frame_pixels_, 0);
  pool_->parallel_for(region_frames, 1024, [&](std::size_t begin, std::size_t end, unsigned) {
    // 1024 frames of 8/16-bit codes cannot overflow 32-bit per-pixel sums.
    using Narrow = std::conditional_t<(sizeof(Code) < 4), std::uint32_t, std::uint64_t>;
    std::vector<Narrow> sum(frame_pixels_, 0);
    for (std::size_t k = begin; k < end; ++k) {
      const std::uint64_t frame =
          (g.region.row_start + k / region_cols) * source_.scan_cols + g.region.col_start + k % region_cols;
      const Code* values = frame_codes<Code>(frame);
      for (std::uint64_t p = 0; p < frame_pixels_; ++p) sum[p] += values[p];
    }
    std::lock_guard<std::mutex> lock(merge_mutex);
    for (std::uint64_t p = 0; p < frame_pixels_; ++p) total[p] += sum[p];
  });
  return total;
}

std::vector<std::uint64_t> CpuResident::pattern_sum(const plan::PlanGeometry& geometry) {
  check_geometry(geometry);
  // Every frame belongs to exactly one plan position, so an uncropped plan's
  // pattern sum is the load-time sum whatever the scan bin.
  std::vector<std::uint64_t> native = geometry.cropped ? with_code_type([&](auto code) {
    return cropped_pattern_sum<decltype(code)>(geometry);
  })
                                                       : pattern_sum_;
  std::vector<std::uint64_t> out(geometry.detector_pixels());
  bin_detector(native.data(), source_.detector_rows, source_.detector_cols, geometry.detector_bin, out.data());
  return out;
}

// --- centre of mass ----------------------------------------------------------

template <class Code>
void CpuResident::center_of_mass_frames(const plan::PlanGeometry& g, std::vector<std::uint64_t>& total,
                                        std::vector<std::uint64_t>& row_moment,
                                        std::vector<std::uint64_t>& col_moment) {
  const std::uint64_t rows = source_.detector_rows;
  const std::uint64_t cols = source_.detector_cols;
  const std::uint64_t bin = g.detector_bin;
  const std::uint64_t region_cols = g.region.col_stop - g.region.col_start;
  const std::uint64_t region_frames = (g.region.row_stop - g.region.row_start) * region_cols;
  total.assign(region_frames, 0);
  row_moment.assign(region_frames, 0);
  col_moment.assign(region_frames, 0);
  // 32-bit partial sums are exact while a row or column of 8/16-bit codes has ≤ 65536 pixels.
  constexpr bool narrow_codes = sizeof(Code) < 4;
  const bool narrow = narrow_codes && rows <= kMaxRunLength && cols <= kMaxRunLength;
  std::vector<std::uint64_t> col_weight(cols);
  for (std::uint64_t c = 0; c < cols; ++c) col_weight[c] = c / bin;

  pool_->parallel_for(region_frames, kFramesPerTask, [&](std::size_t begin, std::size_t end, unsigned) {
    std::vector<std::uint32_t> column_sum32(narrow ? cols : 0);
    std::vector<std::uint64_t> column_sum64(narrow ? 0 : cols);
    for (std::size_t k = begin; k < end; ++k) {
      const std::uint64_t frame =
          (g.region.row_start + k / region_cols) * source_.scan_cols + g.region.col_start + k % region_cols;
      const Code* values = frame_codes<Code>(frame);
      std::uint64_t frame_total = 0;
      std::uint64_t frame_row_moment = 0;
      std::uint64_t frame_col_moment = 0;
      if (narrow) {
        std::fill(column_sum32.begin(), column_sum32.end(), 0);
        for (std::uint64_t r = 0; r < rows; ++r) {
          const Code* row = values + r * cols;
          std::uint32_t row_sum = 0;
          std::uint32_t* column_sum = column_sum32.data();
          for (std::uint64_t c = 0; c < cols; ++c) {
            row_sum += row[c];
            column_sum[c] += row[c];
          }
          frame_total += row_sum;
          frame_row_moment += (r / bin) * std::uint64_t{row_sum};
        }
        for (std::uint64_t c = 0; c < cols; ++c) frame_col_moment += col_weight[c] * column_sum32[c];
      } else {
        std::fill(column_sum64.begin(), column_sum64.end(), 0);
        for (std::uint64_t r = 0; r < rows; ++r) {
          const Code* row = values + r * cols;
          std::uint64_t row_sum = 0;
          std::uint64_t* column_sum = column_sum64.data();
          for (std::uint64_t c = 0; c < cols; ++c) {
            row_sum += row[c];
            column_sum[c] += row[c];
          }
          frame_total += row_sum;
          frame_row_moment += (r / bin) * row_sum;
        }
        for (std::uint64_t c = 0; c < cols; ++c) frame_col_moment += col_weight[c] * column_sum64[c];
      }
      total[k] = frame_total;
      row_moment[k] = frame_row_moment;
      col_moment[k] = frame_col_moment;
    }
  });
}

CenterOfMassSums CpuResident::center_of_mass_sums(const plan::PlanGeometry& geometry) {
  check_geometry(geometry);
  CenterOfMassSums sums;
  with_code_type([&](auto code) {
    center_of_mass_frames<decltype(code)>(geometry, sums.total, sums.row_moment, sums.col_moment);
  });
  sums.total = bin_scan(geometry, std::move(sums.total));
  sums.row_moment = bin_scan(geometry, std::move(sums.row_moment));
  sums.col_moment = bin_scan(geometry, std::move(sums.col_moment));
  return sums;
}

// --- frames and regions ------------------------------------------------------

template <class Code>
void CpuResident::add_block(const plan::PlanGeometry& g, std::uint64_t position, std::uint64_t* native_sum) const {
  const Block block = block_of(g, position);
  for (std::uint64_t r = block.row_begin; r < block.row_end; ++r) {
    for (std::uint64_t c = block.col_begin; c < block.col_end; ++c) {
      const Code* values = frame_codes<Code>(r * source_.scan_cols + c);
      for (std::uint64_t p = 0; p < frame_pixels_; ++p) native_sum[p] += values[p];
    }
  }
}

std::vector<std::uint64_t> CpuResident::frame(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                              std::uint64_t scan_col) {
  check_geometry(geometry);
  if (scan_row >= geometry.scan_rows || scan_col >= geometry.scan_cols) {
    throw bad_request("scan position (" + std::to_string(scan_row) + ", " + std::to_string(scan_col) +
                      ") is outside the plan's " + std::to_string(geometry.scan_rows) + " x " +
                      std::to_string(geometry.scan_cols) + " scan");
  }
  std::vector<std::uint64_t> native(frame_pixels_, 0);
  with_code_type([&](auto code) {
    add_block<decltype(code)>(geometry, scan_row * geometry.scan_cols + scan_col, native.data());
  });
  std::vector<std::uint64_t> out(geometry.detector_pixels());
  bin_detector(native.data(), source_.detector_rows, source_.detector_cols, geometry.detector_bin, out.data());
  return out;
}

template <class Code>
std::vector<std::uint64_t> CpuResident::region_max(const plan::PlanGeometry& g,
                                                   const std::vector<std::uint64_t>& positions) {
  const std::uint64_t binned_pixels = g.detector_pixels();
  std::vector<std::uint64_t> result(binned_pixels, 0);
  std::mutex merge_mutex;
  const bool single_frames = g.scan_bin == 1 && g.detector_bin == 1;
  pool_->parallel_for(positions.size(), 16, [&](std::size_t begin, std::size_t end, unsigned) {
    std::vector<std::uint64_t> best(binned_pixels, 0);
    std::vector<std::uint64_t> native(single_frames ? 0 : frame_pixels_);
    std::vector<std::uint64_t> binned(single_frames ? 0 : binned_pixels);
    for (std::size_t k = begin; k < end; ++k) {
      if (single_frames) {
        const Block block = block_of(g, positions[k]);
        const Code* values = frame_codes<Code>(block.row_begin * source_.scan_cols + block.col_begin);
        for (std::uint64_t p = 0; p < binned_pixels; ++p) best[p] = std::max<std::uint64_t>(best[p], values[p]);
        continue;
      }
      std::fill(native.begin(), native.end(), 0);
      add_block<Code>(g, positions[k], native.data());
      bin_detector(native.data(), source_.detector_rows, source_.detector_cols, g.detector_bin, binned.data());
      for (std::uint64_t p = 0; p < binned_pixels; ++p) best[p] = std::max(best[p], binned[p]);
    }
    std::lock_guard<std::mutex> lock(merge_mutex);
    for (std::uint64_t p = 0; p < binned_pixels; ++p) result[p] = std::max(result[p], best[p]);
  });
  return result;
}

std::vector<std::uint64_t> CpuResident::region_reduce(const plan::PlanGeometry& geometry,
                                                      const std::vector<std::uint64_t>& positions,
                                                      RegionReduce reduce) {
  check_geometry(geometry);
  for (const std::uint64_t position : positions) {
    if (position >= geometry.positions()) {
      throw bad_request("scan position index " + std::to_string(position) + " is outside the plan's " +
                        std::to_string(geometry.positions()) + " positions");
    }
  }
  if (reduce == RegionReduce::max) {
    return with_code_type([&](auto code) { return region_max<decltype(code)>(geometry, positions); });
  }
  std::vector<std::uint64_t> native(frame_pixels_, 0);
  std::mutex merge_mutex;
  pool_->parallel_for(positions.size(), 16, [&](std::size_t begin, std::size_t end, unsigned) {
    std::vector<std::uint64_t> sum(frame_pixels_, 0);
    with_code_type([&](auto code) {
      for (std::size_t k = begin; k < end; ++k) add_block<decltype(code)>(geometry, positions[k], sum.data());
    });
    std::lock_guard<std::mutex> lock(merge_mutex);
    for (std::uint64_t p = 0; p < frame_pixels_; ++p) native[p] += sum[p];
  });
  std::vector<std::uint64_t> out(geometry.detector_pixels());
  bin_detector(native.data(), source_.detector_rows, source_.detector_cols, geometry.detector_bin, out.data());
  return out;
}

// ---------------------------------------------------------------------------
// ResidentBuilder

DType ResidentBuilder::initial_code_dtype(DType source_dtype) {
  return source_dtype == DType::uint32 ? DType::uint16 : source_dtype;
}

std::uint64_t ResidentBuilder::code_bytes(const catalog::Acquisition& source, DType code_dtype) {
  return source.frame_count() * source.frame_pixels() * dtype_size(code_dtype);
}

std::uint64_t ResidentBuilder::working_bytes(const catalog::Acquisition& source, DType code_dtype,
                                             unsigned participants) {
  const std::uint64_t pixels = source.frame_pixels();
  const bool narrowing = source.dtype == DType::uint32 && code_dtype != DType::uint32;
  const std::uint64_t per_participant =
      (narrowing ? pixels * 4 : 0) + (dtype_size(code_dtype) < 4 ? pixels * 4 : 0) + pixels * 8;
  return participants * per_participant + pixels * 8 /* pattern sum */ + source.frame_count() * 8 /* totals */ +
         source.masked_pixel_count * 4;
}

ResidentBuilder::ResidentBuilder(const catalog::Acquisition& source, DType code_dtype,
                                 std::shared_ptr<ThreadPool> pool)
    : source_(source),
      source_dtype_(source.dtype.value_or(code_dtype)),
      code_dtype_(code_dtype),
      frame_pixels_(source.frame_pixels()),
      codes_(code_bytes(source, code_dtype)),
      frame_totals_(source.frame_count(), 0),
      participants_(pool->size()),
      pool_(std::move(pool)) {
  if (!source_.pixel_mask.empty()) {
    for (std::uint64_t p = 0; p < source_.pixel_mask.size() && p < frame_pixels_; ++p) {
      if (source_.pixel_mask[p] != 0) masked_pixels_.push_back(static_cast<std::uint32_t>(p));
    }
  }
  const bool narrowing = source_dtype_ == DType::uint32 && code_dtype_ != DType::uint32;
  for (Participant& participant : participants_) {
    if (narrowing) participant.narrowing_scratch.resize(frame_pixels_);
    if (dtype_size(code_dtype_) < 4) participant.pattern_narrow.assign(frame_pixels_, 0);
    participant.pattern_wide.assign(frame_pixels_, 0);
  }
}

std::uint8_t* ResidentBuilder::decode_target(std::uint64_t frame, unsigned participant) {
  Participant& state = participants_[participant];
  if (!state.narrowing_scratch.empty()) return reinterpret_cast<std::uint8_t*>(state.narrowing_scratch.data());
  return codes_.data() + frame * frame_pixels_ * dtype_size(code_dtype_);
}

namespace {

template <class Code>
std::uint64_t accumulate_frame(const Code* values, std::uint64_t pixels, std::uint32_t* narrow_sum,
                               std::uint64_t* wide_sum) {
  std::uint64_t total = 0;
  if constexpr (sizeof(Code) < 4) {
    for (std::uint64_t p = 0; p < pixels; p += kMaxRunLength) {
      const std::uint64_t end = std::min<std::uint64_t>(pixels, p + kMaxRunLength);
      std::uint32_t run_total = 0;
      for (std::uint64_t q = p; q < end; ++q) {
        run_total += values[q];
        narrow_sum[q] += values[q];
      }
      total += run_total;
    }
  } else {
    (void)narrow_sum;
    for (std::uint64_t p = 0; p < pixels; ++p) {
      total += values[p];
      wide_sum[p] += values[p];
    }
  }
  return total;
}

}  // namespace

void ResidentBuilder::flush(Participant& participant) {
  if (participant.frames_in_narrow == 0) return;
  for (std::uint64_t p = 0; p < frame_pixels_; ++p) {
    participant.pattern_wide[p] += participant.pattern_narrow[p];
    participant.pattern_narrow[p] = 0;
  }
  participant.frames_in_narrow = 0;
}

void ResidentBuilder::finish_frame(std::uint64_t frame, unsigned participant_index) {
  Participant& participant = participants_[participant_index];
  std::uint8_t* slot = codes_.data() + frame * frame_pixels_ * dtype_size(code_dtype_);
  if (!participant.narrowing_scratch.empty()) {
    std::uint32_t* wide = participant.narrowing_scratch.data();
    for (const std::uint32_t p : masked_pixels_) wide[p] = 0;
    std::uint32_t any_bits = 0;
    for (std::uint64_t p = 0; p < frame_pixels_; ++p) any_bits |= wide[p];
    if (any_bits > 0xFFFFu) throw NeedsWideCodes{};
    auto* narrow = reinterpret_cast<std::uint16_t*>(slot);
    for (std::uint64_t p = 0; p < frame_pixels_; ++p) narrow[p] = static_cast<std::uint16_t>(wide[p]);
  } else {
    switch (code_dtype_) {
      case DType::uint8:
        for (const std::uint32_t p : masked_pixels_) slot[p] = 0;
        break;
      case DType::uint16:
        for (const std::uint32_t p : masked_pixels_) reinterpret_cast<std::uint16_t*>(slot)[p] = 0;
        break;
      case DType::uint32:
        for (const std::uint32_t p : masked_pixels_) reinterpret_cast<std::uint32_t*>(slot)[p] = 0;
        break;
    }
  }
  std::uint64_t total = 0;
  switch (code_dtype_) {
    case DType::uint8:
      total = accumulate_frame(slot, frame_pixels_, participant.pattern_narrow.data(), nullptr);
      break;
    case DType::uint16:
      total = accumulate_frame(reinterpret_cast<const std::uint16_t*>(slot), frame_pixels_,
                               participant.pattern_narrow.data(), nullptr);
      break;
    case DType::uint32:
      total = accumulate_frame(reinterpret_cast<const std::uint32_t*>(slot), frame_pixels_, nullptr,
                               participant.pattern_wide.data());
      break;
  }
  frame_totals_[frame] = total;
  // 65536 frames of 8/16-bit codes cannot overflow a 32-bit per-pixel sum.
  if (dtype_size(code_dtype_) < 4 && ++participant.frames_in_narrow == kMaxRunLength) flush(participant);
}

std::shared_ptr<CpuResident> ResidentBuilder::finish(int device_index) {
  std::vector<std::uint64_t> pattern(frame_pixels_, 0);
  for (Participant& participant : participants_) {
    flush(participant);
    for (std::uint64_t p = 0; p < frame_pixels_; ++p) pattern[p] += participant.pattern_wide[p];
  }
  participants_.clear();
  participants_.shrink_to_fit();
  return std::make_shared<CpuResident>(std::move(source_), code_dtype_, std::move(codes_), std::move(pattern),
                                       std::move(frame_totals_), pool_, device_index);
}

}  // namespace quantem::backend::cpu

// ---------------------------------------------------------------------------
// Dense-array factory

namespace quantem::backend {

std::shared_ptr<Resident> make_cpu_resident(const catalog::Acquisition& acquisition, const void* counts,
                                            std::size_t count_bytes, const CpuResidentOptions& options) {
  if (!acquisition.dtype) throw bad_request("the acquisition's dtype is unknown");
  if (!acquisition.scan_shape_known() || !acquisition.detector_shape_known()) {
    throw bad_request("the acquisition's scan and detector shapes must be known");
  }
  if (!acquisition.pixel_mask.empty() && acquisition.pixel_mask.size() != acquisition.frame_pixels()) {
    throw bad_request("the pixel mask has " + std::to_string(acquisition.pixel_mask.size()) +
                      " values; the detector has " + std::to_string(acquisition.frame_pixels()));
  }
  const DType source_dtype = *acquisition.dtype;
  const std::size_t element = dtype_size(source_dtype);
  const std::uint64_t pixels = acquisition.frame_pixels();
  if (count_bytes != acquisition.frame_count() * pixels * element) {
    throw bad_request("dense counts hold " + std::to_string(count_bytes) + " bytes; the acquisition needs " +
                      std::to_string(acquisition.frame_count() * pixels * element));
  }
  auto pool = std::make_shared<cpu::ThreadPool>(options.threads);
  const auto* bytes = static_cast<const std::uint8_t*>(counts);
  DType code_dtype = cpu::ResidentBuilder::initial_code_dtype(source_dtype);
  for (;;) {
    try {
      cpu::ResidentBuilder builder(acquisition, code_dtype, pool);
      pool->parallel_for(acquisition.frame_count(), 64, [&](std::size_t begin, std::size_t end, unsigned who) {
        for (std::size_t frame = begin; frame < end; ++frame) {
          std::memcpy(builder.decode_target(frame, who), bytes + frame * pixels * element, pixels * element);
          builder.finish_frame(frame, who);
        }
      });
      return builder.finish(options.device_index);
    } catch (const cpu::NeedsWideCodes&) {
      code_dtype = DType::uint32;  // a masked count above 65535: hold 32-bit codes
    } catch (const std::bad_alloc&) {
      throw payload_too_large("not enough host memory to hold the " + std::to_string(count_bytes) +
                              "-byte acquisition " + acquisition.name);
    }
  }
}

}  // namespace quantem::backend
