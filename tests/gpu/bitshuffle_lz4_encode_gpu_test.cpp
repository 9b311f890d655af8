// GPU bitshuffle/LZ4 encode (kernels::encode_bitshuffle_lz4) against its
// references: every chunk decodes to exactly its frame through the CPU
// decoder (codec::decode_chunk), the GPU decoder and the official HDF5
// bitshuffle filter (libh5bshuf through H5Dread); every LZ4 block is read by
// liblz4 and is the CPU reference's bit-shuffled block (codec::bitshuffle_block)
// bit for bit; header and raw tail are the CPU encoder's. Element sizes 1, 2
// and 4, odd frame sizes, partial blocks, raw tails, incompressible data and
// block sizes other than the default.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <lz4.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/bitshuffle_lz4.hpp"
#include "quantem/kernels/device.hpp"
#include "quantem/export/arina_writer.hpp"
#include "test_support.hpp"

namespace quantem {
namespace {

using Bytes = std::vector<std::uint8_t>;

// Encodes the frames (one batch, back to back) on the GPU; returns each chunk.
std::vector<Bytes> encode_on_gpu(const std::vector<Bytes>& frames, std::size_t element_size, std::size_t elements,
                                 std::size_t block_elements = 0) {
  Bytes staged;
  for (const Bytes& frame : frames) staged.insert(staged.end(), frame.begin(), frame.end());
  kernels::DeviceBuffer d_frames(std::max<std::size_t>(staged.size(), 1));
  kernels::copy_to_device(d_frames.data(), staged.data(), staged.size());
  kernels::BitshuffleLz4EncodeBatch batch;
  batch.d_frames = d_frames.data();
  batch.chunk_count = frames.size();
  batch.element_size = element_size;
  batch.elements_per_chunk = elements;
  batch.block_elements = block_elements;
  const std::size_t bound = kernels::bitshuffle_lz4_chunk_bound(batch);
  kernels::DeviceBuffer d_out(std::max<std::size_t>(frames.size() * bound, 1));
  kernels::fill_device(d_out.data(), 0xA5, d_out.size());  // poison: every byte kept must be written
  kernels::DeviceBuffer d_offsets((frames.size() + 1) * sizeof(std::uint64_t));
  kernels::DeviceBuffer d_scratch(std::max<std::size_t>(kernels::bitshuffle_lz4_encode_scratch_bytes(batch), 1));
  kernels::encode_bitshuffle_lz4(batch, d_scratch.data(), d_scratch.size(), d_out.as<std::uint8_t>(),
                              d_offsets.as<std::uint64_t>(), nullptr);
  kernels::synchronize_device();
  std::vector<std::uint64_t> offsets(frames.size() + 1);
  kernels::copy_to_host(offsets.data(), d_offsets.data(), d_offsets.size());
  EXPECT_EQ(offsets[0], 0u);
  Bytes all(offsets.back());
  kernels::copy_to_host(all.data(), d_out.data(), all.size());
  std::vector<Bytes> chunks;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    EXPECT_LE(offsets[i], offsets[i + 1]);
    EXPECT_LE(offsets[i + 1] - offsets[i], bound);
    chunks.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(offsets[i]),
                        all.begin() + static_cast<std::ptrdiff_t>(offsets[i + 1]));
  }
  return chunks;
}

Bytes decode_on_cpu(const Bytes& chunk, std::size_t element_size, std::size_t elements) {
  Bytes out(elements * element_size);
  codec::ChunkFormat format;
  format.filter = codec::ChunkFilter::bitshuffle_lz4;
  format.element_size = element_size;
  codec::decode_chunk(format, chunk.data(), chunk.size(), out.data(), out.size());
  return out;
}

std::uint32_t read_u32_be(const std::uint8_t* at) {
  return (std::uint32_t{at[0]} << 24) | (std::uint32_t{at[1]} << 16) | (std::uint32_t{at[2]} << 8) | at[3];
}

