#include "cpu/cpu_resident.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "quantem/backend/cpu_backend.hpp"
#include "quantem/core/error.hpp"

namespace quantem::backend::cpu {
namespace {

// A run of consecutive pixels of one frame. Runs are at most kMaxRunLength
// long so that 32-bit partial sums of 8/16-bit codes cannot overflow.
struct PixelRun {
  std::uint32_t offset = 0;
  std::uint32_t length = 0;
};
constexpr std::uint32_t kMaxRunLength = 65536;

// Partial-sum type: 32 bits are exact for ≤ 65536 values of 8/16-bit codes.
template <class Code>
using Partial = std::conditional_t<(sizeof(Code) < 4), std::uint32_t, std::uint64_t>;

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

// Adds frames [first, last) (global indices) to a grouped frame set.
void add_frame_range(GroupLanes& lanes, std::uint64_t first, std::uint64_t last) {
  for (std::uint64_t frame = first; frame < last; ++frame) {
    const std::uint64_t group = frame / kGroupFrames;
    const LaneMask bit = LaneMask{1} << (frame % kGroupFrames);
    if (!lanes.empty() && lanes.back().first == group) {
      lanes.back().second |= bit;
    } else {
      lanes.emplace_back(group, bit);
    }
  }
}

GroupLanes region_frames(const plan::PlanGeometry& g) {
  GroupLanes lanes;
  plan::for_each_region_row(g, [&](std::uint64_t first, std::uint64_t end) { add_frame_range(lanes, first, end); });
  return lanes;
}

// The source frames of one plan position.
GroupLanes position_frames(const plan::PlanGeometry& g, std::uint64_t position) {
  GroupLanes lanes;
  plan::for_each_position_row(g, position,
                              [&](std::uint64_t first, std::uint64_t end) { add_frame_range(lanes, first, end); });
  return lanes;
}

template <class Visit>
void for_each_lane(LaneMask mask, Visit&& visit) {
  while (mask != 0) {
    const unsigned lane = static_cast<unsigned>(__builtin_ctz(mask));
    visit(lane);
    mask &= mask - 1;
  }
}

// --- per-group kernels (the hot loops) ----------------------------------------

// out[lane] = Σ over the runs' pixels of lane's frame.
template <class Code>
void group_masked_sums(const Code* group, const std::vector<PixelRun>& runs, std::uint64_t* out) {
  std::fill(out, out + kGroupFrames, 0);
  for (const PixelRun& run : runs) {
    Partial<Code> partial[kGroupFrames] = {};
    const Code* line = group + std::uint64_t{run.offset} * kGroupFrames;
    for (std::uint32_t i = 0; i < run.length; ++i, line += kGroupFrames) {
      for (std::uint64_t lane = 0; lane < kGroupFrames; ++lane) partial[lane] += line[lane];
    }
    for (std::uint64_t lane = 0; lane < kGroupFrames; ++lane) out[lane] += partial[lane];
  }
}

// native[p] += Σ over the selected lanes of pixel p.
template <class Code>
void group_add_frames(const Code* group, LaneMask lanes, std::uint64_t pixels, std::uint64_t* native) {
  if ((lanes & (lanes - 1)) == 0) {  // one frame: a strided gather
    const std::uint64_t lane = static_cast<std::uint64_t>(__builtin_ctz(lanes));
    for (std::uint64_t p = 0; p < pixels; ++p) native[p] += group[p * kGroupFrames + lane];
    return;
  }
  Code keep[kGroupFrames];
  for (std::uint64_t lane = 0; lane < kGroupFrames; ++lane) {
    keep[lane] = (lanes >> lane) & 1u ? static_cast<Code>(~Code{0}) : Code{0};
  }
  for (std::uint64_t p = 0; p < pixels; ++p) {
    const Code* line = group + p * kGroupFrames;
    Partial<Code> sum = 0;  // ≤ 32 values
    for (std::uint64_t lane = 0; lane < kGroupFrames; ++lane) sum += static_cast<Code>(line[lane] & keep[lane]);
    native[p] += sum;
  }
}

// Writes `lanes` frames of `pixels` 16-bit values (frame-major, one after the
// other) into a group's pixel-major lines: out[p * kGroupFrames + lane].
void transpose_u16(const std::uint16_t* frames, std::uint64_t lanes, std::uint64_t pixels, std::uint16_t* out) {
  // Memory-bound (an AVX2 version was no faster: docs/benchmarks.md, "Code decisions and their measurements").
  std::uint64_t p = 0;
#if defined(__SSE2__)
  const std::uint64_t full_lane_blocks = lanes / 8;
  for (; p + 8 <= pixels; p += 8) {
    for (std::uint64_t block = 0; block < full_lane_blocks; ++block) {
      const std::uint16_t* in = frames + block * 8 * pixels + p;
      const auto row = [&](std::uint64_t lane) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + lane * pixels));
      };
      const __m128i a0 = row(0), a1 = row(1), a2 = row(2), a3 = row(3);
      const __m128i a4 = row(4), a5 = row(5), a6 = row(6), a7 = row(7);
      const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
      const __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
      const __m128i b4 = _mm_unpacklo_epi16(a4, a5), b5 = _mm_unpackhi_epi16(a4, a5);
      const __m128i b6 = _mm_unpacklo_epi16(a6, a7), b7 = _mm_unpackhi_epi16(a6, a7);
      const __m128i c0 = _mm_unpacklo_epi32(b0, b2), c1 = _mm_unpackhi_epi32(b0, b2);
      const __m128i c2 = _mm_unpacklo_epi32(b1, b3), c3 = _mm_unpackhi_epi32(b1, b3);
      const __m128i c4 = _mm_unpacklo_epi32(b4, b6), c5 = _mm_unpackhi_epi32(b4, b6);
      const __m128i c6 = _mm_unpacklo_epi32(b5, b7), c7 = _mm_unpackhi_epi32(b5, b7);
      std::uint16_t* line = out + p * kGroupFrames + block * 8;
      const auto store = [&](std::uint64_t pixel, __m128i lanes8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(line + pixel * kGroupFrames), lanes8);
      };
      store(0, _mm_unpacklo_epi64(c0, c4));
      store(1, _mm_unpackhi_epi64(c0, c4));
      store(2, _mm_unpacklo_epi64(c1, c5));
      store(3, _mm_unpackhi_epi64(c1, c5));
      store(4, _mm_unpacklo_epi64(c2, c6));
      store(5, _mm_unpackhi_epi64(c2, c6));
      store(6, _mm_unpacklo_epi64(c3, c7));
      store(7, _mm_unpackhi_epi64(c3, c7));
    }
    for (std::uint64_t lane = full_lane_blocks * 8; lane < lanes; ++lane) {
      for (std::uint64_t q = p; q < p + 8; ++q) out[q * kGroupFrames + lane] = frames[lane * pixels + q];
    }
  }
