#include "cpu/cpu_load_plan.hpp"

#include <algorithm>
#include <string>

#include "cpu/cpu_resident.hpp"
#include "quantem/core/error.hpp"

namespace quantem::backend::cpu {

LoadPlan plan_load(const catalog::Acquisition& acquisition, unsigned threads) {
  LoadPlan plan;
  plan.threads = std::max(1u, threads);
  const DType source_dtype = acquisition.dtype.value_or(DType::uint32);
  const std::uint64_t frame_bytes = acquisition.frame_pixels() * dtype_size(source_dtype);
  // Any real encoding of a frame (bitshuffle/LZ4 worst case is ~0.4% above raw
  // plus block headers) is far below this bound.
  plan.max_stored_chunk_bytes = 3 * frame_bytes + 4096;
  // Staging is sized by what the load reads: a batch holds the chunks of one
  // frame group (with the small holes read through between them) up to
  // kReadBatchBytes, or a single larger chunk; only threads that get a group
  // ever hold a buffer.
  const std::uint64_t groups = ResidentBuilder::group_count(acquisition);
  const std::uint64_t frames_per_group = std::min<std::uint64_t>(kGroupFrames, std::max<std::uint64_t>(1, acquisition.frame_count()));
  const std::uint64_t largest_group_read =
      frames_per_group * plan.max_stored_chunk_bytes + (frames_per_group - 1) * kReadGapBytes;
  plan.staging_bytes_per_thread = std::max(plan.max_stored_chunk_bytes, std::min(kReadBatchBytes, largest_group_read));
  plan.reading_threads = static_cast<unsigned>(std::max<std::uint64_t>(1, std::min<std::uint64_t>(plan.threads, groups)));
  plan.frame_index_bytes = acquisition.frame_count() * (sizeof(catalog::FrameLocation) + sizeof(ReadBatch)) +
                           (ResidentBuilder::group_count(acquisition) + 1) * sizeof(std::size_t) +
                           acquisition.shards.size() * 4096;

  const DType first = ResidentBuilder::initial_code_dtype(source_dtype);
  const auto resident = [&](DType code_dtype) {
    return ResidentBuilder::code_bytes(acquisition, code_dtype) + FrameSummaries::bytes(acquisition, code_dtype);
  };
  const auto pass = [&](DType code_dtype) {
    return resident(code_dtype) + ResidentBuilder::working_bytes(acquisition, code_dtype, plan.threads);
  };
  // A uint32 source may need a second, 32-bit pass; the first pass is freed before it starts.
  plan.resident_bytes = resident(first);
  plan.transition_peak_bytes = pass(first) + plan.staging_bytes() + plan.frame_index_bytes;
  plan.wide_pass_growth_bytes = pass(source_dtype) > pass(first) ? pass(source_dtype) - pass(first) : 0;
  plan.max_transition_peak_bytes = plan.transition_peak_bytes + plan.wide_pass_growth_bytes;
  return plan;
}

std::vector<ReadBatch> plan_reads(const catalog::Acquisition& acquisition, const catalog::FrameIndex& index,
                                  const LoadPlan& plan) {
  const std::uint64_t frames = acquisition.frame_count();
  if (index.frames.size() < frames) {
    throw conflict(acquisition.name + " stores " + std::to_string(index.frames.size()) + " frames; its " +
                   std::to_string(acquisition.scan_rows) + " x " + std::to_string(acquisition.scan_cols) +
                   " scan needs " + std::to_string(frames));
  }
  // A coalesced batch always fits one staging buffer (a single chunk does:
  // it is at most max_stored_chunk_bytes).
  const std::uint64_t coalesce_limit = std::min(kReadBatchBytes, plan.staging_bytes_per_thread);
  std::vector<ReadBatch> batches;
  for (std::uint64_t frame = 0; frame < frames; ++frame) {
    const catalog::FrameLocation& location = index.frames[frame];
    if (location.shard >= index.shard_paths.size()) {
      throw CorruptChunk("frame " + std::to_string(frame) + " of " + acquisition.master_path +
                         " points at shard " + std::to_string(location.shard) + " of " +
                         std::to_string(index.shard_paths.size()));
    }
    if (location.stored_bytes == 0 || location.stored_bytes > plan.max_stored_chunk_bytes) {
      throw CorruptChunk("frame " + std::to_string(frame) + " of " + index.shard_paths[location.shard] +
                         " has a stored chunk of " + std::to_string(location.stored_bytes) + " bytes at byte " +
                         std::to_string(location.file_offset) + "; a frame of " +
                         std::to_string(acquisition.frame_pixels()) + " pixels is stored in at most " +
                         std::to_string(plan.max_stored_chunk_bytes));
    }
    if (!batches.empty()) {
      ReadBatch& batch = batches.back();
      const std::uint64_t batch_end = batch.file_offset + batch.bytes;
      const std::uint64_t chunk_end = location.file_offset + location.stored_bytes;
      if (location.shard == batch.shard && frame / kGroupFrames == batch.first_frame / kGroupFrames &&
          location.file_offset >= batch_end &&
          location.file_offset - batch_end <= kReadGapBytes && chunk_end - batch.file_offset <= coalesce_limit) {
        batch.bytes = chunk_end - batch.file_offset;
        batch.frame_count += 1;
        batch.stored_bytes += location.stored_bytes;
        continue;
      }
    }
    batches.push_back({location.shard, location.file_offset, location.stored_bytes, frame, 1, location.stored_bytes});
  }
  return batches;
}

GroupOrder::GroupOrder(const catalog::Acquisition& acquisition, std::optional<ScanRows> first_rows,
                       std::optional<ScanColumns> first_columns)
    : scan_rows_(acquisition.scan_rows), scan_cols_(acquisition.scan_cols) {
  const std::uint64_t groups = ResidentBuilder::group_count(acquisition);
  built_.assign(groups, false);
  order_.reserve(groups);
  std::uint64_t first_row = 0, end_row = 0;
  std::uint64_t first_group = 0, end_group = 0;  // the groups holding a frame of the first rows
  if (first_rows) {
    end_row = std::min(first_rows->end, scan_rows_);
    first_row = std::min(first_rows->first, end_row);
    if (end_row > first_row) {
      first_group = first_row * scan_cols_ / kGroupFrames;
      end_group = (end_row * scan_cols_ + kGroupFrames - 1) / kGroupFrames;
    }
  }
  if (end_group > first_group && first_columns) {
    const std::uint64_t end_col = std::min(first_columns->end, scan_cols_);
    const std::uint64_t first_col = std::min(first_columns->first, end_col);
    if (end_col > first_col && !(first_col == 0 && end_col == scan_cols_)) {
      window_columns_ = ScanColumns{first_col, end_col};
      in_window_.assign(groups, false);
      for (std::uint64_t row = first_row; row < end_row; ++row) {
        const std::uint64_t first_frame = row * scan_cols_ + first_col;
        const std::uint64_t last_frame = row * scan_cols_ + end_col - 1;
        for (std::uint64_t g = first_frame / kGroupFrames; g <= last_frame / kGroupFrames; ++g) {
          if (in_window_[g]) continue;
          in_window_[g] = true;
          order_.push_back(g);
          ++window_groups_left_;
        }
      }
    }
  }
  for (std::uint64_t g = first_group; g < end_group; ++g) {
    if (in_window_.empty() || !in_window_[g]) order_.push_back(g);
  }
  for (std::uint64_t g = 0; g < groups; ++g) {
    if (g < first_group || g >= end_group) order_.push_back(g);
  }
}

bool GroupOrder::row_whole(std::uint64_t row) const {
  const std::uint64_t first = row * scan_cols_ / kGroupFrames;
  const std::uint64_t last = ((row + 1) * scan_cols_ - 1) / kGroupFrames;
  for (std::uint64_t g = first; g <= last; ++g) {
    if (!built_[g]) return false;
  }
  return true;
}

GroupOrder::Built GroupOrder::mark_built(std::uint64_t group, const HeldRows& held) {
  Built built;
  if (!built_[group] && !in_window_.empty() && in_window_[group]) built.window_now_whole = --window_groups_left_ == 0;
  built_[group] = true;
  const std::uint64_t before = whole_rows_;
  while (whole_rows_ < scan_rows_ && row_whole(held.row_at(whole_rows_))) ++whole_rows_;
  built.whole_rows = whole_rows_ > before ? whole_rows_ : 0;
  return built;
}

}  // namespace quantem::backend::cpu
