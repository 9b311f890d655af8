// Product kernels over the ANS resident (declared in
// include/quantem/kernels/resident_products.hpp): per-pixel sums and maxima of
// selected frames, whole scan-binned frames in slots, per-frame moments, and
// the load-time masking of dense frames.
//
// Layers: the host launchers validate, size the grid and shared memory, launch
// and check; the kernels are thin; the decode building blocks are those of the
// codec (kernels/codec/ans_device.cuh).
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "quantem/ans/ans_format.hpp"
#include "quantem/ans/ans_model.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/resident_products.hpp"
#include "../codec/ans_device.cuh"
#include "../codec/ans_resident.cuh"
#include "quantem/kernels/cuda_check.hpp"
#include "../common/warp_collectives.cuh"
#include "../common/tuning.cuh"

namespace quantem::kernels {
namespace {

using namespace quantem::ans;
namespace dev = quantem::kernels::device::ans_device;
namespace tuning = quantem::kernels::device::tuning;

using namespace quantem::kernels::device::ans_resident;

ResidentParams make_params(const AnsResidentView& resident, const char* who) {
  return device::ans_resident::make_resident_params(resident, who);
}

// One thread's stream: its quad's pixels, their class tables (offsets) and shifts, the reader.
struct QuadDecoder {
  std::uint32_t pixels[4];
  std::uint32_t present;
  const std::uint32_t* table;  // the CTA's decode tables
  std::uint32_t class_offset[4];
  std::uint32_t shift[4];
  bool raw_bits;  // some lane of the warp has a class that sends raw low bits
  dev::StreamReader reader;

  __device__ void decode_frame(std::uint32_t values[4]) {
    reader.top_up();
    reader.decode_frame(table, class_offset, shift, raw_bits, values);
  }

  // An inactive decoder (stream past the end) has no pixels and a reader that never reads.
  __device__ void open(const ResidentParams& p, const OpenedGroup& opened, const std::uint32_t* tables,
                       std::uint32_t stream, bool active) {
    table = tables;
    present = active ? dev::quad_pixels(stream, p.quad_cols, p.rows, p.cols, pixels) : 0u;
    if (!active) {
#pragma unroll
      for (int k = 0; k < 4; ++k) pixels[k] = 0;
      dev::no_quad(class_offset, shift, reader);
      return;
    }
    dev::quad_class_tables(opened.blob, opened.header, pixels, present, class_offset, shift);
    reader.open(opened.blob + opened.header.stream_data_offset,
                reinterpret_cast<const std::uint32_t*>(opened.blob + opened.header.stream_offsets_offset), stream,
                opened.header.stream_count, opened.header.stream_data_bytes);
  }

