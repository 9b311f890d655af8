#pragma once
// GPU decode of bitshuffle/LZ4 chunks (HDF5 filter 32008), a batch at a time.
// CUDA-free header; implemented in kernels/codec/bitshuffle_lz4.cu.
//
// Format: the bitshuffle HDF5 filter's (12-byte big-endian header,
// per block a u32 BE length + an LZ4 raw block decoding to the bit-shuffled
// block, an optional partial block of (N mod block) rounded down to 8 elements,
// then (N mod 8) raw elements). The CPU reference is codec::decode_chunk.
//
// The unit of parallelism is the bitshuffle block: one lane parses a block's
// LZ4 tokens (every read and write bounds-checked) and records its sequences,
// then a warp replays them into shared memory, bit-unshuffles the block with
// a warp bit transpose and writes the elements coalesced. A malformed chunk
// never faults: it gets a non-ok ChunkStatus and its frame holds unspecified bytes.
#include <cstddef>
#include <cstdint>

#include "quantem/kernels/device.hpp"

namespace quantem::kernels {

// Per-chunk result, one uint32 per chunk in the status array. The first error
// found wins; ok means the frame was decoded exactly.
enum class ChunkStatus : std::uint32_t {
  ok = 0,
  header_truncated = 1,        // fewer than 12 stored bytes
  size_mismatch = 2,           // header total bytes != elements_per_chunk * element_size
  unsupported_block_size = 3,  // header block size != the batch's block size (or invalid)
  block_truncated = 4,         // a block length field or payload runs past the chunk
  lz4_corrupt = 5,             // malformed LZ4 sequence (bad offset, overrun, end-of-block rules)
  lz4_wrong_size = 6,          // an LZ4 block decoded to fewer bytes than its block
  trailing_bytes = 7,          // bytes left after the raw tail, or a short raw tail
  outside_staging = 8,         // offset + size runs past stored_bytes
};

const char* chunk_status_name(ChunkStatus status) noexcept;

// A batch of chunks staged in one device buffer, all decoding to the same size
// (one detector frame each).
struct BitshuffleLz4Batch {
  const std::uint8_t* d_stored = nullptr;          // device: the staged chunk bytes, 16-byte aligned
  std::uint64_t stored_bytes = 0;                  // readable bytes at d_stored (every read stays below)
  const std::uint64_t* d_chunk_offsets = nullptr;  // device: chunk i starts at d_stored + offset[i]
  const std::uint32_t* d_chunk_sizes = nullptr;    // device: stored bytes of chunk i
  std::size_t chunk_count = 0;
  std::size_t element_size = 2;         // 1, 2 or 4 bytes
  std::size_t elements_per_chunk = 0;   // decoded elements per chunk (detector pixels)
  std::size_t block_elements = 0;       // 0: bitshuffle's default (8192 bytes / element_size)
  std::uint8_t* d_decoded = nullptr;    // device: chunk i -> d_decoded + i * elements_per_chunk * element_size
  std::uint32_t* d_status = nullptr;    // device: one ChunkStatus per chunk (written for every chunk)
};

// Largest block the GPU decoder supports: 8192 bytes (the default for every
// element size, and what DECTRIS and h5py/hdf5plugin write).
inline constexpr std::size_t kMaxBitshuffleBlockBytes = 8192;

// Device scratch bytes decode_bitshuffle_lz4 needs for this batch shape: a
// block table of 8 bytes per block and the blocks' LZ4 sequence tables, 8
// bytes per 3 stored bytes (stored_bytes/3 + 2 entries: a block of n bytes has
// at most n/3 + 1 sequences). Throws quantem::Error(bad_request) for an
// invalid shape (element size, block size, zero elements).
std::size_t bitshuffle_lz4_scratch_bytes(const BitshuffleLz4Batch& batch);

// The decode's launch shape, chosen by the caller (benchmarks vary it; the
// defaults are what a load uses). check_bitshuffle_lz4_tuning throws
// quantem::Error(bad_request) for a value outside its range.
struct BitshuffleLz4Tuning {
  // Bitshuffle blocks each warp takes at a time (its lanes parse them side by
  // side): 1..32 forces a count; 0, the default,
  // bitshuffle_lz4_balanced_blocks_per_warp.
  int blocks_per_warp = 0;
  // The grid as a percentage of the CTAs the device holds at once (1..100; 0,
  // the default, is 100): leaves the encoder's kernels room beside the decode
  // during a load.
  int grid_percent = 0;
  // Replay a block's recorded sequences with the literals of 32 sequences
  // copied at once (true, the default) or sequence by sequence.
  bool batched_literals = true;
};
void check_bitshuffle_lz4_tuning(const BitshuffleLz4Tuning& tuning);

// The default blocks per warp of a decode of `total_blocks` blocks by
// `resident_warps` warps (the grid fills the GPU once and each warp walks its
// share): the rounds the warps need at 8 blocks each, then the fewest blocks
// per warp (1..8) that finish in as many rounds. A launch's time is its rounds
// times one round's parse and replay, and a round of fewer blocks replays less
// (for example 36,864 blocks over 3,168 warps: 2 rounds either way, 6 blocks
// per warp instead of 8).
std::uint32_t bitshuffle_lz4_balanced_blocks_per_warp(std::uint64_t total_blocks, std::uint64_t resident_warps);

// Enqueues the decode on `stream` (asynchronous: synchronise before reading
// d_decoded or d_status). d_scratch must hold bitshuffle_lz4_scratch_bytes().
// Chunks lying in d_stored in offset order, none overlapping the next (as a
// load stages them), get their sequences recorded; otherwise every block is
// decoded by a warp parsing it alone (no sequence table to share: more work
// per block, the same result).
// Throws CudaError on a launch failure and quantem::Error(bad_request) for an
// invalid batch or tuning; corrupt chunk data only ever shows in d_status.
void decode_bitshuffle_lz4(const BitshuffleLz4Batch& batch, void* d_scratch, std::size_t scratch_bytes,
                           StreamHandle stream, const BitshuffleLz4Tuning& tuning = {});

}  // namespace quantem::kernels

