#pragma once
// Helpers for the GPU test suites: a clean skip without a CUDA device, raw
// chunks read straight from HDF5 files (no filter applied), and random frames.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "quantem/kernels/bitshuffle_lz4.hpp"
#include "quantem/kernels/device.hpp"

// Skips the current test when the machine has no usable CUDA device (CI).
#define QUANTEM_REQUIRE_CUDA_DEVICE()                                                            \
  do {                                                                                           \
    if (::quantem::kernels::device_count() == 0)                                                    \
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0): GPU test skipped"; \
  } while (0)

namespace quantem::gpu_test {

// One stored chunk of a frame-chunked 3-D dataset, exactly as in the file.
struct StoredChunk {
  std::vector<std::uint8_t> bytes;
  std::uint32_t filter_mask = 0;
};

struct StoredDataset {
  std::vector<StoredChunk> chunks;  // in frame order
  std::size_t element_size = 0;
  std::size_t frame_elements = 0;   // rows * cols of one chunk
  int filter_id = 0;                // first filter of the pipeline (32008 for bitshuffle/LZ4)
};

// Reads every chunk of `dataset` (shape (frames, rows, cols), chunks (1, rows, cols)).
StoredDataset read_stored_dataset(const std::string& path, const std::string& dataset = "/entry/data/data");

// Little-endian element helpers.
std::vector<std::uint8_t> random_frame(std::mt19937_64& rng, std::size_t elements, std::size_t element_size,
                                       const std::string& pattern);

using Bytes = std::vector<std::uint8_t>;

struct GpuDecodeResult {
  std::vector<Bytes> frames;
  std::vector<kernels::ChunkStatus> status;
};

// Packs the chunks back to back (no alignment, as a staging buffer would) and
// decodes them in one batch on the GPU. staged_backwards: the last chunk first
// in the buffer (offsets descending: the decoder cannot record sequences per
// block and every block takes the warp-at-a-time path).
GpuDecodeResult decode_on_gpu(const std::vector<Bytes>& chunks, std::size_t element_size, std::size_t elements,
                              std::size_t block_elements = 0, bool staged_backwards = false,
                              const kernels::BitshuffleLz4Tuning& tuning = {});

}  // namespace quantem::gpu_test