  // After open(), by every thread of the warp still running.
  __device__ void agree_on_raw_bits() {
    raw_bits = __any_sync(__activemask(), (shift[0] | shift[1] | shift[2] | shift[3]) != 0);
  }
};

// Opens a job's group for one stream and moves its reader to the job's first
// frame; false (error flagged) when that frame is not a seek point.
__device__ inline bool start_job(QuadDecoder& q, const ResidentParams& p, const OpenedGroup& opened,
                                 const std::uint32_t* table, std::uint32_t stream, const FrameJob& job,
                                 std::uint32_t group_in_view) {
  q.open(p, opened, table, stream, true);
  if (job.frame_begin == 0) return true;
  const std::uint32_t segment = p.seek_points == 0 ? 0u : job.frame_begin / p.seek_frames;
  if (segment == 0 || segment > p.seek_points || segment * p.seek_frames != job.frame_begin) return false;
  device::ans_resident::seek_to_segment(p, group_in_view, segment, stream, q.reader);
  return true;
}

// What every per-job decoder does first (grid: stream blocks x jobs, the
// decode tables in dynamic shared memory): opens the job's group, fills the
// CTA's decode tables and starts this thread's stream at the job's first
// frame. false when the thread has nothing to decode: past the last stream,
// or a malformed job (then *error is flagged).
__device__ inline bool start_job_stream(const ResidentParams& p, const FrameJob& job, std::uint8_t* shared,
                                        std::uint32_t* error, OpenedGroup& opened, QuadDecoder& q) {
  auto* table = reinterpret_cast<std::uint32_t*>(shared);
  auto* cdf_scratch = reinterpret_cast<std::uint16_t*>(table + dev::kDecodeTableEntries);
  opened = open_group(p, job.group);
  if (!opened.valid || job.frame_end > opened.frame_count) {
    if (threadIdx.x == 0 && error != nullptr) atomicOr(error, 1u);
    return false;
  }
  group_decode_tables(p, opened, job.group, table, cdf_scratch);  // ends with __syncthreads()
  const std::uint32_t stream = blockIdx.x * blockDim.x + threadIdx.x;
  if (stream >= p.stream_count) return false;
  if (!start_job(q, p, opened, table, stream, job, job.group)) {
    if (error != nullptr) atomicOr(error, 1u);
    return false;
  }
  q.agree_on_raw_bits();
  return true;
}

// After a job's frames: a corrupt stream, or one that reached its group's end
// without finishing cleanly, flags *error.
__device__ inline void flag_if_stream_corrupt(const QuadDecoder& q, const FrameJob& job, const OpenedGroup& opened,
                                              std::uint32_t* error) {
  const bool bad = q.reader.corrupt || (job.frame_end == opened.frame_count && !q.reader.finished_cleanly());
  if (bad && error != nullptr) atomicOr(error, 1u);
}

__device__ inline bool frame_selected(const std::uint32_t* bitmap, std::uint64_t frame) {
  return ((__ldg(bitmap + (frame >> 5)) >> (frame & 31u)) & 1u) != 0;
}

// grid: (stream blocks, jobs). One thread per stream sums (and maxes) its
// quad's values over the selected frames in registers, then adds them once.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    accumulate_frames_kernel(ResidentParams p, const FrameJob* __restrict__ jobs,
                             const std::uint32_t* __restrict__ bitmap, unsigned long long* sums, unsigned int* maxima,
                             std::uint32_t* error) {
  extern __shared__ __align__(16) std::uint8_t shared[];
  const FrameJob job = jobs[blockIdx.y];
  OpenedGroup opened;
  QuadDecoder q;
  if (!start_job_stream(p, job, shared, error, opened, q)) return;
  unsigned long long sum[4] = {0, 0, 0, 0};
  std::uint32_t largest[4] = {0, 0, 0, 0};
  for (std::uint32_t f = job.frame_begin; f < job.frame_end; ++f) {
    const bool selected = frame_selected(bitmap, opened.first_frame + f);
    std::uint32_t values[4];
    q.decode_frame(values);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if ((q.present >> k) & 1u) {
        const std::uint32_t value = values[k];
        if (selected) {
          sum[k] += value;
          largest[k] = max(largest[k], value);
        }
      }
    }
  }
  flag_if_stream_corrupt(q, job, opened, error);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if ((q.present >> k) & 1u) {
      if (sum[k] != 0) atomicAdd(sums + q.pixels[k], sum[k]);
      if (maxima != nullptr && largest[k] != 0) atomicMax(maxima + q.pixels[k], largest[k]);
    }
  }
}

