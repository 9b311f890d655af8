// GPU bitshuffle/LZ4 encode: public call -> dispatch -> thin kernels.
//
//  1. block kernel, a warp per bitshuffle block: bit-shuffles the block into
//     shared memory (a ballot per plane and word), marks where runs of one
//     byte start, and writes the block's u32 BE length and LZ4 data into its
//     slot of the scratch (lz4_runs.cuh).
//  2. chunk size kernel, a thread per chunk: header + its blocks + raw tail;
//     a CUB exclusive scan turns the sizes into the chunks' offsets.
//  3. gather kernel, a warp per chunk: the 12-byte header, the blocks from
//     their slots, then the (N mod 8) raw tail elements.
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstdint>
#include <string>

#include "quantem/core/error.hpp"
#include "quantem/kernels/bitshuffle_lz4.hpp"
#include "quantem/kernels/cuda_check.hpp"
#include "quantem/kernels/scratch_layout.hpp"
#include "chunk_layout.cuh"
#include "lz4_runs.cuh"
#include "../common/tuning.cuh"

namespace quantem::kernels {
namespace {

namespace runs = device::lz4_runs;
namespace tuning = device::tuning;

constexpr std::uint32_t kHeaderBytes = device::kChunkHeaderBytes;
constexpr std::uint32_t kLengthFieldBytes = 4;
constexpr std::uint32_t kMaxMarkWords = (kMaxBitshuffleBlockBytes + 31) / 32;

// The chunks of a batch (the decoder's rule, chunk_layout.cuh), how many
// blocks the batch holds, and each block's slot in the scratch.
struct EncodeLayout {
  device::ChunkLayout chunk;
  std::uint64_t chunk_count;
  std::uint64_t total_blocks;
  std::uint32_t slot_bytes;  // one block's length field + LZ4 bound, 16-byte multiple
};

EncodeLayout make_layout(const BitshuffleLz4EncodeBatch& batch) {
  EncodeLayout layout{};
  layout.chunk = device::make_chunk_layout(batch.elements_per_chunk, batch.element_size, batch.block_elements,
                                           "bitshuffle/LZ4 encode");
  layout.chunk_count = batch.chunk_count;
  layout.total_blocks = layout.chunk_count * layout.chunk.blocks_per_chunk;
  const std::uint32_t block_bytes = layout.chunk.block_elements * layout.chunk.element_size;
  layout.slot_bytes = (kLengthFieldBytes + runs::lz4_bound(block_bytes) + 15u) / 16u * 16u;
  return layout;
}

std::uint64_t chunk_bound(const EncodeLayout& layout) {
  const std::uint64_t full = std::uint64_t{layout.chunk.full_blocks} *
                             (kLengthFieldBytes + runs::lz4_bound(layout.chunk.block_elements * layout.chunk.element_size));
  const std::uint64_t partial =
      layout.chunk.partial_block_elements == 0
          ? 0
          : kLengthFieldBytes + runs::lz4_bound(layout.chunk.partial_block_elements * layout.chunk.element_size);
  return kHeaderBytes + full + partial + std::uint64_t{layout.chunk.tail_elements} * layout.chunk.element_size;
}

struct EncodeScratch {
  std::size_t slots = 0, block_sizes = 0, chunk_sizes = 0, scan = 0, scan_bytes = 0, total = 0;
};

EncodeScratch scratch_layout(const EncodeLayout& layout) {
  std::size_t scan_bytes = 0;
  QUANTEM_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<std::uint64_t*>(nullptr),
                                                 static_cast<std::uint64_t*>(nullptr),
                                                 static_cast<std::int64_t>(layout.chunk_count + 1)));
  ScratchLayout parts;
  EncodeScratch s;
  s.slots = parts.add(layout.total_blocks * layout.slot_bytes);
  s.block_sizes = parts.add(layout.total_blocks * sizeof(std::uint32_t));
  s.chunk_sizes = parts.add((layout.chunk_count + 1) * sizeof(std::uint64_t));
  s.scan = parts.add(scan_bytes);
  s.scan_bytes = scan_bytes;
  s.total = parts.total();
  return s;
}

__device__ inline void store_u32_be(std::uint8_t* at, std::uint32_t value) {
  at[0] = static_cast<std::uint8_t>(value >> 24);
  at[1] = static_cast<std::uint8_t>(value >> 16);
  at[2] = static_cast<std::uint8_t>(value >> 8);
  at[3] = static_cast<std::uint8_t>(value);
}

