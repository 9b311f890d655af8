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

DataLayout decode_layout_message(const RawFile& file, const std::vector<std::uint8_t>& message) {
  Cursor cursor(file, message);
  DataLayout layout;
  layout.message_version = cursor.u8();
  const auto chunk_dims_from = [&](std::vector<std::uint64_t> dims) {
    if (dims.size() < 2) corrupt(file, "chunked layout with fewer than two dimensions");
    layout.element_size = dims.back();
    dims.pop_back();
    layout.chunk_dims = std::move(dims);
  };
  if (layout.message_version == 1 || layout.message_version == 2) {
    const unsigned dimensionality = cursor.u8();
    layout.layout_class = cursor.u8();
    cursor.skip(5);
    if (layout.layout_class != 0) {
      const auto address = cursor.address();
      layout.index_address = address.value_or(~std::uint64_t{0});
    }
    std::vector<std::uint64_t> dims(dimensionality);
    for (auto& d : dims) d = cursor.u32();
    if (layout.layout_class == 2) {
      layout.index_kind = ChunkIndexKind::btree_v1;
      chunk_dims_from(std::move(dims));
    }
    return layout;
  }
  if (layout.message_version != 3 && layout.message_version != 4) {
    corrupt(file, "unknown data layout message version " + std::to_string(layout.message_version));
  }
  layout.layout_class = cursor.u8();
  if (layout.layout_class != 2) return layout;  // compact, contiguous, virtual: not chunk-indexed

  if (layout.message_version == 3) {
    const unsigned dimensionality = cursor.u8();
    const auto address = cursor.address();
    layout.index_address = address.value_or(~std::uint64_t{0});
    std::vector<std::uint64_t> dims(dimensionality);
    for (auto& d : dims) d = cursor.u32();
    layout.index_kind = ChunkIndexKind::btree_v1;
    chunk_dims_from(std::move(dims));
    return layout;
  }

  // Version 4.
  const std::uint8_t flags = cursor.u8();
  const unsigned dimensionality = cursor.u8();
  const unsigned encoded_width = cursor.u8();
  if (encoded_width < 1 || encoded_width > 8) corrupt(file, "bad chunk dimension width");
  std::vector<std::uint64_t> dims(dimensionality);
  for (auto& d : dims) d = cursor.unsigned_value(encoded_width);
  chunk_dims_from(std::move(dims));
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
  const std::uint64_t offset = addressing_.base_address + relative_address;
  if (relative_address > size_ || offset > size_ || bytes > size_ - offset) {
    throw Error(ErrorKind::corrupt_data, "HDF5 metadata at address " + std::to_string(relative_address) + " (" +
                                             std::to_string(bytes) + " bytes) lies outside " + path_);
  }
  std::vector<std::uint8_t> buffer(bytes);
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

struct ChunkGrid {
  std::vector<std::uint64_t> chunk_dims;
  std::vector<std::uint64_t> chunks_per_dim;  // over the dims used to linearise the index
  std::uint64_t chunk_count = 1;
  std::uint64_t chunk_bytes = 0;

  ChunkGrid(const RawFile& file, const DataLayout& layout, const std::vector<std::uint64_t>& extent)
      : chunk_dims(layout.chunk_dims) {
    if (extent.size() != chunk_dims.size()) corrupt(file, "chunk rank differs from the dataset rank");
    chunk_bytes = layout.element_size;
    for (std::size_t d = 0; d < extent.size(); ++d) {
      if (chunk_dims[d] == 0) corrupt(file, "zero chunk dimension");
      const std::uint64_t count = extent[d] / chunk_dims[d] + (extent[d] % chunk_dims[d] != 0);
      chunks_per_dim.push_back(count);
      if (count != 0 && chunk_count > (std::uint64_t{1} << 48) / count) corrupt(file, "chunk grid too large");
      chunk_count *= count;
      chunk_bytes *= chunk_dims[d];
    }
  }

  // Element offsets of the chunk with row-major linear index `index`.
  void offsets_of(std::uint64_t index, std::vector<std::uint64_t>& offsets) const {
    offsets.resize(chunk_dims.size());
    for (std::size_t d = chunk_dims.size(); d-- > 0;) {
      const std::uint64_t per = chunks_per_dim[d] ? chunks_per_dim[d] : 1;
      offsets[d] = (index % per) * chunk_dims[d];
      index /= per;
    }
  }
};

void walk_btree_v1(const RawFile& file, std::uint64_t address, int expected_level, std::size_t depth,
                   std::size_t rank, std::uint64_t max_chunks, std::uint64_t& visited, const ChunkVisitor& visit) {
  if (depth > kMaxBtreeDepth) corrupt(file, "B-tree too deep");
  const std::size_t offset_size = file.addressing().offset_size;
  const std::size_t node_header_bytes = 8 + 2 * offset_size;
  const auto header = file.read(address, node_header_bytes);
  Cursor cursor(file, header);
  if (!cursor.signature("TREE")) corrupt(file, "B-tree node without TREE signature");
  const unsigned node_type = cursor.u8();
  const int level = cursor.u8();
  const unsigned entries = cursor.u16();
  if (node_type != 1) corrupt(file, "chunk B-tree node of type " + std::to_string(node_type));
  if (expected_level >= 0 && level != expected_level) corrupt(file, "B-tree levels are inconsistent");

  const std::size_t key_bytes = 8 + 8 * (rank + 1);
  const std::size_t body_bytes = entries * (key_bytes + offset_size) + key_bytes;
  const auto body = file.read(address + node_header_bytes, body_bytes);
  Cursor entry(file, body);
  std::vector<std::uint64_t> offsets(rank);
  for (unsigned i = 0; i < entries; ++i) {
    const std::uint32_t stored_bytes = entry.u32();
    const std::uint32_t filter_mask = entry.u32();
    for (std::size_t d = 0; d < rank; ++d) offsets[d] = entry.unsigned_value(8);
    entry.skip(8);  // the element-size dimension, always 0
    const auto child = entry.address();
    if (!child) corrupt(file, "B-tree entry with an undefined address");
    if (level == 0) {
      if (++visited > max_chunks) corrupt(file, "B-tree holds more chunks than the dataset has");
      visit(offsets.data(), file.addressing().base_address + *child, stored_bytes, filter_mask);
    } else {
      walk_btree_v1(file, *child, level - 1, depth + 1, rank, max_chunks, visited, visit);
    }
  }
}

void walk_fixed_array(const RawFile& file, const DataLayout& layout, const ChunkGrid& grid, const ChunkVisitor& visit) {
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
  if (entry_count != grid.chunk_count) corrupt(file, "fixed array size differs from the chunk grid");
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
  std::vector<std::uint8_t> bitmap(prefix.begin() + static_cast<std::ptrdiff_t>(block_prefix_bytes), prefix.end());

  std::vector<std::uint64_t> offsets;
  const auto visit_entries = [&](const std::vector<std::uint8_t>& bytes, std::uint64_t first_index,
                                 std::uint64_t count) {
    Cursor entry(file, bytes);
    for (std::uint64_t i = 0; i < count; ++i) {
      const std::size_t start = entry.position();
      const auto chunk_address = entry.address();
      std::uint64_t stored_bytes = grid.chunk_bytes;
      std::uint32_t filter_mask = 0;
      if (client == 1) {
        stored_bytes = entry.unsigned_value(entry_bytes - offset_size - 4);
        filter_mask = entry.u32();
      }
      entry.seek(start + entry_bytes);
      if (!chunk_address) continue;  // never written
      grid.offsets_of(first_index + i, offsets);
      visit(offsets.data(), file.addressing().base_address + *chunk_address, stored_bytes, filter_mask);
    }
  };

  if (!paged) {
    visit_entries(file.read(*block_address + block_prefix_bytes, static_cast<std::size_t>(entry_count * entry_bytes)),
                  0, entry_count);
    return;
  }
  // Paged: prefix + bitmap + checksum, then pages of (entries + checksum).
  const std::uint64_t pages_begin = *block_address + block_prefix_bytes + bitmap_bytes + 4;
  const std::uint64_t full_page_bytes = page_entries * entry_bytes + 4;
  for (std::uint64_t page = 0; page < page_count; ++page) {
    const bool initialised = (bitmap[page / 8] & (0x80u >> (page % 8))) != 0;
    if (!initialised) continue;
    const std::uint64_t first = page * page_entries;
    const std::uint64_t count = std::min(page_entries, entry_count - first);
    visit_entries(file.read(pages_begin + page * full_page_bytes, static_cast<std::size_t>(count * entry_bytes)),
                  first, count);
  }
}

}  // namespace

