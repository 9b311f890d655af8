// libFuzzer target: the chunk-index reader (object header -> data layout
// message -> v1 B-tree / single chunk / implicit / fixed array), which reads
// file bytes with no HDF5 call, on an arbitrary file image held in a memfd.
// Input: [u8 offset size][u8 length size][u8 rank][u8 flags][u32 base address]
//        [u64 object header address][rank x u16 dims][file image...]
// (fuzz_seed_writer writes such inputs from real HDF5 files, with the values
// HDF5 reports for them). Contract (chunk_index.hpp): malformed bytes throw
// quantem::Error and never read out of range or loop; walking the index cut
// into parts visits exactly the chunks of the whole walk, in order.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include "chunk_index.hpp"
#include "fuzz_input.hpp"
#include "quantem/core/error.hpp"

namespace {

using quantem::catalog::detail::ChunkVisitor;

struct Chunk {
  std::vector<std::uint64_t> element_offsets;
  std::uint64_t file_offset, stored_bytes;
  std::uint32_t filter_mask;
  bool operator==(const Chunk& other) const {
    return element_offsets == other.element_offsets && file_offset == other.file_offset &&
           stored_bytes == other.stored_bytes && filter_mask == other.filter_mask;
  }
};

ChunkVisitor collect_into(std::vector<Chunk>& chunks, std::size_t rank) {
  return [&chunks, rank](const std::uint64_t* offsets, std::uint64_t file_offset, std::uint64_t stored_bytes,
                         std::uint32_t filter_mask) {
    chunks.push_back({std::vector<std::uint64_t>(offsets, offsets + rank), file_offset, stored_bytes, filter_mask});
  };
}

constexpr std::size_t kAddressSizes[] = {8, 4, 2};
constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 24;  // bounds one execution's grid walk

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace quantem::catalog::detail;
  static quantem::fuzz::MemoryFile memory_file;
  quantem::fuzz::InputReader input(data, size);
  FileAddressing addressing;
  addressing.offset_size = kAddressSizes[input.take<std::uint8_t>() % 3];
  addressing.length_size = kAddressSizes[input.take<std::uint8_t>() % 3];
  const std::size_t rank = 1 + input.take<std::uint8_t>() % 4;
  const auto flags = input.take<std::uint8_t>();
  addressing.base_address = input.take<std::uint32_t>();
  const auto header_address = input.take<std::uint64_t>();
  std::vector<std::uint64_t> dims(rank), max_dims(rank);
  std::uint64_t elements = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    dims[d] = input.take<std::uint16_t>();
    elements *= dims[d] == 0 ? 1 : dims[d];
    max_dims[d] = (d == 0 && (flags & 1u) != 0) ? ~std::uint64_t{0} : dims[d];  // H5S_UNLIMITED
  }
  if (elements > kMaxElements) return 0;
  memory_file.assign(input.rest(), input.rest_size());

  try {
    const RawFile file(memory_file.path(), addressing);
    const DataLayout layout = read_data_layout(file, header_address);
    if (layout.layout_class != 2) return 0;

    std::vector<Chunk> whole;
    std::optional<quantem::Error> whole_error;
    bool supported = false;
    try {
      supported = visit_chunks(file, layout, dims, max_dims, collect_into(whole, rank));
    } catch (const quantem::Error& error) {
      whole_error = error;
      supported = true;
    }
    if (!supported) return 0;

    std::vector<Chunk> in_parts;
    bool parts_failed = false;
    try {
      const std::optional<ChunkIndexParts> parts = split_chunk_index(file, layout, dims, max_dims, 1 + flags % 7);
      if (!parts) std::abort();  // visit_chunks supported the kind
      for (std::size_t part = 0; part < parts->parts.size(); ++part) {
        visit_chunk_index_part(file, *parts, part, collect_into(in_parts, rank));
      }
    } catch (const quantem::Error&) {
      parts_failed = true;
    }
    if (parts_failed != whole_error.has_value()) std::abort();  // one walk accepted what the other refused
    if (!parts_failed && in_parts != whole) std::abort();
  } catch (const quantem::Error&) {
  }
  return 0;
}