// Walks a chunk as the format says and checks every part against the CPU reference.
void expect_blocks_are_the_references(const Bytes& chunk, const Bytes& frame, std::size_t element_size,
                                      std::size_t elements, std::size_t block_elements, const std::string& what) {
  if (block_elements == 0) block_elements = codec::bitshuffle_default_block_elements(element_size);
  const Bytes reference = codec::encode_bitshuffle_lz4(frame.data(), elements, element_size, block_elements);
  ASSERT_GE(chunk.size(), 12u) << what;
  EXPECT_EQ(Bytes(chunk.begin(), chunk.begin() + 12), Bytes(reference.begin(), reference.begin() + 12)) << what;
  std::size_t at = 12;
  std::size_t element = 0;
  const std::size_t whole = elements - elements % 8;
  Bytes shuffled, decompressed;
  while (element < whole) {
    const std::size_t count = std::min(block_elements, whole - element);
    const std::size_t bytes = count * element_size;
    ASSERT_LE(at + 4, chunk.size()) << what;
    const std::uint32_t length = read_u32_be(chunk.data() + at);
    ASSERT_LE(at + 4 + length, chunk.size()) << what;
    decompressed.assign(bytes, 0);
    const int got = LZ4_decompress_safe(reinterpret_cast<const char*>(chunk.data() + at + 4),
                                        reinterpret_cast<char*>(decompressed.data()), static_cast<int>(length),
                                        static_cast<int>(bytes));
    ASSERT_EQ(got, static_cast<int>(bytes)) << what << ": liblz4 rejects the block at element " << element;
    shuffled.assign(bytes, 0);
    codec::bitshuffle_block(frame.data() + element * element_size, shuffled.data(), count, element_size);
    ASSERT_EQ(decompressed, shuffled) << what << ": block at element " << element;
    at += 4 + length;
    element += count;
  }
  const Bytes tail(frame.begin() + static_cast<std::ptrdiff_t>(whole * element_size), frame.end());
  EXPECT_EQ(Bytes(chunk.begin() + static_cast<std::ptrdiff_t>(at), chunk.end()), tail) << what << ": raw tail";
}

struct Case {
  std::size_t element_size;
  std::size_t elements;
  std::size_t block_elements;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  for (std::size_t element_size : {1u, 2u, 4u}) {
    // 192x192 frames, partial blocks, raw tails, tail-only chunks, several blocks.
    for (std::size_t elements : {36864u, 4100u, 4108u, 12u, 8u, 7u, 1u, 100003u, 2048u * 3 + 40}) {
      all.push_back({element_size, elements, 0});
    }
    for (const std::size_t block_elements : std::vector<std::size_t>{8, 64, 1000, 2048 / element_size}) {
      all.push_back({element_size, 36864u + 13u, block_elements});
    }
  }
  return all;
}

const std::vector<std::string> kPatterns = {"zero", "max", "uniform", "sparse", "disc"};

TEST(BitshuffleLz4GpuEncode, EveryChunkDecodesToItsFrameOnTheCpuAndTheGpuAndIsTheReferencesBlocks) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(20261206);
  for (const Case& c : cases()) {
    std::vector<Bytes> frames;
    for (const std::string& pattern : kPatterns) {
      frames.push_back(gpu_test::random_frame(rng, c.elements, c.element_size, pattern));
    }
    const std::vector<Bytes> chunks = encode_on_gpu(frames, c.element_size, c.elements, c.block_elements);
    const gpu_test::GpuDecodeResult gpu = gpu_test::decode_on_gpu(chunks, c.element_size, c.elements, c.block_elements);
    for (std::size_t i = 0; i < frames.size(); ++i) {
      const std::string what = kPatterns[i] + " " + std::to_string(c.elements) + " x " +
                               std::to_string(c.element_size) + " bytes, block " + std::to_string(c.block_elements);
      EXPECT_EQ(decode_on_cpu(chunks[i], c.element_size, c.elements), frames[i]) << what;
      EXPECT_EQ(gpu.status[i], kernels::ChunkStatus::ok) << what;
      EXPECT_EQ(gpu.frames[i], frames[i]) << what;
      expect_blocks_are_the_references(chunks[i], frames[i], c.element_size, c.elements, c.block_elements, what);
    }
  }
}

