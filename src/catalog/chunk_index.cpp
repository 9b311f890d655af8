#include "chunk_index.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>

#include "quantem/core/error.hpp"

// Format: "HDF5 File Format Specification Version 3.0" (object headers IV.A,
// data layout message IV.A.2.i, v1 B-trees III.A.1, fixed arrays III.H).
namespace quantem::catalog::detail {

namespace {

constexpr std::uint16_t kLayoutMessageType = 0x0008;
constexpr std::uint16_t kContinuationMessageType = 0x0010;
constexpr std::size_t kMaxHeaderChunks = 4096;
constexpr std::size_t kMaxBtreeDepth = 64;

[[noreturn]] void corrupt(const RawFile& file, const std::string& what) {
  throw Error(ErrorKind::corrupt_data, "malformed HDF5 metadata in " + file.path() + ": " + what);
}

bool all_ones(const std::uint8_t* bytes, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    if (bytes[i] != 0xFF) return false;
  }
  return true;
}

// Little-endian reader over one block of metadata bytes with bounds checks.
class Cursor {
 public:
  Cursor(const RawFile& file, const std::vector<std::uint8_t>& bytes, std::size_t position = 0)
      : file_(file), bytes_(bytes), position_(position) {}

  std::size_t position() const { return position_; }
  std::size_t remaining() const { return position_ <= bytes_.size() ? bytes_.size() - position_ : 0; }
  void seek(std::size_t position) {
    if (position > bytes_.size()) corrupt(file_, "seek past the end of a metadata block");
    position_ = position;
  }
  void skip(std::size_t count) { seek(position_ + count); }