#endif
  for (; p < pixels; ++p) {
    for (std::uint64_t lane = 0; lane < lanes; ++lane) out[p * kGroupFrames + lane] = frames[lane * pixels + p];
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// CpuResident

std::uint64_t FrameSummaries::bytes(const catalog::Acquisition& source, DType code_dtype) {
  const std::uint64_t projection = dtype_size(code_dtype) < 4 ? 4 : 8;
  return (source.frame_pixels() + source.frame_count()) * sizeof(std::uint64_t) +
         source.frame_count() * (source.detector_rows + source.detector_cols) * projection;
}

CpuResident::CpuResident(catalog::Acquisition source, DType code_dtype, HostBuffer codes, FrameSummaries summaries,
                         std::shared_ptr<ThreadPool> pool, int device_index)
    : source_(std::move(source)),
      code_dtype_(code_dtype),
      codes_(std::move(codes)),
      frame_pixels_(source_.frame_pixels()),
      summaries_(std::move(summaries)),
      pool_(std::move(pool)),
      device_index_(device_index) {}

std::uint64_t CpuResident::resident_bytes() const {
  return codes_.size() +
         (summaries_.pattern_sum.size() + summaries_.frame_totals.size()) * sizeof(std::uint64_t) +
         summaries_.row_projections.size() + summaries_.col_projections.size();
}

std::string CpuResident::encoding() const {
  switch (code_dtype_) {
    case DType::uint8: return "grouped32-u8";
    case DType::uint16: return "grouped32-u16";
    case DType::uint32: return "grouped32-u32";
  }
  return "grouped32";
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

// --- masked sums -----------------------------------------------------------

template <class Code>
std::vector<std::uint64_t> CpuResident::masked_frame_sums(const plan::PlanGeometry& g,
                                                          const std::vector<std::uint8_t>& binned_mask) {
  // The mask at source resolution: a source pixel belongs to its detector bin.
  const std::vector<std::uint8_t> native = plan::source_detector_mask(g, binned_mask);
  const std::uint64_t selected = static_cast<std::uint64_t>(std::count(native.begin(), native.end(), 1));
  // A mask covering most of the detector is summed as total − complement (exact).
  const bool complement = selected * 2 > frame_pixels_;
  const std::vector<PixelRun> runs = pixel_runs(native, complement ? 0 : 1);

  const GroupLanes groups = region_frames(g);
  std::vector<std::uint64_t> sums(plan::region_frame_count(g));
  pool_->parallel_for(groups.size(), 4, [&](std::size_t begin, std::size_t end, unsigned) {
    std::uint64_t lane_sums[kGroupFrames];
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint64_t group = groups[i].first;  // no structured binding: captured below (C++17)
      const LaneMask lanes = groups[i].second;
      group_masked_sums(group_codes<Code>(group), runs, lane_sums);
      for_each_lane(lanes, [&](unsigned lane) {
        const std::uint64_t frame = group * kGroupFrames + lane;
        sums[plan::region_index(g, frame)] =
            complement ? summaries_.frame_totals[frame] - lane_sums[lane] : lane_sums[lane];
      });
    }
  });
  return sums;
}

std::vector<std::uint64_t> CpuResident::compute_masked_sum(const plan::PlanGeometry& geometry,
                                                           const std::vector<std::uint8_t>& binned_detector_mask) {
  auto per_frame = with_code_type([&](auto code) {
    return masked_frame_sums<decltype(code)>(geometry, binned_detector_mask);
  });
  return plan::bin_scan_sums(geometry, std::move(per_frame));
}

// Several masks in one walk. The detector splits into classes of pixels that
// belong to the same masks (bit m of a class: mask m); each class is summed
// once per frame over its runs, the largest class not at all (the frame total
// minus the others, exact), and mask m's sum is the sum of the classes that
// hold it. Every pixel is read at most once, however many masks overlap.
template <class Code>
std::vector<std::vector<std::uint64_t>> CpuResident::masked_frame_sums_together(
    const plan::PlanGeometry& g, const std::vector<std::vector<std::uint8_t>>& binned_masks) {
  const std::size_t mask_count = binned_masks.size();
  std::vector<std::uint32_t> membership(frame_pixels_, 0);
  for (std::size_t m = 0; m < mask_count; ++m) {
    const std::vector<std::uint8_t> native = plan::source_detector_mask(g, binned_masks[m]);
    for (std::uint64_t p = 0; p < frame_pixels_; ++p) membership[p] |= std::uint32_t{native[p]} << m;
  }
  // Dense class numbers (at most 255 classes: the caller checks) and their sizes.
  std::vector<std::uint32_t> class_members;  // class -> membership bits
  std::vector<std::uint64_t> class_pixels;
  std::vector<std::uint8_t> pixel_class(frame_pixels_);
  for (std::uint64_t p = 0; p < frame_pixels_; ++p) {
    const auto found = std::find(class_members.begin(), class_members.end(), membership[p]);
    const std::size_t c = static_cast<std::size_t>(found - class_members.begin());
    if (found == class_members.end()) {
      class_members.push_back(membership[p]);
      class_pixels.push_back(0);
    }
    ++class_pixels[c];
    pixel_class[p] = static_cast<std::uint8_t>(c);
  }
  const std::size_t classes = class_members.size();
  const std::size_t derived = static_cast<std::size_t>(
      std::max_element(class_pixels.begin(), class_pixels.end()) - class_pixels.begin());
  std::vector<std::vector<PixelRun>> runs(classes);
  for (std::size_t c = 0; c < classes; ++c) {
    if (c != derived) runs[c] = pixel_runs(pixel_class, static_cast<std::uint8_t>(c));
  }

  const GroupLanes groups = region_frames(g);
  std::vector<std::vector<std::uint64_t>> sums(mask_count, std::vector<std::uint64_t>(plan::region_frame_count(g)));
  pool_->parallel_for(groups.size(), 4, [&](std::size_t begin, std::size_t end, unsigned) {
    std::vector<std::uint64_t> class_sums(classes * kGroupFrames);
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint64_t group = groups[i].first;  // no structured binding: captured below (C++17)
      const LaneMask lanes = groups[i].second;
      for (std::size_t c = 0; c < classes; ++c) {
        if (c != derived) group_masked_sums(group_codes<Code>(group), runs[c], class_sums.data() + c * kGroupFrames);
      }
      for_each_lane(lanes, [&](unsigned lane) {
        const std::uint64_t frame = group * kGroupFrames + lane;
        std::uint64_t others = 0;
        for (std::size_t c = 0; c < classes; ++c) {
          if (c != derived) others += class_sums[c * kGroupFrames + lane];
        }
        class_sums[derived * kGroupFrames + lane] = summaries_.frame_totals[frame] - others;
        const std::uint64_t index = plan::region_index(g, frame);
        for (std::size_t m = 0; m < mask_count; ++m) {
          std::uint64_t sum = 0;
          for (std::size_t c = 0; c < classes; ++c) {
            if ((class_members[c] >> m) & 1u) sum += class_sums[c * kGroupFrames + lane];
          }
          sums[m][index] = sum;
        }
      });
    }
  });
  return sums;
}

