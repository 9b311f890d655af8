// GPU decoders of the ANS resident: full frames, the seek points and the
// decode tables recorded at load. The masked sum, a product over the same
// streams, is in kernels/products/masked_sum.cu.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "quantem/ans/ans_format.hpp"
#include "quantem/ans/ans_model.hpp"
#include "quantem/core/error.hpp"
#include "quantem/kernels/ans.hpp"
#include "quantem/kernels/cuda_check.hpp"
#include "../common/warp_collectives.cuh"
#include "ans_device.cuh"
#include "ans_resident.cuh"
#include "../common/tuning.cuh"

namespace quantem::kernels {
namespace {

using namespace quantem::ans;
namespace dev = quantem::kernels::device::ans_device;

using namespace quantem::kernels::device::ans_resident;

// One thread's stream of an opened group: its quad's pixels, their class
// tables and shifts, and its reader at the group's first frame. raw_bits is
// agreed on by the threads of the warp still running (call from all of them).
struct GroupStream {
  std::uint32_t pixels[4];
  std::uint32_t present;
  std::uint32_t class_offset[4];
  std::uint32_t shift[4];
  bool raw_bits;
  dev::StreamReader reader;

  __device__ void open(const ResidentParams& p, const OpenedGroup& opened, std::uint32_t stream) {
    const auto& header = opened.header;
    present = dev::quad_pixels(stream, p.quad_cols, p.rows, p.cols, pixels);
    dev::quad_class_tables(opened.blob, header, pixels, present, class_offset, shift);
    reader.open(opened.blob + header.stream_data_offset,
                reinterpret_cast<const std::uint32_t*>(opened.blob + header.stream_offsets_offset), stream,
                header.stream_count, header.stream_data_bytes);
    raw_bits = __any_sync(__activemask(), (shift[0] | shift[1] | shift[2] | shift[3]) != 0);
  }

  __device__ void decode_frame(const std::uint32_t* table, std::uint32_t values[4]) {
    reader.top_up();
    reader.decode_frame(table, class_offset, shift, raw_bits, values);
  }
};

// grid: (stream blocks, groups). One thread per stream writes its quad of every frame.
template <class Out>
__global__ void __launch_bounds__(device::tuning::kAnsDecodeThreads)
    decode_frames_kernel(ResidentParams p, std::uint32_t first_group, Out* out, std::uint32_t* error) {
  extern __shared__ __align__(16) std::uint8_t shared[];
  auto* table = reinterpret_cast<std::uint32_t*>(shared);
  auto* cdf_scratch = reinterpret_cast<std::uint16_t*>(table + dev::kDecodeTableEntries);
  const OpenedGroup opened = open_group_or_flag(p, first_group + blockIdx.y, error);
  if (!opened.valid) return;
  const auto& [blob, header, first_frame, frame_count, valid] = opened;
  group_decode_tables(p, opened, first_group + blockIdx.y, table, cdf_scratch);
  const std::uint32_t stream = blockIdx.x * blockDim.x + threadIdx.x;
  if (stream >= header.stream_count) return;
  GroupStream s;
  s.open(p, opened, stream);
  const std::uint64_t pixels_per_frame = std::uint64_t{p.rows} * p.cols;
  Out* group_out = out + (first_frame - std::uint64_t{first_group} * p.frames_per_group) * pixels_per_frame;
  bool overflow = false;
  for (std::uint32_t f = 0; f < frame_count; ++f) {
    Out* frame_out = group_out + f * pixels_per_frame;
    std::uint32_t values[4];
    s.decode_frame(table, values);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if ((s.present >> k) & 1u) {
        if (sizeof(Out) == 2 && values[k] > 0xffffu) overflow = true;
        frame_out[s.pixels[k]] = static_cast<Out>(values[k]);
      }
    }
  }
  if ((!s.reader.finished_cleanly() || overflow) && error != nullptr) atomicOr(error, 1u);
}

// grid: groups. A CTA writes its group's decode tables to global memory (the
// same tables a decoding CTA builds in shared memory).
__global__ void __launch_bounds__(device::tuning::kAnsBuildTablesThreads)
    build_group_decode_tables_kernel(ResidentParams p, std::uint32_t* tables, std::uint32_t* error) {
  extern __shared__ __align__(16) std::uint8_t shared[];
  auto* cdf_scratch = reinterpret_cast<std::uint16_t*>(shared);
  const OpenedGroup opened = open_group_or_flag(p, blockIdx.x, error);
  if (!opened.valid) return;  // every thread of the CTA
  dev::build_decode_tables(opened.blob, opened.header, tables + std::uint64_t{blockIdx.x} * dev::kDecodeTableEntries,
                           cdf_scratch);
}

// grid: (stream blocks, groups). One thread per stream decodes its whole
// chain and writes its reader's states and word index before every frame
// s·seek_frames (s = 1 .. seek_points) to the seek table.
__global__ void __launch_bounds__(device::tuning::kAnsSeekPointThreads)
    record_seek_points_kernel(ResidentParams p, std::uint32_t seek_frames, std::uint32_t seek_points,
                              std::uint32_t* points, std::uint32_t* error) {
  extern __shared__ __align__(16) std::uint8_t shared[];
  auto* table = reinterpret_cast<std::uint32_t*>(shared);
  auto* cdf_scratch = reinterpret_cast<std::uint16_t*>(table + dev::kDecodeTableEntries);
  const OpenedGroup opened = open_group_or_flag(p, blockIdx.y, error);
  if (!opened.valid) return;
  const auto& [blob, header, first_frame, frame_count, valid] = opened;
  group_decode_tables(p, opened, blockIdx.y, table, cdf_scratch);
  const std::uint32_t stream = blockIdx.x * blockDim.x + threadIdx.x;
  if (stream >= header.stream_count) return;
  GroupStream s;
  s.open(p, opened, stream);
  std::uint32_t* group_points = points + std::uint64_t{blockIdx.y} * seek_points * 5 * p.stream_count + stream;
  std::uint32_t next_point = 1;
  for (std::uint32_t f = 0; f < frame_count; ++f) {
    if (f == next_point * seek_frames && next_point <= seek_points) {
      std::uint32_t* at = group_points + std::uint64_t{next_point - 1} * 5 * p.stream_count;
#pragma unroll
      for (int k = 0; k < 4; ++k) at[k * p.stream_count] = s.reader.state[k];
      at[4 * p.stream_count] = s.reader.word_index();
      ++next_point;
    }
    std::uint32_t values[4];
    s.decode_frame(table, values);
  }
  if (!s.reader.finished_cleanly() && error != nullptr) atomicOr(error, 1u);
}

}  // namespace

