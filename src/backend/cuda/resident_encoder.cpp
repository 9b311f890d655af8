#include "resident_encoder.hpp"

#include <algorithm>
#include <cstring>
#include <system_error>

#include "quantem/ans/ans_format.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/ans.hpp"
#include "quantem/kernels/resident_products.hpp"

namespace quantem::backend::cuda {
namespace {

std::uint64_t align16(std::uint64_t value) { return (value + 15) / 16 * 16; }

const char* dtype_tag(DType dtype) {
  switch (dtype) {
    case DType::uint8: return "u8";
    case DType::uint16: return "u16";
    case DType::uint32: return "u32";
  }
  return "u32";
}

}  // namespace

void ResidentReservation::take(std::uint64_t bytes) {
  const std::uint64_t needed = taken_ + round_to_granularity(bytes);
  if (needed > held_) {
    if (reservation_ != nullptr) reservation_->grow(needed - held_);
    held_ = needed;
  }
  taken_ = needed;
}

ResidentEncoder::ResidentEncoder(const catalog::Acquisition& source, const CudaLoadPlan& plan, int dense_slots,
                                 cudaStream_t stream, std::shared_ptr<Ledger> ledger, ResidentReservation reservation)
    : source_(source), plan_(plan), stream_(stream), ledger_(std::move(ledger)), reservation_(reservation) {
  std::vector<std::uint32_t> masked;
  for (std::uint64_t p = 0; p < source.pixel_mask.size() && p < plan.frame_pixels; ++p) {
    if (source.pixel_mask[p] != 0) masked.push_back(static_cast<std::uint32_t>(p));
  }
  masked_count_ = static_cast<std::uint32_t>(masked.size());
  if (!masked.empty()) {
    masked_ = TrackedBuffer(masked.size() * 4, ledger_);
    QUANTEM_CUDA_TRY(cudaMemcpyAsync(masked_.data(), masked.data(), masked.size() * 4, cudaMemcpyHostToDevice, stream_));
  }
  for (int slot = 0; slot < dense_slots; ++slot) {
    DenseSlot dense;
    dense.frames = TrackedBuffer(plan.dense_batch_bytes, ledger_);
    dense.statuses = TrackedBuffer(plan.batch_statuses_bytes, ledger_);
    QUANTEM_CUDA_TRY(cudaMemsetAsync(dense.statuses.data(), 0, plan.batch_statuses_bytes, stream_));
    slots_.push_back(std::move(dense));
  }
  misc_ = TrackedBuffer(plan.batch_misc_bytes, ledger_);
  reservation_.take(plan.frame_moments_bytes);
  d_frame_moments_ = TrackedBuffer(plan.frame_moments_bytes, ledger_);
  reservation_.take(plan.seek_table_bytes);
  d_seek_points_ = TrackedBuffer(plan.seek_table_bytes, ledger_);
  reservation_.take(plan.decode_table_bytes);
  d_decode_tables_ = TrackedBuffer(plan.decode_table_bytes, ledger_);

  d_pattern_ = TrackedBuffer(plan.frame_pixels * 8, ledger_);  // within the plan's ring_setup_bytes
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_pattern_.data(), 0, plan.frame_pixels * 8, stream_));
  scratch_ = TrackedBuffer(plan.encode_scratch_bytes, ledger_);
  host_offsets_ = kernels::PinnedBuffer(std::size_t{plan.groups_per_batch} * 8);
  host_sizes_ = kernels::PinnedBuffer(std::size_t{plan.groups_per_batch} * 8);
  QUANTEM_CUDA_TRY(cudaMemsetAsync(misc_.data(), 0, plan.batch_misc_bytes, stream_));  // the max value starts at 0
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream_));  // the host mask list goes out of scope
  prepare_host_staging();
}

ResidentEncoder::~ResidentEncoder() { join_host_staging(); }

void ResidentEncoder::prepare_host_staging() {
  int device = 0;
  QUANTEM_CUDA_TRY(cudaGetDevice(&device));
  const std::size_t bytes = CudaResident::first_product_staging_bytes(source_);
  try {
    staging_thread_ = std::thread([this, device, bytes] {
      try {
        QUANTEM_CUDA_TRY(cudaSetDevice(device));
        host_staging_ = kernels::PinnedBuffer(bytes);
      } catch (...) {
        // Left empty: the first product grows the staging itself, as before.
      }
    });
  } catch (const std::system_error&) {
    // No thread: the first product grows the staging itself.
  }
}