std::vector<std::optional<std::vector<std::uint32_t>>> CpuResident::compute_masked_sums_u32(
    const plan::PlanGeometry& geometry, const std::vector<std::vector<std::uint8_t>>& binned_detector_masks) {
  // Up to 7 masks make at most 128 classes (a class number fits a byte).
  constexpr std::size_t kMostMasksTogether = 7;
  if (binned_detector_masks.size() < 2 || binned_detector_masks.size() > kMostMasksTogether) {
    return Resident::compute_masked_sums_u32(geometry, binned_detector_masks);
  }
  auto per_frame = with_code_type([&](auto code) {
    return masked_frame_sums_together<decltype(code)>(geometry, binned_detector_masks);
  });
  std::vector<std::optional<std::vector<std::uint32_t>>> sums;
  sums.reserve(per_frame.size());
  for (auto& frames : per_frame) sums.push_back(narrowed_to_u32(plan::bin_scan_sums(geometry, std::move(frames))));
  return sums;
}

// --- frame sums ----------------------------------------------------------------

template <class Code>
void CpuResident::add_frames(const GroupLanes& frames, std::uint64_t* native_sum, bool parallel) {
  if (!parallel || frames.size() < 2) {
    for (const auto& [group, lanes] : frames) group_add_frames(group_codes<Code>(group), lanes, frame_pixels_, native_sum);
    return;
  }
  std::mutex merge_mutex;
  pool_->parallel_for(frames.size(), 8, [&](std::size_t begin, std::size_t end, unsigned) {
    std::vector<std::uint64_t> partial(frame_pixels_, 0);
    for (std::size_t i = begin; i < end; ++i) {
      group_add_frames(group_codes<Code>(frames[i].first), frames[i].second, frame_pixels_, partial.data());
    }
    std::lock_guard<std::mutex> lock(merge_mutex);
    for (std::uint64_t p = 0; p < frame_pixels_; ++p) native_sum[p] += partial[p];
  });
}

