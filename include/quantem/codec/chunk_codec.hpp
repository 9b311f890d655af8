#pragma once
// CPU reference codecs for stored detector chunks (host memory only, no CUDA).
//
// Formats (the bitshuffle HDF5 filter's, kiyo-masui/bitshuffle src/bshuf_h5filter.c;
// the HDF5 LZ4 filter's):
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
  std::size_t element_size = 2;  // bytes per element: 1, 2, 4 (fast paths) or any other positive size
};

// bitshuffle's default block size in elements for an element size:
// 8192 / element_size rounded down to a multiple of 8, at least 128.
std::size_t bitshuffle_default_block_elements(std::size_t element_size) noexcept;

// Where the pieces of one stored chunk lie, as validated by parse_chunk_layout.
struct StoredBlock {
  std::size_t stored_offset = 0;   // offset in the stored chunk of the block's data (after its u32 length)
  std::size_t stored_bytes = 0;    // the u32 BE length: compressed bytes (or raw bytes when `raw`)
  std::size_t decoded_offset = 0;  // offset of the block's bytes in the decoded chunk
  std::size_t decoded_bytes = 0;   // bytes the block decodes to
  bool raw = false;                // lz4 (32004) only: stored_bytes == decoded_bytes, copied verbatim
};

struct ChunkLayout {
  std::size_t decoded_bytes = 0;  // the header's total (== out_bytes)
  std::size_t block_bytes = 0;    // the header's block size in bytes (bitshuffle_lz4, lz4)
  std::vector<StoredBlock> blocks;
  // bitshuffle_lz4: the (N mod 8) trailing elements, stored raw at the end of the chunk.
  std::size_t tail_stored_offset = 0;
  std::size_t tail_decoded_offset = 0;
  std::size_t tail_bytes = 0;
};

// Validates the framing of a stored chunk (header, every block length and
// offset, the raw tail, no bytes left over) without decoding the LZ4 data, and
// returns where each block lies. For `none` the layout is one raw block.
// Throws CorruptChunk exactly when decode_chunk would for framing reasons;
// decode_chunk additionally checks that every LZ4 block decodes to exactly its
// decoded_bytes.
//
// Strictness beyond the official filter: the header's block size must be
// positive (total > 0) and, for bitshuffle_lz4, a multiple of 8 elements; the
// header's total must equal out_bytes; trailing bytes after the last block are
// rejected.
ChunkLayout parse_chunk_layout(const ChunkFormat& format, const std::uint8_t* stored, std::size_t stored_bytes,
                               std::size_t out_bytes);

// Decodes one stored chunk into `out`, which must be exactly the chunk's
// decoded size (element_count * element_size bytes). Throws CorruptChunk when
// the stream is malformed or does not decode to exactly out_bytes; `out` may
// then hold partial output. Throws quantem::Error (internal) when
// format.element_size is 0. Thread-safe: the only state is a thread-local
// scratch buffer of one block. Element sizes other than 1, 2 and 4 decode
// through a slower portable path.
void decode_chunk(const ChunkFormat& format, const std::uint8_t* stored, std::size_t stored_bytes,
                  std::uint8_t* out, std::size_t out_bytes);

// Bit-transposes one bitshuffle block of `element_count` elements
// (a multiple of 8) from `in` to `out` (no overlap), and back. Both throw
// quantem::Error (internal) when element_count is not a multiple of 8 or
// element_size is 0. Element sizes 1, 2 and 4 take an SSE2 or (chosen at run
// time) AVX2 path on x86-64; other sizes a portable 64-bit path.
void bitshuffle_block(const std::uint8_t* in, std::uint8_t* out, std::size_t element_count,
                      std::size_t element_size);
void bitunshuffle_block(const std::uint8_t* in, std::uint8_t* out, std::size_t element_count,
                        std::size_t element_size);

// Encodes little-endian elements as a bitshuffle+LZ4 chunk exactly as the
// official HDF5 filter does: header, then each full block and the partial last
// block (rounded down to 8 elements) bit-shuffled and compressed with
// LZ4_compress_default, then the (N mod 8) trailing elements raw. With the same
// block size and the same liblz4 the bytes are identical to bshuf_compress_lz4.
// block_elements = 0 selects the default block size. Throws quantem::Error
// (bad_request) when block_elements is not a multiple of 8 or a block is too
// large for the format (u32 block bytes, LZ4's ~2 GB input limit).
std::vector<std::uint8_t> encode_bitshuffle_lz4(const std::uint8_t* elements, std::size_t element_count,
                                                std::size_t element_size, std::size_t block_elements = 0);
// The same chunk appended to `out` (its capacity reused across chunks).
void append_bitshuffle_lz4(const std::uint8_t* elements, std::size_t element_count, std::size_t element_size,
                           std::vector<std::uint8_t>& out, std::size_t block_elements = 0);

// Encodes bytes as a plain-LZ4 (32004) chunk like the HDF5 LZ4 filter: the
// block size (0 = the filter's default, 1 GiB) is clamped to the data size and
// written to the header; a block that LZ4 does not shrink is stored raw with
// its length equal to its size. Throws quantem::Error (bad_request) when a
// block is too large for LZ4.
std::vector<std::uint8_t> encode_lz4(const std::uint8_t* data, std::size_t bytes,
                                     std::size_t block_bytes = 1u << 30);

}  // namespace quantem::codec