// Decodes one job's frames and stores those from keep_from on, whole, as
// Element values: frames[(f - keep_from) * pixels + p]. A keep_from outside
// the job flags *error.
template <class Element>
__device__ inline void decode_job_frames(const ResidentParams& p, const FrameJob& job, std::uint32_t keep_from,
                                         Element* frames, std::uint8_t* shared, std::uint32_t* error) {
  if (keep_from < job.frame_begin || keep_from >= job.frame_end) {
    if (threadIdx.x == 0 && error != nullptr) atomicOr(error, 1u);
    return;
  }
  OpenedGroup opened;
  QuadDecoder q;
  if (!start_job_stream(p, job, shared, error, opened, q)) return;
  const std::uint64_t pixels = std::uint64_t{p.rows} * p.cols;
  for (std::uint32_t f = job.frame_begin; f < job.frame_end; ++f) {
    std::uint32_t values[4];
    q.decode_frame(values);
    if (f < keep_from) continue;
    Element* frame = frames + (f - keep_from) * pixels;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if ((q.present >> k) & 1u) frame[q.pixels[k]] = static_cast<Element>(values[k]);
    }
  }
  flag_if_stream_corrupt(q, job, opened, error);
}

// grid: (stream blocks). One job's frames from keep_from on.
template <class Element>
__global__ void __launch_bounds__(tuning::kAccumulateThreads)
    decode_frames_kernel(ResidentParams p, FrameJob job, std::uint32_t keep_from, Element* frames,
                         std::uint32_t* error) {
  extern __shared__ __align__(16) std::uint8_t shared[];
  decode_job_frames(p, job, keep_from, frames, shared, error);
}

// grid: (stream blocks, runs). Each run's frames at its output frame.
template <class Element>
__global__ void __launch_bounds__(tuning::kAccumulateThreads)
    decode_frame_runs_kernel(ResidentParams p, const FrameRun* __restrict__ runs, Element* frames,
                             std::uint32_t* error) {
  extern __shared__ __align__(16) std::uint8_t shared[];
  const FrameRun run = runs[blockIdx.y];
  decode_job_frames(p, run.job, run.keep_from, frames + run.out_frame * (std::uint64_t{p.rows} * p.cols), shared,
                    error);
}

// grid: (stream blocks, jobs). Adds each selected frame's values to its slot.
__global__ void __launch_bounds__(tuning::kAccumulateThreads)
    accumulate_slots_kernel(ResidentParams p, const FrameJob* __restrict__ jobs,
                            const std::int32_t* __restrict__ frame_slots, unsigned long long* slot_sums,
                            std::uint32_t* error) {
  extern __shared__ __align__(16) std::uint8_t shared[];
  const FrameJob job = jobs[blockIdx.y];
  OpenedGroup opened;
  QuadDecoder q;
  if (!start_job_stream(p, job, shared, error, opened, q)) return;
  const std::uint64_t pixels = std::uint64_t{p.rows} * p.cols;
  for (std::uint32_t f = job.frame_begin; f < job.frame_end; ++f) {
    const std::int32_t slot = __ldg(frame_slots + opened.first_frame + f);
    std::uint32_t values[4];
    q.decode_frame(values);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if ((q.present >> k) & 1u) {
        const std::uint32_t value = values[k];
        if (slot >= 0 && value != 0) {
          atomicAdd(slot_sums + static_cast<std::uint64_t>(slot) * pixels + q.pixels[k],
                    static_cast<unsigned long long>(value));
        }
      }
    }
  }
  flag_if_stream_corrupt(q, job, opened, error);
}

__global__ void binned_slot_max_kernel(const std::uint64_t* __restrict__ slot_sums, std::uint32_t slot_count,
                                       std::uint32_t rows, std::uint32_t cols, std::uint32_t bin,
                                       std::uint32_t out_cols, std::uint64_t out_pixels, unsigned long long* result) {
  const std::uint64_t pixels = std::uint64_t{rows} * cols;
  const std::uint64_t total = std::uint64_t{slot_count} * out_pixels;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t slot = i / out_pixels;
    const std::uint64_t binned = i % out_pixels;
    const std::uint32_t row_begin = static_cast<std::uint32_t>(binned / out_cols) * bin;
    const std::uint32_t col_begin = static_cast<std::uint32_t>(binned % out_cols) * bin;
    const std::uint32_t row_end = min(rows, row_begin + bin);
    const std::uint32_t col_end = min(cols, col_begin + bin);
    const std::uint64_t* frame = slot_sums + slot * pixels;
    unsigned long long sum = 0;
    for (std::uint32_t r = row_begin; r < row_end; ++r)
      for (std::uint32_t c = col_begin; c < col_end; ++c) sum += frame[std::uint64_t{r} * cols + c];
    atomicMax(result + binned, sum);
  }
}