std::vector<std::uint64_t> CpuResident::compute_pattern_sum(const plan::PlanGeometry& geometry) {
  // Every frame belongs to exactly one plan position, so an uncropped plan's
  // pattern sum is the build-time sum whatever the scan bin.
  std::vector<std::uint64_t> native;
  if (geometry.cropped) {
    native.assign(frame_pixels_, 0);
    with_code_type([&](auto code) { add_frames<decltype(code)>(region_frames(geometry), native.data(), true); });
  } else {
    native = summaries_.pattern_sum;
  }
  std::vector<std::uint64_t> out(geometry.detector_pixels());
  plan::bin_detector_sums(native.data(), source_.detector_rows, source_.detector_cols, geometry.detector_bin, out.data());
  return out;
}

std::vector<std::uint64_t> CpuResident::compute_frame(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                                      std::uint64_t scan_col) {
  std::vector<std::uint64_t> native(frame_pixels_, 0);
  const GroupLanes frames = position_frames(geometry, scan_row * geometry.scan_cols + scan_col);
  // A large scan bin sums many groups: spread them over the pool.
  with_code_type([&](auto code) { add_frames<decltype(code)>(frames, native.data(), frames.size() > 4); });
  std::vector<std::uint64_t> out(geometry.detector_pixels());
  plan::bin_detector_sums(native.data(), source_.detector_rows, source_.detector_cols, geometry.detector_bin, out.data());
  return out;
}

template <class Out>
void CpuResident::copy_unbinned_frames(const plan::PlanGeometry& geometry, std::uint64_t first_position,
                                       std::uint64_t count, Out* out) const {
  const auto global_frame = [&](std::uint64_t position) {
    return (geometry.region.row_start + position / geometry.scan_cols) * geometry.source_scan_cols +
           geometry.region.col_start + position % geometry.scan_cols;
  };
  with_code_type([&](auto code) {
    using Code = decltype(code);
    for (std::uint64_t i = 0; i < count;) {
      const std::uint64_t frame = global_frame(first_position + i);
      const std::uint64_t lane = frame % kGroupFrames;
      std::uint64_t run = 1;
      while (i + run < count && lane + run < kGroupFrames && global_frame(first_position + i + run) == frame + run) {
        ++run;
      }
      // Tiles of pixels: a tile's lines stay in L1 while each frame's part
      // is written in one sequential burst (writing every frame of the run
      // per pixel would put the run's streams, a multiple of 4 KiB apart, in
      // one cache set).
      constexpr std::uint64_t kTilePixels = 256;
      const Code* lines = group_codes<Code>(frame / kGroupFrames) + lane;
      Out* target = out + i * frame_pixels_;
      for (std::uint64_t tile = 0; tile < frame_pixels_; tile += kTilePixels) {
        const std::uint64_t end = std::min(tile + kTilePixels, frame_pixels_);
        for (std::uint64_t k = 0; k < run; ++k) {
          const Code* line = lines + tile * kGroupFrames + k;
          Out* values = target + k * frame_pixels_;
          for (std::uint64_t p = tile; p < end; ++p, line += kGroupFrames) values[p] = static_cast<Out>(*line);
        }
      }
      i += run;
    }
  });
}

