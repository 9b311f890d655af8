// Frame -> (shard, file offset, stored bytes, filter mask), read from each
// shard's chunk index without per-chunk HDF5 calls (see chunk_index.hpp).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "chunk_index.hpp"
#include "dataset_storage.hpp"
#include "hdf5_handles.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/error.hpp"

namespace quantem::catalog {

namespace {

constexpr std::uint64_t kUnset = std::numeric_limits<std::uint64_t>::max();

// Chunks of one shard, gathered by frame (local frame order).
class ShardFrames {
 public:
  ShardFrames(std::string where, const std::vector<std::uint64_t>& dims, std::uint64_t file_size)
      : where_(std::move(where)), dims_(dims), file_size_(file_size) {
    frame_count_ = 1;
    for (std::size_t d = 0; d + 2 < dims_.size(); ++d) frame_count_ *= dims_[d];
    // Every frame needs at least one stored byte: a larger count is a corrupt header.
    if (frame_count_ > file_size_) throw Error(ErrorKind::corrupt_data, where_ + ": more frames than bytes in the file");
    locations_.assign(frame_count_, FrameLocation{0, 0, kUnset, 0});
  }

  std::uint64_t frame_count() const { return frame_count_; }

  void add(const std::uint64_t* element_offsets, std::uint64_t file_offset, std::uint64_t stored_bytes,
           std::uint32_t filter_mask) {
    const std::size_t rank = dims_.size();
    std::uint64_t frame = 0;
    for (std::size_t d = 0; d + 2 < rank; ++d) {
      if (element_offsets[d] >= dims_[d]) return;  // beyond the current extent (dataset shrunk): not a frame
      frame = frame * dims_[d] + element_offsets[d];
    }
    if (element_offsets[rank - 2] != 0 || element_offsets[rank - 1] != 0) {
      throw Error(ErrorKind::corrupt_data, where_ + ": chunk offsets are not frame-aligned");
    }
    if (stored_bytes == 0 || file_offset > file_size_ || stored_bytes > file_size_ - file_offset) {
      throw Error(ErrorKind::corrupt_data, where_ + ": the chunk of frame " + std::to_string(frame) + " (" +
                                               std::to_string(stored_bytes) + " bytes at " +
                                               std::to_string(file_offset) + ") lies outside the file");
    }
    FrameLocation& location = locations_[frame];
    if (location.file_offset != kUnset) {
      throw Error(ErrorKind::corrupt_data, where_ + ": frame " + std::to_string(frame) + " has two chunks");
    }
    location.file_offset = file_offset;
    location.stored_bytes = stored_bytes;
    location.filter_mask = filter_mask;
  }

  // Appends to the global index; throws when a frame has no chunk.
  void append_to(FrameIndex& index, std::uint32_t shard) const {
    for (std::uint64_t frame = 0; frame < frame_count_; ++frame) {
      FrameLocation location = locations_[frame];
      if (location.file_offset == kUnset) {
        throw Error(ErrorKind::corrupt_data, where_ + ": frame " + std::to_string(frame) + " has no stored chunk");
      }
      location.shard = shard;
      index.frames.push_back(location);
      index.stored_bytes_total += location.stored_bytes;
    }
  }

 private:
  std::string where_;
  std::vector<std::uint64_t> dims_;
  std::uint64_t file_size_;
  std::uint64_t frame_count_ = 0;
  std::vector<FrameLocation> locations_;
};

// O(N^2) on HDF5 1.10.8, but correct for every index kind HDF5 supports.
void visit_chunks_with_hdf5(const hdf5::Dataset& dataset, const detail::FileAddressing& addressing,
                            std::size_t rank, const detail::ChunkVisitor& visit) {
  const hdf5::Dataspace space = dataset.space();
  hsize_t chunk_count = 0;
  if (H5Dget_num_chunks(dataset.id(), space.id(), &chunk_count) < 0) hdf5::throw_error("H5Dget_num_chunks");
  std::vector<hsize_t> offsets(rank);
  std::vector<std::uint64_t> element_offsets(rank);
  for (hsize_t i = 0; i < chunk_count; ++i) {
    unsigned filter_mask = 0;
    haddr_t address = HADDR_UNDEF;
    hsize_t stored_bytes = 0;
    if (H5Dget_chunk_info(dataset.id(), space.id(), i, offsets.data(), &filter_mask, &address, &stored_bytes) < 0) {
      hdf5::throw_error("H5Dget_chunk_info");
    }
    if (address == HADDR_UNDEF) continue;
    std::copy(offsets.begin(), offsets.end(), element_offsets.begin());
    // H5Dget_chunk_info reports addresses relative to the base address (1.10.8).
    visit(element_offsets.data(), addressing.base_address + address, stored_bytes, filter_mask);
  }
}

void index_shard(const Shard& shard, const Acquisition& acquisition, std::uint32_t shard_number, FrameIndex& index) {
  const std::string where = shard.file_path + ":" + shard.dataset_path;
  const hdf5::File file = hdf5::File::open_read_only(shard.file_path);
  const hdf5::Dataset dataset = hdf5::open_dataset(file.id(), shard.dataset_path);
  const hdf5::Dataspace space = dataset.space();
  const int rank = H5Sget_simple_extent_ndims(space.id());
  if (rank < 3) throw Error(ErrorKind::conflict, where + " changed since inspection (rank)");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), max_dims(static_cast<std::size_t>(rank));
  if (H5Sget_simple_extent_dims(space.id(), dims.data(), max_dims.data()) < 0) {
    hdf5::throw_error("H5Sget_simple_extent_dims");
  }
  const std::vector<std::uint64_t> dims64(dims.begin(), dims.end()), max_dims64(max_dims.begin(), max_dims.end());
  if (dims64[dims64.size() - 2] != acquisition.detector_rows || dims64.back() != acquisition.detector_cols) {
    throw Error(ErrorKind::conflict, where + " changed since inspection (detector shape)");
  }