TEST(BitshuffleLz4GpuEncode, CountingDataCompressesNearlyAsWellAsLiblz4) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(7);
  for (std::size_t element_size : {1u, 2u, 4u}) {
    for (const std::string pattern : {"zero", "sparse", "disc"}) {
      const std::vector<Bytes> frames = {gpu_test::random_frame(rng, 36864, element_size, pattern)};
      const Bytes gpu = encode_on_gpu(frames, element_size, 36864).front();
      const Bytes cpu = codec::encode_bitshuffle_lz4(frames[0].data(), 36864, element_size);
      EXPECT_LE(gpu.size(), cpu.size() * 5 / 4 + 64) << pattern << " x " << element_size << ": " << gpu.size()
                                                     << " bytes, liblz4's " << cpu.size();
    }
  }
}

TEST(BitshuffleLz4GpuEncode, RejectsBlocksItCannotHold) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  kernels::BitshuffleLz4EncodeBatch batch;
  batch.elements_per_chunk = 100;
  batch.element_size = 2;
  batch.block_elements = 12;  // not a multiple of 8
  EXPECT_THROW(kernels::bitshuffle_lz4_chunk_bound(batch), Error);
  batch.block_elements = 8192;  // 16 KiB: above the shared-memory block
  EXPECT_THROW(kernels::bitshuffle_lz4_chunk_bound(batch), Error);
  batch.block_elements = 0;
  batch.element_size = 3;
  EXPECT_THROW(kernels::bitshuffle_lz4_chunk_bound(batch), Error);
}

// The official filter: the directory holding libh5bshuf.so (QUANTEM_HDF5_PLUGIN_DIR
// on a GPU machine's bundle, else Debian's plugin folder).
std::string official_plugin_dir() {
  if (const char* dir = std::getenv("QUANTEM_HDF5_PLUGIN_DIR")) return dir;
  return "/usr/lib/x86_64-linux-gnu/hdf5/serial/plugins";
}

TEST(BitshuffleLz4GpuEncode, TheOfficialFilterReadsWhatItWrites) {
  QUANTEM_REQUIRE_CUDA_DEVICE();
  const std::string plugins = official_plugin_dir();
  ASSERT_TRUE(std::filesystem::exists(plugins + "/libh5bshuf.so"))
      << "the official bitshuffle filter (libh5bshuf.so) is not in " << plugins;
  test::TempDir dir;
  std::mt19937_64 rng(11);
  for (DType dtype : {DType::uint8, DType::uint16, DType::uint32}) {
    const std::size_t element_size = dtype_size(dtype);
    const std::size_t rows = 37, cols = 29;  // odd: a partial block and a raw tail
    std::vector<Bytes> frames;
    for (const std::string& pattern : kPatterns) frames.push_back(gpu_test::random_frame(rng, rows * cols, element_size, pattern));
    const std::vector<Bytes> chunks = encode_on_gpu(frames, element_size, rows * cols);
    const std::string path = dir.file("gpu_" + std::to_string(element_size) + ".h5");
    {
      arina::BitshuffleFilterRegistration registration;
      arina::ShardFile shard(path, 1, frames.size(), rows, cols, dtype);
      for (std::size_t i = 0; i < chunks.size(); ++i) shard.write_chunk(i, chunks[i].data(), chunks[i].size());
      shard.close();
    }
    ASSERT_GE(H5PLprepend(plugins.c_str()), 0);
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const hid_t dataset = H5Dopen2(file, "/entry/data/data", H5P_DEFAULT);
    ASSERT_GE(dataset, 0);
    const hid_t memory_type = element_size == 1 ? H5T_NATIVE_UINT8 : element_size == 2 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32;
    Bytes read(frames.size() * rows * cols * element_size);
    EXPECT_GE(H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, read.data()), 0)
        << "H5Dread through the official filter failed";
    H5Dclose(dataset);
    H5Fclose(file);
    for (std::size_t i = 0; i < frames.size(); ++i) {
      const std::size_t frame_bytes = rows * cols * element_size;
      EXPECT_EQ(Bytes(read.begin() + static_cast<std::ptrdiff_t>(i * frame_bytes),
                      read.begin() + static_cast<std::ptrdiff_t>((i + 1) * frame_bytes)),
                frames[i])
          << kPatterns[i] << " x " << element_size;
    }
  }
}

}  // namespace
}  // namespace quantem