// A warp's sum of one moment: a 32-bit redux when every warp sum fits 32
// bits (`narrow`), else 64-bit shuffles.
__device__ __forceinline__ unsigned long long warp_moment_sum(unsigned long long lane_value, bool narrow) {
  return narrow ? __reduce_add_sync(0xffffffffu, static_cast<std::uint32_t>(lane_value))
                : device::warp_sum_u64(lane_value);
}

// grid: (stream blocks, groups). Like the codec's masked sum: per frame a warp
// reduces its lanes' three sums, one lane per frame keeps them and adds them
// to the CTA's per-frame sums in shared memory every 32 frames; at the end the
// CTA adds them to the global ones.
__global__ void __launch_bounds__(tuning::kMomentsThreads)
    frame_moments_kernel(ResidentParams p, const std::uint32_t* __restrict__ row_weights,
                         const std::uint32_t* __restrict__ col_weights, bool narrow_weights,
                         unsigned long long* total, unsigned long long* row_moment, unsigned long long* col_moment,
                         std::uint32_t* error) {
  extern __shared__ __align__(16) std::uint8_t shared_bytes[];
  const GroupSumsShared shared = group_sums_shared(shared_bytes);
  const OpenedGroup opened = open_group_for_sums(p, error, shared, 3);
  if (!opened.valid) return;
  const std::uint32_t frames = opened.frame_count;
  const std::uint32_t* table = shared.table;
  unsigned long long* frame_sums = shared.frame_sums;

  const std::uint32_t stream = blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = stream < p.stream_count;
  if (__any_sync(0xffffffffu, active)) {
    QuadDecoder q;
    q.open(p, opened, table, stream, active);
    q.agree_on_raw_bits();
    std::uint32_t row_weight[4];
    std::uint32_t col_weight[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const bool here = ((q.present >> k) & 1u) != 0;
      row_weight[k] = here ? __ldg(row_weights + q.pixels[k] / p.cols) : 0u;
      col_weight[k] = here ? __ldg(col_weights + q.pixels[k] % p.cols) : 0u;
    }
    const std::uint32_t lane = threadIdx.x % 32;
    // 16-bit groups with weights below 512: every warp sum fits 32 bits (32 * 4 * 65535 * 511 < 2^32).
    const bool narrow = narrow_weights && opened.header.raw_words == 1;
    // Lane j keeps the warp sums of frame 32i + j in registers and adds them
    // to the CTA's sums every 32 frames (64-bit shared atomics are CAS loops:
    // once per frame and warp they dominated the kernel).
    for (std::uint32_t first = 0; first < frames; first += 32) {
      const std::uint32_t frames_here = min(32u, frames - first);
      unsigned long long mine_total = 0;
      unsigned long long mine_row = 0;
      unsigned long long mine_col = 0;
      for (std::uint32_t j = 0; j < frames_here; ++j) {
        std::uint32_t values[4];
        q.decode_frame(values);
        unsigned long long lane_total = 0;
        unsigned long long lane_row = 0;
        unsigned long long lane_col = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {  // absent positions: value 0, weights 0
          const std::uint32_t value = values[k];
          lane_total += value;
          lane_row += static_cast<unsigned long long>(row_weight[k]) * value;
          lane_col += static_cast<unsigned long long>(col_weight[k]) * value;
        }
        lane_total = warp_moment_sum(lane_total, narrow);
        lane_row = warp_moment_sum(lane_row, narrow);
        lane_col = warp_moment_sum(lane_col, narrow);
        if (lane == j) {
          mine_total = lane_total;
          mine_row = lane_row;
          mine_col = lane_col;
        }
      }
      if (lane < frames_here && mine_total != 0) {  // a zero total has zero moments
        const std::uint32_t f = first + lane;
        atomicAdd(frame_sums + f, mine_total);
        atomicAdd(frame_sums + frames + f, mine_row);
        atomicAdd(frame_sums + 2 * frames + f, mine_col);
      }
    }
    if (active && !q.reader.finished_cleanly() && error != nullptr) atomicOr(error, 1u);
  }
  __syncthreads();
  for (std::uint32_t f = threadIdx.x; f < frames; f += blockDim.x) {
    if (frame_sums[f] == 0) continue;
    atomicAdd(total + opened.first_frame + f, frame_sums[f]);
    if (frame_sums[frames + f] != 0) atomicAdd(row_moment + opened.first_frame + f, frame_sums[frames + f]);
    if (frame_sums[2 * frames + f] != 0) atomicAdd(col_moment + opened.first_frame + f, frame_sums[2 * frames + f]);
  }
}

