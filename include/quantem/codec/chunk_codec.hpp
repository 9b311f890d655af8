#pragma once
// CPU reference codecs for stored detector chunks (host memory only, no CUDA).
//
// Formats (reference/arina-format-and-codecs.md §2, §1.9):
//  - bitshuffle_lz4 (HDF5 filter 32008, cd_values {major, minor, elem_size, block, 2}):
//    12-byte big-endian header (u64 total bytes, u32 block bytes), then per block
//    a u32 BE compressed length + an LZ4 raw block that decodes to the
//    bit-shuffled block, then (N mod 8) raw trailing elements.
//  - lz4 (HDF5 filter 32004): same 12-byte header, per block u32 BE length + LZ4
//    raw block (a block whose length equals the block size is stored raw); no shuffle.
//  - none: the chunk is the little-endian elements themselves.
//
// Every decoder validates every length and offset: a malformed stream throws
// quantem::CorruptChunk and never reads or writes out of bounds.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace quantem::codec {

enum class ChunkFilter : std::uint8_t { none, bitshuffle_lz4, lz4 };

struct ChunkFormat {
  ChunkFilter filter = ChunkFilter::none;
  std::size_t element_size = 2;  // bytes per element: 1, 2 or 4
};

// bitshuffle's default block size in elements for an element size:
// 8192 / element_size rounded down to a multiple of 8, at least 128.
std::size_t bitshuffle_default_block_elements(std::size_t element_size) noexcept;

// Decodes one stored chunk into `out`, which must be exactly the chunk's
// decoded size (element_count * element_size bytes). Throws CorruptChunk when
// the stream is malformed or does not decode to exactly out_bytes.
void decode_chunk(const ChunkFormat& format, const std::uint8_t* stored, std::size_t stored_bytes,
                  std::uint8_t* out, std::size_t out_bytes);

// Bit-transposes one bitshuffle block of `element_count` elements
// (a multiple of 8) from `in` to `out` (no overlap), and back.
void bitshuffle_block(const std::uint8_t* in, std::uint8_t* out, std::size_t element_count,
                      std::size_t element_size);
void bitunshuffle_block(const std::uint8_t* in, std::uint8_t* out, std::size_t element_count,
                        std::size_t element_size);

// Encodes little-endian elements as a bitshuffle+LZ4 chunk exactly as the
// official HDF5 filter does (byte-identical to bshuf_compress_lz4 with the same
// block size). block_elements = 0 selects the default block size.
std::vector<std::uint8_t> encode_bitshuffle_lz4(const std::uint8_t* elements, std::size_t element_count,
                                                std::size_t element_size, std::size_t block_elements = 0);

// Encodes little-endian elements as a plain-LZ4 (32004) chunk.
std::vector<std::uint8_t> encode_lz4(const std::uint8_t* data, std::size_t bytes,
                                     std::size_t block_bytes = 1u << 30);

}  // namespace quantem::codec