bool CpuResident::compute_frames_u32(const plan::PlanGeometry& geometry, std::uint64_t first_position,
                                     std::uint64_t count, std::vector<std::uint32_t>& out) {
  if (geometry.scan_bin != 1 || geometry.detector_bin != 1) {
    return Resident::compute_frames_u32(geometry, first_position, count, out);
  }
  out.resize(count * frame_pixels_);
  copy_unbinned_frames(geometry, first_position, count, out.data());
  return true;
}

bool CpuResident::compute_export_chunks(const plan::PlanGeometry& geometry, std::uint64_t first_position,
                                        std::uint64_t count, std::size_t element_size, EncodedChunks& out) {
  if (geometry.scan_bin != 1 || geometry.detector_bin != 1 || !source_.dtype ||
      element_size != dtype_size(*source_.dtype)) {
    return false;
  }
  // A run of frames at a time (at most a group's), then each encoded.
  thread_local std::vector<std::uint8_t> frames;
  frames.resize(kGroupFrames * frame_pixels_ * element_size);
  out.bytes.clear();
  out.offsets.assign(1, 0);
  for (std::uint64_t first = 0; first < count; first += kGroupFrames) {
    const std::uint64_t run = std::min(kGroupFrames, count - first);
    switch (element_size) {
      case 1: copy_unbinned_frames(geometry, first_position + first, run, frames.data()); break;
      case 2:
        copy_unbinned_frames(geometry, first_position + first, run, reinterpret_cast<std::uint16_t*>(frames.data()));
        break;
      default:
        copy_unbinned_frames(geometry, first_position + first, run, reinterpret_cast<std::uint32_t*>(frames.data()));
        break;
    }
    for (std::uint64_t k = 0; k < run; ++k) {
      codec::append_bitshuffle_lz4(frames.data() + k * frame_pixels_ * element_size, frame_pixels_, element_size,
                                   out.bytes);
      out.offsets.push_back(out.bytes.size());
    }
  }
  return true;
}

// --- centre of mass ----------------------------------------------------------

template <class Projection>
void CpuResident::center_of_mass_frames(const plan::PlanGeometry& g, std::vector<std::uint64_t>& total,
                                        std::vector<std::uint64_t>& row_moment,
                                        std::vector<std::uint64_t>& col_moment) {
  // From the frames' row and column projections: Σ I = Σ_r row(r),
  // Σ (r / bin)·I = Σ_r (r / bin)·row(r), Σ (c / bin)·I = Σ_c (c / bin)·col(c).
  const std::uint64_t rows = source_.detector_rows;
  const std::uint64_t cols = source_.detector_cols;
  const std::uint64_t bin = g.detector_bin;
  const std::uint64_t region_cols = g.region.col_stop - g.region.col_start;
  const std::uint64_t region_frame_count = plan::region_frame_count(g);
  total.assign(region_frame_count, 0);
  row_moment.assign(region_frame_count, 0);
  col_moment.assign(region_frame_count, 0);
  const auto* row_projections = reinterpret_cast<const Projection*>(summaries_.row_projections.data());
  const auto* col_projections = reinterpret_cast<const Projection*>(summaries_.col_projections.data());
  std::vector<std::uint64_t> row_weight(rows);
  std::vector<std::uint64_t> col_weight(cols);
  for (std::uint64_t r = 0; r < rows; ++r) row_weight[r] = r / bin;
  for (std::uint64_t c = 0; c < cols; ++c) col_weight[c] = c / bin;
  pool_->parallel_for(region_frame_count, 256, [&](std::size_t begin, std::size_t end, unsigned) {
    for (std::size_t k = begin; k < end; ++k) {
      const std::uint64_t frame =
          (g.region.row_start + k / region_cols) * source_.scan_cols + g.region.col_start + k % region_cols;
      const Projection* row = row_projections + frame * rows;
      const Projection* col = col_projections + frame * cols;
      std::uint64_t frame_total = 0;
      std::uint64_t frame_row_moment = 0;
      std::uint64_t frame_col_moment = 0;
      for (std::uint64_t r = 0; r < rows; ++r) {
        frame_total += row[r];
        frame_row_moment += row_weight[r] * row[r];
      }
      for (std::uint64_t c = 0; c < cols; ++c) frame_col_moment += col_weight[c] * col[c];
      total[k] = frame_total;
      row_moment[k] = frame_row_moment;
      col_moment[k] = frame_col_moment;
    }
  });
}

CenterOfMassSums CpuResident::compute_center_of_mass_sums(const plan::PlanGeometry& geometry) {
  CenterOfMassSums sums;
  if (summaries_.wide_projections) {
    center_of_mass_frames<std::uint64_t>(geometry, sums.total, sums.row_moment, sums.col_moment);
  } else {
    center_of_mass_frames<std::uint32_t>(geometry, sums.total, sums.row_moment, sums.col_moment);
  }
  sums.total = plan::bin_scan_sums(geometry, std::move(sums.total));
  sums.row_moment = plan::bin_scan_sums(geometry, std::move(sums.row_moment));
  sums.col_moment = plan::bin_scan_sums(geometry, std::move(sums.col_moment));
  return sums;
}

