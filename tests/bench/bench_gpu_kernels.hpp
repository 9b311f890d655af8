#pragma once
// Bench-only GPU helpers (baselines and checks), CUDA-free declarations.
#include <cstddef>
#include <cstdint>

#include "quantem/kernels/device.hpp"

namespace quantem::bench {

// Plain masked sum over a dense uint16 volume, the dense peer of the ANS
// masked sum: one warp per frame reads the 32-bit words that hold masked
// pixels (d_word_entries: word index | pixel mask << 30, sorted, so a warp's
// loads are contiguous) and sums the masked halves. d_sums[frame] is written.
void dense_masked_sum_u16(const std::uint16_t* d_frames, std::uint64_t frame_count, std::uint32_t frame_pixels,
                          const std::uint32_t* d_word_entries, std::uint32_t entry_count, std::uint64_t* d_sums,
                          kernels::StreamHandle stream);

// Number of differing bytes between two device buffers (synchronous).
std::uint64_t count_differences(const std::uint8_t* d_a, const std::uint8_t* d_b, std::size_t bytes);

// Device timer around work enqueued on `stream` (cudaEvent pair).
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(kernels::StreamHandle stream);
  double stop_ms(kernels::StreamHandle stream);  // synchronises

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

}  // namespace quantem::bench
