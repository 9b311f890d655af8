// Host-side logic of the CUDA loader (no GPU needed): the read schedule puts
// every frame's chunk where the decoder will look for it, sub-batches respect
// the staging and batch limits, and the admission estimate covers every
// allocation the plan makes.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>

#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "cuda_load_plan.hpp"
#include "quantem/kernels/bitshuffle_lz4.hpp"
#include "quantem/kernels/device.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/synth/synth.hpp"
#include "test_support.hpp"

namespace quantem::backend::cuda {
namespace {

std::vector<std::uint8_t> pread_bytes(const std::string& path, std::uint64_t offset, std::uint64_t bytes) {
  std::vector<std::uint8_t> out(bytes);
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  EXPECT_EQ(::pread(fd, out.data(), bytes, static_cast<off_t>(offset)), static_cast<ssize_t>(bytes));
  ::close(fd);
  return out;
}

TEST(CudaLoadPlan, ReadScheduleStagesEveryChunkWhereTheDecoderLooks) {
  test::TempDir dir;
  synth::SynthOptions options;
  options.output_dir = dir.path();
  options.scan_rows = 11;
  options.scan_cols = 13;
  options.detector_rows = 24;
  options.detector_cols = 20;
  options.frames_per_shard = 50;
  options.threads = 2;
  const synth::SynthReport report = synth::write_acquisition(options);
  const catalog::Acquisition acquisition = catalog::inspect_master(report.master_path);
  ASSERT_TRUE(acquisition.status.loadable) << acquisition.status.reason;
  const catalog::FrameIndex index = catalog::build_frame_index(acquisition);

  for (const std::uint64_t staging : {std::uint64_t{0}, std::uint64_t{8} << 10}) {
    CudaLoadTuning tuning;
    tuning.frames_per_group = 16;
    tuning.groups_per_batch = 2;
    tuning.staging_bytes = staging;
    tuning.sub_batch_frames = 9;
    const CudaLoadPlan plan = plan_cuda_load(acquisition, tuning);
    EXPECT_TRUE(plan.gpu_decoder);
    EXPECT_EQ(plan.frames_per_group, 16u);
    EXPECT_EQ(plan.batch_frames, 32u);
    EXPECT_EQ(plan.batches, (143u + 31) / 32);
    const ReadSchedule schedule = plan_reads(acquisition, index, plan);
    EXPECT_EQ(schedule.stored_bytes, report.stored_bytes);

    std::uint64_t next_frame = 0;
    for (const SubBatch& sub : schedule.sub_batches) {
      EXPECT_EQ(sub.first_frame, next_frame);
      EXPECT_GE(sub.frame_count, 1u);
      EXPECT_LE(sub.frame_count, plan.sub_batch_frames);
      EXPECT_EQ(sub.batch, sub.first_frame / plan.batch_frames);
      EXPECT_EQ(sub.batch, (sub.first_frame + sub.frame_count - 1) / plan.batch_frames) << "crosses a batch";
      EXPECT_LE(sub.slot_bytes, plan.staging_bytes);
      EXPECT_TRUE(sub.gpu_decoded);
      // Stage the sub-batch the way the loader does, then find each chunk where the decoder looks.
      std::vector<std::uint8_t> slot(plan.staging_bytes, 0);
      for (std::size_t k = 0; k < sub.read_count; ++k) {
        const PreadSpan& read = schedule.reads[sub.first_read + k];
        EXPECT_EQ(read.slot_offset % 16, 0u);
        EXPECT_LE(read.slot_offset + read.bytes, sub.slot_bytes);
        const auto bytes = pread_bytes(index.shard_paths[read.shard], read.file_offset, read.bytes);
        std::copy(bytes.begin(), bytes.end(), slot.begin() + static_cast<std::ptrdiff_t>(read.slot_offset));
      }
      for (std::uint64_t frame = sub.first_frame; frame < sub.first_frame + sub.frame_count; ++frame) {
        const catalog::FrameLocation& location = index.frames[frame];
        const std::uint64_t at = schedule.chunk_slot_offsets[frame];
        ASSERT_LE(at + location.stored_bytes, sub.slot_bytes) << "frame " << frame;
        const auto chunk = pread_bytes(index.shard_paths[location.shard], location.file_offset, location.stored_bytes);
        EXPECT_TRUE(std::equal(chunk.begin(), chunk.end(), slot.begin() + static_cast<std::ptrdiff_t>(at)))
            << "frame " << frame;
      }
      next_frame += sub.frame_count;
    }
    EXPECT_EQ(next_frame, acquisition.frame_count());

    // The estimate covers the resident bound and every working allocation, rounded: a load from
    // files holds two dense batches with their statuses (decode one, encode the other), two device
    // staging slots and the decoder scratch; a load from dense host counts one dense batch.
    const std::uint64_t peak = plan.transition_peak_bytes(true);
    EXPECT_EQ(plan.batch_statuses_bytes, plan.batch_frames * 4);
    EXPECT_GE(peak, plan.resident_bound_bytes + 2 * (plan.dense_batch_bytes + plan.batch_statuses_bytes) +
                        2 * plan.device_slot_bytes + plan.encode_scratch_bytes + plan.bslz4_scratch_bytes +
                        plan.batch_misc_bytes + plan.group_offsets_bytes + kRuntimeReserveBytes);
    EXPECT_EQ(peak - plan.transition_peak_bytes(false),
              round_to_granularity(plan.dense_batch_bytes) + round_to_granularity(plan.batch_statuses_bytes) +
                  2 * round_to_granularity(plan.device_slot_bytes) + round_to_granularity(plan.bslz4_scratch_bytes));
  }
}

// The benchmarks' acquisition: 512 x 512 frames of 192 x 192 uint16 in bitshuffle/LZ4 chunks.
catalog::Acquisition realistic_512(const std::string& name) {
  catalog::Acquisition a;
  a.name = name;
  a.scan_rows = 512;
  a.scan_cols = 512;
  a.detector_rows = 192;
  a.detector_cols = 192;
  a.dtype = DType::uint16;
  a.chunk_format.filter = codec::ChunkFilter::bitshuffle_lz4;
  a.chunk_format.element_size = 2;
  return a;
}

TEST(CudaLoadPlan, DefaultsHoldAbout1GiBOfFramesPerBatchAndBoundTheResident) {
  catalog::Acquisition a = realistic_512("big_master.h5");
  const CudaLoadPlan plan = plan_cuda_load(a, {});
  EXPECT_EQ(plan.frames_per_group, 2048u);
  EXPECT_EQ(plan.groups_per_batch, 7u);  // 7 x 2048 frames x 72 KiB = 1.06 GB
  EXPECT_EQ(plan.batches, (128u + 6) / 7);
  const std::uint64_t dense = 512ull * 512 * 192 * 192 * 2;
  EXPECT_GT(plan.resident_bound_bytes, dense * 5 / 4);         // 2.5 bytes per value plus per-group layout
  EXPECT_LT(plan.resident_bound_bytes, dense * 5 / 4 + (dense / 100));
  // The overlapped load's second dense batch: 14,336 frames of 72 KiB (1008 MiB) and their
  // statuses (56 KiB, one 2 MiB granule), on top of the staging slots and the decoder scratch.
  EXPECT_EQ(plan.dense_batch_bytes, std::uint64_t{1008} << 20);
  EXPECT_EQ(plan.batch_statuses_bytes, 14336u * 4);
  EXPECT_EQ(plan.transition_peak_bytes(true) - plan.transition_peak_bytes(false),
            (std::uint64_t{1010} << 20) + 2 * round_to_granularity(plan.device_slot_bytes) +
                round_to_granularity(plan.bslz4_scratch_bytes));
  // A 1024 x 1024 scan of the same detector is admitted on one H200 (80% of 141 GB).
  a.scan_rows = a.scan_cols = 1024;
  EXPECT_LT(plan_cuda_load(a, {}).transition_peak_bytes(true), 112'000'000'000ull);
  // uint32: the format's own worst case, 6 bytes per value.
  a.dtype = DType::uint32;
  a.chunk_format.element_size = 4;
  a.scan_rows = a.scan_cols = 64;
  EXPECT_GE(plan_cuda_load(a, {}).resident_bound_bytes, 64ull * 64 * 192 * 192 * 6);
}

// The words each stream keeps for the write pass to copy (2 per frame by
// default) size the encoder's scratch, and the scratch is admitted with the
// rest of the load's working memory.
TEST(CudaLoadPlan, KeptWordsPerFrameSizeTheEncoderScratchAndAreAdmitted) {
  const catalog::Acquisition a = realistic_512("kept_master.h5");
  const CudaLoadPlan by_default = plan_cuda_load(a, {});
  EXPECT_EQ(by_default.kept_words_per_frame, 2u);
  CudaLoadTuning tuning;
  tuning.kept_words_per_frame = 4;
  const CudaLoadPlan four = plan_cuda_load(a, tuning);
  tuning.kept_words_per_frame = CudaLoadTuning::kNoKeptWords;
  const CudaLoadPlan none = plan_cuda_load(a, tuning);
  EXPECT_EQ(four.kept_words_per_frame, 4u);
  EXPECT_EQ(none.kept_words_per_frame, 0u);
  // 96 x 96 streams per group, 7 groups per batch, 2048 frames: 2 bytes per kept word.
  const std::uint64_t per_word_per_frame = 96ull * 96 * 7 * 2048 * 2;
  EXPECT_NEAR(static_cast<double>(four.encode_scratch_bytes - by_default.encode_scratch_bytes),
              static_cast<double>(2 * per_word_per_frame), 512.0);
  EXPECT_NEAR(static_cast<double>(by_default.encode_scratch_bytes - none.encode_scratch_bytes),
              static_cast<double>(2 * per_word_per_frame), 512.0);
  EXPECT_EQ(four.working_bytes(true) - by_default.working_bytes(true),
            round_to_granularity(four.encode_scratch_bytes) - round_to_granularity(by_default.encode_scratch_bytes));
}

TEST(CudaLoadPlan, RecentFramesHoldOneSeekSegmentWithinTheirCap) {
  catalog::Acquisition a = realistic_512("recent_master.h5");
  CudaLoadPlan plan = plan_cuda_load(a, {});
  // One seek segment (512 frames, one scan row here) of 72 KiB frames: 36 MiB, under the 64 MiB cap.
  EXPECT_EQ(plan.recent_frames, 512u);
  EXPECT_EQ(plan.recent_frames_bytes, 512u * 192 * 192 * 2);
  const std::uint64_t without = [&] {
    CudaLoadTuning none;
    none.recent_frames_max_bytes = CudaLoadTuning::kNoRecentFrames;
    const CudaLoadPlan p = plan_cuda_load(a, none);
    EXPECT_EQ(p.recent_frames, 0u);
    EXPECT_EQ(p.recent_frames_bytes, 0u);
    return p.resident_bytes_bound();
  }();
  EXPECT_EQ(plan.resident_bytes_bound(), without + plan.recent_frames_bytes);  // admitted with the resident
  // Large frames: as many as the cap holds (256 KiB frames: 256 of the segment's 512).
  a.detector_rows = a.detector_cols = 256;
  a.dtype = DType::uint32;
  a.chunk_format.element_size = 4;
  EXPECT_EQ(plan_cuda_load(a, {}).recent_frames, 256u);
  // No seek points: the segment is a group, still within the cap; a smaller cap, fewer frames.
  a.detector_rows = a.detector_cols = 64;
  CudaLoadTuning tuning;
  tuning.frames_per_seek_point = CudaLoadTuning::kNoSeekPoints;
  EXPECT_EQ(plan_cuda_load(a, tuning).recent_frames, 2048u);  // 2048 x 16 KiB = 32 MiB
  tuning.recent_frames_max_bytes = 3 * 64 * 64 * 4 + 1;
  EXPECT_EQ(plan_cuda_load(a, tuning).recent_frames, 3u);
  // A scan smaller than a segment: its frames.
  a.scan_rows = a.scan_cols = 4;
  EXPECT_EQ(plan_cuda_load(a, {}).recent_frames, 16u);
}

}  // namespace
}  // namespace quantem::backend::cuda

namespace quantem::backend::cuda {
namespace {

TEST(BitshuffleLz4Launch, BalancedBlocksPerWarpKeepTheRoundsAndShortenThem) {
  // 4096 frames of 192 x 192 u16 (9 blocks each) on an H200's 3,168 resident
  // warps: 2 rounds at 8 blocks per warp, and still 2 at 6.
  EXPECT_EQ(kernels::bitshuffle_lz4_balanced_blocks_per_warp(36864, 3168), 6u);
  EXPECT_EQ(kernels::bitshuffle_lz4_balanced_blocks_per_warp(18432, 3168), 6u);  // a batch's last 2048 frames: 1 round
  EXPECT_EQ(kernels::bitshuffle_lz4_balanced_blocks_per_warp(25344, 3168), 8u);  // exactly one round of 8
  EXPECT_EQ(kernels::bitshuffle_lz4_balanced_blocks_per_warp(25345, 3168), 5u);  // one block more: 2 rounds of 5
  EXPECT_EQ(kernels::bitshuffle_lz4_balanced_blocks_per_warp(100, 3168), 1u);
  EXPECT_EQ(kernels::bitshuffle_lz4_balanced_blocks_per_warp(0, 3168), 1u);
  EXPECT_EQ(kernels::bitshuffle_lz4_balanced_blocks_per_warp(1000, 0), 8u);  // no warps known: the most
  for (std::uint64_t blocks : {1ull, 7ull, 3169ull, 50000ull, 1234567ull}) {
    for (std::uint64_t warps : {1ull, 96ull, 3168ull}) {
      const std::uint64_t per_warp = kernels::bitshuffle_lz4_balanced_blocks_per_warp(blocks, warps);
      ASSERT_GE(per_warp, 1u);
      ASSERT_LE(per_warp, 8u);
      const auto rounds = [&](std::uint64_t b) { return ((blocks + b - 1) / b + warps - 1) / warps; };
      EXPECT_EQ(rounds(per_warp), rounds(8)) << blocks << " blocks, " << warps << " warps";
      if (per_warp > 1) {
        EXPECT_GT(rounds(per_warp - 1), rounds(8)) << "the fewest blocks per warp";
      }
    }
  }
}

// kernels::HostPages needs no device (start-up faults the staging slots in while
// the context is created): zeroed, writable, split across threads, move-only.
TEST(HostPages, FaultsInZeroedWritableMemoryWithoutADevice) {
  const std::size_t bytes = (std::size_t{5} << 20) + 123;  // not a whole number of huge pages
  kernels::HostPages pages(bytes, 4);
  ASSERT_NE(pages.data(), nullptr);
  ASSERT_EQ(pages.size(), bytes);
  auto* data = static_cast<std::uint8_t*>(pages.data());
  EXPECT_EQ(std::count(data, data + bytes, std::uint8_t{0}), static_cast<std::ptrdiff_t>(bytes));
  for (std::size_t i = 0; i < bytes; i += 4093) data[i] = static_cast<std::uint8_t>(i % 251 + 1);
  kernels::HostPages moved(std::move(pages));
  EXPECT_EQ(pages.data(), nullptr);
  EXPECT_EQ(pages.size(), 0u);
  ASSERT_EQ(moved.data(), data);
  for (std::size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(data[i], static_cast<std::uint8_t>(i % 251 + 1));
  kernels::HostPages assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.data(), data);
  EXPECT_EQ(kernels::HostPages(0, 8).data(), nullptr);
  EXPECT_NE(kernels::HostPages(100, 64).data(), nullptr);  // more threads than pages
}

}  // namespace
}  // namespace quantem::backend::cuda