  std::uint64_t unsigned_value(std::size_t width) {
    require(width);
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < width && i < 8; ++i) value |= std::uint64_t(bytes_[position_ + i]) << (8 * i);
    position_ += width;
    return value;
  }
  std::uint8_t u8() { return static_cast<std::uint8_t>(unsigned_value(1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(unsigned_value(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(unsigned_value(4)); }

  // An address; nullopt for the undefined address (all bits set).
  std::optional<std::uint64_t> address() {
    const std::size_t width = file_.addressing().offset_size;
    require(width);
    const bool undefined = all_ones(bytes_.data() + position_, width);
    const std::uint64_t value = unsigned_value(width);
    if (undefined) return std::nullopt;
    return value;
  }
  std::uint64_t length() { return unsigned_value(file_.addressing().length_size); }

  bool signature(const char* expected) {
    require(4);
    const bool matches = std::memcmp(bytes_.data() + position_, expected, 4) == 0;
    position_ += 4;
    return matches;
  }

 private:
  void require(std::size_t count) const {
    if (count > remaining()) corrupt(file_, "metadata block ends early");
  }
  const RawFile& file_;
  const std::vector<std::uint8_t>& bytes_;
  std::size_t position_;
};

// The chunk dimensions of a chunked layout: all but the last of `dims`, whose
// last entry is the element size.
void set_chunk_dims(const RawFile& file, std::vector<std::uint64_t> dims, DataLayout& layout) {
  if (dims.size() < 2) corrupt(file, "chunked layout with fewer than two dimensions");
  layout.element_size = dims.back();
  dims.pop_back();
  layout.chunk_dims = std::move(dims);
}

std::vector<std::uint64_t> read_u32_dims(Cursor& cursor, unsigned dimensionality) {
  std::vector<std::uint64_t> dims(dimensionality);
  for (auto& d : dims) d = cursor.u32();
  return dims;
}

// Layout message versions 1 and 2 (after the version byte).
void decode_layout_v1_v2(const RawFile& file, Cursor& cursor, DataLayout& layout) {
  const unsigned dimensionality = cursor.u8();
  layout.layout_class = cursor.u8();
  cursor.skip(5);
  if (layout.layout_class != 0) {
    const auto address = cursor.address();
    layout.index_address = address.value_or(~std::uint64_t{0});
  }
  std::vector<std::uint64_t> dims = read_u32_dims(cursor, dimensionality);
  if (layout.layout_class == 2) {
    layout.index_kind = ChunkIndexKind::btree_v1;
    set_chunk_dims(file, std::move(dims), layout);
  }
}

// A chunked layout of message version 3 (after the layout class).
void decode_chunked_layout_v3(const RawFile& file, Cursor& cursor, DataLayout& layout) {
  const unsigned dimensionality = cursor.u8();
  const auto address = cursor.address();
  layout.index_address = address.value_or(~std::uint64_t{0});
  layout.index_kind = ChunkIndexKind::btree_v1;
  set_chunk_dims(file, read_u32_dims(cursor, dimensionality), layout);
}

// A chunked layout of message version 4 (after the layout class): flags,
// chunk dimensions of an encoded width, the chunk index type and its fields.
void decode_chunked_layout_v4(const RawFile& file, Cursor& cursor, DataLayout& layout) {
  const std::uint8_t flags = cursor.u8();
  const unsigned dimensionality = cursor.u8();
  const unsigned encoded_width = cursor.u8();
  if (encoded_width < 1 || encoded_width > 8) corrupt(file, "bad chunk dimension width");
  std::vector<std::uint64_t> dims(dimensionality);
  for (auto& d : dims) d = cursor.unsigned_value(encoded_width);
  set_chunk_dims(file, std::move(dims), layout);
  const unsigned index_type = cursor.u8();
  switch (index_type) {
    case 1:
      layout.index_kind = ChunkIndexKind::single_chunk;
      if (flags & 0x02) {
        layout.single_chunk_filtered = true;
        layout.single_chunk_stored_bytes = cursor.length();
        layout.single_chunk_filter_mask = cursor.u32();
      }
      break;
    case 2:
      layout.index_kind = ChunkIndexKind::implicit;
      break;
    case 3:
      layout.index_kind = ChunkIndexKind::fixed_array;
      cursor.skip(1);  // page bits (also in the array header)
      break;
    case 4:
      layout.index_kind = ChunkIndexKind::extensible_array;
      cursor.skip(5);
      break;
    case 5:
      layout.index_kind = ChunkIndexKind::btree_v2;
      cursor.skip(6);
      break;
    default:
      corrupt(file, "unknown chunk index type " + std::to_string(index_type));
  }
  const auto address = cursor.address();
  layout.index_address = address.value_or(~std::uint64_t{0});
}

DataLayout decode_layout_message(const RawFile& file, const std::vector<std::uint8_t>& message) {
  Cursor cursor(file, message);
  DataLayout layout;
  layout.message_version = cursor.u8();
  if (layout.message_version == 1 || layout.message_version == 2) {
    decode_layout_v1_v2(file, cursor, layout);
    return layout;
  }
  if (layout.message_version != 3 && layout.message_version != 4) {
    corrupt(file, "unknown data layout message version " + std::to_string(layout.message_version));
  }
  layout.layout_class = cursor.u8();
  if (layout.layout_class != 2) return layout;  // compact, contiguous, virtual: not chunk-indexed
  if (layout.message_version == 3) {
    decode_chunked_layout_v3(file, cursor, layout);
  } else {
    decode_chunked_layout_v4(file, cursor, layout);
  }
  return layout;
}

// Scans one block of object-header messages; returns the layout message when
// found and queues continuation blocks.
struct HeaderScan {
  std::optional<std::vector<std::uint8_t>> layout_message;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> continuations;  // (address, length)
};

void scan_messages(const RawFile& file, const std::vector<std::uint8_t>& block, std::size_t begin,
                   std::size_t end, unsigned header_version, bool creation_order_tracked, HeaderScan& scan) {
  Cursor cursor(file, block, begin);
  const std::size_t message_header_bytes = header_version == 1 ? 8 : (creation_order_tracked ? 6 : 4);
  while (cursor.position() + message_header_bytes <= end) {
    std::uint16_t type = 0;
    std::size_t size = 0;
    if (header_version == 1) {
      type = cursor.u16();
      size = cursor.u16();
      cursor.skip(4);  // flags + reserved
    } else {
      type = cursor.u8();
      size = cursor.u16();
      cursor.skip(1);  // flags
      if (creation_order_tracked) cursor.skip(2);
    }
    if (cursor.position() + size > end) corrupt(file, "object header message overruns its block");
    const std::size_t data_start = cursor.position();
    if (type == kLayoutMessageType && !scan.layout_message) {
      scan.layout_message.emplace(block.begin() + static_cast<std::ptrdiff_t>(data_start),
                                  block.begin() + static_cast<std::ptrdiff_t>(data_start + size));
    } else if (type == kContinuationMessageType) {
      const auto address = cursor.address();
      const std::uint64_t length = cursor.length();
      if (!address) corrupt(file, "continuation message with an undefined address");
      scan.continuations.emplace_back(*address, length);
    }
    cursor.seek(data_start + size);
  }
}

}  // namespace

const char* chunk_index_kind_name(ChunkIndexKind kind) noexcept {
  switch (kind) {
    case ChunkIndexKind::not_chunked: return "not chunked";
    case ChunkIndexKind::btree_v1: return "v1 B-tree";
    case ChunkIndexKind::single_chunk: return "single chunk";
    case ChunkIndexKind::implicit: return "implicit";
    case ChunkIndexKind::fixed_array: return "fixed array";
    case ChunkIndexKind::extensible_array: return "extensible array";
    case ChunkIndexKind::btree_v2: return "v2 B-tree";
  }
  return "unknown";
}

RawFile::RawFile(const std::string& path, const FileAddressing& addressing) : path_(path), addressing_(addressing) {
  if (addressing.offset_size < 2 || addressing.offset_size > 8 || addressing.length_size < 2 ||
      addressing.length_size > 8) {
    throw Error(ErrorKind::corrupt_data, "unsupported HDF5 address size in " + path);
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw IoError("cannot open " + path + ": " + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd_, &info) != 0) {
    const int error = errno;
    ::close(fd_);
    throw IoError("cannot stat " + path + ": " + std::strerror(error));
  }
  size_ = static_cast<std::uint64_t>(info.st_size);
}

RawFile::~RawFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::uint8_t> RawFile::read(std::uint64_t relative_address, std::size_t bytes) const {
  std::vector<std::uint8_t> buffer;
  read_into(relative_address, bytes, buffer);
  return buffer;
}

DataLayout read_data_layout(const RawFile& file, std::uint64_t header_address) {
  HeaderScan scan;
  // The prefix is at most 4+1+1+16+4+8 bytes (v2) or 16 bytes (v1).
  const std::uint64_t header_offset = file.addressing().base_address + header_address;
  if (header_offset >= file.size()) corrupt(file, "object header address beyond the end of the file");
  const auto peek_bytes = static_cast<std::size_t>(std::min<std::uint64_t>(48, file.size() - header_offset));
  const std::vector<std::uint8_t> prefix = file.read(header_address, peek_bytes);
  Cursor cursor(file, prefix);
  unsigned header_version = 0;
  bool creation_order_tracked = false;
  if (prefix.size() >= 4 && std::memcmp(prefix.data(), "OHDR", 4) == 0) {
    cursor.skip(4);
    header_version = cursor.u8();
    if (header_version != 2) corrupt(file, "unknown object header version " + std::to_string(header_version));
    const std::uint8_t flags = cursor.u8();
    creation_order_tracked = (flags & 0x04) != 0;
    if (flags & 0x20) cursor.skip(16);  // access, modification, change, birth times
    if (flags & 0x10) cursor.skip(4);   // attribute phase change values
    const std::uint64_t chunk0_bytes = cursor.unsigned_value(std::size_t{1} << (flags & 0x03));
    const std::size_t messages_begin = cursor.position();
    if (chunk0_bytes > file.size()) corrupt(file, "object header larger than the file");
    const auto block = file.read(header_address, messages_begin + static_cast<std::size_t>(chunk0_bytes));
    scan_messages(file, block, messages_begin, block.size(), 2, creation_order_tracked, scan);
  } else {
    header_version = cursor.u8();
    if (header_version != 1) corrupt(file, "no object header at address " + std::to_string(header_address));
    cursor.skip(1);  // reserved
    cursor.skip(2);  // message count
    cursor.skip(4);  // reference count
    const std::uint32_t header_bytes = cursor.u32();
    if (header_bytes > file.size()) corrupt(file, "object header larger than the file");
    const auto block = file.read(header_address, 16 + header_bytes);
    scan_messages(file, block, 16, block.size(), 1, false, scan);
  }

  std::set<std::uint64_t> visited;
  for (std::size_t next = 0; !scan.layout_message && next < scan.continuations.size(); ++next) {
    const auto [address, length] = scan.continuations[next];
    if (visited.size() >= kMaxHeaderChunks || !visited.insert(address).second) {
      corrupt(file, "object header continuation loop");
    }
    if (length > file.size()) corrupt(file, "object header continuation larger than the file");
    const auto block = file.read(address, static_cast<std::size_t>(length));
    if (header_version == 1) {
      scan_messages(file, block, 0, block.size(), 1, false, scan);
    } else {
      if (block.size() < 8 || std::memcmp(block.data(), "OCHK", 4) != 0) {
        corrupt(file, "object header continuation block without OCHK signature");
      }
      scan_messages(file, block, 4, block.size() - 4, 2, creation_order_tracked, scan);
    }
  }
  if (!scan.layout_message) corrupt(file, "dataset object header has no data layout message");
  return decode_layout_message(file, *scan.layout_message);
}

namespace {

// HDF5's default chunk B-tree K is 32: nodes hold up to 2K = 64 entries and
// are allocated at that size, so reading that much reads a node in one pread.
constexpr std::size_t kExpectedBtreeEntries = 64;
// Fixed-array and implicit parts hold at least this many chunks: smaller parts
// cost more to hand out than to walk.
constexpr std::uint64_t kMinChunksPerPart = 1024;

// Little-endian unsigned integer of `width` bytes (1 to 8).
std::uint64_t load_le(const std::uint8_t* bytes, std::size_t width) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  if (width == 8) {
    std::uint64_t value = 0;
    std::memcpy(&value, bytes, 8);
    return value;
  }
  if (width == 4) {
    std::uint32_t value = 0;
    std::memcpy(&value, bytes, 4);
    return value;
  }
#endif
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < width; ++i) value |= std::uint64_t(bytes[i]) << (8 * i);
  return value;
}

// A file address of `width` bytes; nullopt for the undefined address (all bits set).
std::optional<std::uint64_t> load_address(const std::uint8_t* bytes, std::size_t width) {
  const std::uint64_t value = load_le(bytes, width);
  const std::uint64_t undefined = width >= 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * width)) - 1;
  if (value == undefined) return std::nullopt;
  return value;
}