void ResidentEncoder::join_host_staging() noexcept {
  if (staging_thread_.joinable()) staging_thread_.join();
}

void ResidentEncoder::encode_batch(int slot, std::uint64_t first_frame, std::uint64_t frame_count) {
  if (first_frame != encoded_frames_ || frame_count == 0 || frame_count > plan_.batch_frames) {
    throw internal_error("CUDA resident encoder: batch of frames [" + std::to_string(first_frame) + ", " +
                         std::to_string(first_frame + frame_count) + ") out of order");
  }
  void* d_frames = slots_.at(static_cast<std::size_t>(slot)).frames.data();
  const bool track_max = plan_.source_dtype == DType::uint32;
  kernels::prepare_frames(d_frames, plan_.source_dtype, frame_count, static_cast<std::uint32_t>(plan_.frame_pixels),
                       masked_.as<std::uint32_t>(), masked_count_, track_max ? misc_.as<std::uint32_t>() : nullptr,
                       stream_);
  const std::uint64_t first_group = first_frame / plan_.frames_per_group;
  std::uint32_t* seek_points = batch_seek_points(first_group);
  const kernels::AnsEncodeBatch batch = encode_batch_shape(d_frames, frame_count, seek_points);
  const std::vector<std::uint64_t> sizes = measure_batch(batch, first_frame);
  auto* d_batch_offsets = reinterpret_cast<std::uint64_t*>(misc_.as<std::uint8_t>() + 16);
  const std::uint64_t* offsets = host_offsets_.as<std::uint64_t>();
  TrackedBuffer piece = place_piece(sizes, first_frame + frame_count);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_batch_offsets, offsets, sizes.size() * 8, cudaMemcpyHostToDevice, stream_));
  kernels::ans_encode_write(batch, scratch_.data(), scratch_.size(), piece.as<std::uint8_t>(), d_batch_offsets, stream_);
  // The batch's groups as the decoders see them, for what is derived from
  // them on this worker's stream (overlapped with the loader's next batch).
  kernels::AnsResidentView written;
  written.d_blobs = piece.as<std::uint8_t>();
  written.d_group_offsets = d_batch_offsets;
  written.group_count = sizes.size();
  written.frames_per_group = plan_.frames_per_group;
  written.total_frames = frame_count;
  written.detector_rows = batch.detector_rows;
  written.detector_cols = batch.detector_cols;
  enqueue_derived_tables(written, first_group, seek_points);
  for (std::size_t g = 0; g < sizes.size(); ++g) group_addresses_.push_back(piece.as<std::uint8_t>() + offsets[g]);
  encoded_bytes_ += piece.size();
  encoded_frames_ += frame_count;
  pieces_.push_back(std::move(piece));
}

std::uint32_t* ResidentEncoder::batch_seek_points(std::uint64_t first_group) const {
  if (plan_.frames_per_seek_point == 0) return nullptr;
  const quantem::ans::AnsGroupLayout layout = quantem::ans::ans_group_layout(
      static_cast<std::uint32_t>(source_.detector_rows), static_cast<std::uint32_t>(source_.detector_cols));
  return d_seek_points_.as<std::uint32_t>() + kernels::ans_seek_table_words(first_group, plan_.frames_per_group,
                                                                         plan_.frames_per_seek_point,
                                                                         layout.stream_count);
}

kernels::AnsEncodeBatch ResidentEncoder::encode_batch_shape(void* d_frames, std::uint64_t frame_count,
                                                         std::uint32_t* seek_points) const {
  kernels::AnsEncodeBatch batch;
  batch.d_frames = d_frames;
  batch.dtype = plan_.source_dtype;
  batch.total_frames = frame_count;
  batch.frames_per_group = plan_.frames_per_group;
  batch.kept_words_per_frame = plan_.kept_words_per_frame;
  batch.detector_rows = static_cast<std::uint32_t>(source_.detector_rows);
  batch.detector_cols = static_cast<std::uint32_t>(source_.detector_cols);
  batch.d_pattern_sum = d_pattern_.as<std::uint64_t>();  // from the model's own pixel sums
  if (plan_.seek_points_from_encoder) {
    batch.d_seek_points = seek_points;
    batch.frames_per_seek_point = plan_.frames_per_seek_point;
  }
  return batch;
}

