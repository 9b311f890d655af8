#pragma once
// How a bitshuffle/LZ4 chunk (HDF5 filter 32008) is cut into blocks: the one
// rule of the GPU decoder (bitshuffle_lz4.cu) and encoder
// (bitshuffle_lz4_encode.cu), the CPU codec's (codec::decode_chunk).
#include <cstddef>
#include <cstdint>
#include <string>

#include "quantem/core/error.hpp"
#include "quantem/kernels/bitshuffle_lz4.hpp"

namespace quantem::kernels::device {

inline constexpr std::uint32_t kChunkHeaderBytes = 12;  // u64 BE total bytes, u32 BE block bytes

struct ChunkLayout {
  std::uint64_t elements_per_chunk;
  std::uint32_t element_size;
  std::uint32_t block_elements;
  std::uint32_t full_blocks;
  std::uint32_t partial_block_elements;  // 0 when there is no partial block
  std::uint32_t blocks_per_chunk;
  std::uint32_t tail_elements;           // elements_per_chunk mod 8, stored raw
};

// The layout of chunks of `elements` elements of `element_size` bytes in
// blocks of `block_elements` (0: the default, 8192 bytes). Throws
// quantem::Error(bad_request), its text starting with `who`, for an element
// size other than 1, 2 or 4, no elements, or a block that is not a multiple of
// 8 elements of at most kMaxBitshuffleBlockBytes.
inline ChunkLayout make_chunk_layout(std::size_t elements, std::size_t element_size, std::size_t block_elements,
                                     const char* who) {
  if (element_size != 1 && element_size != 2 && element_size != 4)
    throw bad_request(std::string(who) + ": element size must be 1, 2 or 4 bytes");
  if (elements == 0) throw bad_request(std::string(who) + ": zero elements per chunk");
  if (block_elements == 0) block_elements = kMaxBitshuffleBlockBytes / element_size;
  if (block_elements % 8 != 0 || block_elements * element_size > kMaxBitshuffleBlockBytes)
    throw bad_request(std::string(who) + ": block size must be a multiple of 8 elements and at most " +
                      std::to_string(kMaxBitshuffleBlockBytes) + " bytes");
  ChunkLayout layout{};
  layout.elements_per_chunk = elements;
  layout.element_size = static_cast<std::uint32_t>(element_size);
  layout.block_elements = static_cast<std::uint32_t>(block_elements);
  const std::uint64_t full_blocks = elements / block_elements;
  const std::uint64_t remainder = elements % block_elements;
  if (full_blocks + 1 > 0xffffffffu) throw bad_request(std::string(who) + ": chunk too large");
  layout.full_blocks = static_cast<std::uint32_t>(full_blocks);
  layout.partial_block_elements = static_cast<std::uint32_t>(remainder - remainder % 8);
  layout.blocks_per_chunk = layout.full_blocks + (layout.partial_block_elements > 0 ? 1u : 0u);
  layout.tail_elements = static_cast<std::uint32_t>(remainder % 8);
  return layout;
}

}  // namespace quantem::kernels::device