ChunkGrid make_grid(const RawFile& file, const DataLayout& layout, const std::vector<std::uint64_t>& extent) {
  ChunkGrid grid;
  grid.chunk_dims = layout.chunk_dims;
  if (extent.size() != grid.chunk_dims.size()) corrupt(file, "chunk rank differs from the dataset rank");
  grid.chunk_bytes = layout.element_size;
  for (std::size_t d = 0; d < extent.size(); ++d) {
    if (grid.chunk_dims[d] == 0) corrupt(file, "zero chunk dimension");
    const std::uint64_t count = extent[d] / grid.chunk_dims[d] + (extent[d] % grid.chunk_dims[d] != 0);
    grid.chunks_per_dim.push_back(count);
    if (count != 0 && grid.chunk_count > (std::uint64_t{1} << 48) / count) corrupt(file, "chunk grid too large");
    grid.chunk_count *= count;
    // A wrapped chunk size would fool the implicit index's "within the file"
    // bound (fuzz_chunk_index: 2^30 chunks of a wrapped size in a 758-byte file).
    if (__builtin_mul_overflow(grid.chunk_bytes, grid.chunk_dims[d], &grid.chunk_bytes)) {
      corrupt(file, "chunk size overflows 64 bits");
    }
  }
  if (grid.chunk_bytes == 0) corrupt(file, "zero element size");
  return grid;
}

