// GPU bitshuffle/LZ4 decode: public call -> dispatch -> two thin kernels.
//
//  1. index kernel, one thread per chunk: validates the 12-byte header, walks
//     the u32 BE block lengths (each bounded by the chunk), writes a block
//     table (payload offset, length) and copies the raw tail elements.
//     It also clears the flag that lets the block kernel record sequences,
//     when a chunk's bytes overlap the next chunk's (never in a load).
//  2. block kernel, a warp per 32 bitshuffle blocks: each lane parses one
//     block's LZ4 tokens (every check of lz4_decode_block) and records its
//     sequences in the scratch; then the warp replays each block's sequences
//     into shared memory, unshuffles it with a warp bit transpose and stores
//     it coalesced. Errors go to the chunk's status with atomicCAS (first
//     error wins); nothing ever faults.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "quantem/core/error.hpp"
#include "quantem/core/host_device.hpp"
#include "quantem/kernels/bitshuffle_lz4.hpp"
#include "quantem/kernels/cuda_check.hpp"
#include "bitshuffle.cuh"
#include "chunk_layout.cuh"
#include "lz4_block.cuh"
#include "../common/tuning.cuh"

namespace quantem::kernels {

const char* chunk_status_name(ChunkStatus status) noexcept {
  switch (status) {
    case ChunkStatus::ok: return "ok";
    case ChunkStatus::header_truncated: return "header_truncated";
    case ChunkStatus::size_mismatch: return "size_mismatch";
    case ChunkStatus::unsupported_block_size: return "unsupported_block_size";
    case ChunkStatus::block_truncated: return "block_truncated";
    case ChunkStatus::lz4_corrupt: return "lz4_corrupt";
    case ChunkStatus::lz4_wrong_size: return "lz4_wrong_size";
    case ChunkStatus::trailing_bytes: return "trailing_bytes";
    case ChunkStatus::outside_staging: return "outside_staging";
  }
  return "unknown";
}

namespace {

constexpr std::uint32_t kHeaderBytes = device::kChunkHeaderBytes;
using device::ChunkLayout;

ChunkLayout make_layout(const BitshuffleLz4Batch& batch) {
  return device::make_chunk_layout(batch.elements_per_chunk, batch.element_size, batch.block_elements,
                                   "bitshuffle/LZ4 decode");
}

__device__ std::uint32_t load_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

// Where block payloads' sequence tables go: the payload at byte p (>= 16:
// after the chunk header and its length field) of a block of n bytes gets the
// table entries from (p - 4) / 3 on, n / 3 + 1 of them, so blocks whose bytes
// (with their length fields) do not overlap get tables that do not overlap.
QUANTEM_HOST_DEVICE constexpr std::uint64_t sequence_table_entries(std::uint64_t stored_bytes) {
  return stored_bytes / 3 + 2;
}
__device__ inline std::uint64_t sequence_table_start(std::uint64_t payload) { return (payload - 4) / 3; }

__global__ void __launch_bounds__(device::tuning::kBslz4IndexThreads)
    index_chunks_kernel(const std::uint8_t* __restrict__ stored, std::uint64_t stored_bytes,
                        const std::uint64_t* __restrict__ chunk_offsets,
                        const std::uint32_t* __restrict__ chunk_sizes, std::size_t chunk_count, ChunkLayout layout,
                        uint2* __restrict__ block_table, std::uint8_t* __restrict__ decoded,
                        std::uint32_t* __restrict__ status, std::uint32_t* __restrict__ overlapping) {
  for (std::size_t chunk = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; chunk < chunk_count;
       chunk += std::size_t{gridDim.x} * blockDim.x) {
    const std::uint64_t offset = chunk_offsets[chunk];
    const std::uint8_t* base = stored + offset;
    const std::uint32_t size = chunk_sizes[chunk];
    // The sequence tables need every chunk's bytes apart from the next one's
    // (in a load they lie back to back in offset order).
    if (chunk + 1 < chunk_count && chunk_offsets[chunk + 1] < offset + size) atomicOr(overlapping, 1u);
    ChunkStatus result = ChunkStatus::ok;
    if (offset > stored_bytes || size > stored_bytes - offset) {
      result = ChunkStatus::outside_staging;
    } else if (size < kHeaderBytes) {
      result = ChunkStatus::header_truncated;
    } else {
      const std::uint64_t total_bytes = (std::uint64_t{load_be32(base)} << 32) | load_be32(base + 4);
      const std::uint32_t block_bytes = load_be32(base + 8);
      if (total_bytes != layout.elements_per_chunk * layout.element_size) {
        result = ChunkStatus::size_mismatch;
      } else if (block_bytes != layout.block_elements * layout.element_size) {
        result = ChunkStatus::unsupported_block_size;
      } else {
        std::uint32_t position = kHeaderBytes;
        uint2* table = block_table + chunk * layout.blocks_per_chunk;
        for (std::uint32_t block = 0; block < layout.blocks_per_chunk; ++block) {
          if (size - position < 4) {
            result = ChunkStatus::block_truncated;
            break;
          }
          const std::uint32_t length = load_be32(base + position);
          position += 4;
          if (length > size - position) {
            result = ChunkStatus::block_truncated;
            break;
          }
          const std::uint32_t block_bytes_decoded =
              (block < layout.full_blocks ? layout.block_elements : layout.partial_block_elements) *
              layout.element_size;
          if (length == 0 || length > block_bytes_decoded + block_bytes_decoded / 255 + 16) {
            result = ChunkStatus::lz4_corrupt;  // empty, or beyond LZ4_COMPRESSBOUND (as the CPU reference)
            break;
          }
          table[block] = make_uint2(position, length);
          position += length;
        }
        if (result == ChunkStatus::ok) {
          const std::uint32_t tail_bytes = layout.tail_elements * layout.element_size;
          if (size - position != tail_bytes) {
            result = ChunkStatus::trailing_bytes;
          } else {
            std::uint8_t* out = decoded + chunk * layout.elements_per_chunk * layout.element_size +
                                (layout.elements_per_chunk - layout.tail_elements) * layout.element_size;
            for (std::uint32_t i = 0; i < tail_bytes; ++i) out[i] = base[position + i];
          }
        }
      }
    }
    status[chunk] = static_cast<std::uint32_t>(result);
  }
}

// The block at global index `global_block` of the batch.
struct BlockAt {
  std::uint64_t chunk;
  std::uint32_t block;
  std::uint32_t output_bytes;
};
__device__ inline BlockAt block_at(std::uint64_t global_block, const ChunkLayout& layout, std::uint32_t element_bytes) {
  BlockAt at;
  at.chunk = global_block / layout.blocks_per_chunk;
  at.block = static_cast<std::uint32_t>(global_block - at.chunk * layout.blocks_per_chunk);
  at.output_bytes =
      (at.block < layout.full_blocks ? layout.block_elements : layout.partial_block_elements) * element_bytes;
  return at;
}

__device__ inline void flag_chunk(std::uint32_t* status, std::uint64_t chunk, device::Lz4Result result) {
  const ChunkStatus code = result == device::Lz4Result::wrong_size ? ChunkStatus::lz4_wrong_size : ChunkStatus::lz4_corrupt;
  atomicCAS(status + chunk, static_cast<std::uint32_t>(ChunkStatus::ok), static_cast<std::uint32_t>(code));
}

// Each warp takes `batch` (kBslz4BlocksPerWarp) consecutive blocks at a time (a
// grid-stride loop over a grid that fills the GPU once). Phase 1: lane l
// parses block first + l alone (RecordingLz4Io: the checks of
// lz4_decode_block, the sequences into the scratch). Phase 2: the warp
// replays each parsed block into its 8 KiB shared buffer and unshuffles it.
// Parsing is the serial part of LZ4: blocks parsed side by side by lanes
// take a fraction of the instructions of one warp parsing each in turn.
// With `overlapping` set (chunks whose bytes overlap: their tables would),
// every block is decoded the older way instead: the whole warp runs
// lz4_decode_block on one block at a time.
template <int kElementBytes>
__global__ void __launch_bounds__(device::tuning::kBslz4WarpsPerCta * 32)
    decode_blocks_kernel(const std::uint8_t* __restrict__ stored, const std::uint64_t* __restrict__ chunk_offsets,
                         std::size_t chunk_count, ChunkLayout layout, const uint2* __restrict__ block_table,
                         device::Lz4Sequence* sequences, const std::uint32_t* __restrict__ overlapping,
                         std::uint8_t* __restrict__ decoded, std::uint32_t* status, std::uint32_t batch,
                         bool batched_literals) {
  using Element = typename device::ElementType<kElementBytes>::type;
  extern __shared__ __align__(16) std::uint8_t warp_areas[];  // 8 KiB of output per warp
  const std::uint32_t warp = threadIdx.x / 32;
  const std::uint32_t lane = threadIdx.x % 32;
  std::uint8_t* buffer = warp_areas + std::size_t{warp} * kMaxBitshuffleBlockBytes;
  const std::uint64_t total_blocks = std::uint64_t{chunk_count} * layout.blocks_per_chunk;
  const bool record = *overlapping == 0;
  constexpr std::uint32_t kNotDecoded = 0xffffffffu;
  for (std::uint64_t first = (std::uint64_t{blockIdx.x} * device::tuning::kBslz4WarpsPerCta + warp) * batch;
       first < total_blocks; first += std::uint64_t{gridDim.x} * device::tuning::kBslz4WarpsPerCta * batch) {
    // Phase 1: this lane's block, parsed and recorded (or only looked up).
    std::uint32_t mine = kNotDecoded;  // the block's sequence count, or 0 for the warp to parse (overlapping)
    std::uint64_t payload = 0;
    const std::uint64_t global_block = first + lane;
    if (lane < batch && global_block < total_blocks) {
      const BlockAt at = block_at(global_block, layout, kElementBytes);
      if (*static_cast<volatile std::uint32_t*>(status + at.chunk) == static_cast<std::uint32_t>(ChunkStatus::ok)) {
        const uint2 entry = block_table[global_block];
        payload = chunk_offsets[at.chunk] + entry.x;
        if (!record) {
          mine = 0;
        } else {
          device::RecordingLz4Io io{stored + payload, sequences + sequence_table_start(payload)};
          const device::Lz4Result result = device::lz4_decode_block(io, entry.y, at.output_bytes);
          if (result == device::Lz4Result::ok) {
            io.finish();
            mine = io.count;
          } else {
            flag_chunk(status, at.chunk, result);
          }
        }
      }
    }
    __syncwarp();  // the recorded sequences are visible to the warp
    // Phase 2: every parsed block in turn, by the whole warp.
    for (std::uint32_t k = 0; k < batch; ++k) {
      const std::uint32_t count = __shfl_sync(0xffffffffu, mine, k);
      if (count == kNotDecoded) continue;
      const std::uint64_t block_payload =
          (std::uint64_t{__shfl_sync(0xffffffffu, static_cast<std::uint32_t>(payload >> 32), k)} << 32) |
          __shfl_sync(0xffffffffu, static_cast<std::uint32_t>(payload), k);
      const BlockAt at = block_at(first + k, layout, kElementBytes);
      if (record && batched_literals) {
        device::replay_lz4_sequences_batched(sequences + sequence_table_start(block_payload), count,
                                              stored + block_payload, buffer, lane);
      } else if (record) {
        device::replay_lz4_sequences(sequences + sequence_table_start(block_payload), count, stored + block_payload,
                                      buffer, lane);
      } else {
        device::WarpLz4Io io{stored + block_payload, buffer, lane};
        const device::Lz4Result result = device::lz4_decode_block(io, block_table[first + k].y, at.output_bytes);
        if (result != device::Lz4Result::ok) {
          if (lane == 0) flag_chunk(status, at.chunk, result);
          continue;
        }
      }
      Element* out = reinterpret_cast<Element*>(decoded + at.chunk * layout.elements_per_chunk * kElementBytes) +
                     std::uint64_t{at.block} * layout.block_elements;
      device::bitunshuffle_block_warp<kElementBytes>(buffer, at.output_bytes / kElementBytes, out, lane);
      __syncwarp();  // the buffer is rewritten by the next block
    }
  }
}

constexpr std::size_t kDecodeSharedBytes = device::tuning::kBslz4WarpsPerCta * kMaxBitshuffleBlockBytes;

// CTAs of decode_blocks_kernel<element bytes> that fit the current device at
// once (asked once per device and element size).
std::uint64_t resident_decode_ctas(std::uint32_t element_bytes) {
  int device = 0;
  QUANTEM_CUDA_TRY(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<int, std::uint32_t>, std::uint64_t> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, element_bytes);
  auto it = known.find(key);
  if (it == known.end()) {
    const int sms = current_sm_count();
    int per_sm = 0;
    const int threads = device::tuning::kBslz4WarpsPerCta * 32;
    if (element_bytes == 1) {
      QUANTEM_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_blocks_kernel<1>, threads, kDecodeSharedBytes));
    } else if (element_bytes == 2) {
      QUANTEM_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_blocks_kernel<2>, threads, kDecodeSharedBytes));
    } else {
      QUANTEM_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_blocks_kernel<4>, threads, kDecodeSharedBytes));
    }
    it = known.emplace(key, std::uint64_t(std::max(sms, 1)) * std::uint64_t(std::max(per_sm, 1))).first;
  }
  return it->second;
}

