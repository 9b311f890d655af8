#pragma once
// The CUDA backend: real GPUs, each acquisition held as one lossless ANS
// resident on one device (format and design: docs/kernels.md), every product
// computed from that resident on its device.
//
// CUDA-free header that exists in every build. In a build without CUDA
// (QUANTEM_HAVE_CUDA off) make_cuda_backend and make_cuda_resident throw
// Error(unavailable) "CUDA unavailable: ...", and cuda_device_count() is 0;
// nothing ever falls back to the CPU backend.
//
// Load pipeline (one device, bound on the loading thread with cudaSetDevice):
//   catalog::build_frame_index -> coalesced preads (up to 1 MiB each, many
//   threads) into pinned staging slots -> host-to-device copies on a copy
//   stream, overlapped with the GPU bitshuffle/LZ4 decode on a compute stream
//   -> masked pixels zeroed -> ANS encode, a batch of frame groups at a time,
//   on an encode worker thread and stream (batch b encodes while batch b + 1
//   is read, copied and decoded), into exactly sized device pieces of ONE
//   resident.
// Chunks the GPU decoder does not take (plain LZ4, unfiltered chunks, a
// non-default bitshuffle block size) are decoded on the host with
// codec::decode_chunk and copied; the resident's encoding() says how many.
// The dense acquisition never exists on the device: at most two batches of
// dense frames at a time (the one being decoded, the one being encoded). estimate_load() is an upper bound of every device byte the
// load allocates (each allocation rounded up to the 2 MiB allocation
// granularity, plus a reserve for the CUDA runtime's lazily loaded kernels);
// the load checks the encoded size against its bound before allocating each
// piece and fails with Error(payload_too_large) rather than exceed it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/backend/cuda_load.hpp"

namespace quantem::backend {

struct CudaBackendOptions {
  std::vector<int> device_indices;  // empty: every visible device
  std::uint64_t budget_bytes = 0;   // per device; 0: budget_fraction of the device's total memory
  double budget_fraction = 0.8;
  unsigned read_threads = 0;        // pread threads; 0: hardware concurrency (at most 32)
  CudaLoadTuning tuning;
};

class CudaBackend : public Backend {
 public:
  virtual CudaLoadReport last_load_report() const = 0;
};

// Throws Error(unavailable) "CUDA unavailable: ..." when there is no CUDA
// support, no visible device, or a requested index is not a visible device.
std::unique_ptr<CudaBackend> make_cuda_backend(const CudaBackendOptions& options);

// Visible CUDA devices; 0 without CUDA support or device. Never throws.
int cuda_device_count() noexcept;

// What `quantem-gpu info` reports about CUDA on this machine. Never throws.
struct CudaDeviceReport {
  int index = 0;
  std::string name;
  std::uint64_t total_bytes = 0;
  std::uint64_t free_bytes = 0;   // cudaMemGetInfo (creates a context on the device)
  std::uint64_t budget_bytes = 0;  // the admission budget serve would use: budget_bytes, else budget_fraction x total
};
struct CudaSystemReport {
  bool built_with_cuda = false;
  int driver_version = 0;   // cudaDriverGetVersion, e.g. 12040; 0 without a driver
  int runtime_version = 0;  // cudaRuntimeGetVersion of the runtime linked in
  std::string error;        // why devices could not be listed, empty otherwise
  std::vector<CudaDeviceReport> devices;
};
CudaSystemReport cuda_system_report(const CudaBackendOptions& options);

// Device bytes held by CUDA residents and loads in progress in this process
// (a failed or cancelled load returns to the value it started from).
std::uint64_t cuda_resident_bytes_in_use() noexcept;

struct CudaResidentOptions {
  int device_index = 0;
  CudaLoadTuning tuning;
};

// Builds a CUDA resident from dense host counts (tests, benchmarks,
// conformance), with the rules of load(): masked pixels zeroed, uint32 held as
// 16-bit when every masked count fits. `counts` holds frame_count() *
// frame_pixels() little-endian values of *acquisition.dtype. Throws
// Error(bad_request) for a size or shape mismatch, Error(payload_too_large)
// when the device runs out of memory, Error(unavailable) without CUDA.
std::shared_ptr<Resident> make_cuda_resident(const catalog::Acquisition& acquisition, const void* counts,
                                             std::size_t count_bytes, const CudaResidentOptions& options = {});

// Fault injection for tests (docs/testing.md): from this call on, counts the
// device allocations of CUDA loads and resident builds (every cudaMalloc of the
// load pipeline, its encoder and the resident it builds: staging slots, decode
// scratch, dense batches, ring tables, ANS pieces, the group table), on every
// thread, and makes the `fail_at`-th one (1-based) fail once as cudaMalloc does
// on a full device: cudaErrorMemoryAllocation, thrown as
// kernels::OutOfDeviceMemory, which load() maps to Error(payload_too_large) like a
// real one. fail_at = 0 only counts. Product scratch is not counted. Set and
// clear only while no load runs; unset, an allocation pays one relaxed atomic
// load. Without CUDA both calls do nothing.
void set_device_allocation_failure_for_testing(std::uint64_t fail_at);
struct DeviceAllocationFaultReport {
  std::uint64_t allocations_counted = 0;  // since set_device_allocation_failure_for_testing
  bool failure_injected = false;          // the fail_at-th allocation came and failed
};
// Stops counting and failing; returns what happened since the set call.
DeviceAllocationFaultReport clear_device_allocation_failure_for_testing();

}  // namespace quantem::backend