// --- scan regions --------------------------------------------------------------

template <class Code>
std::vector<std::uint64_t> CpuResident::region_max(const plan::PlanGeometry& g,
                                                   const std::vector<std::uint64_t>& positions) {
  const std::uint64_t binned_pixels = g.detector_pixels();
  std::vector<std::uint64_t> result(binned_pixels, 0);
  std::mutex merge_mutex;
  pool_->parallel_for(positions.size(), 8, [&](std::size_t begin, std::size_t end, unsigned) {
    std::vector<std::uint64_t> best(binned_pixels, 0);
    std::vector<std::uint64_t> native(frame_pixels_);
    std::vector<std::uint64_t> binned(binned_pixels);
    for (std::size_t k = begin; k < end; ++k) {
      std::fill(native.begin(), native.end(), 0);
      add_frames<Code>(position_frames(g, positions[k]), native.data(), false);
      plan::bin_detector_sums(native.data(), source_.detector_rows, source_.detector_cols, g.detector_bin, binned.data());
      for (std::uint64_t p = 0; p < binned_pixels; ++p) best[p] = std::max(best[p], binned[p]);
    }
    std::lock_guard<std::mutex> lock(merge_mutex);
    for (std::uint64_t p = 0; p < binned_pixels; ++p) result[p] = std::max(result[p], best[p]);
  });
  return result;
}

std::vector<std::uint64_t> CpuResident::compute_region_reduce(const plan::PlanGeometry& geometry,
                                                              const std::vector<std::uint64_t>& sorted,
                                                              RegionReduce reduce) {
  if (reduce == RegionReduce::max) {
    return with_code_type([&](auto code) { return region_max<decltype(code)>(geometry, sorted); });
  }
  // Distinct positions have disjoint frame blocks: sum the union of their frames.
  GroupLanes frames;
  for (const std::uint64_t position : sorted) {
    for (const auto& [group, lanes] : position_frames(geometry, position)) {
      if (!frames.empty() && frames.back().first == group) {
        frames.back().second |= lanes;
      } else {
        frames.emplace_back(group, lanes);
      }
    }
  }
  std::sort(frames.begin(), frames.end());
  GroupLanes merged;
  for (const auto& [group, lanes] : frames) {
    if (!merged.empty() && merged.back().first == group) {
      merged.back().second |= lanes;
    } else {
      merged.emplace_back(group, lanes);
    }
  }
  std::vector<std::uint64_t> native(frame_pixels_, 0);
  with_code_type([&](auto code) { add_frames<decltype(code)>(merged, native.data(), true); });
  std::vector<std::uint64_t> out(geometry.detector_pixels());
  plan::bin_detector_sums(native.data(), source_.detector_rows, source_.detector_cols, geometry.detector_bin, out.data());
  return out;
}

// ---------------------------------------------------------------------------
// ResidentBuilder

DType ResidentBuilder::initial_code_dtype(DType source_dtype) {
  return source_dtype == DType::uint32 ? DType::uint16 : source_dtype;
}

std::uint64_t ResidentBuilder::group_count(const catalog::Acquisition& source) {
  return (source.frame_count() + kGroupFrames - 1) / kGroupFrames;
}

std::uint64_t ResidentBuilder::code_bytes(const catalog::Acquisition& source, DType code_dtype) {
  return group_count(source) * kGroupFrames * source.frame_pixels() * dtype_size(code_dtype);
}

std::uint64_t ResidentBuilder::working_bytes(const catalog::Acquisition& source, DType code_dtype,
                                             unsigned participants) {
  const std::uint64_t pixels = source.frame_pixels();
  const std::uint64_t source_element = dtype_size(source.dtype.value_or(code_dtype));
  const std::uint64_t per_participant = kGroupFrames * pixels * source_element +
                                        (dtype_size(code_dtype) < 4 ? pixels * 4 : 0) + pixels * 8;
  return participants * per_participant + source.frame_pixels() * 4 /* masked pixel list, at most */;
}