// A warp per block (grid-stride): shuffle, mark, write the slot.
template <int kElementBytes>
__global__ void __launch_bounds__(tuning::kBslz4EncodeWarpsPerCta * 32)
    encode_blocks_kernel(const typename device::ElementType<kElementBytes>::type* __restrict__ frames,
                         EncodeLayout layout, std::uint8_t* slots, std::uint32_t* block_sizes) {
  constexpr int kWarps = tuning::kBslz4EncodeWarpsPerCta;
  __shared__ __align__(16) std::uint8_t shuffled[kWarps][kMaxBitshuffleBlockBytes];
  __shared__ std::uint32_t boundaries[kWarps][kMaxMarkWords];
  __shared__ std::uint32_t run_starts[kWarps][kMaxMarkWords];
  const std::uint32_t warp = threadIdx.x / 32;
  const std::uint32_t lane = threadIdx.x % 32;
  for (std::uint64_t block = std::uint64_t{blockIdx.x} * kWarps + warp; block < layout.total_blocks;
       block += std::uint64_t{gridDim.x} * kWarps) {
    const std::uint64_t chunk = block / layout.chunk.blocks_per_chunk;
    const std::uint32_t in_chunk = static_cast<std::uint32_t>(block % layout.chunk.blocks_per_chunk);
    const std::uint32_t count =
        in_chunk < layout.chunk.full_blocks ? layout.chunk.block_elements : layout.chunk.partial_block_elements;
    const auto* in = frames + chunk * layout.chunk.elements_per_chunk + std::uint64_t{in_chunk} * layout.chunk.block_elements;
    runs::bitshuffle_block_warp<kElementBytes>(in, count, shuffled[warp], lane);
    __syncwarp();
    const std::uint32_t bytes = count * kElementBytes;
    runs::mark_byte_runs(shuffled[warp], bytes, boundaries[warp], run_starts[warp], lane);
    __syncwarp();
    std::uint8_t* slot = slots + block * layout.slot_bytes;
    const std::uint32_t written =
        runs::write_lz4_runs(shuffled[warp], bytes, boundaries[warp], run_starts[warp], slot + kLengthFieldBytes, lane);
    if (lane == 0) {
      store_u32_be(slot, written);
      block_sizes[block] = kLengthFieldBytes + written;
    }
    __syncwarp();  // the next block reuses the shared buffers
  }
}

// A thread per chunk: its stored size.
__global__ void chunk_sizes_kernel(EncodeLayout layout, const std::uint32_t* __restrict__ block_sizes,
                                   unsigned long long* chunk_sizes) {
  const std::uint64_t chunk = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (chunk >= layout.chunk_count) return;
  std::uint64_t bytes = kHeaderBytes + std::uint64_t{layout.chunk.tail_elements} * layout.chunk.element_size;
  const std::uint32_t* sizes = block_sizes + chunk * layout.chunk.blocks_per_chunk;
  for (std::uint32_t b = 0; b < layout.chunk.blocks_per_chunk; ++b) bytes += sizes[b];
  chunk_sizes[chunk] = bytes;
}

// A warp per chunk (grid-stride): header, blocks, raw tail at its offset.
__global__ void __launch_bounds__(tuning::kBslz4GatherWarpsPerCta * 32)
    gather_chunks_kernel(EncodeLayout layout, const std::uint8_t* __restrict__ frames,
                         const std::uint8_t* __restrict__ slots, const std::uint32_t* __restrict__ block_sizes,
                         const unsigned long long* __restrict__ offsets, std::uint8_t* out) {
  constexpr int kWarps = tuning::kBslz4GatherWarpsPerCta;
  const std::uint32_t lane = threadIdx.x % 32;
  const std::uint64_t frame_bytes = layout.chunk.elements_per_chunk * layout.chunk.element_size;
  for (std::uint64_t chunk = std::uint64_t{blockIdx.x} * kWarps + threadIdx.x / 32; chunk < layout.chunk_count;
       chunk += std::uint64_t{gridDim.x} * kWarps) {
    std::uint8_t* at = out + offsets[chunk];
    if (lane < 8) at[lane] = static_cast<std::uint8_t>(frame_bytes >> (8 * (7 - lane)));
    if (lane >= 8 && lane < kHeaderBytes) {
      const std::uint32_t block_bytes = layout.chunk.block_elements * layout.chunk.element_size;
      at[lane] = static_cast<std::uint8_t>(block_bytes >> (8 * (kHeaderBytes - 1 - lane)));
    }
    std::uint64_t position = kHeaderBytes;
    for (std::uint32_t b = 0; b < layout.chunk.blocks_per_chunk; ++b) {
      const std::uint64_t block = chunk * layout.chunk.blocks_per_chunk + b;
      const std::uint32_t size = block_sizes[block];
      const std::uint8_t* slot = slots + block * layout.slot_bytes;
      for (std::uint32_t i = lane; i < size; i += 32) at[position + i] = slot[i];
      position += size;
    }
    const std::uint32_t tail_bytes = layout.chunk.tail_elements * layout.chunk.element_size;
    const std::uint8_t* tail = frames + (chunk + 1) * frame_bytes - tail_bytes;
    for (std::uint32_t i = lane; i < tail_bytes; i += 32) at[position + i] = tail[i];
  }
}

