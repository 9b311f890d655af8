// The LZ4 control flow the GPU decoder runs (kernels/codec/lz4_block.cuh),
// compiled for the host and compared with liblz4's LZ4_decompress_safe on
// valid blocks and on thousands of mutated ones. Needs no GPU.
#include <gtest/gtest.h>
#include <lz4.h>

#include <cstdint>
#include <random>
#include <vector>

#include "../../kernels/codec/lz4_block.cuh"
#include "lz4_test_support.hpp"

namespace quantem {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes compress(const Bytes& input) {
  Bytes out(static_cast<std::size_t>(LZ4_compressBound(static_cast<int>(input.size()))));
  const int n = LZ4_compress_default(reinterpret_cast<const char*>(input.data()), reinterpret_cast<char*>(out.data()),
                                     static_cast<int>(input.size()), static_cast<int>(out.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

Bytes sample_block(std::mt19937_64& rng, std::size_t bytes, int kind) {
  Bytes block(bytes, 0);
  std::uniform_int_distribution<int> byte(0, 255);
  std::bernoulli_distribution sparse(0.05);
  for (std::size_t i = 0; i < bytes; ++i) {
    if (kind == 0) block[i] = 0;
    else if (kind == 1) block[i] = sparse(rng) ? static_cast<std::uint8_t>(byte(rng)) : 0;
    else if (kind == 2) block[i] = static_cast<std::uint8_t>(byte(rng));
    else block[i] = static_cast<std::uint8_t>((i / 7) % 3 == 0 ? byte(rng) : i % 5);
  }
  return block;
}

// Returns whether ours accepted; fills `out`.
bool ours(const Bytes& compressed, std::size_t output_bytes, Bytes& out) {
  out.assign(output_bytes, 0);
  kernels::device::HostLz4Io io{compressed.data(), out.data()};
  return kernels::device::lz4_decode_block(io, static_cast<std::uint32_t>(compressed.size()),
                                   static_cast<std::uint32_t>(output_bytes)) == kernels::device::Lz4Result::ok;
}

bool theirs(const Bytes& compressed, std::size_t output_bytes, Bytes& out) {
  out.assign(output_bytes, 0);
  const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(compressed.data()), reinterpret_cast<char*>(out.data()),
                                    static_cast<int>(compressed.size()), static_cast<int>(output_bytes));
  return n == static_cast<int>(output_bytes);
}

using lz4_test::has_zero_offset;

TEST(Lz4BlockHost, DecodesWhatLiblz4Writes) {
  std::mt19937_64 rng(1);
  for (std::size_t bytes : {1u, 5u, 12u, 13u, 64u, 1000u, 4096u, 8192u}) {
    for (int kind = 0; kind < 4; ++kind) {
      const Bytes block = sample_block(rng, bytes, kind);
      const Bytes compressed = compress(block);
      Bytes decoded;
      ASSERT_TRUE(ours(compressed, bytes, decoded)) << bytes << " bytes, kind " << kind;
      EXPECT_EQ(decoded, block);
      EXPECT_FALSE(ours(compressed, bytes + 1, decoded)) << "a longer block must be rejected";
      if (bytes > 1) {
        EXPECT_FALSE(ours(compressed, bytes - 1, decoded)) << "a shorter block must be rejected";
      }
    }
  }
}

TEST(Lz4BlockHost, AcceptsExactlyWhatLiblz4AcceptsOnMutatedBlocks) {
  std::mt19937_64 rng(2);
  int rejected = 0;
  int zero_offset_cases = 0;
  for (int trial = 0; trial < 6000; ++trial) {
    const std::size_t bytes = trial % 3 == 0 ? 8192 : 16 + static_cast<std::size_t>(rng() % 2000);
    const Bytes block = sample_block(rng, bytes, trial % 4);
    Bytes compressed = compress(block);
    const int mutation = trial % 4;
    if (mutation == 0) {
      compressed[rng() % compressed.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
    } else if (mutation == 1) {
      compressed[rng() % compressed.size()] = static_cast<std::uint8_t>(rng());
    } else if (mutation == 2) {
      compressed.resize(rng() % compressed.size());
    } else {
      compressed.insert(compressed.begin() + static_cast<std::ptrdiff_t>(rng() % compressed.size()),
                        static_cast<std::uint8_t>(rng()));
    }
    Bytes mine;
    Bytes reference;
    const bool ours_ok = ours(compressed, bytes, mine);
    const bool theirs_ok = theirs(compressed, bytes, reference);
    if (theirs_ok && !ours_ok && has_zero_offset(compressed)) {
      ++zero_offset_cases;  // documented difference: liblz4 copies undefined bytes
      continue;
    }
    ASSERT_EQ(ours_ok, theirs_ok) << "trial " << trial;
    if (ours_ok) {
      ASSERT_EQ(mine, reference) << "trial " << trial;
    }
    if (!ours_ok) ++rejected;
  }
  EXPECT_GT(rejected, 1000);
  RecordProperty("zero_offset_cases", zero_offset_cases);
}

}  // namespace
}  // namespace quantem