template <class T>
__global__ void zero_masked_kernel(T* frames, std::uint64_t frame_count, std::uint32_t frame_pixels,
                                   const std::uint32_t* __restrict__ masked, std::uint32_t masked_count) {
  const std::uint64_t total = frame_count * masked_count;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t frame = i / masked_count;
    frames[frame * frame_pixels + __ldg(masked + i % masked_count)] = T{0};
  }
}

template <class T>
__global__ void max_value_kernel(const T* __restrict__ values, std::uint64_t count, unsigned int* result) {
  std::uint32_t largest = 0;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    largest = max(largest, static_cast<std::uint32_t>(values[i]));
  }
  largest = __reduce_max_sync(0xffffffffu, largest);
  if (threadIdx.x % 32 == 0 && largest != 0) atomicMax(result, largest);
}



template <class T>
void launch_prepare(T* frames, std::uint64_t frame_count, std::uint32_t frame_pixels, const std::uint32_t* masked,
                    std::uint32_t masked_count, std::uint32_t* d_max, cudaStream_t stream) {
  const int threads = tuning::kPrepareThreads;
  if (masked_count != 0 && frame_count != 0) {
    zero_masked_kernel<T><<<tuning::elementwise_ctas(frame_count * masked_count, threads, current_sm_count()), threads, 0, stream>>>(
        frames, frame_count, frame_pixels, masked, masked_count);
    QUANTEM_CUDA_CHECK_LAUNCH(stream, "zero_masked_kernel");
  }
  if (d_max != nullptr && frame_count != 0) {
    const std::uint64_t count = frame_count * frame_pixels;
    max_value_kernel<T><<<tuning::elementwise_ctas(count, threads, current_sm_count()), threads, 0, stream>>>(
        frames, count, reinterpret_cast<unsigned int*>(d_max));
    QUANTEM_CUDA_CHECK_LAUNCH(stream, "max_value_kernel");
  }
}

void check_jobs(const FrameJob* d_jobs, std::size_t job_count, const char* who) {
  if (job_count > kMaxFrameJobs) throw bad_request(std::string(who) + ": more than 65535 group jobs in one call");
  if (job_count != 0 && d_jobs == nullptr) throw bad_request(std::string(who) + ": null job list");
}

}  // namespace