// Scratch: the block table, the overlap flag, the sequence tables.
struct ScratchParts {
  std::size_t block_table = 0, overlapping = 0, sequences = 0, total = 0;
};
ScratchParts scratch_parts(const BitshuffleLz4Batch& batch, const ChunkLayout& layout) {
  ScratchParts parts;
  parts.block_table = 0;
  parts.overlapping = (batch.chunk_count * std::size_t{layout.blocks_per_chunk} * sizeof(uint2) + 15) / 16 * 16;
  parts.sequences = parts.overlapping + 16;
  parts.total = parts.sequences + sequence_table_entries(batch.stored_bytes) * sizeof(device::Lz4Sequence);
  return parts;
}

}  // namespace

void check_bitshuffle_lz4_tuning(const BitshuffleLz4Tuning& tuning) {
  if (tuning.blocks_per_warp < 0 || tuning.blocks_per_warp > 32)
    throw bad_request("bitshuffle/LZ4 blocks per warp: 0 (the default) or 1..32");
  if (tuning.grid_percent < 0 || tuning.grid_percent > 100)
    throw bad_request("bitshuffle/LZ4 grid percent: 0 (the default) or 1..100");
}

std::uint32_t bitshuffle_lz4_balanced_blocks_per_warp(std::uint64_t total_blocks, std::uint64_t resident_warps) {
  const std::uint64_t most = device::tuning::kBslz4BlocksPerWarp;
  const std::uint64_t warps = std::max<std::uint64_t>(resident_warps, 1);
  // The rounds the resident warps need at the most blocks per warp, then the
  // fewest blocks per warp that still finish in that many rounds.
  const std::uint64_t rounds = std::max<std::uint64_t>((total_blocks + most * warps - 1) / (most * warps), 1);
  const std::uint64_t blocks = (total_blocks + rounds * warps - 1) / (rounds * warps);
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(blocks, 1, most));
}

