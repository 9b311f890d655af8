#pragma once
// The CUDA backend's load settings and report: what a caller may tune
// (CudaLoadTuning, inside CudaBackendOptions) and what a load reports
// (CudaBackend::last_load_report). A header of its own so the backend's
// internal files reach these types without the backend's factory
// (quantem/backend/cuda_backend.hpp). CUDA-free.
#include <cstdint>

namespace quantem::backend {

// Internal sizes of the load, for tests and benchmarks (0: the default).
struct CudaLoadTuning {
  std::uint32_t frames_per_group = 0;      // ANS group: default 2048 consecutive frames
  std::uint32_t groups_per_batch = 0;      // dense frames decoded before encoding: default ~1 GiB of frames
  std::uint64_t staging_bytes = 0;         // per staging slot (pinned host and device): default 64 MiB
  std::uint32_t sub_batch_frames = 0;      // chunks per decode launch: default 4096
  // Frames between a stream's seek points (docs/kernels.md, "Seek points"):
  // default 512; kNoSeekPoints: none (every decode starts at a group's first frame).
  std::uint32_t frames_per_seek_point = 0;
  static constexpr std::uint32_t kNoSeekPoints = 0xffffffffu;
  // The seek points written by the encoder's measuring pass from its own
  // states (no decode pass); false: the encoded groups are decoded once more
  // to record them (kernels::ans_record_seek_points), which also checks that
  // every stream decodes cleanly.
  bool seek_points_from_encoder = true;
  // Every group's decode tables built once at load and kept beside the
  // groups (docs/kernels.md, "Decode tables at load"); false: every decoding
  // CTA builds its group's tables from the frequency tables.
  bool decode_tables_at_load = true;
  // 16-bit words per frame of each ANS stream that the encoder's measuring
  // pass keeps for its write pass to copy (a stream that needs more is
  // encoded twice; kernels::AnsEncodeBatch::kept_words_per_frame): default 2 (8
  // bits per value); kNoKeptWords: none (every stream encoded twice).
  std::uint32_t kept_words_per_frame = 0;
  static constexpr std::uint32_t kNoKeptWords = 0xffffffffu;
  // The encoder's stream at the device's greatest priority, so its kernels
  // (the load's longer chain) take the SMs first and the decode of the next
  // batch fills the rest (benchmarks); default: both at the normal priority.
  bool prioritise_encoder = false;
  // Device memory the resident keeps for the decoded frames of the seek
  // segment its last frame request decoded (a viewer's cursor walks along a
  // scan row: the next frames are copied, not decoded): default 64 MiB, at
  // most one segment's frames; kNoRecentFrames: none.
  std::uint64_t recent_frames_max_bytes = 0;
  static constexpr std::uint64_t kNoRecentFrames = ~std::uint64_t{0};
  // The bitshuffle/LZ4 decode's launch shape (kernels::BitshuffleLz4Tuning):
  // blocks per warp 1..32 (0: balanced per launch), grid 1..100 percent of
  // the CTAs the device holds (0: 100), the literals of 32 sequences copied
  // at once (false: sequence by sequence). Benchmarks vary them.
  int bslz4_blocks_per_warp = 0;
  int bslz4_grid_percent = 0;
  bool bslz4_batched_literals = true;
  // CTA width of the resident's frame decoders (kernels::ans_accumulate_frames):
  // 0 chooses per call, 512 or 1024 force a width (tests, benchmarks).
  int accumulate_frames_cta_threads = 0;
};

// Where the time and the bytes of the last load went (benchmarks, tests).
struct CudaLoadReport {
  bool valid = false;
  double seconds = 0.0;              // the whole load() call
  double index_seconds = 0.0;        // catalog::build_frame_index + read planning
  double setup_seconds = 0.0;        // after the index: the working buffers, streams, events and encode worker
  double finish_seconds = 0.0;       // after the last batch: the resident's tables assembled, buffers released
  double read_seconds = 0.0;         // host time in preads (and host decodes), summed over sub-batches
  double wait_seconds = 0.0;         // loading-thread time blocked (staging slots, the encode worker freeing a dense batch, the end)
  double gpu_decode_seconds = 0.0;   // CUDA events: bitshuffle/LZ4 decode launches
  double gpu_encode_seconds = 0.0;   // CUDA events: masking + ANS measure + write
  double gpu_copy_seconds = 0.0;     // CUDA events: host-to-device copies
  std::uint64_t stored_bytes = 0;    // compressed chunk bytes read
  std::uint64_t dense_bytes = 0;     // frames x pixels x source element size
  std::uint64_t resident_bytes = 0;
  std::uint64_t host_decoded_chunks = 0;
  std::uint64_t admitted_peak_bytes = 0;   // estimate_load().transition_peak_bytes: reserved before the load
  std::uint64_t reserved_peak_bytes = 0;   // the most the load's reservation held (after its growth)
  std::uint64_t allocated_peak_bytes = 0;  // largest sum of live device allocations of the load
  std::uint64_t measured_peak_bytes = 0;   // cudaMemGetInfo: free at start - least free seen after allocations
  std::uint32_t batches = 0;
  std::uint32_t sub_batches = 0;
};

}  // namespace quantem::backend
