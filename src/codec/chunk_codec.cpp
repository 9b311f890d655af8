// Chunk framing, decoding and encoding for bitshuffle+LZ4 (32008), plain LZ4
// (32004) and uncompressed chunks. The bit transposes live in bitshuffle.cpp.
#include "quantem/codec/chunk_codec.hpp"

#include <lz4.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "quantem/core/error.hpp"

namespace quantem::codec {
namespace {

constexpr std::size_t kHeaderBytes = 12;       // u64 BE total bytes, u32 BE block bytes
constexpr std::size_t kLengthFieldBytes = 4;   // u32 BE stored length before each block
constexpr std::size_t kElementsPerGroup = 8;   // bitshuffle works on multiples of 8 elements
constexpr std::size_t kLz4DefaultBlockBytes = std::size_t{1} << 30;  // HDF5 LZ4 filter default

std::uint64_t read_u64_be(const std::uint8_t* p) {
  std::uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | p[i];
  return value;
}

std::uint32_t read_u32_be(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
}

void write_u64_be(std::uint8_t* p, std::uint64_t value) {
  for (int i = 7; i >= 0; --i) {
    p[i] = static_cast<std::uint8_t>(value);
    value >>= 8;
  }
}

void write_u32_be(std::uint8_t* p, std::uint32_t value) {
  for (int i = 3; i >= 0; --i) {
    p[i] = static_cast<std::uint8_t>(value);
    value >>= 8;
  }
}

const char* filter_label(ChunkFilter filter) {
  switch (filter) {
    case ChunkFilter::bitshuffle_lz4:
      return "bitshuffle-lz4 chunk";
    case ChunkFilter::lz4:
      return "lz4 chunk";
    case ChunkFilter::none:
      break;
  }
  return "uncompressed chunk";
}

[[noreturn]] void corrupt(ChunkFilter filter, const std::string& what) {
  throw CorruptChunk(std::string(filter_label(filter)) + ": " + what);
}

std::string block_label(std::size_t block_index, std::size_t block_count, std::size_t length_offset) {
  return "block " + std::to_string(block_index) + " of " + std::to_string(block_count) + " (length field at offset " +
         std::to_string(length_offset) + ")";
}

std::size_t lz4_bound(std::size_t bytes) { return bytes + bytes / 255 + 16; }  // LZ4_COMPRESSBOUND

// Reads the u32 length of block `block_index` at `position` and checks that the
// block fits in the stored chunk. Returns the length; advances nothing.
std::size_t read_block_length(ChunkFilter filter, const std::uint8_t* stored, std::size_t stored_bytes,
                              std::size_t position, std::size_t block_index, std::size_t block_count,
                              std::size_t decoded_bytes) {
  const std::size_t left = stored_bytes - position;
  if (left < kLengthFieldBytes)
    corrupt(filter, block_label(block_index, block_count, position) + ": truncated length field, " +
                        std::to_string(left) + " bytes left in the " + std::to_string(stored_bytes) + "-byte chunk");
  const std::size_t length = read_u32_be(stored + position);
  if (length == 0) corrupt(filter, block_label(block_index, block_count, position) + ": compressed length is 0");
  if (length > left - kLengthFieldBytes)
    corrupt(filter, block_label(block_index, block_count, position) + ": length " + std::to_string(length) +
                        " runs past the end of the " + std::to_string(stored_bytes) + "-byte chunk (" +
                        std::to_string(left - kLengthFieldBytes) + " bytes left)");
  if (length > lz4_bound(decoded_bytes))
    corrupt(filter, block_label(block_index, block_count, position) + ": length " + std::to_string(length) +
                        " exceeds LZ4's bound " + std::to_string(lz4_bound(decoded_bytes)) + " for a " +
                        std::to_string(decoded_bytes) + "-byte block");
  if (decoded_bytes > static_cast<std::size_t>(LZ4_MAX_INPUT_SIZE))
    corrupt(filter, block_label(block_index, block_count, position) + ": block of " + std::to_string(decoded_bytes) +
                        " bytes exceeds LZ4's maximum block size");
  return length;
}

struct HeaderFields {
  std::size_t total_bytes = 0;
  std::size_t block_bytes = 0;
};

HeaderFields read_header(ChunkFilter filter, const std::uint8_t* stored, std::size_t stored_bytes,
                         std::size_t out_bytes) {
  if (stored_bytes < kHeaderBytes)
    corrupt(filter, "truncated header: " + std::to_string(stored_bytes) + " bytes stored, the header needs " +
                        std::to_string(kHeaderBytes));
  const std::uint64_t total = read_u64_be(stored);
  if (total != out_bytes)
    corrupt(filter, "header says " + std::to_string(total) + " decoded bytes, the chunk should decode to " +
                        std::to_string(out_bytes));
  return {out_bytes, read_u32_be(stored + 8)};
}

// Walks the framing of a stored chunk, calling on_block(index, StoredBlock)
// for each block in order, and returns the layout without the block list
// (tail fields filled). Validates everything parse_chunk_layout promises.
template <typename OnBlock>
ChunkLayout walk_chunk(const ChunkFormat& format, const std::uint8_t* stored, std::size_t stored_bytes,
                       std::size_t out_bytes, OnBlock&& on_block) {
  const ChunkFilter filter = format.filter;
  const std::size_t element_size = format.element_size;
  if (element_size == 0) throw internal_error("decode_chunk: element_size is 0");
  ChunkLayout layout;
  layout.decoded_bytes = out_bytes;

  if (filter == ChunkFilter::none) {
    if (stored_bytes != out_bytes)
      corrupt(filter, std::to_string(stored_bytes) + " bytes stored, expected " + std::to_string(out_bytes));
    on_block(std::size_t{0}, StoredBlock{0, stored_bytes, 0, out_bytes, true});
    return layout;
  }

  const HeaderFields header = read_header(filter, stored, stored_bytes, out_bytes);
  layout.block_bytes = header.block_bytes;
  std::size_t position = kHeaderBytes;

  if (filter == ChunkFilter::bitshuffle_lz4) {
    if (out_bytes % element_size != 0)
      corrupt(filter, "decoded size " + std::to_string(out_bytes) + " is not a multiple of the element size " +
                          std::to_string(element_size));
    if (header.block_bytes == 0 || header.block_bytes % element_size != 0 ||
        (header.block_bytes / element_size) % kElementsPerGroup != 0)
      corrupt(filter, "header block size " + std::to_string(header.block_bytes) +
                          " bytes is not a positive multiple of 8 elements of " + std::to_string(element_size) +
                          " bytes");
    const std::size_t element_count = out_bytes / element_size;
    const std::size_t block_elements = header.block_bytes / element_size;
    const std::size_t full_blocks = element_count / block_elements;
    const std::size_t leftover_elements = element_count % block_elements;
    const std::size_t partial_elements = leftover_elements - leftover_elements % kElementsPerGroup;
    const std::size_t block_count = full_blocks + (partial_elements > 0 ? 1 : 0);
    std::size_t decoded_offset = 0;
    for (std::size_t index = 0; index < block_count; ++index) {
      const std::size_t decoded_bytes = (index < full_blocks ? block_elements : partial_elements) * element_size;
      const std::size_t length =
          read_block_length(filter, stored, stored_bytes, position, index, block_count, decoded_bytes);
      on_block(index, StoredBlock{position + kLengthFieldBytes, length, decoded_offset, decoded_bytes, false});
      position += kLengthFieldBytes + length;
      decoded_offset += decoded_bytes;
    }
    const std::size_t tail_bytes = (element_count % kElementsPerGroup) * element_size;
    const std::size_t left = stored_bytes - position;
    if (left < tail_bytes)
      corrupt(filter, "truncated tail: " + std::to_string(element_count % kElementsPerGroup) +
                          " trailing elements need " + std::to_string(tail_bytes) + " bytes at offset " +
                          std::to_string(position) + ", " + std::to_string(left) + " left");
    if (left > tail_bytes)
      corrupt(filter, std::to_string(left - tail_bytes) + " unexpected bytes after the last block and tail (offset " +
                          std::to_string(position + tail_bytes) + " of " + std::to_string(stored_bytes) + ")");
    layout.tail_stored_offset = position;
    layout.tail_decoded_offset = decoded_offset;
    layout.tail_bytes = tail_bytes;
    return layout;
  }

  // Plain LZ4 (32004): the last block may be shorter; a block stored with a
  // length equal to its decoded size is raw.
  if (out_bytes > 0 && header.block_bytes == 0) corrupt(filter, "header block size is 0");
  const std::size_t block_bytes = std::min(header.block_bytes, out_bytes);
  const std::size_t block_count = out_bytes == 0 ? 0 : (out_bytes - 1) / block_bytes + 1;
  std::size_t decoded_offset = 0;
  for (std::size_t index = 0; index < block_count; ++index) {
    const std::size_t decoded_bytes = std::min(block_bytes, out_bytes - decoded_offset);
    const std::size_t length =
        read_block_length(filter, stored, stored_bytes, position, index, block_count, decoded_bytes);
    on_block(index,
             StoredBlock{position + kLengthFieldBytes, length, decoded_offset, decoded_bytes, length == decoded_bytes});
    position += kLengthFieldBytes + length;
    decoded_offset += decoded_bytes;
  }
  if (position != stored_bytes)
    corrupt(filter, std::to_string(stored_bytes - position) + " unexpected bytes after the last block (offset " +
                        std::to_string(position) + " of " + std::to_string(stored_bytes) + ")");
  layout.tail_stored_offset = position;
  layout.tail_decoded_offset = decoded_offset;
  return layout;
}

void decode_lz4_block(ChunkFilter filter, const std::uint8_t* stored, std::size_t index, const StoredBlock& block,
                      std::uint8_t* out) {
  const int decoded = LZ4_decompress_safe(reinterpret_cast<const char*>(stored + block.stored_offset),
                                          reinterpret_cast<char*>(out), static_cast<int>(block.stored_bytes),
                                          static_cast<int>(block.decoded_bytes));
  if (decoded < 0)
    corrupt(filter, "block " + std::to_string(index) + " (" + std::to_string(block.stored_bytes) +
                        " bytes at offset " + std::to_string(block.stored_offset) +
                        "): malformed LZ4 data (liblz4 error " + std::to_string(decoded) + ")");
  if (static_cast<std::size_t>(decoded) != block.decoded_bytes)
    corrupt(filter, "block " + std::to_string(index) + " (" + std::to_string(block.stored_bytes) +
                        " bytes at offset " + std::to_string(block.stored_offset) + "): LZ4 data decodes to " +
                        std::to_string(decoded) + " bytes, expected " + std::to_string(block.decoded_bytes));
}

void check_encodable_block(const char* function, std::size_t block_bytes) {
  if (block_bytes > static_cast<std::size_t>(LZ4_MAX_INPUT_SIZE) || block_bytes > UINT32_MAX)
    throw bad_request(std::string(function) + ": a block of " + std::to_string(block_bytes) +
                      " bytes is too large for LZ4");
}

// Appends one LZ4-compressed block (u32 BE length + data) to `out`; returns its compressed length.
std::size_t append_lz4_block(std::vector<std::uint8_t>& out, const std::uint8_t* data, std::size_t bytes) {
  const std::size_t position = out.size();
  const int capacity = LZ4_compressBound(static_cast<int>(bytes));
  out.resize(position + kLengthFieldBytes + static_cast<std::size_t>(capacity));
  const int compressed = LZ4_compress_default(reinterpret_cast<const char*>(data),
                                              reinterpret_cast<char*>(out.data() + position + kLengthFieldBytes),
                                              static_cast<int>(bytes), capacity);
  if (compressed <= 0) throw internal_error("LZ4_compress_default failed on a " + std::to_string(bytes) + "-byte block");
  write_u32_be(out.data() + position, static_cast<std::uint32_t>(compressed));
  out.resize(position + kLengthFieldBytes + static_cast<std::size_t>(compressed));
  return static_cast<std::size_t>(compressed);
}

std::vector<std::uint8_t>& thread_scratch() {
  thread_local std::vector<std::uint8_t> scratch;
  return scratch;
}

}  // namespace

std::size_t bitshuffle_default_block_elements(std::size_t element_size) noexcept {
  if (element_size == 0) return 0;
  std::size_t elements = 8192 / element_size;
  elements -= elements % kElementsPerGroup;
  return std::max<std::size_t>(elements, 128);
}

ChunkLayout parse_chunk_layout(const ChunkFormat& format, const std::uint8_t* stored, std::size_t stored_bytes,
                               std::size_t out_bytes) {
  std::vector<StoredBlock> blocks;
  ChunkLayout layout = walk_chunk(format, stored, stored_bytes, out_bytes,
                                  [&](std::size_t, const StoredBlock& block) { blocks.push_back(block); });
  layout.blocks = std::move(blocks);
  return layout;
}

void decode_chunk(const ChunkFormat& format, const std::uint8_t* stored, std::size_t stored_bytes,
                  std::uint8_t* out, std::size_t out_bytes) {
  const ChunkFilter filter = format.filter;
  const std::size_t element_size = format.element_size;
  if (filter == ChunkFilter::bitshuffle_lz4) {
    std::vector<std::uint8_t>& scratch = thread_scratch();
    const ChunkLayout layout =
        walk_chunk(format, stored, stored_bytes, out_bytes, [&](std::size_t index, const StoredBlock& block) {
          if (scratch.size() < block.decoded_bytes) scratch.resize(block.decoded_bytes);
          decode_lz4_block(filter, stored, index, block, scratch.data());
          bitunshuffle_block(scratch.data(), out + block.decoded_offset, block.decoded_bytes / element_size,
                             element_size);
        });
    if (layout.tail_bytes > 0)
      std::memcpy(out + layout.tail_decoded_offset, stored + layout.tail_stored_offset, layout.tail_bytes);
    return;
  }
  walk_chunk(format, stored, stored_bytes, out_bytes, [&](std::size_t index, const StoredBlock& block) {
    if (block.raw) {
      if (block.decoded_bytes > 0) std::memcpy(out + block.decoded_offset, stored + block.stored_offset, block.decoded_bytes);
    } else {
      decode_lz4_block(filter, stored, index, block, out + block.decoded_offset);
    }
  });
}

void append_bitshuffle_lz4(const std::uint8_t* elements, std::size_t element_count, std::size_t element_size,
                           std::vector<std::uint8_t>& out, std::size_t block_elements) {
  if (element_size == 0) throw bad_request("encode_bitshuffle_lz4: element_size is 0");
  if (block_elements == 0) block_elements = bitshuffle_default_block_elements(element_size);
  if (block_elements % kElementsPerGroup != 0)
    throw bad_request("encode_bitshuffle_lz4: block_elements " + std::to_string(block_elements) +
                      " is not a multiple of 8");
  if (block_elements > static_cast<std::size_t>(LZ4_MAX_INPUT_SIZE) / element_size)
    throw bad_request("encode_bitshuffle_lz4: a block of " + std::to_string(block_elements) + " elements of " +
                      std::to_string(element_size) + " bytes is too large for LZ4");
  const std::size_t block_bytes = block_elements * element_size;

  const std::size_t full_blocks = element_count / block_elements;
  const std::size_t leftover_elements = element_count % block_elements;
  const std::size_t partial_elements = leftover_elements - leftover_elements % kElementsPerGroup;
  const std::size_t tail_bytes = (element_count % kElementsPerGroup) * element_size;

  const std::size_t header_at = out.size();
  out.reserve(header_at + kHeaderBytes + full_blocks * (kLengthFieldBytes + lz4_bound(block_bytes)) +
              (kLengthFieldBytes + lz4_bound(partial_elements * element_size)) + tail_bytes);
  out.resize(header_at + kHeaderBytes);
  write_u64_be(out.data() + header_at, element_count * element_size);
  write_u32_be(out.data() + header_at + 8, static_cast<std::uint32_t>(block_bytes));

  thread_local std::vector<std::uint8_t> shuffled;  // one block, reused by every chunk of the thread
  shuffled.resize(std::min(block_elements, element_count) * element_size);
  const std::uint8_t* next = elements;
  for (std::size_t index = 0; index < full_blocks + (partial_elements > 0 ? 1 : 0); ++index) {
    const std::size_t count = index < full_blocks ? block_elements : partial_elements;
    bitshuffle_block(next, shuffled.data(), count, element_size);
    append_lz4_block(out, shuffled.data(), count * element_size);
    next += count * element_size;
  }
  out.insert(out.end(), next, next + tail_bytes);
}

std::vector<std::uint8_t> encode_bitshuffle_lz4(const std::uint8_t* elements, std::size_t element_count,
                                                std::size_t element_size, std::size_t block_elements) {
  std::vector<std::uint8_t> out;
  append_bitshuffle_lz4(elements, element_count, element_size, out, block_elements);
  return out;
}

std::vector<std::uint8_t> encode_lz4(const std::uint8_t* data, std::size_t bytes, std::size_t block_bytes) {
  if (block_bytes == 0) block_bytes = kLz4DefaultBlockBytes;
  block_bytes = std::min(block_bytes, bytes);
  check_encodable_block("encode_lz4", block_bytes);

  std::vector<std::uint8_t> out(kHeaderBytes);
  write_u64_be(out.data(), bytes);
  write_u32_be(out.data() + 8, static_cast<std::uint32_t>(block_bytes));
  for (std::size_t offset = 0; offset < bytes; offset += block_bytes) {
    const std::size_t this_block = std::min(block_bytes, bytes - offset);
    const std::size_t position = out.size();
    const std::size_t compressed = append_lz4_block(out, data + offset, this_block);
    if (compressed >= this_block) {  // LZ4 did not help: store raw, length == block size
      out.resize(position + kLengthFieldBytes + this_block);
      write_u32_be(out.data() + position, static_cast<std::uint32_t>(this_block));
      std::memcpy(out.data() + position + kLengthFieldBytes, data + offset, this_block);
    }
  }
  return out;
}

}  // namespace quantem::codec