ResidentBuilder::ResidentBuilder(const catalog::Acquisition& source, DType code_dtype,
                                 std::shared_ptr<ThreadPool> pool, int device_index)
    : source_(source),
      source_dtype_(source.dtype.value_or(code_dtype)),
      code_dtype_(code_dtype),
      frame_pixels_(source.frame_pixels()),
      participants_(pool->size()),
      pool_(pool),
      resident_(std::make_shared<CpuResident>(source, code_dtype, HostBuffer(code_bytes(source, code_dtype)),
                                              FrameSummaries{}, std::move(pool), device_index)),
      codes_(resident_->codes_),
      summaries_(resident_->summaries_) {
  const std::uint64_t projection = dtype_size(code_dtype_) < 4 ? 4 : 8;
  summaries_.pattern_sum.assign(frame_pixels_, 0);  // its size counts in resident_bytes() from the start
  summaries_.frame_totals.assign(source_.frame_count(), 0);
  summaries_.wide_projections = projection == 8;
  summaries_.row_projections = HostBuffer(source_.frame_count() * source_.detector_rows * projection);
  summaries_.col_projections = HostBuffer(source_.frame_count() * source_.detector_cols * projection);
  for (std::uint64_t p = 0; p < source_.pixel_mask.size() && p < frame_pixels_; ++p) {
    if (source_.pixel_mask[p] != 0) masked_pixels_.push_back(static_cast<std::uint32_t>(p));
  }
  for (Participant& participant : participants_) {
    participant.frames.resize(kGroupFrames * frame_pixels_ * dtype_size(source_dtype_));
    if (dtype_size(code_dtype_) < 4) participant.pattern_narrow.assign(frame_pixels_, 0);
    participant.pattern_wide.assign(frame_pixels_, 0);
  }
}

std::uint8_t* ResidentBuilder::decode_target(std::uint64_t frame, unsigned participant) {
  return participants_[participant].frames.data() +
         (frame % kGroupFrames) * frame_pixels_ * dtype_size(source_dtype_);
}

void ResidentBuilder::flush(Participant& participant) {
  if (participant.frames_in_narrow == 0) return;
  for (std::uint64_t p = 0; p < frame_pixels_; ++p) {
    participant.pattern_wide[p] += participant.pattern_narrow[p];
    participant.pattern_narrow[p] = 0;
  }
  participant.frames_in_narrow = 0;
}

// One pass over a frame: its row and column projections, its per-pixel
// contribution to the pattern sum, and its total (returned). Projection sums
// are exact: a detector axis has at most 65536 pixels (checked at build).
template <class Source, class Projection, class PatternSum>
std::uint64_t ResidentBuilder::summarize_frame(const Source* values, std::uint64_t frame, PatternSum* pattern) {
  const std::uint64_t rows = source_.detector_rows;
  const std::uint64_t cols = source_.detector_cols;
  auto* row_projection = reinterpret_cast<Projection*>(summaries_.row_projections.data()) + frame * rows;
  auto* col_projection = reinterpret_cast<Projection*>(summaries_.col_projections.data()) + frame * cols;
  std::uint64_t total = 0;
  for (std::uint64_t r = 0; r < rows; ++r) {
    const Source* row = values + r * cols;
    PatternSum* pattern_row = pattern + r * cols;
    Projection row_sum = 0;
    for (std::uint64_t c = 0; c < cols; ++c) {
      const Projection value = static_cast<Projection>(row[c]);
      row_sum += value;
      col_projection[c] += value;
      pattern_row[c] += static_cast<PatternSum>(value);
    }
    row_projection[r] = row_sum;
    total += row_sum;
  }
  return total;
}

template <class Source, class Code>
void ResidentBuilder::finish_frame_typed(std::uint64_t frame, Participant& participant) {
  Source* values =
      reinterpret_cast<Source*>(participant.frames.data()) + (frame % kGroupFrames) * frame_pixels_;
  for (const std::uint32_t p : masked_pixels_) values[p] = 0;
  if constexpr (sizeof(Code) < sizeof(Source)) {
    Source any_bits = 0;
    for (std::uint64_t p = 0; p < frame_pixels_; ++p) any_bits |= values[p];
    if (any_bits > static_cast<Source>(static_cast<Code>(~Code{0}))) throw NeedsWideCodes{};
  }
  // With 8/16-bit codes every value is < 2^16 here.
  if constexpr (sizeof(Code) < 4) {
    summaries_.frame_totals[frame] =
        summarize_frame<Source, std::uint32_t>(values, frame, participant.pattern_narrow.data());
    // 65536 frames of values < 2^16 cannot overflow a 32-bit per-pixel sum.
    if (++participant.frames_in_narrow == kMaxRunLength) flush(participant);
  } else {
    summaries_.frame_totals[frame] =
        summarize_frame<Source, std::uint64_t>(values, frame, participant.pattern_wide.data());
  }
}

