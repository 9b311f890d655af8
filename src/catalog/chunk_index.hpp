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
//
// The walk can be cut into parts (split_chunk_index: B-tree subtrees, ranges
// of fixed-array entries or implicit chunks) that several threads walk at
// once: walking a part only preads the file. No HDF5 call is made here.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
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
  // The same into `buffer` (resized to `bytes`; its capacity is reused).
  void read_into(std::uint64_t relative_address, std::size_t bytes, std::vector<std::uint8_t>& buffer) const;
  // Bytes from a relative address to the end of the file (0 beyond it).
  std::uint64_t bytes_after(std::uint64_t relative_address) const;

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
// The same as walking every part of split_chunk_index(..., 1) in order.
bool visit_chunks(const RawFile& file, const DataLayout& layout, const std::vector<std::uint64_t>& dims,
                  const std::vector<std::uint64_t>& max_dims, const ChunkVisitor& visit);

// The grid of chunks over an extent: chunk_count chunks of chunk_bytes
// (uncompressed), numbered row-major over chunks_per_dim.
struct ChunkGrid {
  std::vector<std::uint64_t> chunk_dims;
  std::vector<std::uint64_t> chunks_per_dim;
  std::uint64_t chunk_count = 1;
  std::uint64_t chunk_bytes = 0;
};

// A chunk index cut into parts, in index order. Walking every part visits
// exactly the chunks visit_chunks visits; parts may be walked in any order
// and concurrently (from several threads, one RawFile shared).
struct ChunkIndexParts {
  struct Part {
    std::uint64_t address = 0;  // v1 B-tree: the subtree's root node (relative address)
    int level = -1;             // v1 B-tree: that node's level; -1 when not yet known (the tree's root)
    std::uint64_t first = 0;    // fixed array, implicit: the first chunk (row-major index over the grid)
    std::uint64_t count = 0;    // fixed array, implicit: chunks in the part
  };
  ChunkIndexKind kind = ChunkIndexKind::not_chunked;
  std::size_t rank = 0;
  ChunkGrid grid;
  std::uint64_t chunks_address = 0;  // single chunk: the chunk; implicit: the first chunk (relative)
  std::uint64_t single_chunk_stored_bytes = 0;
  std::uint32_t single_chunk_filter_mask = 0;
  // Fixed array: entries of entry_bytes (address, then for client 1 a stored
  // size and a filter mask), in pages of page_entries when paged.
  unsigned fixed_array_client = 0;
  std::size_t fixed_array_entry_bytes = 0;
  std::uint64_t fixed_array_page_entries = 0;
  bool fixed_array_paged = false;
  std::uint64_t fixed_array_entries_address = 0;  // unpaged: the first entry; paged: the first page
  std::vector<std::uint8_t> fixed_array_page_bitmap;  // paged: bit (0x80 >> page % 8) of byte page / 8: initialised
  std::vector<Part> parts;
};

// Cuts the chunk index into at least `wanted_parts` parts where it has that
// many (a small index may give fewer; B-trees are cut at node boundaries, so
// possibly many more), reading the top B-tree levels or the fixed-array
// header to do so. Returns nullopt when the index kind is not supported here.
std::optional<ChunkIndexParts> split_chunk_index(const RawFile& file, const DataLayout& layout,
                                                 const std::vector<std::uint64_t>& dims,
                                                 const std::vector<std::uint64_t>& max_dims,
                                                 std::size_t wanted_parts);

// Visits the chunks of parts.parts[part]. Thread-safe: several threads may walk
// parts of the same ChunkIndexParts over the same RawFile at once (`visit` is
// then called from each of them).
void visit_chunk_index_part(const RawFile& file, const ChunkIndexParts& parts, std::size_t part,
                            const ChunkVisitor& visit);

}  // namespace quantem::catalog::detail