void prepare_frames(void* d_frames, DType dtype, std::uint64_t frame_count, std::uint32_t frame_pixels,
                    const std::uint32_t* d_masked_pixels, std::uint32_t masked_count, std::uint32_t* d_max,
                    StreamHandle stream) {
  if (d_frames == nullptr && frame_count != 0) throw bad_request("prepare_frames: null frames");
  if (masked_count != 0 && d_masked_pixels == nullptr) throw bad_request("prepare_frames: null masked pixel list");
  switch (dtype) {
    case DType::uint8:
      launch_prepare(static_cast<std::uint8_t*>(d_frames), frame_count, frame_pixels, d_masked_pixels, masked_count,
                     d_max, stream);
      break;
    case DType::uint16:
      launch_prepare(static_cast<std::uint16_t*>(d_frames), frame_count, frame_pixels, d_masked_pixels, masked_count,
                     d_max, stream);
      break;
    case DType::uint32:
      launch_prepare(static_cast<std::uint32_t*>(d_frames), frame_count, frame_pixels, d_masked_pixels, masked_count,
                     d_max, stream);
      break;
  }
}

namespace {
// The launch both accumulate kernels share: one CTA per (stream block, job),
// the decode tables in dynamic shared memory.
template <class Kernel, class... Args>
void launch_per_job(Kernel kernel, const char* name, const ResidentParams& p, std::size_t job_count,
                    StreamHandle stream, Args... args) {
  const int threads = tuning::kAccumulateThreads;
  const std::size_t shared_bytes = table_shared_bytes(threads);
  QUANTEM_CUDA_TRY(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)));
  const dim3 grid((p.stream_count + threads - 1) / threads, static_cast<unsigned>(job_count));
  kernel<<<grid, threads, shared_bytes, stream>>>(p, args...);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, name);
}
}  // namespace