// Element offsets of the chunk with row-major linear index `index`.
void chunk_offsets(const ChunkGrid& grid, std::uint64_t index, std::uint64_t* offsets) {
  for (std::size_t d = grid.chunk_dims.size(); d-- > 0;) {
    const std::uint64_t per = grid.chunks_per_dim[d] ? grid.chunks_per_dim[d] : 1;
    offsets[d] = (index % per) * grid.chunk_dims[d];
    index /= per;
  }
}

// Cuts [0, total) into about `wanted` ranges of at least kMinChunksPerPart
// (the last may be shorter), each starting at a multiple of `alignment`.
std::vector<ChunkIndexParts::Part> ranges(std::uint64_t total, std::size_t wanted, std::uint64_t alignment) {
  std::vector<ChunkIndexParts::Part> parts;
  if (total == 0) return parts;
  std::uint64_t size = std::max<std::uint64_t>(kMinChunksPerPart, total / std::max<std::size_t>(wanted, 1) + 1);
  size = (size + alignment - 1) / alignment * alignment;
  for (std::uint64_t first = 0; first < total; first += size) {
    ChunkIndexParts::Part part;
    part.first = first;
    part.count = std::min(size, total - first);
    parts.push_back(part);
  }
  return parts;
}

// Reads v1 B-tree nodes of a chunk index, each (usually) with one pread into a
// reused buffer, and walks subtrees.
class BtreeReader {
 public:
  BtreeReader(const RawFile& file, std::size_t rank)
      : file_(file),
        offset_size_(file.addressing().offset_size),
        header_bytes_(8 + 2 * offset_size_),
        key_bytes_(8 + 8 * (rank + 1)),
        entry_bytes_(key_bytes_ + offset_size_),
        rank_(rank) {}