namespace quantem::kernels {

// --- Encode ------------------------------------------------------------------
//
// GPU encode of dense frames into bitshuffle/LZ4 chunks of the same format
// (what the decoder above, codec::decode_chunk and the official HDF5 filter
// read). The CPU reference is codec::encode_bitshuffle_lz4: the bit-shuffled
// blocks are bit-identical to its, and every chunk decodes to exactly its
// frame. The LZ4 blocks are valid LZ4 but not liblz4's bytes: a warp codes
// each block's runs of one repeated byte (the zero bit-planes and zero
// stretches of counting data) as matches of offset 1 and everything else as
// literals, so chunks are byte-for-byte deterministic and a little larger than
// liblz4's where the data repeats in longer patterns.

// Dense frames on the device to encode, one chunk each.
struct BitshuffleLz4EncodeBatch {
  const void* d_frames = nullptr;      // device: chunk_count frames of elements_per_chunk elements, contiguous
  std::size_t chunk_count = 0;
  std::size_t element_size = 2;        // 1, 2 or 4 bytes
  std::size_t elements_per_chunk = 0;  // elements per frame (at least 1)
  std::size_t block_elements = 0;      // 0: bitshuffle's default (8192 bytes / element_size); a multiple of 8
                                       // of at most kMaxBitshuffleBlockBytes bytes
};

// Largest stored chunk of one frame of this batch (header, every block at
// LZ4's bound with its length field, the raw tail). Throws
// quantem::Error(bad_request) for an invalid shape (as the calls below);
// d_frames is not read (sizes may be asked before the frames exist).
std::size_t bitshuffle_lz4_chunk_bound(const BitshuffleLz4EncodeBatch& batch);

// Device scratch bytes encode_bitshuffle_lz4 needs: one slot of LZ4's bound per
// block, the blocks' sizes and the chunks' sizes.
std::size_t bitshuffle_lz4_encode_scratch_bytes(const BitshuffleLz4EncodeBatch& batch);

// Enqueues the encode on `stream` (asynchronous). Chunk i is written at
// d_out + d_chunk_offsets[i], back to back in frame order;
// d_chunk_offsets holds chunk_count + 1 values (the last: total bytes).
// d_out must hold chunk_count * bitshuffle_lz4_chunk_bound(batch) bytes.
// Throws CudaError on a launch failure and quantem::Error(bad_request) for an
// invalid batch or too small a scratch.
void encode_bitshuffle_lz4(const BitshuffleLz4EncodeBatch& batch, void* d_scratch, std::size_t scratch_bytes,
                           std::uint8_t* d_out, std::uint64_t* d_chunk_offsets, StreamHandle stream);

}  // namespace quantem::kernels