template <class Source, class Code>
void ResidentBuilder::store_group_typed(std::uint64_t group, Participant& participant) {
  const std::uint64_t first = group * kGroupFrames;
  const std::uint64_t count = std::min(kGroupFrames, source_.frame_count() - first);
  const auto* frames = reinterpret_cast<const Source*>(participant.frames.data());
  const std::uint64_t group_bytes = frame_pixels_ * kGroupFrames * sizeof(Code);
  codes_.populate(group * group_bytes, group_bytes);  // first touch of the group's pages in one call
  Code* out = reinterpret_cast<Code*>(codes_.data()) + group * frame_pixels_ * kGroupFrames;
  if constexpr (sizeof(Code) == 2) {
    if constexpr (sizeof(Source) == 4) {  // narrow in place (every value fits): the scratch becomes 16-bit frames
      auto* narrow = reinterpret_cast<std::uint16_t*>(participant.frames.data());
      for (std::uint64_t i = 0; i < count * frame_pixels_; ++i) narrow[i] = static_cast<std::uint16_t>(frames[i]);
    }
    transpose_u16(reinterpret_cast<const std::uint16_t*>(participant.frames.data()), count, frame_pixels_,
                  reinterpret_cast<std::uint16_t*>(out));
    return;
  }
  // Other code widths: a tile of pixels at a time, so the tile's output lines
  // stay in cache while every lane is written.
  constexpr std::uint64_t kTilePixels = 64;
  for (std::uint64_t tile = 0; tile < frame_pixels_; tile += kTilePixels) {
    const std::uint64_t tile_end = std::min(frame_pixels_, tile + kTilePixels);
    for (std::uint64_t lane = 0; lane < count; ++lane) {
      const Source* values = frames + lane * frame_pixels_;
      for (std::uint64_t p = tile; p < tile_end; ++p) out[p * kGroupFrames + lane] = static_cast<Code>(values[p]);
    }
  }
}

template <class Visit>
void ResidentBuilder::with_types(Visit&& visit) {
  switch (source_dtype_) {
    case DType::uint8:
      visit(std::uint8_t{}, std::uint8_t{});
      return;
    case DType::uint16:
      visit(std::uint16_t{}, std::uint16_t{});
      return;
    case DType::uint32:
      if (code_dtype_ == DType::uint16) {
        visit(std::uint32_t{}, std::uint16_t{});
      } else {
        visit(std::uint32_t{}, std::uint32_t{});
      }
      return;
  }
}

void ResidentBuilder::finish_frame(std::uint64_t frame, unsigned participant) {
  with_types([&](auto source, auto code) {
    finish_frame_typed<decltype(source), decltype(code)>(frame, participants_[participant]);
  });
}

void ResidentBuilder::finish_group(std::uint64_t group, unsigned participant) {
  with_types([&](auto source, auto code) {
    store_group_typed<decltype(source), decltype(code)>(group, participants_[participant]);
  });
}

std::shared_ptr<CpuResident> ResidentBuilder::finish() {
  // In place: only a plan over every row reads it, and none is answered before the resident holds them all.
  std::vector<std::uint64_t>& pattern = summaries_.pattern_sum;
  for (Participant& participant : participants_) {
    flush(participant);
    for (std::uint64_t p = 0; p < frame_pixels_; ++p) pattern[p] += participant.pattern_wide[p];
  }
  participants_.clear();
  participants_.shrink_to_fit();
  return resident_;
}

}  // namespace quantem::backend::cpu

// ---------------------------------------------------------------------------
// Dense-array factory

namespace quantem::backend {

std::uint64_t cpu_code_bytes_in_use() noexcept { return cpu::HostBuffer::bytes_in_use(); }

std::shared_ptr<Resident> make_cpu_resident(const catalog::Acquisition& acquisition, const void* counts,
                                            std::size_t count_bytes, const CpuResidentOptions& options) {
  check_dense_counts(acquisition, count_bytes, cpu::kMaxDetectorAxis);
  const DType source_dtype = *acquisition.dtype;
  const std::size_t frame_bytes = acquisition.frame_pixels() * dtype_size(source_dtype);
  auto pool = std::make_shared<ThreadPool>(options.threads);
  const auto* bytes = static_cast<const std::uint8_t*>(counts);
  const std::uint64_t frames = acquisition.frame_count();
  DType code_dtype = cpu::ResidentBuilder::initial_code_dtype(source_dtype);
  for (;;) {
    try {
      cpu::ResidentBuilder builder(acquisition, code_dtype, pool, options.device_index);
      pool->parallel_for(cpu::ResidentBuilder::group_count(acquisition), 1,
                         [&](std::size_t begin, std::size_t end, unsigned who) {
                           for (std::size_t group = begin; group < end; ++group) {
                             const std::uint64_t first = group * cpu::kGroupFrames;
                             const std::uint64_t last = std::min(frames, first + cpu::kGroupFrames);
                             for (std::uint64_t frame = first; frame < last; ++frame) {
                               std::memcpy(builder.decode_target(frame, who), bytes + frame * frame_bytes, frame_bytes);
                               builder.finish_frame(frame, who);
                             }
                             builder.finish_group(group, who);
                           }
                         });
      return builder.finish();
    } catch (const cpu::NeedsWideCodes&) {
      code_dtype = DType::uint32;  // a masked count above 65535: hold 32-bit codes
    } catch (const std::bad_alloc&) {
      throw payload_too_large("not enough host memory to hold the " + std::to_string(count_bytes) +
                              "-byte acquisition " + acquisition.name);
    }
  }
}

}  // namespace quantem::backend