namespace {
template <int Threads>
void launch_accumulate_frames(const ResidentParams& p, std::size_t job_count, StreamHandle stream, const FrameJob* d_jobs,
                              const std::uint32_t* d_frame_bitmap, std::uint64_t* d_sums, std::uint32_t* d_max,
                              std::uint32_t* d_error) {
  const std::size_t shared_bytes = table_shared_bytes(Threads);
  QUANTEM_CUDA_TRY(cudaFuncSetAttribute(accumulate_frames_kernel<Threads>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
  const dim3 grid((p.stream_count + Threads - 1) / Threads, static_cast<unsigned>(job_count));
  accumulate_frames_kernel<Threads><<<grid, Threads, shared_bytes, stream>>>(
      p, d_jobs, d_frame_bitmap, reinterpret_cast<unsigned long long*>(d_sums), reinterpret_cast<unsigned int*>(d_max),
      d_error);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "accumulate_frames_kernel");
}
}  // namespace

void check_ans_accumulate_frames_cta_threads(int cta_threads) {
  if (cta_threads != 0 && cta_threads != tuning::kAccumulateFramesNarrowThreads &&
      cta_threads != tuning::kAccumulateFramesWideThreads) {
    throw bad_request("ans_accumulate_frames: CTA threads 0 (the default), " +
                      std::to_string(tuning::kAccumulateFramesNarrowThreads) + " or " +
                      std::to_string(tuning::kAccumulateFramesWideThreads));
  }
}

int ans_accumulate_frames_threads_for(std::size_t job_count, std::uint32_t stream_count, int sm_count) {
  const auto ctas = [&](std::uint64_t threads) { return job_count * ((stream_count + threads - 1) / threads); };
  return ctas(tuning::kAccumulateFramesWideThreads) >= static_cast<std::uint64_t>(sm_count)
             ? tuning::kAccumulateFramesWideThreads
             : tuning::kAccumulateFramesNarrowThreads;
}

void ans_accumulate_frames(const AnsResidentView& resident, const FrameJob* d_jobs, std::size_t job_count,
                           const std::uint32_t* d_frame_bitmap, std::uint64_t* d_sums, std::uint32_t* d_max,
                           std::uint32_t* d_error, StreamHandle stream, int cta_threads) {
  check_ans_accumulate_frames_cta_threads(cta_threads);
  const ResidentParams p = make_params(resident, "ans_accumulate_frames");
  check_jobs(d_jobs, job_count, "ans_accumulate_frames");
  if (job_count == 0) return;
  if (d_frame_bitmap == nullptr || d_sums == nullptr) throw bad_request("ans_accumulate_frames: null bitmap or sums");
  const int threads = cta_threads != 0 ? cta_threads
                                       : ans_accumulate_frames_threads_for(job_count, p.stream_count, current_sm_count());
  if (threads == tuning::kAccumulateFramesWideThreads) {
    launch_accumulate_frames<tuning::kAccumulateFramesWideThreads>(p, job_count, stream, d_jobs, d_frame_bitmap, d_sums,
                                                                   d_max, d_error);
  } else {
    launch_accumulate_frames<tuning::kAccumulateFramesNarrowThreads>(p, job_count, stream, d_jobs, d_frame_bitmap,
                                                                     d_sums, d_max, d_error);
  }
}

void ans_accumulate_slots(const AnsResidentView& resident, const FrameJob* d_jobs, std::size_t job_count,
                          const std::int32_t* d_frame_slots, std::uint64_t* d_slot_sums, std::uint32_t* d_error,
                          StreamHandle stream) {
  const ResidentParams p = make_params(resident, "ans_accumulate_slots");
  check_jobs(d_jobs, job_count, "ans_accumulate_slots");
  if (job_count == 0) return;
  if (d_frame_slots == nullptr || d_slot_sums == nullptr) throw bad_request("ans_accumulate_slots: null slots");
  launch_per_job(accumulate_slots_kernel, "accumulate_slots_kernel", p, job_count, stream, d_jobs, d_frame_slots,
                 reinterpret_cast<unsigned long long*>(d_slot_sums), d_error);
}

void ans_decode_frames(const AnsResidentView& resident, const FrameJob& job, std::uint32_t keep_from, void* d_frames,
                       std::uint32_t element_bytes, std::uint32_t* d_error, StreamHandle stream) {
  const ResidentParams p = make_params(resident, "ans_decode_frames");
  if (d_frames == nullptr) throw bad_request("ans_decode_frames: null frames");
  if (job.frame_begin >= job.frame_end || keep_from < job.frame_begin || keep_from >= job.frame_end)
    throw bad_request("ans_decode_frames: keep_from must lie in the job's frames [frame_begin, frame_end)");
  switch (element_bytes) {
    case 1:
      launch_per_job(decode_frames_kernel<std::uint8_t>, "decode_frames_kernel", p, 1, stream, job, keep_from,
                     static_cast<std::uint8_t*>(d_frames), d_error);
      break;
    case 2:
      launch_per_job(decode_frames_kernel<std::uint16_t>, "decode_frames_kernel", p, 1, stream, job, keep_from,
                     static_cast<std::uint16_t*>(d_frames), d_error);
      break;
    case 4:
      launch_per_job(decode_frames_kernel<std::uint32_t>, "decode_frames_kernel", p, 1, stream, job, keep_from,
                     static_cast<std::uint32_t*>(d_frames), d_error);
      break;
    default:
      throw bad_request("ans_decode_frames: element size must be 1, 2 or 4 bytes");
  }
}

void ans_decode_frame_runs(const AnsResidentView& resident, const FrameRun* d_runs, std::size_t run_count,
                           void* d_frames, std::uint32_t element_bytes, std::uint32_t* d_error, StreamHandle stream) {
  const ResidentParams p = make_params(resident, "ans_decode_frame_runs");
  if (run_count > kMaxFrameJobs) throw bad_request("ans_decode_frame_runs: more than 65535 runs in one call");
  if (run_count == 0) return;
  if (d_runs == nullptr || d_frames == nullptr) throw bad_request("ans_decode_frame_runs: null runs or frames");
  switch (element_bytes) {
    case 1:
      launch_per_job(decode_frame_runs_kernel<std::uint8_t>, "decode_frame_runs_kernel", p, run_count, stream, d_runs,
                     static_cast<std::uint8_t*>(d_frames), d_error);
      break;
    case 2:
      launch_per_job(decode_frame_runs_kernel<std::uint16_t>, "decode_frame_runs_kernel", p, run_count, stream, d_runs,
                     static_cast<std::uint16_t*>(d_frames), d_error);
      break;
    case 4:
      launch_per_job(decode_frame_runs_kernel<std::uint32_t>, "decode_frame_runs_kernel", p, run_count, stream, d_runs,
                     static_cast<std::uint32_t*>(d_frames), d_error);
      break;
    default:
      throw bad_request("ans_decode_frame_runs: element size must be 1, 2 or 4 bytes");
  }
}

void binned_slot_max(const std::uint64_t* d_slot_sums, std::uint32_t slot_count, std::uint32_t detector_rows,
                     std::uint32_t detector_cols, std::uint32_t detector_bin, std::uint64_t* d_result,
                     StreamHandle stream) {
  if (slot_count == 0) return;
  if (d_slot_sums == nullptr || d_result == nullptr) throw bad_request("binned_slot_max: null pointer");
  if (detector_bin == 0 || detector_rows == 0 || detector_cols == 0) throw bad_request("binned_slot_max: empty shape");
  const std::uint32_t out_rows = (detector_rows + detector_bin - 1) / detector_bin;
  const std::uint32_t out_cols = (detector_cols + detector_bin - 1) / detector_bin;
  const std::uint64_t out_pixels = std::uint64_t{out_rows} * out_cols;
  const int threads = tuning::kBinnedMaxThreads;
  binned_slot_max_kernel<<<tuning::elementwise_ctas(out_pixels * slot_count, threads, current_sm_count()), threads, 0, stream>>>(
      d_slot_sums, slot_count, detector_rows, detector_cols, detector_bin, out_cols, out_pixels,
      reinterpret_cast<unsigned long long*>(d_result));
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "binned_slot_max_kernel");
}