bool visit_chunks(const RawFile& file, const DataLayout& layout, const std::vector<std::uint64_t>& dims,
                  const std::vector<std::uint64_t>& max_dims, const ChunkVisitor& visit) {
  const std::uint64_t undefined = ~std::uint64_t{0};
  switch (layout.index_kind) {
    case ChunkIndexKind::btree_v1: {
      if (layout.index_address == undefined) return true;  // no chunk written yet
      const ChunkGrid grid(file, layout, dims);
      std::uint64_t visited = 0;
      walk_btree_v1(file, layout.index_address, -1, 0, dims.size(), grid.chunk_count, visited, visit);
      return true;
    }
    case ChunkIndexKind::single_chunk: {
      if (layout.index_address == undefined) return true;
      const ChunkGrid grid(file, layout, dims);
      std::vector<std::uint64_t> offsets(dims.size(), 0);
      visit(offsets.data(), file.addressing().base_address + layout.index_address,
            layout.single_chunk_filtered ? layout.single_chunk_stored_bytes : grid.chunk_bytes,
            layout.single_chunk_filtered ? layout.single_chunk_filter_mask : 0);
      return true;
    }
    case ChunkIndexKind::implicit: {
      if (layout.index_address == undefined) return true;
      const ChunkGrid grid(file, layout, max_dims);
      if (grid.chunk_count * grid.chunk_bytes > file.size()) corrupt(file, "implicit chunk index beyond the file");
      std::vector<std::uint64_t> offsets;
      for (std::uint64_t index = 0; index < grid.chunk_count; ++index) {
        grid.offsets_of(index, offsets);
        visit(offsets.data(), file.addressing().base_address + layout.index_address + index * grid.chunk_bytes,
              grid.chunk_bytes, 0);
      }
      return true;
    }
    case ChunkIndexKind::fixed_array: {
      if (layout.index_address == undefined) return true;
      const ChunkGrid grid(file, layout, max_dims);
      walk_fixed_array(file, layout, grid, visit);
      return true;
    }
    case ChunkIndexKind::extensible_array:
    case ChunkIndexKind::btree_v2:
    case ChunkIndexKind::not_chunked:
      return false;
  }
  return false;
}

}  // namespace quantem::catalog::detail
