// The libhdf5 facts of one shard's dataset (shard_storage.hpp): read here
// under the process-wide HDF5 lock, or fetched from the installed source (the
// daemon's inspector worker, decision 0012). Everything else about the frame
// index is pread (frame_index.cpp).
#include "quantem/catalog/shard_storage.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>

#include "chunk_index.hpp"
#include "quantem/hdf5/error.hpp"
#include "quantem/hdf5/library_lock.hpp"
#include "quantem/hdf5/read.hpp"

namespace quantem::catalog {

namespace {

// O(N^2) on HDF5 1.10.8, but correct for every index kind HDF5 supports.
std::vector<ShardChunk> list_chunks_with_hdf5(const hdf5::Dataset& dataset, const detail::FileAddressing& addressing,
                                              std::size_t rank) {
  std::vector<ShardChunk> chunks;
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
    chunks.push_back(ShardChunk{element_offsets, addressing.base_address + address, stored_bytes, filter_mask});
  }
  return chunks;
}

std::mutex& shard_storage_source_mutex() {
  static std::mutex mutex;
  return mutex;
}
ShardStorageFunction& shard_storage_source() {
  static ShardStorageFunction source;
  return source;
}

}  // namespace

ShardStorage read_shard_storage(const std::string& file_path, const std::string& dataset_path) {
  // The handles close before the lock is released.
  const hdf5::LibraryLock hdf5_lock;
  ShardStorage storage;
  const hdf5::File file = hdf5::File::open_read_only(file_path);
  const hdf5::Dataset dataset = hdf5::open_dataset(file.id(), dataset_path);
  const hdf5::Dataspace space = dataset.space();
  const int rank = H5Sget_simple_extent_ndims(space.id());
  if (rank < 0) hdf5::throw_error("H5Sget_simple_extent_ndims");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), max_dims(static_cast<std::size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space.id(), dims.data(), max_dims.data()) < 0) {
    hdf5::throw_error("H5Sget_simple_extent_dims");
  }
  storage.dims.assign(dims.begin(), dims.end());
  storage.max_dims.assign(max_dims.begin(), max_dims.end());
  detail::FileAddressing addressing;
  addressing.offset_size = file.offset_size();
  addressing.length_size = file.length_size();
  addressing.base_address = file.user_block_size();
  storage.offset_size = addressing.offset_size;
  storage.length_size = addressing.length_size;
  storage.base_address = addressing.base_address;
  const hdf5::PropertyList creation = dataset.creation_properties();
  const H5D_layout_t layout_class = H5Pget_layout(creation.id());
  if (layout_class == H5D_LAYOUT_ERROR) hdf5::throw_error("H5Pget_layout");
  if (layout_class == H5D_CONTIGUOUS) {
    storage.layout = ShardLayout::contiguous;
    storage.contiguous_offset = dataset.contiguous_offset();
  } else if (layout_class == H5D_CHUNKED) {
    storage.layout = ShardLayout::chunked;
    std::vector<hsize_t> chunk_dims(H5S_MAX_RANK);
    const int chunk_rank = H5Pget_chunk(creation.id(), H5S_MAX_RANK, chunk_dims.data());
    if (chunk_rank < 0) hdf5::throw_error("H5Pget_chunk");
    storage.chunk_dims.assign(chunk_dims.begin(), chunk_dims.begin() + chunk_rank);
    storage.object_header_address = dataset.object_header_address();
    // The index kinds not read directly get their chunks listed by HDF5.
    const detail::RawFile raw(file_path, addressing);
    const detail::DataLayout layout = detail::read_data_layout(raw, storage.object_header_address);
    if (layout.index_kind == detail::ChunkIndexKind::extensible_array ||
        layout.index_kind == detail::ChunkIndexKind::btree_v2) {
      spdlog::warn("catalog: {}:{}: chunk index kind '{}' is not read directly; using H5Dget_chunk_info (slow for "
                   "many chunks)",
                   file_path, dataset_path, detail::chunk_index_kind_name(layout.index_kind));
      storage.chunks_listed = true;
      storage.chunks = list_chunks_with_hdf5(dataset, addressing, storage.dims.size());
    }
  }
  return storage;
}

void set_shard_storage_source(ShardStorageFunction source) {
  std::lock_guard<std::mutex> lock(shard_storage_source_mutex());
  shard_storage_source() = std::move(source);
}

FrameIndex build_frame_index(const Acquisition& acquisition) {
  ShardStorageFunction source;
  {
    std::lock_guard<std::mutex> lock(shard_storage_source_mutex());
    source = shard_storage_source();
  }
  return build_frame_index(acquisition, source ? source : ShardStorageFunction(read_shard_storage));
}

}  // namespace quantem::catalog
