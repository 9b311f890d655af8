#pragma once
// What build_frame_index needs from libhdf5 about one shard's dataset, as
// plain data; everything else it reads itself with pread (the chunk index,
// chunk_index.hpp). The daemon gets it from the inspector worker
// (inspector/inspector.hpp, decision 0012), so that libhdf5 never runs on a
// data-folder file in the daemon's process; tools and tests read it in-process.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "quantem/catalog/acquisition.hpp"

namespace quantem::catalog {

struct ShardChunk {
  std::vector<std::uint64_t> element_offsets;  // of the chunk's first element, one per dimension
  std::uint64_t file_offset = 0;               // absolute
  std::uint64_t stored_bytes = 0;
  std::uint32_t filter_mask = 0;
};

enum class ShardLayout : std::uint8_t { contiguous, chunked, other };

struct ShardStorage {
  std::vector<std::uint64_t> dims;      // current extent
  std::vector<std::uint64_t> max_dims;  // H5S_UNLIMITED as 2^64 - 1
  std::uint64_t offset_size = 8;        // the file's address and length sizes, bytes
  std::uint64_t length_size = 8;
  std::uint64_t base_address = 0;       // the user block size
  ShardLayout layout = ShardLayout::other;
  std::vector<std::uint64_t> chunk_dims;            // chunked: HDF5's chunk shape
  std::uint64_t object_header_address = 0;          // chunked: the dataset's object header (relative)
  std::optional<std::uint64_t> contiguous_offset;   // contiguous: absolute; nullopt when no data is written
  // Chunked with an index kind that is not read directly (extensible array,
  // v2 B-tree): every written chunk, from H5Dget_chunk_info (O(N^2)).
  bool chunks_listed = false;
  std::vector<ShardChunk> chunks;
};

// Reads it with libhdf5 in this process (under the process-wide HDF5 lock).
// Throws HdfError / IoError when the file or dataset cannot be opened or read.
ShardStorage read_shard_storage(const std::string& file_path, const std::string& dataset_path);

using ShardStorageFunction = std::function<ShardStorage(const std::string& file_path, const std::string& dataset_path)>;

// build_frame_index with the libhdf5 facts from `storage`.
FrameIndex build_frame_index(const Acquisition& acquisition, const ShardStorageFunction& storage);

// Where build_frame_index(acquisition) gets the facts: read_shard_storage
// unless a source is installed (serve installs the inspector's before any load
// and removes it after the last; empty: back to read_shard_storage).
void set_shard_storage_source(ShardStorageFunction source);

}  // namespace quantem::catalog