  struct Node {
    int level = 0;
    unsigned entries = 0;
    const std::uint8_t* first_entry = nullptr;  // entry i: key, then child address
  };

  // Reads the node at `address` into `buffer`. `expected_level` < 0 accepts any level.
  Node read(std::uint64_t address, int expected_level, std::vector<std::uint8_t>& buffer) {
    const std::uint64_t guess = header_bytes_ + expected_entries_ * entry_bytes_ + key_bytes_;
    const std::uint64_t available = file_.bytes_after(address);
    file_.read_into(address, static_cast<std::size_t>(available < header_bytes_ ? header_bytes_ : std::min(guess, available)),
                    buffer);
    const std::uint8_t* bytes = buffer.data();
    if (std::memcmp(bytes, "TREE", 4) != 0) corrupt(file_, "B-tree node without TREE signature");
    const unsigned node_type = bytes[4];
    Node node;
    node.level = bytes[5];
    node.entries = static_cast<unsigned>(load_le(bytes + 6, 2));
    if (node_type != 1) corrupt(file_, "chunk B-tree node of type " + std::to_string(node_type));
    if (expected_level >= 0 && node.level != expected_level) corrupt(file_, "B-tree levels are inconsistent");
    const std::size_t node_bytes = header_bytes_ + node.entries * entry_bytes_ + key_bytes_;
    if (node_bytes > buffer.size()) {
      // More entries than expected (a K above 32): read the whole node again.
      expected_entries_ = std::max<std::size_t>(expected_entries_, node.entries);
      file_.read_into(address, node_bytes, buffer);
    }
    node.first_entry = buffer.data() + header_bytes_;
    return node;
  }

  std::uint64_t child_address(const Node& node, unsigned entry) const {
    const auto address = load_address(node.first_entry + entry * entry_bytes_ + key_bytes_, offset_size_);
    if (!address) corrupt(file_, "B-tree entry with an undefined address");
    return *address;
  }

  // Visits the chunks under the node at `address`, at most `max_chunks` of them.
  void walk(std::uint64_t address, int expected_level, std::uint64_t max_chunks, const ChunkVisitor& visit) {
    buffers_.resize(kMaxBtreeDepth + 1);
    offsets_.resize(rank_);
    visited_ = 0;
    walk(address, expected_level, 0, max_chunks, visit);
  }

 private:
  void walk(std::uint64_t address, int expected_level, std::size_t depth, std::uint64_t max_chunks,
            const ChunkVisitor& visit) {
    if (depth > kMaxBtreeDepth) corrupt(file_, "B-tree too deep");
    const Node node = read(address, expected_level, buffers_[depth]);
    const std::uint64_t base_address = file_.addressing().base_address;
    for (unsigned i = 0; i < node.entries; ++i) {
      const std::uint64_t child = child_address(node, i);
      if (node.level == 0) {
        const std::uint8_t* key = node.first_entry + i * entry_bytes_;
        const auto stored_bytes = load_le(key, 4);
        const auto filter_mask = static_cast<std::uint32_t>(load_le(key + 4, 4));
        for (std::size_t d = 0; d < rank_; ++d) offsets_[d] = load_le(key + 8 + 8 * d, 8);
        if (++visited_ > max_chunks) corrupt(file_, "B-tree holds more chunks than the dataset has");
        visit(offsets_.data(), base_address + child, stored_bytes, filter_mask);
      } else {
        walk(child, node.level - 1, depth + 1, max_chunks, visit);
      }
    }
  }