std::size_t bitshuffle_lz4_scratch_bytes(const BitshuffleLz4Batch& batch) {
  return scratch_parts(batch, make_layout(batch)).total;
}

void decode_bitshuffle_lz4(const BitshuffleLz4Batch& batch, void* d_scratch, std::size_t scratch_bytes,
                           StreamHandle stream, const BitshuffleLz4Tuning& tuning) {
  check_bitshuffle_lz4_tuning(tuning);
  const ChunkLayout layout = make_layout(batch);
  if (batch.chunk_count == 0) return;
  if (scratch_bytes < bitshuffle_lz4_scratch_bytes(batch))
    throw bad_request("bitshuffle/LZ4 decode: scratch smaller than bitshuffle_lz4_scratch_bytes()");
  if (batch.d_stored == nullptr || batch.d_chunk_offsets == nullptr || batch.d_chunk_sizes == nullptr ||
      batch.d_decoded == nullptr || batch.d_status == nullptr)
    throw bad_request("bitshuffle/LZ4 decode: null device pointer in the batch");
  if (reinterpret_cast<std::uintptr_t>(batch.d_stored) % 16 != 0)
    throw bad_request("bitshuffle/LZ4 decode: d_stored must be 16-byte aligned");
  const ScratchParts parts = scratch_parts(batch, layout);
  auto* scratch = static_cast<std::uint8_t*>(d_scratch);
  auto* block_table = reinterpret_cast<uint2*>(scratch + parts.block_table);
  auto* overlapping = reinterpret_cast<std::uint32_t*>(scratch + parts.overlapping);
  auto* sequences = reinterpret_cast<device::Lz4Sequence*>(scratch + parts.sequences);
  QUANTEM_CUDA_TRY(cudaMemsetAsync(overlapping, 0, 4, stream));

  const std::size_t index_ctas_needed =
      (batch.chunk_count + device::tuning::kBslz4IndexThreads - 1) / device::tuning::kBslz4IndexThreads;
  const unsigned index_ctas = static_cast<unsigned>(
      index_ctas_needed < device::tuning::kBslz4IndexMaxCtas ? index_ctas_needed : device::tuning::kBslz4IndexMaxCtas);
  index_chunks_kernel<<<index_ctas, device::tuning::kBslz4IndexThreads, 0, stream>>>(
      batch.d_stored, batch.stored_bytes, batch.d_chunk_offsets, batch.d_chunk_sizes, batch.chunk_count, layout,
      block_table, batch.d_decoded, batch.d_status, overlapping);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "index_chunks_kernel");

  const std::uint64_t total_blocks = std::uint64_t{batch.chunk_count} * layout.blocks_per_chunk;
  if (total_blocks == 0) return;
  const int percent = tuning.grid_percent;
  const std::uint64_t ctas_resident = std::max<std::uint64_t>(  // the GPU filled once (by default)
      1, resident_decode_ctas(layout.element_size) * static_cast<std::uint64_t>(percent == 0 ? 100 : percent) / 100);
  const int forced = tuning.blocks_per_warp;
  const std::uint32_t batch_blocks =
      forced != 0 ? static_cast<std::uint32_t>(forced)
                  : bitshuffle_lz4_balanced_blocks_per_warp(total_blocks, ctas_resident * device::tuning::kBslz4WarpsPerCta);
  const std::uint64_t blocks_per_cta = std::uint64_t{device::tuning::kBslz4WarpsPerCta} * batch_blocks;
  const bool batched = tuning.batched_literals;
  const std::uint64_t ctas_needed = (total_blocks + blocks_per_cta - 1) / blocks_per_cta;
  const unsigned ctas = static_cast<unsigned>(std::min(ctas_needed, ctas_resident));
  const unsigned threads = device::tuning::kBslz4WarpsPerCta * 32;
  const std::size_t shared_bytes = kDecodeSharedBytes;
  switch (layout.element_size) {
    case 1:
      decode_blocks_kernel<1><<<ctas, threads, shared_bytes, stream>>>(batch.d_stored, batch.d_chunk_offsets,
                                                                       batch.chunk_count, layout, block_table, sequences,
                                                                       overlapping, batch.d_decoded, batch.d_status,
                                                                       batch_blocks, batched);
      break;
    case 2:
      decode_blocks_kernel<2><<<ctas, threads, shared_bytes, stream>>>(batch.d_stored, batch.d_chunk_offsets,
                                                                       batch.chunk_count, layout, block_table, sequences,
                                                                       overlapping, batch.d_decoded, batch.d_status,
                                                                       batch_blocks, batched);
      break;
    default:
      decode_blocks_kernel<4><<<ctas, threads, shared_bytes, stream>>>(batch.d_stored, batch.d_chunk_offsets,
                                                                       batch.chunk_count, layout, block_table, sequences,
                                                                       overlapping, batch.d_decoded, batch.d_status,
                                                                       batch_blocks, batched);
      break;
  }
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "decode_blocks_kernel");
}

}  // namespace quantem::kernels
