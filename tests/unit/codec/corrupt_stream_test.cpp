// Malformed streams: every one either decodes to some output or throws
// CorruptChunk, never reads or writes out of bounds (run under ASan/UBSan with
// -DQUANTEM_SANITIZE=ON). Buffers are exact-size heap vectors so the
// sanitizer sees any overrun.
#include <gtest/gtest.h>

#include <lz4.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codec_test_support.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/error.hpp"

namespace quantem::codec {
namespace {

using test_support::random_bytes;
using test_support::sparse_elements;

constexpr ChunkFormat kBitshuffleU16{ChunkFilter::bitshuffle_lz4, 2};
constexpr ChunkFormat kLz4U16{ChunkFilter::lz4, 2};

// Decodes into an exact-size buffer; returns the CorruptChunk message, or "" when it decoded.
std::string decode_error(const ChunkFormat& format, const std::vector<std::uint8_t>& stored, std::size_t out_bytes) {
  std::vector<std::uint8_t> out(out_bytes);
  try {
    decode_chunk(format, stored.data(), stored.size(), out.data(), out.size());
  } catch (const CorruptChunk& error) {
    return error.what();
  }
  return "";
}

void put_u32_be(std::vector<std::uint8_t>& bytes, std::size_t offset, std::uint32_t value) {
  for (int i = 3; i >= 0; --i) {
    bytes[offset + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(value);
    value >>= 8;
  }
}

void put_u64_be(std::vector<std::uint8_t>& bytes, std::size_t offset, std::uint64_t value) {
  for (int i = 7; i >= 0; --i) {
    bytes[offset + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(value);
    value >>= 8;
  }
}

std::vector<std::uint8_t> header(std::uint64_t total_bytes, std::uint32_t block_bytes) {
  std::vector<std::uint8_t> bytes(12);
  put_u64_be(bytes, 0, total_bytes);
  put_u32_be(bytes, 8, block_bytes);
  return bytes;
}

void append_block(std::vector<std::uint8_t>& chunk, const std::vector<std::uint8_t>& data) {
  std::vector<char> compressed(static_cast<std::size_t>(LZ4_compressBound(static_cast<int>(data.size()))));
  const int length = LZ4_compress_default(reinterpret_cast<const char*>(data.data()), compressed.data(),
                                          static_cast<int>(data.size()), static_cast<int>(compressed.size()));
  chunk.resize(chunk.size() + 4);
  put_u32_be(chunk, chunk.size() - 4, static_cast<std::uint32_t>(length));
  chunk.insert(chunk.end(), compressed.begin(), compressed.begin() + length);
}

// A 4108-element u16 chunk: one 4096-element block, one 8-element block, 4 raw elements.
struct SmallChunk {
  std::vector<std::uint8_t> elements;
  std::vector<std::uint8_t> stored;
};

SmallChunk small_bitshuffle_chunk() {
  std::mt19937_64 rng(23);
  SmallChunk chunk;
  chunk.elements = sparse_elements(rng, 4108, 2);
  chunk.stored = encode_bitshuffle_lz4(chunk.elements.data(), 4108, 2);
  return chunk;
}

TEST(CodecCorruptStreams, ValidSmallChunkDecodes) {
  const SmallChunk chunk = small_bitshuffle_chunk();
  EXPECT_EQ(decode_error(kBitshuffleU16, chunk.stored, chunk.elements.size()), "");
  EXPECT_EQ(test_support::decode(kBitshuffleU16, chunk.stored, chunk.elements.size()), chunk.elements);
}

TEST(CodecCorruptStreams, TruncatedHeaders) {
  for (const ChunkFormat& format : {kBitshuffleU16, kLz4U16}) {
    for (std::size_t length = 0; length < 12; ++length) {
      const std::vector<std::uint8_t> stored(length, 0);
      const std::string error = decode_error(format, stored, 64);
      EXPECT_NE(error.find("truncated header"), std::string::npos) << length << ": " << error;
    }
  }
}

TEST(CodecCorruptStreams, EveryTruncationThrows) {
  const SmallChunk chunk = small_bitshuffle_chunk();
  for (std::size_t length = 0; length < chunk.stored.size(); ++length) {
    const std::vector<std::uint8_t> truncated(chunk.stored.begin(), chunk.stored.begin() + length);
    EXPECT_NE(decode_error(kBitshuffleU16, truncated, chunk.elements.size()), "") << "length " << length;
  }
  std::mt19937_64 rng(29);
  const auto data = random_bytes(rng, 3000);
  const auto lz4_chunk = encode_lz4(data.data(), data.size(), 1000);
  for (std::size_t length = 0; length < lz4_chunk.size(); ++length) {
    const std::vector<std::uint8_t> truncated(lz4_chunk.begin(), lz4_chunk.begin() + length);
    EXPECT_NE(decode_error(kLz4U16, truncated, data.size()), "") << "length " << length;
  }
}

TEST(CodecCorruptStreams, TruncatedTailAndTrailingBytes) {
  const SmallChunk chunk = small_bitshuffle_chunk();
  auto short_tail = chunk.stored;
  short_tail.pop_back();
  EXPECT_NE(decode_error(kBitshuffleU16, short_tail, chunk.elements.size()).find("truncated tail"), std::string::npos);
  auto extra = chunk.stored;
  extra.push_back(0);
  EXPECT_NE(decode_error(kBitshuffleU16, extra, chunk.elements.size()).find("unexpected bytes"), std::string::npos);
}

TEST(CodecCorruptStreams, WrongTotalInHeader) {
  const SmallChunk chunk = small_bitshuffle_chunk();
  for (std::uint64_t total : {std::uint64_t{0}, std::uint64_t{8214}, std::uint64_t{8218}, std::uint64_t{16432},
                              ~std::uint64_t{0}}) {
    auto stored = chunk.stored;
    put_u64_be(stored, 0, total);
    EXPECT_NE(decode_error(kBitshuffleU16, stored, chunk.elements.size()).find("decoded bytes"), std::string::npos)
        << total;
  }
  // A total that matches a wrong expectation, and an odd total for u16 elements.
  EXPECT_NE(decode_error(kBitshuffleU16, chunk.stored, chunk.elements.size() + 2), "");
  auto odd = header(9, 8192);
  EXPECT_NE(decode_error(kBitshuffleU16, odd, 9).find("multiple of the element size"), std::string::npos);
}

TEST(CodecCorruptStreams, BadBlockSizesInHeader) {
  const SmallChunk chunk = small_bitshuffle_chunk();
  for (std::uint32_t block_bytes : {0u, 1u, 2u, 14u, 17u, 8191u}) {
    auto stored = chunk.stored;
    put_u32_be(stored, 8, block_bytes);
    EXPECT_NE(decode_error(kBitshuffleU16, stored, chunk.elements.size()).find("block size"), std::string::npos)
        << block_bytes;
  }
  // Valid-looking but different block sizes change the framing: still CorruptChunk.
  for (std::uint32_t block_bytes : {16u, 4096u, 16384u, 0xFFFFFFF0u}) {
    auto stored = chunk.stored;
    put_u32_be(stored, 8, block_bytes);
    EXPECT_NE(decode_error(kBitshuffleU16, stored, chunk.elements.size()), "") << block_bytes;
  }
  // Plain LZ4: zero block size with a non-empty total.
  auto lz4_zero_block = header(64, 0);
  EXPECT_NE(decode_error(kLz4U16, lz4_zero_block, 64).find("block size is 0"), std::string::npos);
  EXPECT_EQ(decode_error(kLz4U16, header(0, 0), 0), "");  // empty chunk: nothing to decode
}

TEST(CodecCorruptStreams, BlockLengthsPastTheEndOrZero) {
  const SmallChunk chunk = small_bitshuffle_chunk();
  const std::size_t second_length_offset = [&] {
    const auto layout = parse_chunk_layout(kBitshuffleU16, chunk.stored.data(), chunk.stored.size(), 8216);
    return layout.blocks[1].stored_offset - 4;
  }();
  for (std::size_t offset : {std::size_t{12}, second_length_offset}) {
    for (std::uint32_t length : {0xFFFFFFFFu, 0x7FFFFFFFu, static_cast<std::uint32_t>(chunk.stored.size())}) {
      auto stored = chunk.stored;
      put_u32_be(stored, offset, length);
      const std::string error = decode_error(kBitshuffleU16, stored, chunk.elements.size());
      EXPECT_NE(error.find("runs past the end"), std::string::npos) << offset << " " << length << ": " << error;
    }
    auto stored = chunk.stored;
    put_u32_be(stored, offset, 0);
    EXPECT_NE(decode_error(kBitshuffleU16, stored, chunk.elements.size()).find("compressed length is 0"),
              std::string::npos);
  }
}

TEST(CodecCorruptStreams, Lz4DataDecodingToTheWrongSize) {
  // 16 u16 elements in one 16-element block (32 bytes).
  const std::vector<std::uint8_t> too_short(16, 1), too_long(64, 1), exact(32, 1);
  for (const auto& payload : {too_short, too_long}) {
    auto stored = header(32, 32);
    append_block(stored, payload);
    EXPECT_NE(decode_error(kBitshuffleU16, stored, 32), "") << payload.size();
  }
  auto short_stored = header(32, 32);
  append_block(short_stored, too_short);
  EXPECT_NE(decode_error(kBitshuffleU16, short_stored, 32).find("decodes to 16 bytes, expected 32"), std::string::npos);
  auto good = header(32, 32);
  append_block(good, exact);
  EXPECT_EQ(decode_error(kBitshuffleU16, good, 32), "");

  // Plain LZ4: a compressed block whose data decodes short.
  auto lz4_short = header(32, 32);
  append_block(lz4_short, too_short);
  EXPECT_NE(decode_error(kLz4U16, lz4_short, 32), "");
  // Plain LZ4: a length equal to the block size means raw bytes.
  auto lz4_raw = header(32, 32);
  lz4_raw.resize(16);
  put_u32_be(lz4_raw, 12, 32);
  lz4_raw.insert(lz4_raw.end(), exact.begin(), exact.end());
  std::vector<std::uint8_t> out(32);
  decode_chunk(kLz4U16, lz4_raw.data(), lz4_raw.size(), out.data(), out.size());
  EXPECT_EQ(out, exact);
}

TEST(CodecCorruptStreams, UncompressedSizeMustMatch) {
  const std::vector<std::uint8_t> stored(10, 7);
  EXPECT_NE(decode_error({ChunkFilter::none, 2}, stored, 12), "");
  EXPECT_EQ(decode_error({ChunkFilter::none, 2}, stored, 10), "");
}

// Mutations of valid chunks: flips, overwrites, truncations, insertions,
// deletions and header rewrites. Each result either decodes or throws
// CorruptChunk; parse_chunk_layout agrees on framing failures.
TEST(CodecCorruptStreams, SeededRandomMutationsNeverCrash) {
  std::mt19937_64 rng(20240601);
  struct Base {
    ChunkFormat format;
    std::vector<std::uint8_t> stored;
    std::size_t out_bytes;
  };
  std::vector<Base> bases;
  for (std::size_t element_size : {1, 2, 4}) {
    for (std::size_t count : {12, 4108, 36864}) {
      const auto elements = sparse_elements(rng, count, element_size);
      bases.push_back({{ChunkFilter::bitshuffle_lz4, element_size},
                       encode_bitshuffle_lz4(elements.data(), count, element_size, count == 36864 ? 0 : 64),
                       elements.size()});
    }
  }
  {
    auto data = sparse_elements(rng, 20000, 2);
    const auto noise = random_bytes(rng, 5000);
    std::copy(noise.begin(), noise.end(), data.begin());
    bases.push_back({{ChunkFilter::lz4, 2}, encode_lz4(data.data(), data.size(), 4096), data.size()});
  }

  std::size_t decoded = 0, rejected = 0;
  for (int iteration = 0; iteration < 4000; ++iteration) {
    const Base& base = bases[static_cast<std::size_t>(iteration) % bases.size()];
    std::vector<std::uint8_t> stored = base.stored;
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations && !stored.empty(); ++m) {
      const std::size_t at = rng() % stored.size();
      switch (rng() % 7) {
        case 0:
          stored[at] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
          break;
        case 1:
          stored[at] = static_cast<std::uint8_t>(rng());
          break;
        case 2:
          stored.resize(at);
          break;
        case 3:
          stored.insert(stored.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::uint8_t>(rng()));
          break;
        case 4:
          stored.erase(stored.begin() + static_cast<std::ptrdiff_t>(at),
                       stored.begin() + static_cast<std::ptrdiff_t>(std::min(stored.size(), at + 1 + rng() % 16)));
          break;
        case 5:  // rewrite a header field
          if (stored.size() >= 12) {
            if (rng() % 2) put_u32_be(stored, 8, static_cast<std::uint32_t>(rng() % 2 ? rng() : rng() % 20000));
            else put_u64_be(stored, 0, rng() % 2 ? rng() : base.out_bytes + rng() % 5 - 2);
          }
          break;
        default:  // rewrite the first block's length field
          if (stored.size() >= 16) put_u32_be(stored, 12, static_cast<std::uint32_t>(rng() % 12000));
          break;
      }
    }
    bool framing_ok = true;
    try {
      parse_chunk_layout(base.format, stored.data(), stored.size(), base.out_bytes);
    } catch (const CorruptChunk&) {
      framing_ok = false;
    }
    const std::string error = decode_error(base.format, stored, base.out_bytes);
    if (error.empty()) {
      ++decoded;
      EXPECT_TRUE(framing_ok) << "iteration " << iteration << ": decoded a chunk whose framing was rejected";
    } else {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 2000u);
  EXPECT_EQ(decoded + rejected, 4000u);
}

TEST(CodecCorruptStreams, RandomGarbageNeverCrashes) {
  std::mt19937_64 rng(99);
  std::size_t rejected = 0;
  for (int iteration = 0; iteration < 2000; ++iteration) {
    const std::size_t out_bytes = 8 * (1 + rng() % 600);
    std::vector<std::uint8_t> stored;
    if (iteration % 2 == 0) {
      stored = random_bytes(rng, rng() % 2000);
    } else {  // a plausible header and length fields, random payload
      stored = header(out_bytes, static_cast<std::uint32_t>(16 * (1 + rng() % 64)));
      const std::size_t blocks = 1 + rng() % 6;
      for (std::size_t b = 0; b < blocks; ++b) {
        const std::size_t length = 1 + rng() % 200;
        stored.resize(stored.size() + 4);
        put_u32_be(stored, stored.size() - 4, static_cast<std::uint32_t>(length));
        const auto payload = random_bytes(rng, length);
        stored.insert(stored.end(), payload.begin(), payload.end());
      }
    }
    for (const ChunkFormat& format : {ChunkFormat{ChunkFilter::bitshuffle_lz4, 1}, kBitshuffleU16,
                                      ChunkFormat{ChunkFilter::bitshuffle_lz4, 4}, kLz4U16}) {
      if (!decode_error(format, stored, out_bytes).empty()) ++rejected;
    }
  }
  EXPECT_GT(rejected, 7000u);
}

TEST(CodecCorruptStreams, ConcurrentDecodesAreIndependent) {
  std::mt19937_64 rng(41);
  std::vector<std::vector<std::uint8_t>> frames, chunks;
  for (int i = 0; i < 4; ++i) {
    frames.push_back(sparse_elements(rng, 36864, i % 2 ? 2 : 4));
    chunks.push_back(encode_bitshuffle_lz4(frames.back().data(), 36864, i % 2 ? 2 : 4));
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      const ChunkFormat format{ChunkFilter::bitshuffle_lz4, static_cast<std::size_t>(i % 2 ? 2 : 4)};
      for (int repeat = 0; repeat < 50; ++repeat)
        if (test_support::decode(format, chunks[static_cast<std::size_t>(i)], frames[static_cast<std::size_t>(i)].size()) !=
            frames[static_cast<std::size_t>(i)])
          ++mismatches[static_cast<std::size_t>(i)];
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace quantem::codec
