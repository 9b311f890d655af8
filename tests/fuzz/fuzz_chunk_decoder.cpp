// libFuzzer target: the CPU bitshuffle/LZ4 (32008), LZ4 (32004) and
// uncompressed chunk decoders on arbitrary stored bytes.
// Input: [u8 filter/element selector][u32 decoded bytes][stored chunk...].
// The contract (chunk_codec.hpp): a malformed stream throws CorruptChunk, never
// reads or writes out of bounds (ASan), and parse_chunk_layout throws for
// framing exactly when decode_chunk does; a stream that decodes re-encodes
// (bitshuffle_lz4 with its block size) to a chunk that decodes to the same bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_input.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/error.hpp"

namespace {

constexpr std::size_t kMaxDecodedBytes = std::size_t{1} << 20;
constexpr std::size_t kElementSizes[] = {1, 2, 4, 3, 8};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace quantem;
  fuzz::InputReader input(data, size);
  const auto selector = input.take<std::uint8_t>();
  const std::size_t out_bytes = input.take<std::uint32_t>() % (kMaxDecodedBytes + 1);
  codec::ChunkFormat format;
  format.filter = static_cast<codec::ChunkFilter>(selector % 3);
  format.element_size = kElementSizes[(selector / 3) % 5];

  // An exactly sized heap copy so ASan sees any read past the stored bytes.
  std::vector<std::uint8_t> stored(input.rest(), input.rest() + input.rest_size());
  bool framing_ok = true;
  codec::ChunkLayout layout;
  try {
    layout = codec::parse_chunk_layout(format, stored.data(), stored.size(), out_bytes);
  } catch (const CorruptChunk&) {
    framing_ok = false;
  }
  std::vector<std::uint8_t> out(out_bytes);
  bool decoded = true;
  try {
    codec::decode_chunk(format, stored.data(), stored.size(), out.data(), out.size());
  } catch (const CorruptChunk&) {
    decoded = false;
  }
  if (decoded && !framing_ok) std::abort();  // decode accepted what the framing check refused

  if (decoded && format.filter == codec::ChunkFilter::bitshuffle_lz4 && out_bytes % format.element_size == 0 &&
      layout.block_bytes % format.element_size == 0) {
    const std::size_t elements = out_bytes / format.element_size;
    // A header block size beyond the data (accepted, as by the official
    // filter) changes nothing decoded: re-encode with the data's own size.
    const std::size_t block_elements =
        std::min(layout.block_bytes / format.element_size, (elements + 7) / 8 * 8);
    if (elements > 0 && block_elements % 8 == 0) {
      const std::vector<std::uint8_t> again =
          codec::encode_bitshuffle_lz4(out.data(), elements, format.element_size, block_elements);
      std::vector<std::uint8_t> round_trip(out_bytes);
      codec::decode_chunk(format, again.data(), again.size(), round_trip.data(), round_trip.size());
      if (round_trip != out) std::abort();
    }
  }
  return 0;
}