std::vector<std::uint64_t> ResidentEncoder::measure_batch(const kernels::AnsEncodeBatch& batch, std::uint64_t first_frame) {
  // The measuring pass, then (from the second batch on, the partition being
  // set up) the ring pass, which needs nothing measured: the stream runs it
  // while this thread waits for the sizes and sizes the batch's piece.
  const std::size_t group_count = kernels::ans_group_count(batch.total_frames, plan_.frames_per_group);
  kernels::ans_encode_measure_async(batch, scratch_.data(), scratch_.size(), host_sizes_.as<std::uint64_t>(), stream_);
  QUANTEM_CUDA_TRY(cudaEventRecord(measured_.get(), stream_));
  const bool rings_ready = rings_.has_value();
  if (rings_ready) enqueue_ring_pass(batch.d_frames, first_frame, batch.total_frames);
  // Also orders the previous batch's copy from host_offsets_ before the host rewrites it (place_piece).
  QUANTEM_CUDA_TRY(cudaEventSynchronize(measured_.get()));
  std::vector<std::uint64_t> sizes(host_sizes_.as<std::uint64_t>(), host_sizes_.as<std::uint64_t>() + group_count);
  kernels::ans_encode_check_sizes(sizes);
  if (!rings_ready) {
    set_up_rings();  // from the first batch's pattern, which d_pattern_ holds now
    enqueue_ring_pass(batch.d_frames, first_frame, batch.total_frames);
  }
  return sizes;
}

TrackedBuffer ResidentEncoder::place_piece(const std::vector<std::uint64_t>& sizes, std::uint64_t end_frame) {
  auto* offsets = host_offsets_.as<std::uint64_t>();
  std::uint64_t piece_bytes = 0;
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    offsets[g] = piece_bytes;
    piece_bytes += align16(sizes[g]);
  }
  if (encoded_bytes_ + piece_bytes > plan_.resident_bound_bytes) {
    throw payload_too_large("the ANS encoding of " + source_.name + " needs more than its admitted bound of " +
                            std::to_string(plan_.resident_bound_bytes) + " bytes (" +
                            std::to_string(encoded_bytes_ + piece_bytes) + " after frame " +
                            std::to_string(end_frame) +
                            "): the counts are too close to incompressible noise for the CUDA resident");
  }
  reservation_.take(piece_bytes);
  return TrackedBuffer(piece_bytes, ledger_);
}

void ResidentEncoder::enqueue_derived_tables(const kernels::AnsResidentView& written, std::uint64_t first_group,
                                             std::uint32_t* seek_points) {
  kernels::AnsResidentView view = written;
  if (plan_.decode_table_bytes != 0) {
    // Every group's decode tables, once (the decode recorder below, when used, reads them too).
    std::uint32_t* tables = d_decode_tables_.as<std::uint32_t>() + first_group * kernels::ans_decode_table_words();
    kernels::ans_build_decode_tables(view, tables, misc_.as<std::uint32_t>() + 1, stream_);
    view.d_decode_tables = tables;
  }
  if (seek_points != nullptr && !plan_.seek_points_from_encoder) {
    // The batch's streams decoded once more for their seek points.
    kernels::ans_record_seek_points(view, plan_.frames_per_seek_point, seek_points, misc_.as<std::uint32_t>() + 1,
                                 stream_);  // the seek error flag: misc_ bytes 4..7
  }
}

void ResidentEncoder::enqueue_ring_pass(const void* d_frames, std::uint64_t first_frame, std::uint64_t frame_count) {
  // One pass over the frames for their ring sums and their moments.
  kernels::dense_ring_sums(d_frames, plan_.source_dtype, frame_count, static_cast<std::uint32_t>(plan_.frame_pixels),
                        d_pixels_by_ring_.as<std::uint32_t>(), d_ring_of_sorted_.as<std::uint16_t>(),
                        d_ring_of_pixel_.as<std::uint16_t>(), rings_->ring_count(), d_ring_sums_.data(),
                        ring_sum_bytes_, plan_.frames, first_frame, stream_,
                        kernels::FrameMomentsTarget{d_frame_moments_.as<std::uint64_t>(),
                                                 static_cast<std::uint32_t>(source_.detector_cols), plan_.frames});
}