  const RawFile& file_;
  std::size_t offset_size_;
  std::size_t header_bytes_;
  std::size_t key_bytes_;    // stored size, filter mask, rank + 1 offsets
  std::size_t entry_bytes_;  // key, child address
  std::size_t rank_;
  std::size_t expected_entries_ = kExpectedBtreeEntries;
  std::vector<std::vector<std::uint8_t>> buffers_;  // one per depth
  std::vector<std::uint64_t> offsets_;
  std::uint64_t visited_ = 0;
};

// Cuts a v1 B-tree into subtrees, in index order: passes over the cut replace
// nodes by their children, right to left, until there are `wanted_parts`
// subtrees (or only leaves). Larger subtrees thus come first and the small
// ones last, which keeps threads taking parts in order evenly busy.
void split_btree_v1(const RawFile& file, std::uint64_t root, std::size_t wanted_parts, ChunkIndexParts& parts) {
  ChunkIndexParts::Part root_part;
  root_part.address = root;
  std::vector<ChunkIndexParts::Part> cut{root_part};
  BtreeReader reader(file, parts.rank);
  std::vector<std::uint8_t> buffer;
  bool expanded = true;
  while (cut.size() < wanted_parts && expanded) {
    expanded = false;
    std::vector<ChunkIndexParts::Part> reversed;  // the next cut, last part first
    for (std::size_t i = cut.size(); i-- > 0;) {
      const auto& part = cut[i];
      if (part.level == 0 || reversed.size() + i + 1 >= wanted_parts) {
        reversed.push_back(part);
        continue;
      }
      const BtreeReader::Node node = reader.read(part.address, part.level, buffer);
      if (node.level == 0) {  // the root is a leaf
        reversed.push_back(part);
        continue;
      }
      for (unsigned entry = node.entries; entry-- > 0;) {
        ChunkIndexParts::Part child;
        child.address = reader.child_address(node, entry);
        child.level = node.level - 1;
        reversed.push_back(child);
      }
      expanded = true;
      // Every subtree of a valid tree holds at least one chunk.
      if (reversed.size() > parts.grid.chunk_count) {
        corrupt(file, "B-tree holds more nodes than the dataset has chunks");
      }
    }
    cut.assign(reversed.rbegin(), reversed.rend());
  }
  parts.parts = std::move(cut);
}

void split_fixed_array(const RawFile& file, const DataLayout& layout, std::size_t wanted_parts,
                       ChunkIndexParts& parts) {
  const std::size_t offset_size = file.addressing().offset_size;
  const std::size_t length_size = file.addressing().length_size;
  const auto header = file.read(layout.index_address, 8 + length_size + offset_size + 4);
  Cursor cursor(file, header);
  if (!cursor.signature("FAHD")) corrupt(file, "fixed array header without FAHD signature");
  if (cursor.u8() != 0) corrupt(file, "unknown fixed array version");
  const unsigned client = cursor.u8();  // 0: unfiltered chunks, 1: filtered chunks
  const std::size_t entry_bytes = cursor.u8();
  const unsigned page_bits = cursor.u8();
  const std::uint64_t entry_count = cursor.length();
  const auto block_address = cursor.address();
  if (client > 1) corrupt(file, "unknown fixed array client");
  const std::size_t expected_min = client == 0 ? offset_size : offset_size + 1 + 4;
  if (entry_bytes < expected_min || entry_bytes > offset_size + 8 + 4 || (client == 0 && entry_bytes != offset_size)) {
    corrupt(file, "bad fixed array entry size");
  }
  if (page_bits > 32) corrupt(file, "bad fixed array page size");
  if (entry_count != parts.grid.chunk_count) corrupt(file, "fixed array size differs from the chunk grid");
  if (!block_address || entry_count == 0) return;  // nothing allocated yet

  const std::uint64_t page_entries = std::uint64_t{1} << page_bits;
  const bool paged = entry_count > page_entries;
  const std::uint64_t page_count = paged ? (entry_count + page_entries - 1) / page_entries : 1;
  const std::size_t bitmap_bytes = paged ? static_cast<std::size_t>((page_count + 7) / 8) : 0;
  const std::size_t block_prefix_bytes = 4 + 1 + 1 + offset_size;
  if (entry_count * entry_bytes > file.size()) corrupt(file, "fixed array larger than the file");

  const auto prefix = file.read(*block_address, block_prefix_bytes + bitmap_bytes);
  Cursor block(file, prefix);
  if (!block.signature("FADB")) corrupt(file, "fixed array data block without FADB signature");
  parts.fixed_array_client = client;
  parts.fixed_array_entry_bytes = entry_bytes;
  parts.fixed_array_page_entries = page_entries;
  parts.fixed_array_paged = paged;
  parts.fixed_array_page_bitmap.assign(prefix.begin() + static_cast<std::ptrdiff_t>(block_prefix_bytes), prefix.end());
  // Paged: prefix + bitmap + checksum, then pages of (entries + checksum).
  parts.fixed_array_entries_address = *block_address + block_prefix_bytes + (paged ? bitmap_bytes + 4 : 0);
  parts.parts = ranges(entry_count, wanted_parts, paged ? page_entries : 1);
}