  detail::FileAddressing addressing;
  addressing.offset_size = file.offset_size();
  addressing.length_size = file.length_size();
  addressing.base_address = file.user_block_size();
  detail::RawFile raw(shard.file_path, addressing);

  ShardFrames frames(where, dims64, raw.size());
  if (frames.frame_count() != shard.frame_count) {
    throw Error(ErrorKind::conflict, where + " changed since inspection (" + std::to_string(frames.frame_count()) +
                                         " frames, inspected " + std::to_string(shard.frame_count) + ")");
  }
  const std::uint64_t frame_bytes =
      acquisition.detector_rows * acquisition.detector_cols * dtype_size(acquisition.dtype.value());

  const auto storage = detail::describe_storage(dataset, dtype_size(acquisition.dtype.value()));
  if (storage.layout == H5D_CONTIGUOUS) {
    const auto offset = dataset.contiguous_offset();
    if (!offset) throw Error(ErrorKind::conflict, where + " has no data written");
    if (frame_bytes == 0 || *offset > raw.size() || frames.frame_count() > (raw.size() - *offset) / frame_bytes) {
      throw Error(ErrorKind::corrupt_data, where + ": the contiguous data extends beyond the end of the file");
    }
    std::vector<std::uint64_t> element_offsets(dims64.size(), 0);
    for (std::uint64_t frame = 0; frame < frames.frame_count(); ++frame) {
      // Row-major leading offsets of this frame.
      std::uint64_t rest = frame;
      for (std::size_t d = dims64.size() - 2; d-- > 0;) {
        element_offsets[d] = rest % dims64[d];
        rest /= dims64[d];
      }
      frames.add(element_offsets.data(), *offset + frame * frame_bytes, frame_bytes, 0);
    }
  } else if (storage.layout == H5D_CHUNKED) {
    const detail::DataLayout layout = detail::read_data_layout(raw, dataset.object_header_address());
    if (layout.layout_class != 2 || layout.element_size != dtype_size(acquisition.dtype.value()) ||
        layout.chunk_dims != std::vector<std::uint64_t>(storage.chunk_dims.begin(), storage.chunk_dims.end())) {
      throw Error(ErrorKind::corrupt_data, where + ": the data layout message disagrees with HDF5's chunk shape");
    }
    const detail::ChunkVisitor add = [&](const std::uint64_t* element_offsets, std::uint64_t file_offset,
                                         std::uint64_t stored_bytes, std::uint32_t filter_mask) {
      frames.add(element_offsets, file_offset, stored_bytes, filter_mask);
    };
    if (!detail::visit_chunks(raw, layout, dims64, max_dims64, add)) {
      spdlog::warn("catalog: {}: chunk index kind '{}' is not read directly; using H5Dget_chunk_info (slow for many "
                   "chunks)",
                   where, detail::chunk_index_kind_name(layout.index_kind));
      visit_chunks_with_hdf5(dataset, addressing, dims64.size(), add);
    }
  } else {
    throw Error(ErrorKind::conflict, where + " changed since inspection (storage layout)");
  }
  frames.append_to(index, shard_number);
}

}  // namespace

FrameIndex build_frame_index(const Acquisition& acquisition) {
  if (!acquisition.status.loadable || !acquisition.dtype || !acquisition.detector_shape_known()) {
    throw conflict("acquisition is not loadable: " + acquisition.master_path + " (" + acquisition.status.reason + ")");
  }
  FrameIndex index;
  for (const auto& shard : acquisition.shards) {
    const auto found = std::find(index.shard_paths.begin(), index.shard_paths.end(), shard.file_path);
    const auto shard_number = static_cast<std::uint32_t>(found - index.shard_paths.begin());
    if (found == index.shard_paths.end()) index.shard_paths.push_back(shard.file_path);
    index_shard(shard, acquisition, shard_number, index);
  }
  if (index.frames.size() != acquisition.stored_frames) {
    throw conflict(acquisition.master_path + " changed since inspection (" + std::to_string(index.frames.size()) +
                   " frames indexed, " + std::to_string(acquisition.stored_frames) + " inspected)");
  }
  return index;
}

}  // namespace quantem::catalog
