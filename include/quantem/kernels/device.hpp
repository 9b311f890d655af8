#pragma once
// Host-side device utilities (CUDA-free header; implemented in kernels/).
//
// Pointers named d_* are device pointers. Every function checks its CUDA calls
// and throws quantem::kernels::CudaError (OutOfDeviceMemory for failed
// allocations); device_count() alone never throws.
#include <cstddef>
#include <cstdint>
#include <string>

#include "quantem/kernels/handle.hpp"

namespace quantem::kernels {

// Number of usable CUDA devices; 0 when there is no driver, no device, or the
// runtime reports any error. Never throws.
int device_count() noexcept;

// Name of device `index` ("NVIDIA H200").
std::string device_name(int index);

// True when QUANTEM_DEBUG_SYNC is set to anything but "" or "0": every launch
// through our launchers is then followed by a stream synchronisation and a check.
bool debug_sync_enabled() noexcept;

// Binds the calling thread to a device (cudaSetDevice).
void set_device(int index);

// Binds the calling thread to a device and creates its primary context now
// (cudaSetDevice + cudaFree(nullptr)) rather than in the first CUDA call that
// needs it.
void create_context(int index);

// Streaming multiprocessors of the calling thread's current device (asked once per device).
int current_sm_count();

// Blocks until all work on the current device has finished; throws on a
// pending asynchronous error.
void synchronize_device();
void synchronize_stream(StreamHandle stream);

// Free and total bytes on the current device (cudaMemGetInfo).
struct DeviceMemoryInfo {
  std::uint64_t free_bytes = 0;
  std::uint64_t total_bytes = 0;
};
DeviceMemoryInfo device_memory_info();

// One device allocation (cudaMalloc), freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);  // throws OutOfDeviceMemory

  void* data() const noexcept { return memory_.get().data; }
  std::size_t size() const noexcept { return memory_.get().bytes; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data());
  }

 private:
  Handle<DeviceMemoryTraits> memory_;
};

// Synchronous copies and fill (the legacy default stream).
void copy_to_device(void* d_destination, const void* host_source, std::size_t bytes);
void copy_to_host(void* host_destination, const void* d_source, std::size_t bytes);
void fill_device(void* d_destination, int byte_value, std::size_t bytes);

// Anonymous host memory, advised to transparent huge pages, its pages
// faulted in by up to `threads` threads. Needs no device and no CUDA context:
// start-up faults in the staging slots while the context is created, and
// PinnedBuffer(HostPages) then pins them (registering pages already faulted
// in costs a small part of what cudaMallocHost of the same size does, which
// faults and pins on the calling thread; tests/gpu/pinned_host_bench.cpp
// compares them). Unmapped on destruction. Move-only.
class HostPages {
 public:
  HostPages() = default;
  HostPages(std::size_t bytes, unsigned threads);  // throws std::bad_alloc when mmap fails
  void* data() const noexcept { return pages_.get().data; }
  std::size_t size() const noexcept { return pages_.get().bytes; }
  // Gives the pages up unmapped (PinnedBuffer takes them over once registered).
  Allocation release() noexcept { return pages_.release(); }

 private:
  Handle<MappedPagesTraits> pages_;
};

// Pinned (page-locked) host memory, freed on destruction. Move-only.
// Buffers of 4 MiB or more are HostPages registered with the driver
// (portable: pinned for every device's context); smaller ones come from
// cudaMallocHost. Either way data() is page-locked and device-visible.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);
  // Pins memory already faulted in (the calling thread needs a device bound).
  explicit PinnedBuffer(HostPages pages);

  void* data() const noexcept { return registered_.held() ? registered_.get().data : allocated_.get().data; }
  std::size_t size() const noexcept { return registered_.held() ? registered_.get().bytes : allocated_.get().bytes; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data());
  }

 private:
  Handle<RegisteredPagesTraits> registered_;  // HostPages registered with the driver
  Handle<PinnedMemoryTraits> allocated_;      // or cudaMallocHost's
};

}  // namespace quantem::kernels
