#pragma once
// Device building blocks of the ANS resident (format: quantem/ans/ans_format.hpp):
// decode tables in shared memory, a per-thread stream reader, the 2x2 quad
// geometry. One thread decodes one stream (one quad across a group's frames),
// so a warp holds 32 independent rANS states and a masked product decodes
// exactly the streams its mask touches.
#include <cstdint>

#include "quantem/ans/ans_format.hpp"
#include "quantem/ans/ans_model.hpp"
#include "../common/warp_collectives.cuh"
#include "ans_stream_reader.cuh"

namespace quantem::kernels::device::ans_device {

using ans::AnsGroupHeader;
using ans::kAnsAlphabetSize;
using ans::kAnsClassCount;
using ans::kAnsEscape16;
using ans::kAnsEscape32;
using ans::kAnsStreamAlignment;
using ans::kAnsProbabilityBits;
using ans::kAnsProbabilityScale;
using ans::kAnsStateLower;

// Shared memory of the decode tables: one uint32 per (class, slot), 128 KiB,
// then the neutral entry of absent positions at kNeutralTableOffset (padded to 16 bytes).
inline constexpr std::uint32_t kDecodeTableEntries = kNeutralTableOffset + 4;
// Per-warp cumulative-frequency scratch used while building the tables.
inline constexpr std::uint32_t kCdfScratchEntries = kAnsAlphabetSize + 2;

__device__ inline AnsGroupHeader load_header(const std::uint8_t* blob) {
  AnsGroupHeader header;
  const uint4* source = reinterpret_cast<const uint4*>(blob);  // blobs are 16-byte aligned
  uint4* destination = reinterpret_cast<uint4*>(&header);
#pragma unroll
  for (int i = 0; i < 4; ++i) destination[i] = __ldg(source + i);
  return header;
}

// Builds the table of every class of the group (entries: make_decode_entry in
// ans_stream_reader.cuh), so one shared load gives x' = frequency * (x >> bits) +
// (slot - cdf), and the neutral entry after them. A class whose frequencies do
// not sum to the scale (unused) gets frequency 0 entries, which the reader
// reports as corrupt if they are ever hit.
// All threads of the CTA must call it; it ends with __syncthreads().
__device__ inline void build_decode_tables(const std::uint8_t* blob, const AnsGroupHeader& header,
                                           std::uint32_t* table, std::uint16_t* cdf_scratch) {
  const std::uint32_t warp = threadIdx.x / 32;
  const std::uint32_t lane = threadIdx.x % 32;
  const std::uint32_t warps = blockDim.x / 32;
  std::uint16_t* cdf = cdf_scratch + warp * kCdfScratchEntries;
  const std::uint16_t* frequencies = reinterpret_cast<const std::uint16_t*>(blob + header.freq_table_offset);
  for (std::uint32_t cls = warp; cls < kAnsClassCount; cls += warps) {
    std::uint32_t local[8];
    std::uint32_t local_sum = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      local[k] = __ldg(frequencies + cls * kAnsAlphabetSize + lane * 8 + k);
      local_sum += local[k];
    }
    const std::uint32_t inclusive = warp_inclusive_scan_u32(local_sum, lane);
    std::uint32_t running = inclusive - local_sum;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      cdf[lane * 8 + k] = static_cast<std::uint16_t>(running > 0xffffu ? 0xffffu : running);
      running += local[k];
    }
    const std::uint32_t total = __shfl_sync(0xffffffffu, inclusive, 31);
    if (lane == 0) cdf[kAnsAlphabetSize] = static_cast<std::uint16_t>(total > 0xffffu ? 0xffffu : total);
    __syncwarp();
    for (std::uint32_t slot = lane; slot < kAnsProbabilityScale; slot += 32) {
      std::uint32_t entry = 0;
      if (total == kAnsProbabilityScale) {
        std::uint32_t low = 0;
        std::uint32_t high = kAnsAlphabetSize - 1;
        while (low < high) {  // the largest symbol with cdf <= slot has a non-zero frequency
          const std::uint32_t middle = (low + high + 1) / 2;
          if (cdf[middle] <= slot) low = middle;
          else high = middle - 1;
        }
        const std::uint32_t frequency = cdf[low + 1] - cdf[low];
        entry = make_decode_entry(low, frequency, slot - cdf[low]);
      }
      table[cls * kAnsProbabilityScale + slot] = entry;
    }
    __syncwarp();
  }
  if (threadIdx.x < kDecodeTableEntries - kNeutralTableOffset) table[kNeutralTableOffset + threadIdx.x] = kNeutralEntry;
  __syncthreads();
}

// The 2x2 quad of stream `stream`: pixels[k] for quad position k = 2 * dr + dc
// (coding order), and a bit mask of the positions inside the detector.
__device__ inline std::uint32_t quad_pixels(std::uint32_t stream, std::uint32_t quad_cols, std::uint32_t rows,
                                            std::uint32_t cols, std::uint32_t pixels[4]) {
  const std::uint32_t row = 2 * (stream / quad_cols);
  const std::uint32_t col = 2 * (stream % quad_cols);
  pixels[0] = row * cols + col;
  pixels[1] = pixels[0] + 1;
  pixels[2] = pixels[0] + cols;
  pixels[3] = pixels[2] + 1;
  const bool has_right = col + 1 < cols;
  const bool has_below = row + 1 < rows;
  return 1u | (has_right ? 2u : 0u) | (has_below ? 4u : 0u) | (has_right && has_below ? 8u : 0u);
}

// The decode table (its offset in the tables) and class shift of each
// position of a quad: its pixel's class for a present position, the neutral
// entry (shift 0) for an absent one.
__device__ inline void quad_class_tables(const std::uint8_t* blob, const AnsGroupHeader& header,
                                         const std::uint32_t pixels[4], std::uint32_t present,
                                         std::uint32_t class_offset[4], std::uint32_t shift[4]) {
  const std::uint8_t* classes = blob + header.class_map_offset;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const bool here = ((present >> k) & 1u) != 0;
    const std::uint32_t cls = here ? min(std::uint32_t{__ldg(classes + pixels[k])}, kAnsClassCount - 1) : 0u;
    class_offset[k] = here ? cls * kAnsProbabilityScale : kNeutralTableOffset;
    shift[k] = here ? ans::class_shift(cls, header.class_scale) : 0u;
  }
}

// A lane without a stream: neutral entries, no shifts, an empty reader.
__device__ inline void no_quad(std::uint32_t class_offset[4], std::uint32_t shift[4], StreamReader& reader) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    class_offset[k] = kNeutralTableOffset;
    shift[k] = 0;
  }
  reader.open_empty();
}

}  // namespace quantem::kernels::device::ans_device