// Visits `count` fixed-array entries, the first being chunk `first_index`.
void visit_fixed_array_entries(const RawFile& file, const ChunkIndexParts& parts, const std::vector<std::uint8_t>& bytes,
                               std::uint64_t first_index, std::uint64_t count, std::vector<std::uint64_t>& offsets,
                               const ChunkVisitor& visit) {
  const std::size_t offset_size = file.addressing().offset_size;
  const std::size_t entry_bytes = parts.fixed_array_entry_bytes;
  if (count > bytes.size() / entry_bytes) corrupt(file, "metadata block ends early");
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::uint8_t* entry = bytes.data() + i * entry_bytes;
    const auto chunk_address = load_address(entry, offset_size);
    std::uint64_t stored_bytes = parts.grid.chunk_bytes;
    std::uint32_t filter_mask = 0;
    if (parts.fixed_array_client == 1) {
      stored_bytes = load_le(entry + offset_size, entry_bytes - offset_size - 4);
      filter_mask = static_cast<std::uint32_t>(load_le(entry + entry_bytes - 4, 4));
    }
    if (!chunk_address) continue;  // never written
    chunk_offsets(parts.grid, first_index + i, offsets.data());
    visit(offsets.data(), file.addressing().base_address + *chunk_address, stored_bytes, filter_mask);
  }
}

void visit_fixed_array_part(const RawFile& file, const ChunkIndexParts& parts, const ChunkIndexParts::Part& part,
                            const ChunkVisitor& visit) {
  const std::size_t entry_bytes = parts.fixed_array_entry_bytes;
  std::vector<std::uint64_t> offsets(parts.rank);
  std::vector<std::uint8_t> bytes;
  if (!parts.fixed_array_paged) {
    file.read_into(parts.fixed_array_entries_address + part.first * entry_bytes,
                   static_cast<std::size_t>(part.count * entry_bytes), bytes);
    visit_fixed_array_entries(file, parts, bytes, part.first, part.count, offsets, visit);
    return;
  }
  const std::uint64_t page_entries = parts.fixed_array_page_entries;
  const std::uint64_t full_page_bytes = page_entries * entry_bytes + 4;
  for (std::uint64_t first = part.first; first < part.first + part.count; first += page_entries) {
    const std::uint64_t page = first / page_entries;
    const bool initialised = (parts.fixed_array_page_bitmap[page / 8] & (0x80u >> (page % 8))) != 0;
    if (!initialised) continue;
    const std::uint64_t count = std::min(page_entries, part.first + part.count - first);
    file.read_into(parts.fixed_array_entries_address + page * full_page_bytes, static_cast<std::size_t>(count * entry_bytes),
                   bytes);
    visit_fixed_array_entries(file, parts, bytes, first, count, offsets, visit);
  }
}

}  // namespace

void RawFile::read_into(std::uint64_t relative_address, std::size_t bytes, std::vector<std::uint8_t>& buffer) const {
  const std::uint64_t offset = addressing_.base_address + relative_address;
  if (relative_address > size_ || offset > size_ || bytes > size_ - offset) {
    throw Error(ErrorKind::corrupt_data, "HDF5 metadata at address " + std::to_string(relative_address) + " (" +
                                             std::to_string(bytes) + " bytes) lies outside " + path_);
  }
  buffer.resize(bytes);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd_, buffer.data() + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot read " + path_ + ": " + std::strerror(errno));
    }
    if (n == 0) throw IoError("unexpected end of " + path_);
    done += static_cast<std::size_t>(n);
  }
}

std::uint64_t RawFile::bytes_after(std::uint64_t relative_address) const {
  const std::uint64_t offset = addressing_.base_address + relative_address;
  if (relative_address > size_ || offset > size_) return 0;
  return size_ - offset;
}

