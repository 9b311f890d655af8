#pragma once
// The CPU backend: CPU virtual devices over host memory, each acquisition held
// as one CPU resident (make_cpu_backend), and that resident built directly
// from dense counts (make_cpu_resident).
//
// The CPU backend's resident: one acquisition held losslessly in host memory
// as dense codes in frame groups: 32 consecutive frames (row-major scan order)
// form a group stored pixel-major, [group][detector pixel][frame in group], so
// a masked sum reads one contiguous 32-code line per selected pixel and group
// and nothing else (encoding "grouped32-u8|u16|u32"). Exact per-frame
// summaries computed while building (totals, row and column projections, the
// pattern sum over all frames; about 2% of the codes for 192 x 192 frames)
// make every centre-of-mass product and every uncropped pattern sum cheap.
// Built by the CPU backend's load() from files, or directly from a dense array
// (tests, benchmarks, conformance suites), with exactly the same rules:
//  - detector pixels flagged in acquisition.pixel_mask are zeroed in every frame;
//  - uint8 and uint16 sources keep their type; a uint32 source is held as 16-bit
//    codes when every masked count fits in 16 bits, else as 32-bit codes.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quantem/backend/backend.hpp"
#include "quantem/core/error.hpp"

namespace quantem::backend {

struct CpuBackendOptions {
  int virtual_devices = 1;
  std::uint64_t budget_bytes_per_device = 0;  // 0: budget_fraction of physical RAM / virtual_devices
  double budget_fraction = 0.8;               // in (0, 1]
  unsigned threads = 0;                       // 0: hardware concurrency
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

struct CpuResidentOptions {
  int device_index = 0;  // the virtual CPU device reported by device_index()
  unsigned threads = 0;  // threads used by the primitives; 0: hardware concurrency
};

// `counts` holds acquisition.frame_count() * acquisition.frame_pixels() values
// of *acquisition.dtype (little-endian, the acquisition's 4-D shape, row-major);
// count_bytes must be exactly that many bytes. Throws quantem::Error(bad_request)
// for a size or shape mismatch, Error(payload_too_large) when memory runs out.
std::shared_ptr<Resident> make_cpu_resident(const catalog::Acquisition& acquisition, const void* counts,
                                            std::size_t count_bytes, const CpuResidentOptions& options = {});

// Host bytes currently held for CPU resident codes by every CPU resident and
// every load in progress in this process (a failed or cancelled load returns
// to the value it started from).
std::uint64_t cpu_code_bytes_in_use() noexcept;

template <class Count>
std::shared_ptr<Resident> make_cpu_resident(const catalog::Acquisition& acquisition,
                                            const std::vector<Count>& counts,
                                            const CpuResidentOptions& options = {}) {
  if (!acquisition.dtype || dtype_size(*acquisition.dtype) != sizeof(Count)) {
    throw bad_request("dense counts of " + std::to_string(sizeof(Count)) +
                      " bytes per value do not match the acquisition's dtype");
  }
  return make_cpu_resident(acquisition, counts.data(), counts.size() * sizeof(Count), options);
}

}  // namespace quantem::backend