void ans_decode_frames(const AnsResidentView& resident, std::size_t first_group, std::size_t group_count,
                       DType out_dtype, void* d_out, std::uint32_t* d_error, StreamHandle stream) {
  const ResidentParams p = make_resident_params(resident, "ANS decode");
  if (group_count == 0) return;
  if (first_group + group_count > resident.group_count || group_count > 65535)
    throw bad_request("ANS decode: group range out of bounds");
  if (d_out == nullptr) throw bad_request("ANS decode: null output");
  const int threads = device::tuning::kAnsDecodeThreads;
  const std::size_t shared_bytes = table_shared_bytes(threads);
  const dim3 grid((p.stream_count + threads - 1) / threads, static_cast<unsigned>(group_count));
  switch (out_dtype) {
    case DType::uint16:
      QUANTEM_CUDA_TRY(cudaFuncSetAttribute(decode_frames_kernel<std::uint16_t>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)));
      decode_frames_kernel<std::uint16_t><<<grid, threads, shared_bytes, stream>>>(
          p, static_cast<std::uint32_t>(first_group), static_cast<std::uint16_t*>(d_out), d_error);
      break;
    case DType::uint32:
      QUANTEM_CUDA_TRY(cudaFuncSetAttribute(decode_frames_kernel<std::uint32_t>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes)));
      decode_frames_kernel<std::uint32_t><<<grid, threads, shared_bytes, stream>>>(
          p, static_cast<std::uint32_t>(first_group), static_cast<std::uint32_t*>(d_out), d_error);
      break;
    default: throw bad_request("ANS decode: output must be uint16 or uint32");
  }
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "decode_frames_kernel");
}

void ans_record_seek_points(const AnsResidentView& resident, std::uint32_t frames_per_seek_point,
                            std::uint32_t* d_points, std::uint32_t* d_error, StreamHandle stream) {
  AnsResidentView plain = resident;
  plain.d_seek_points = nullptr;
  const ResidentParams p = make_resident_params(plain, "ANS seek points");
  const std::uint32_t seek_points = ans_seek_points_per_group(resident.frames_per_group, frames_per_seek_point);
  if (seek_points == 0 || resident.group_count == 0) return;
  if (d_points == nullptr) throw bad_request("ANS seek points: null table");
  if (resident.group_count > 65535) throw bad_request("ANS seek points: more than 65535 groups");
  const int threads = device::tuning::kAnsSeekPointThreads;
  const std::size_t shared_bytes = table_shared_bytes(threads);
  QUANTEM_CUDA_TRY(cudaFuncSetAttribute(record_seek_points_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
  // Points past a short last group's frames are never read; zero them all the same.
  QUANTEM_CUDA_TRY(cudaMemsetAsync(
      d_points, 0,
      ans_seek_table_words(resident.group_count, resident.frames_per_group, frames_per_seek_point, p.stream_count) * 4,
      stream));
  const dim3 grid((p.stream_count + threads - 1) / threads, static_cast<unsigned>(resident.group_count));
  record_seek_points_kernel<<<grid, threads, shared_bytes, stream>>>(p, frames_per_seek_point, seek_points, d_points,
                                                                     d_error);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "record_seek_points_kernel");
}

static_assert(ans_decode_table_words() == dev::kDecodeTableEntries, "the host's and the kernels' table size agree");

void ans_build_decode_tables(const AnsResidentView& resident, std::uint32_t* d_tables, std::uint32_t* d_error,
                             StreamHandle stream) {
  AnsResidentView plain = resident;
  plain.d_decode_tables = nullptr;
  const ResidentParams p = make_resident_params(plain, "ANS decode tables");
  if (resident.group_count == 0) return;
  if (d_tables == nullptr) throw bad_request("ANS decode tables: null output");
  if (resident.group_count > 0x7fffffffu) throw bad_request("ANS decode tables: too many groups");
  const int threads = device::tuning::kAnsBuildTablesThreads;
  const std::size_t shared_bytes = std::size_t{threads / 32} * dev::kCdfScratchEntries * sizeof(std::uint16_t);
  build_group_decode_tables_kernel<<<static_cast<unsigned>(resident.group_count), threads, shared_bytes, stream>>>(
      p, d_tables, d_error);
  QUANTEM_CUDA_CHECK_LAUNCH(stream, "build_group_decode_tables_kernel");
}

}  // namespace quantem::kernels