std::optional<ChunkIndexParts> split_chunk_index(const RawFile& file, const DataLayout& layout,
                                                 const std::vector<std::uint64_t>& dims,
                                                 const std::vector<std::uint64_t>& max_dims,
                                                 std::size_t wanted_parts) {
  const std::uint64_t undefined = ~std::uint64_t{0};
  ChunkIndexParts parts;
  parts.kind = layout.index_kind;
  parts.rank = dims.size();
  switch (layout.index_kind) {
    case ChunkIndexKind::btree_v1:
      if (layout.index_address == undefined) return parts;  // no chunk written yet
      parts.grid = make_grid(file, layout, dims);
      split_btree_v1(file, layout.index_address, wanted_parts, parts);
      return parts;
    case ChunkIndexKind::single_chunk:
      if (layout.index_address == undefined) return parts;
      parts.grid = make_grid(file, layout, dims);
      parts.chunks_address = layout.index_address;
      parts.single_chunk_stored_bytes = layout.single_chunk_filtered ? layout.single_chunk_stored_bytes : parts.grid.chunk_bytes;
      parts.single_chunk_filter_mask = layout.single_chunk_filtered ? layout.single_chunk_filter_mask : 0;
      parts.parts.emplace_back();
      return parts;
    case ChunkIndexKind::implicit:
      if (layout.index_address == undefined) return parts;
      parts.grid = make_grid(file, layout, max_dims);
      if (parts.grid.chunk_bytes != 0 && parts.grid.chunk_count > file.size() / parts.grid.chunk_bytes) {
        corrupt(file, "implicit chunk index beyond the file");
      }
      parts.chunks_address = layout.index_address;
      parts.parts = ranges(parts.grid.chunk_count, wanted_parts, 1);
      return parts;
    case ChunkIndexKind::fixed_array:
      if (layout.index_address == undefined) return parts;
      parts.grid = make_grid(file, layout, max_dims);
      split_fixed_array(file, layout, wanted_parts, parts);
      return parts;
    case ChunkIndexKind::extensible_array:
    case ChunkIndexKind::btree_v2:
    case ChunkIndexKind::not_chunked:
      return std::nullopt;
  }
  return std::nullopt;
}

void visit_chunk_index_part(const RawFile& file, const ChunkIndexParts& parts, std::size_t part_number,
                            const ChunkVisitor& visit) {
  const ChunkIndexParts::Part& part = parts.parts.at(part_number);
  const std::uint64_t base_address = file.addressing().base_address;
  switch (parts.kind) {
    case ChunkIndexKind::btree_v1: {
      BtreeReader reader(file, parts.rank);
      reader.walk(part.address, part.level, parts.grid.chunk_count, visit);
      return;
    }
    case ChunkIndexKind::single_chunk: {
      const std::vector<std::uint64_t> offsets(parts.rank, 0);
      visit(offsets.data(), base_address + parts.chunks_address, parts.single_chunk_stored_bytes,
            parts.single_chunk_filter_mask);
      return;
    }
    case ChunkIndexKind::implicit: {
      std::vector<std::uint64_t> offsets(parts.rank);
      for (std::uint64_t index = part.first; index < part.first + part.count; ++index) {
        chunk_offsets(parts.grid, index, offsets.data());
        visit(offsets.data(), base_address + parts.chunks_address + index * parts.grid.chunk_bytes,
              parts.grid.chunk_bytes, 0);
      }
      return;
    }
    case ChunkIndexKind::fixed_array:
      visit_fixed_array_part(file, parts, part, visit);
      return;
    case ChunkIndexKind::extensible_array:
    case ChunkIndexKind::btree_v2:
    case ChunkIndexKind::not_chunked:
      break;
  }
  throw Error(ErrorKind::internal, "visit_chunk_index_part: no parts for this index kind");
}

bool visit_chunks(const RawFile& file, const DataLayout& layout, const std::vector<std::uint64_t>& dims,
                  const std::vector<std::uint64_t>& max_dims, const ChunkVisitor& visit) {
  const auto parts = split_chunk_index(file, layout, dims, max_dims, 1);
  if (!parts) return false;
  for (std::size_t part = 0; part < parts->parts.size(); ++part) visit_chunk_index_part(file, *parts, part, visit);
  return true;
}

}  // namespace quantem::catalog::detail