void ResidentEncoder::set_up_rings() {
  const auto rows = static_cast<std::uint32_t>(source_.detector_rows);
  const auto cols = static_cast<std::uint32_t>(source_.detector_cols);
  const std::uint64_t pixels = plan_.frame_pixels;
  std::vector<std::uint64_t> pattern(pixels);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(pattern.data(), d_pattern_.data(), pixels * 8, cudaMemcpyDeviceToHost, stream_));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream_));
  rings_ = make_ring_partition(rows, cols, bright_centroid(pattern, rows, cols));
  ring_sum_bytes_ = ring_sum_bytes_for(*rings_, plan_.source_dtype);
  d_pixels_by_ring_ = TrackedBuffer(pixels * 4, ledger_);
  d_ring_of_sorted_ = TrackedBuffer(pixels * 2, ledger_);
  d_ring_of_pixel_ = TrackedBuffer(pixels * 2, ledger_);
  const std::uint64_t ring_table_bytes = std::uint64_t{rings_->ring_count()} * plan_.frames * ring_sum_bytes_;
  reservation_.take(ring_table_bytes);
  d_ring_sums_ = TrackedBuffer(ring_table_bytes, ledger_);
  // From pageable memory: staged before the calls return, so the host vectors may change afterwards.
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_pixels_by_ring_.data(), rings_->pixels_by_ring.data(), pixels * 4,
                                   cudaMemcpyHostToDevice, stream_));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_ring_of_sorted_.data(), rings_->ring_of_sorted.data(), pixels * 2,
                                   cudaMemcpyHostToDevice, stream_));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(d_ring_of_pixel_.data(), rings_->ring_of_pixel.data(), pixels * 2,
                                   cudaMemcpyHostToDevice, stream_));
}

std::shared_ptr<CudaResident> ResidentEncoder::finish(int device_index, const std::string& note) {
  if (encoded_frames_ != plan_.frames) {
    throw internal_error("CUDA resident encoder: " + std::to_string(encoded_frames_) + " of " +
                         std::to_string(plan_.frames) + " frames encoded");
  }
  std::uint32_t max_value = 0;
  std::uint32_t seek_error = 0;
  std::vector<std::uint64_t> pattern(plan_.frame_pixels);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(&max_value, misc_.data(), 4, cudaMemcpyDeviceToHost, stream_));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(&seek_error, misc_.as<std::uint32_t>() + 1, 4, cudaMemcpyDeviceToHost, stream_));
  QUANTEM_CUDA_TRY(
      cudaMemcpyAsync(pattern.data(), d_pattern_.data(), pattern.size() * 8, cudaMemcpyDeviceToHost, stream_));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream_));
  d_pattern_.release();
  if (seek_error != 0) {
    throw internal_error("the ANS groups just encoded for " + source_.name +
                         " do not decode cleanly (found while recording their seek points)");
  }
  masked_.release();
  slots_.clear();
  misc_.release();
  scratch_.release();
  d_pixels_by_ring_.release();
  d_ring_of_sorted_.release();
  d_ring_of_pixel_.release();

  const std::uint8_t* base = *std::min_element(group_addresses_.begin(), group_addresses_.end());
  std::vector<std::uint64_t> table(group_addresses_.size());
  for (std::size_t g = 0; g < table.size(); ++g) {
    table[g] = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(group_addresses_[g]) -
                                          reinterpret_cast<std::uintptr_t>(base));
  }
  reservation_.take(table.size() * 8);
  TrackedBuffer group_offsets(table.size() * 8, ledger_);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(group_offsets.data(), table.data(), table.size() * 8, cudaMemcpyHostToDevice, stream_));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream_));

  // uint8 and uint16 keep their type; uint32 is held as 16-bit codes when every masked count fits.
  const DType held = plan_.source_dtype == DType::uint32 && max_value <= 0xffffu ? DType::uint16 : plan_.source_dtype;
  std::string encoding = std::string("ans-") + dtype_tag(held);
  if (!note.empty()) encoding += " (" + note + ")";
  CudaRingTable ring_table{std::move(*rings_), ring_sum_bytes_, std::move(d_ring_sums_)};
  CudaRecentFrames recent;
  recent.capacity = plan_.recent_frames;
  if (recent.capacity != 0) {
    const std::uint64_t recent_bytes = recent.capacity * plan_.frame_pixels * dtype_size(held);  // <= the plan's bytes
    reservation_.take(recent_bytes);
    recent.d_frames = TrackedBuffer(recent_bytes, ledger_);
  }
  auto resident = std::make_shared<CudaResident>(
      source_, held, encoding, device_index, plan_.frames_per_group, std::move(pieces_), std::move(group_offsets), base,
      std::move(ring_table), std::move(d_frame_moments_),
      CudaSeekTable{plan_.frames_per_seek_point, std::move(d_seek_points_)}, std::move(d_decode_tables_),
      std::move(recent), std::move(pattern), plan_.accumulate_frames_cta_threads);
  join_host_staging();
  resident->adopt_host_staging(std::move(host_staging_));
  return resident;
}

}  // namespace quantem::backend::cuda
