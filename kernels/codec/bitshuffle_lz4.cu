// GPU bitshuffle/LZ4 decode: public call -> dispatch -> two thin kernels.
//
//  1. index kernel, one thread per chunk: validates the 12-byte header, walks
//     the u32 BE block lengths (each bounded by the chunk), writes a block
//     table (payload offset, length) and copies the raw tail elements.
//  2. block kernel, one warp per bitshuffle block: LZ4 into shared memory,
//     ballot unshuffle, coalesced stores. Errors go to the chunk's status with
//     atomicCAS (first error wins); nothing ever faults.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "quantem/core/error.hpp"
#include "quantem/cuda/bitshuffle_lz4.hpp"
#include "../common/cuda_check.cuh"
#include "bitshuffle.cuh"
#include "lz4_block.cuh"
#include "tuning.cuh"

namespace quantem::cuda {

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

constexpr std::uint32_t kHeaderBytes = 12;

struct ChunkLayout {
  std::uint64_t elements_per_chunk;
  std::uint32_t element_size;
  std::uint32_t block_elements;
  std::uint32_t full_blocks;
  std::uint32_t partial_block_elements;  // 0 when there is no partial block
  std::uint32_t blocks_per_chunk;
  std::uint32_t tail_elements;           // elements_per_chunk mod 8, stored raw
};

ChunkLayout make_layout(const BitshuffleLz4Batch& batch) {
  if (batch.element_size != 1 && batch.element_size != 2 && batch.element_size != 4)
    throw bad_request("bitshuffle/LZ4 decode: element size must be 1, 2 or 4 bytes");
  if (batch.elements_per_chunk == 0) throw bad_request("bitshuffle/LZ4 decode: zero elements per chunk");
  std::size_t block_elements = batch.block_elements;
  if (block_elements == 0) block_elements = kMaxBitshuffleBlockBytes / batch.element_size;
  if (block_elements % 8 != 0 || block_elements * batch.element_size > kMaxBitshuffleBlockBytes)
    throw bad_request("bitshuffle/LZ4 decode: block size must be a multiple of 8 elements and at most " +
                      std::to_string(kMaxBitshuffleBlockBytes) + " bytes");
  ChunkLayout layout{};
  layout.elements_per_chunk = batch.elements_per_chunk;
  layout.element_size = static_cast<std::uint32_t>(batch.element_size);
  layout.block_elements = static_cast<std::uint32_t>(block_elements);
  const std::uint64_t full_blocks = batch.elements_per_chunk / block_elements;
  const std::uint64_t remainder = batch.elements_per_chunk % block_elements;
  if (full_blocks + 1 > 0xffffffffu) throw bad_request("bitshuffle/LZ4 decode: chunk too large");
  layout.full_blocks = static_cast<std::uint32_t>(full_blocks);
  layout.partial_block_elements = static_cast<std::uint32_t>(remainder - remainder % 8);
  layout.blocks_per_chunk = layout.full_blocks + (layout.partial_block_elements > 0 ? 1u : 0u);
  layout.tail_elements = static_cast<std::uint32_t>(remainder % 8);
  return layout;
}

__device__ std::uint32_t load_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

__global__ void __launch_bounds__(kernels::tuning::kBslz4IndexThreads)
    index_chunks_kernel(const std::uint8_t* __restrict__ stored, std::uint64_t stored_bytes,
                        const std::uint64_t* __restrict__ chunk_offsets,
                        const std::uint32_t* __restrict__ chunk_sizes, std::size_t chunk_count, ChunkLayout layout,
                        uint2* __restrict__ block_table, std::uint8_t* __restrict__ decoded,
                        std::uint32_t* __restrict__ status) {
  for (std::size_t chunk = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; chunk < chunk_count;
       chunk += std::size_t{gridDim.x} * blockDim.x) {
    const std::uint64_t offset = chunk_offsets[chunk];
    const std::uint8_t* base = stored + offset;
    const std::uint32_t size = chunk_sizes[chunk];
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

// Shared memory of one warp of decode_blocks_kernel: an 8 KiB output buffer
// and, when compressed blocks are staged, room for one (16-byte loads may
// start up to 15 bytes before it and end past it).
__host__ __device__ constexpr std::size_t warp_area_bytes(std::uint32_t stage_bytes) {
  return kMaxBitshuffleBlockBytes + (stage_bytes == 0 ? 0 : (std::size_t{stage_bytes} + 32 + 15) / 16 * 16);
}

template <int kElementBytes>
__global__ void __launch_bounds__(kernels::tuning::kBslz4WarpsPerCta * 32)
    decode_blocks_kernel(const std::uint8_t* __restrict__ stored, std::uint64_t stored_bytes,
                         const std::uint64_t* __restrict__ chunk_offsets, std::size_t chunk_count, ChunkLayout layout,
                         const uint2* __restrict__ block_table, std::uint8_t* __restrict__ decoded,
                         std::uint32_t* status, std::uint32_t stage_bytes) {
  using Element = typename kernels::ElementType<kElementBytes>::type;
  // Per warp: the block's output, then (stage_bytes > 0) its staged input.
  extern __shared__ __align__(16) std::uint8_t warp_areas[];
  const std::uint32_t warp = threadIdx.x / 32;
  const std::uint32_t lane = threadIdx.x % 32;
  std::uint8_t* buffer = warp_areas + std::size_t{warp} * warp_area_bytes(stage_bytes);
  std::uint8_t* staged = buffer + kMaxBitshuffleBlockBytes;
  const std::uint64_t total_blocks = std::uint64_t{chunk_count} * layout.blocks_per_chunk;
  for (std::uint64_t global_block = std::uint64_t{blockIdx.x} * kernels::tuning::kBslz4WarpsPerCta + warp;
       global_block < total_blocks; global_block += std::uint64_t{gridDim.x} * kernels::tuning::kBslz4WarpsPerCta) {
    const std::uint64_t chunk = global_block / layout.blocks_per_chunk;
    const std::uint32_t block = static_cast<std::uint32_t>(global_block % layout.blocks_per_chunk);
    std::uint32_t chunk_status = 0;
    if (lane == 0) chunk_status = *static_cast<volatile std::uint32_t*>(status + chunk);
    chunk_status = __shfl_sync(0xffffffffu, chunk_status, 0);
    if (chunk_status != static_cast<std::uint32_t>(ChunkStatus::ok)) continue;

    const std::uint32_t element_count =
        block < layout.full_blocks ? layout.block_elements : layout.partial_block_elements;
    const uint2 entry = block_table[global_block];
    const std::uint64_t payload = chunk_offsets[chunk] + entry.x;
    kernels::Lz4Result result;
    if (entry.y <= stage_bytes) {
      // Stage the compressed block: aligned 16-byte loads, never past stored_bytes.
      const std::uint64_t aligned = payload & ~std::uint64_t{15};
      const std::uint32_t lead = static_cast<std::uint32_t>(payload - aligned);
      const std::uint32_t pieces = (lead + entry.y + 15) / 16;
      for (std::uint32_t piece = lane; piece < pieces; piece += 32) {
        const std::uint64_t at = aligned + 16 * std::uint64_t{piece};
        if (at + 16 <= stored_bytes) {
          *reinterpret_cast<uint4*>(staged + 16 * piece) = __ldg(reinterpret_cast<const uint4*>(stored + at));
        } else {
          for (std::uint32_t b = 0; b < 16; ++b) staged[16 * piece + b] = at + b < stored_bytes ? stored[at + b] : 0;
        }
      }
      __syncwarp();
      kernels::SharedInputWarpLz4Io io{staged + lead, buffer, lane};
      result = kernels::lz4_decode_block(io, entry.y, element_count * kElementBytes);
    } else {
      kernels::WarpLz4Io io{stored + payload, buffer, lane};
      result = kernels::lz4_decode_block(io, entry.y, element_count * kElementBytes);
    }
    if (result != kernels::Lz4Result::ok) {
      if (lane == 0) {
        const ChunkStatus code =
            result == kernels::Lz4Result::wrong_size ? ChunkStatus::lz4_wrong_size : ChunkStatus::lz4_corrupt;
        atomicCAS(status + chunk, static_cast<std::uint32_t>(ChunkStatus::ok), static_cast<std::uint32_t>(code));
      }
      continue;
    }
    Element* out = reinterpret_cast<Element*>(decoded + chunk * layout.elements_per_chunk * kElementBytes) +
                   std::uint64_t{block} * layout.block_elements;
    kernels::bitunshuffle_block_warp<kElementBytes>(buffer, element_count, out, lane);
    __syncwarp();  // the buffers are rewritten by the next block
  }
}

}  // namespace

std::size_t bitshuffle_lz4_scratch_bytes(const BitshuffleLz4Batch& batch) {
  const ChunkLayout layout = make_layout(batch);
  return batch.chunk_count * std::size_t{layout.blocks_per_chunk} * sizeof(uint2);
}

void decode_bitshuffle_lz4(const BitshuffleLz4Batch& batch, void* d_scratch, std::size_t scratch_bytes,
                           StreamHandle stream) {
  const ChunkLayout layout = make_layout(batch);
  if (batch.chunk_count == 0) return;
  if (scratch_bytes < bitshuffle_lz4_scratch_bytes(batch))
    throw bad_request("bitshuffle/LZ4 decode: scratch smaller than bitshuffle_lz4_scratch_bytes()");
  if (batch.d_stored == nullptr || batch.d_chunk_offsets == nullptr || batch.d_chunk_sizes == nullptr ||
      batch.d_decoded == nullptr || batch.d_status == nullptr)
    throw bad_request("bitshuffle/LZ4 decode: null device pointer in the batch");
  if (reinterpret_cast<std::uintptr_t>(batch.d_stored) % 16 != 0)
    throw bad_request("bitshuffle/LZ4 decode: d_stored must be 16-byte aligned");
  auto* block_table = static_cast<uint2*>(d_scratch);

  const std::size_t index_ctas_needed =
      (batch.chunk_count + kernels::tuning::kBslz4IndexThreads - 1) / kernels::tuning::kBslz4IndexThreads;
  const unsigned index_ctas = static_cast<unsigned>(index_ctas_needed < 65535 ? index_ctas_needed : 65535);
  index_chunks_kernel<<<index_ctas, kernels::tuning::kBslz4IndexThreads, 0, stream>>>(
      batch.d_stored, batch.stored_bytes, batch.d_chunk_offsets, batch.d_chunk_sizes, batch.chunk_count, layout,
      block_table,
      batch.d_decoded, batch.d_status);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "index_chunks_kernel");

  const std::uint64_t total_blocks = std::uint64_t{batch.chunk_count} * layout.blocks_per_chunk;
  if (total_blocks == 0) return;
  const std::uint64_t ctas_needed = (total_blocks + kernels::tuning::kBslz4WarpsPerCta - 1) / kernels::tuning::kBslz4WarpsPerCta;
  const unsigned ctas = static_cast<unsigned>(ctas_needed < (1u << 30) ? ctas_needed : (1u << 30));
  const unsigned threads = kernels::tuning::kBslz4WarpsPerCta * 32;
  constexpr std::uint32_t stage_bytes = kernels::tuning::kBslz4StageBytes;
  const std::size_t shared_bytes = kernels::tuning::kBslz4WarpsPerCta * warp_area_bytes(stage_bytes);
  switch (layout.element_size) {
    case 1:
      decode_blocks_kernel<1><<<ctas, threads, shared_bytes, stream>>>(batch.d_stored, batch.stored_bytes, batch.d_chunk_offsets, batch.chunk_count,
                                                            layout, block_table, batch.d_decoded, batch.d_status, stage_bytes);
      break;
    case 2:
      decode_blocks_kernel<2><<<ctas, threads, shared_bytes, stream>>>(batch.d_stored, batch.stored_bytes, batch.d_chunk_offsets, batch.chunk_count,
                                                            layout, block_table, batch.d_decoded, batch.d_status, stage_bytes);
      break;
    default:
      decode_blocks_kernel<4><<<ctas, threads, shared_bytes, stream>>>(batch.d_stored, batch.stored_bytes, batch.d_chunk_offsets, batch.chunk_count,
                                                            layout, block_table, batch.d_decoded, batch.d_status, stage_bytes);
      break;
  }
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "decode_blocks_kernel");
}

}  // namespace quantem::cuda
