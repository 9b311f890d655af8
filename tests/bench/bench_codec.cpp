// CPU codec throughput, single thread; prints one JSON object.
//
//   bench_codec [--frames N] [--seconds S]
//
// Frames are sparse electron-counting 192x192 u16 patterns (a Poisson bright
// disc wandering around the centre plus diffuse counts, about 8 KB stored per
// frame, close to what a real Arina acquisition stores per frame), encoded
// with our encoder.
// Throughputs are decoded bytes per second of thread CPU time, best of 3 rounds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <time.h>
#include <vector>

#include <lz4.h>

#include "quantem/codec/chunk_codec.hpp"

namespace {

constexpr std::size_t kDetectorSide = 192;
constexpr std::size_t kFrameElements = kDetectorSide * kDetectorSide;

std::vector<std::uint16_t> make_frame(std::mt19937_64& rng) {
  std::normal_distribution<double> jitter(0.0, 3.0);
  const double centre_row = kDetectorSide / 2.0 + jitter(rng);
  const double centre_col = kDetectorSide / 2.0 + jitter(rng);
  std::poisson_distribution<int> disc_counts(6.0);
  std::poisson_distribution<int> diffuse_counts(0.15);
  std::vector<std::uint16_t> frame(kFrameElements);
  for (std::size_t row = 0; row < kDetectorSide; ++row) {
    for (std::size_t col = 0; col < kDetectorSide; ++col) {
      const double dr = static_cast<double>(row) - centre_row, dc = static_cast<double>(col) - centre_col;
      const bool in_disc = dr * dr + dc * dc < 24.0 * 24.0;
      frame[row * kDetectorSide + col] = static_cast<std::uint16_t>(in_disc ? disc_counts(rng) : diffuse_counts(rng));
    }
  }
  return frame;
}

// CPU time of the calling thread: on a shared machine this leaves out the time
// the thread waited for a core (cache and memory contention remain).
double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// Runs `pass` (which processes `bytes_per_pass` decoded bytes) until
// `min_seconds` of thread CPU time have passed; the best of 3 rounds.
template <typename Pass>
double gigabytes_per_second(double min_seconds, std::size_t bytes_per_pass, Pass&& pass) {
  pass();  // warm up
  double best = 0.0;
  for (int round = 0; round < 3; ++round) {
    std::size_t passes = 0;
    const double start = thread_cpu_seconds();
    double elapsed = 0.0;
    do {
      pass();
      ++passes;
      elapsed = thread_cpu_seconds() - start;
    } while (elapsed < min_seconds / 3);
    best = std::max(best, static_cast<double>(passes * bytes_per_pass) / elapsed / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t frame_count = 256;
  double min_seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--frames") frame_count = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--seconds") min_seconds = std::strtod(argv[i + 1], nullptr);
  }

  std::mt19937_64 rng(1);
  std::vector<std::vector<std::uint8_t>> chunks;
  std::vector<std::uint8_t> frames(frame_count * kFrameElements * 2);
  std::size_t stored_bytes = 0;
  for (std::size_t f = 0; f < frame_count; ++f) {
    const auto frame = make_frame(rng);
    std::memcpy(frames.data() + f * kFrameElements * 2, frame.data(), kFrameElements * 2);
    chunks.push_back(quantem::codec::encode_bitshuffle_lz4(frames.data() + f * kFrameElements * 2, kFrameElements, 2));
    stored_bytes += chunks.back().size();
  }
  const std::size_t decoded_bytes = frames.size();

  std::vector<std::uint8_t> out(decoded_bytes);
  const quantem::codec::ChunkFormat format{quantem::codec::ChunkFilter::bitshuffle_lz4, 2};
  const double decode_gbps = gigabytes_per_second(min_seconds, decoded_bytes, [&] {
    for (std::size_t f = 0; f < frame_count; ++f)
      quantem::codec::decode_chunk(format, chunks[f].data(), chunks[f].size(), out.data() + f * kFrameElements * 2,
                                   kFrameElements * 2);
  });
  const bool decode_exact = out == frames;

  // LZ4 alone: every block of every chunk into one cache-resident block buffer.
  std::vector<quantem::codec::ChunkLayout> layouts;
  for (const auto& chunk : chunks)
    layouts.push_back(quantem::codec::parse_chunk_layout(format, chunk.data(), chunk.size(), kFrameElements * 2));
  std::vector<char> lz4_block(8192);
  const double lz4_gbps = gigabytes_per_second(min_seconds, decoded_bytes, [&] {
    for (std::size_t f = 0; f < frame_count; ++f)
      for (const auto& block : layouts[f].blocks)
        LZ4_decompress_safe(reinterpret_cast<const char*>(chunks[f].data() + block.stored_offset), lz4_block.data(),
                            static_cast<int>(block.stored_bytes), static_cast<int>(block.decoded_bytes));
  });

  // The bit transpose alone, one default block at a time over a cache-resident
  // 256 KiB set of blocks, for (a) the frames bit-shuffled as elements of 1, 2
  // and 4 bytes (sparse: most high bit planes are zero) and (b) random bytes
  // (no zero planes: the worst case).
  const std::size_t cached_bytes = std::size_t{256} << 10;
  std::mt19937_64 noise_rng(2);
  std::vector<std::uint8_t> noise(decoded_bytes);
  for (auto& byte : noise) byte = static_cast<std::uint8_t>(noise_rng());
  std::string unshuffle_json, unshuffle_random_json;
  bool unshuffle_exact = true;
  for (std::size_t element_size : {1, 2, 4}) {
    const std::size_t block_elements = quantem::codec::bitshuffle_default_block_elements(element_size);
    const std::size_t block_bytes = block_elements * element_size;
    const std::size_t blocks = cached_bytes / block_bytes;
    // Frames as elements of this width (values clipped to the width).
    std::vector<std::uint8_t> elements(blocks * block_bytes, 0);
    for (std::size_t e = 0; e < elements.size() / element_size; ++e) {
      std::uint16_t value;
      std::memcpy(&value, frames.data() + 2 * e, 2);
      if (element_size == 1 && value > 255) value = 255;
      std::memcpy(elements.data() + e * element_size, &value, element_size == 1 ? 1 : 2);
    }
    std::vector<std::uint8_t> shuffled_blocks(elements.size()), unshuffled(elements.size());
    for (std::size_t b = 0; b < blocks; ++b)
      quantem::codec::bitshuffle_block(elements.data() + b * block_bytes, shuffled_blocks.data() + b * block_bytes,
                                       block_elements, element_size);
    for (const auto* input : {&shuffled_blocks, &noise}) {
      const double gbps = gigabytes_per_second(min_seconds, blocks * block_bytes, [&] {
        for (std::size_t b = 0; b < blocks; ++b)
          quantem::codec::bitunshuffle_block(input->data() + b * block_bytes, unshuffled.data() + b * block_bytes,
                                             block_elements, element_size);
      });
      if (input == &shuffled_blocks && unshuffled != elements) unshuffle_exact = false;
      std::string& json = input == &noise ? unshuffle_random_json : unshuffle_json;
      char entry[96];
      std::snprintf(entry, sizeof entry, "%s\"u%zu\": %.3f", json.empty() ? "" : ", ", 8 * element_size, gbps);
      json += entry;
    }
  }

  std::vector<std::uint8_t> shuffled(decoded_bytes);
  const double shuffle_gbps = gigabytes_per_second(min_seconds, decoded_bytes / 8192 * 8192, [&] {
    for (std::size_t b = 0; b < decoded_bytes / 8192; ++b)
      quantem::codec::bitshuffle_block(frames.data() + b * 8192, shuffled.data() + b * 8192, 4096, 2);
  });
  const double encode_gbps = gigabytes_per_second(min_seconds, decoded_bytes, [&] {
    for (std::size_t f = 0; f < frame_count; ++f)
      quantem::codec::encode_bitshuffle_lz4(frames.data() + f * kFrameElements * 2, kFrameElements, 2);
  });

  std::printf(
      "{\"benchmark\": \"codec\", \"threads\": 1, \"timer\": \"thread_cpu_time\", \"frames\": %zu, \"frame\": \"192x192 u16 sparse\", "
      "\"decoded_bytes\": %zu, \"stored_bytes\": %zu, \"stored_bytes_per_frame\": %.1f, \"ratio\": %.3f, "
      "\"decode_bitshuffle_lz4_gb_per_s\": %.3f, \"lz4_only_gb_per_s\": %.3f, \"decode_exact\": %s, \"unshuffle_exact\": %s, "
      "\"unshuffle_in_cache_sparse_gb_per_s\": {%s}, \"unshuffle_in_cache_random_gb_per_s\": {%s}, \"shuffle_u16_gb_per_s\": %.3f, \"encode_bitshuffle_lz4_gb_per_s\": %.3f}\n",
      frame_count, decoded_bytes, stored_bytes, static_cast<double>(stored_bytes) / static_cast<double>(frame_count),
      static_cast<double>(decoded_bytes) / static_cast<double>(stored_bytes), decode_gbps, lz4_gbps,
      decode_exact ? "true" : "false", unshuffle_exact ? "true" : "false", unshuffle_json.c_str(), unshuffle_random_json.c_str(), shuffle_gbps, encode_gbps);
  return decode_exact && unshuffle_exact ? 0 : 1;
}
