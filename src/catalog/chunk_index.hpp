#pragma once
// Reads a chunked dataset's chunk index straight from the file bytes (private
// header), the way dectris/neggia does, because HDF5 1.10.8's per-chunk index
// calls (H5Dget_chunk_info, _by_coord) cost O(N) each and H5Dchunk_iter does
// not exist there.
//
// The caller gets the dataset's object-header address from HDF5
// (H5Oget_info) and the file's address/length sizes and base address from its
// creation property list. From there everything is pread: the object header
// (v1, or v2 "OHDR" with "OCHK" continuation blocks) gives the data layout
// message, whose chunk index is walked:
//   - layout v1-v3: v1 B-tree ("TREE", node type 1), every level;
//   - layout v4: single chunk, implicit, fixed array ("FAHD"/"FADB", paged or not).
// Extensible arrays and v2 B-trees (layout v4 with an unlimited dimension, or
// several) are reported as unsupported; the caller falls back to HDF5's calls.
//
// Checksums of v2 metadata are not verified; every size, offset and level is
// bounds-checked, so malformed bytes throw quantem::Error(corrupt_data) and
// never read out of range or loop.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace quantem::catalog::detail {

struct FileAddressing {
  std::size_t offset_size = 8;     // bytes per file address
  std::size_t length_size = 8;     // bytes per length
  std::uint64_t base_address = 0;  // absolute offset of relative address 0 (the user block size)
};

enum class ChunkIndexKind : std::uint8_t {
  not_chunked,       // compact, contiguous or virtual layout
  btree_v1,          // layout v1-v3
  single_chunk,      // layout v4, index type 1
  implicit,          // layout v4, index type 2
  fixed_array,       // layout v4, index type 3
  extensible_array,  // layout v4, index type 4 (unsupported: fall back)
  btree_v2,          // layout v4, index type 5 (unsupported: fall back)
};

const char* chunk_index_kind_name(ChunkIndexKind kind) noexcept;

// The data layout message of one dataset.
struct DataLayout {
  unsigned message_version = 0;
  unsigned layout_class = 0;  // 0 compact, 1 contiguous, 2 chunked, 3 virtual
  ChunkIndexKind index_kind = ChunkIndexKind::not_chunked;
  std::uint64_t index_address = 0;  // relative; B-tree root, chunk, array header
  std::vector<std::uint64_t> chunk_dims;  // one per dataset dimension
  std::uint64_t element_size = 0;         // the extra last chunk "dimension"
  bool single_chunk_filtered = false;
  std::uint64_t single_chunk_stored_bytes = 0;
  std::uint32_t single_chunk_filter_mask = 0;
};

// One stored chunk: element offsets of its first element (one per dataset
// dimension), absolute file offset, stored size, filter mask.
using ChunkVisitor = std::function<void(const std::uint64_t* element_offsets, std::uint64_t file_offset,
                                        std::uint64_t stored_bytes, std::uint32_t filter_mask)>;

class RawFile {
 public:
  RawFile(const std::string& path, const FileAddressing& addressing);
  ~RawFile();
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;

  const std::string& path() const { return path_; }
  const FileAddressing& addressing() const { return addressing_; }
  std::uint64_t size() const { return size_; }
  // Reads `bytes` at a relative address; throws corrupt_data when out of the file.
  std::vector<std::uint8_t> read(std::uint64_t relative_address, std::size_t bytes) const;

 private:
  std::string path_;
  FileAddressing addressing_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// Decodes the data layout message of the object header at `header_address` (relative).
DataLayout read_data_layout(const RawFile& file, std::uint64_t header_address);

// Visits every allocated chunk. `dims` and `max_dims` are the dataset's current
// and maximum dimensions (max_dims entries equal to H5S_UNLIMITED are allowed).
// Returns false (visiting nothing) when the index kind is not supported here.
bool visit_chunks(const RawFile& file, const DataLayout& layout, const std::vector<std::uint64_t>& dims,
                  const std::vector<std::uint64_t>& max_dims, const ChunkVisitor& visit);

}  // namespace quantem::catalog::detail