template <int kElementBytes>
void launch_encode_blocks(const BitshuffleLz4EncodeBatch& batch, const EncodeLayout& layout, std::uint8_t* slots,
                          std::uint32_t* block_sizes, cudaStream_t stream) {
  using Element = typename device::ElementType<kElementBytes>::type;
  if (layout.total_blocks == 0) return;  // frames of fewer than 8 elements: header and raw tail only
  const std::uint64_t needed = (layout.total_blocks + tuning::kBslz4EncodeWarpsPerCta - 1) /
                               tuning::kBslz4EncodeWarpsPerCta;
  const std::uint64_t most = std::uint64_t{tuning::kBslz4EncodeCtasPerSm} * current_sm_count();
  encode_blocks_kernel<kElementBytes><<<static_cast<unsigned>(std::min(needed, most)),
                                        tuning::kBslz4EncodeWarpsPerCta * 32, 0, stream>>>(
      static_cast<const Element*>(batch.d_frames), layout, slots, block_sizes);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "encode_blocks_kernel");
}

}  // namespace

std::size_t bitshuffle_lz4_chunk_bound(const BitshuffleLz4EncodeBatch& batch) {
  return chunk_bound(make_layout(batch));
}

std::size_t bitshuffle_lz4_encode_scratch_bytes(const BitshuffleLz4EncodeBatch& batch) {
  return scratch_layout(make_layout(batch)).total;
}

void encode_bitshuffle_lz4(const BitshuffleLz4EncodeBatch& batch, void* d_scratch, std::size_t scratch_bytes,
                           std::uint8_t* d_out, std::uint64_t* d_chunk_offsets, StreamHandle stream) {
  const EncodeLayout layout = make_layout(batch);
  const EncodeScratch s = scratch_layout(layout);
  if (d_chunk_offsets == nullptr) throw bad_request("bitshuffle/LZ4 encode: null chunk offsets");
  if (layout.chunk_count == 0) {
    QUANTEM_CUDA_TRY(cudaMemsetAsync(d_chunk_offsets, 0, sizeof(std::uint64_t), stream));
    return;
  }
  if (d_scratch == nullptr || scratch_bytes < s.total)
    throw bad_request("bitshuffle/LZ4 encode: scratch of " + std::to_string(scratch_bytes) + " bytes, " +
                      std::to_string(s.total) + " needed");
  if (d_out == nullptr || batch.d_frames == nullptr) throw bad_request("bitshuffle/LZ4 encode: null frames or output");
  auto* slots = scratch_part<std::uint8_t>(d_scratch, s.slots);
  auto* block_sizes = scratch_part<std::uint32_t>(d_scratch, s.block_sizes);
  auto* chunk_sizes = scratch_part<unsigned long long>(d_scratch, s.chunk_sizes);
  switch (layout.chunk.element_size) {
    case 1: launch_encode_blocks<1>(batch, layout, slots, block_sizes, stream); break;
    case 2: launch_encode_blocks<2>(batch, layout, slots, block_sizes, stream); break;
    default: launch_encode_blocks<4>(batch, layout, slots, block_sizes, stream); break;
  }
  QUANTEM_CUDA_TRY(cudaMemsetAsync(chunk_sizes + layout.chunk_count, 0, sizeof(std::uint64_t), stream));
  const int size_threads = tuning::kBslz4ChunkSizeThreads;
  chunk_sizes_kernel<<<static_cast<unsigned>((layout.chunk_count + size_threads - 1) / size_threads), size_threads, 0,
                       stream>>>(layout, block_sizes, chunk_sizes);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "chunk_sizes_kernel");
  std::size_t scan_bytes = s.scan_bytes;
  auto* offsets = reinterpret_cast<unsigned long long*>(d_chunk_offsets);
  QUANTEM_CUDA_TRY(cub::DeviceScan::ExclusiveSum(scratch_part<void>(d_scratch, s.scan), scan_bytes, chunk_sizes,
                                                 offsets, static_cast<std::int64_t>(layout.chunk_count + 1),
                                                 stream));
  const std::uint64_t needed =
      (layout.chunk_count + tuning::kBslz4GatherWarpsPerCta - 1) / tuning::kBslz4GatherWarpsPerCta;
  const std::uint64_t most = std::uint64_t{tuning::kElementwiseCtasPerSm} * current_sm_count();
  gather_chunks_kernel<<<static_cast<unsigned>(std::min(needed, most)), tuning::kBslz4GatherWarpsPerCta * 32, 0,
                         stream>>>(layout, static_cast<const std::uint8_t*>(batch.d_frames), slots, block_sizes,
                                   offsets, d_out);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "gather_chunks_kernel");
}

}  // namespace quantem::kernels