void ans_frame_moments(const AnsResidentView& resident, const std::uint32_t* d_row_weights,
                       const std::uint32_t* d_col_weights, std::uint32_t max_weight, std::uint64_t* d_total,
                       std::uint64_t* d_row_moment, std::uint64_t* d_col_moment, std::uint32_t* d_error,
                       StreamHandle stream) {
  const ResidentParams p = make_params(resident, "ans_frame_moments");
  if (resident.frames_per_group > kMomentsMaxFramesPerGroup)
    throw bad_request("ans_frame_moments: frames_per_group above " + std::to_string(kMomentsMaxFramesPerGroup));
  if (resident.group_count > 65535) throw bad_request("ans_frame_moments: more than 65535 groups");
  if (d_row_weights == nullptr || d_col_weights == nullptr || d_total == nullptr || d_row_moment == nullptr ||
      d_col_moment == nullptr)
    throw bad_request("ans_frame_moments: null pointer");
  const std::size_t bytes = resident.total_frames * sizeof(std::uint64_t);
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_total, 0, bytes, stream));
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_row_moment, 0, bytes, stream));
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d_col_moment, 0, bytes, stream));
  if (resident.group_count == 0) return;
  const int threads = tuning::kMomentsThreads;
  const std::size_t shared_bytes =
      table_shared_bytes(threads) + 3 * std::size_t{resident.frames_per_group} * sizeof(std::uint64_t);
  QUANTEM_CUDA_TRY(cudaFuncSetAttribute(frame_moments_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
  const dim3 grid((p.stream_count + threads - 1) / threads, static_cast<unsigned>(resident.group_count));
  frame_moments_kernel<<<grid, threads, shared_bytes, stream>>>(
      p, d_row_weights, d_col_weights, max_weight < 512, reinterpret_cast<unsigned long long*>(d_total),
      reinterpret_cast<unsigned long long*>(d_row_moment), reinterpret_cast<unsigned long long*>(d_col_moment),
      d_error);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "frame_moments_kernel");
}

}  // namespace quantem::kernels
