#pragma once
// Internal RAII pieces of the CUDA backend: tracked device allocations (so a
// failed or cancelled load is proven to free everything), streams, events,
// stream-ordered scratch for product calls. Every CUDA call is checked
// (quantem/kernels/cuda_check.hpp); destructors never throw.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "quantem/kernels/cuda_check.hpp"
#include "quantem/kernels/device.hpp"
#include "quantem/kernels/handle.hpp"

namespace quantem::backend::cuda {

// Allocation granularity assumed by the load estimate: cudaMalloc hands out
// whole 2 MiB pages for large allocations and may take one for a small one.
inline constexpr std::uint64_t kAllocationGranularity = std::uint64_t{2} << 20;
inline std::uint64_t round_to_granularity(std::uint64_t bytes) {
  return (bytes + kAllocationGranularity - 1) / kAllocationGranularity * kAllocationGranularity;
}

// Device bytes held by CUDA residents and loads of this process.
std::atomic<std::uint64_t>& process_bytes_in_use() noexcept;

// Live and peak device bytes of one load.
class Ledger {
 public:
  void add(std::uint64_t bytes) noexcept;
  void remove(std::uint64_t bytes) noexcept;
  std::uint64_t peak() const noexcept { return peak_.load(); }

 private:
  std::mutex mutex_;
  std::atomic<std::uint64_t> live_{0};
  std::atomic<std::uint64_t> peak_{0};
};

// A device allocation counted in process_bytes_in_use() (and in a load's ledger).
class TrackedBuffer {
 public:
  TrackedBuffer() = default;
  TrackedBuffer(std::size_t bytes, std::shared_ptr<Ledger> ledger);  // throws kernels::OutOfDeviceMemory
  ~TrackedBuffer() { release(); }
  TrackedBuffer(TrackedBuffer&& other) noexcept
      : buffer_(std::move(other.buffer_)), ledger_(std::move(other.ledger_)) {}
  TrackedBuffer& operator=(TrackedBuffer&& other) noexcept;
  TrackedBuffer(const TrackedBuffer&) = delete;
  TrackedBuffer& operator=(const TrackedBuffer&) = delete;

  void* data() const noexcept { return buffer_.data(); }
  std::size_t size() const noexcept { return buffer_.size(); }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(buffer_.data());
  }
  void release() noexcept;

 private:
  kernels::DeviceBuffer buffer_;
  std::shared_ptr<Ledger> ledger_;
};

class Stream {
 public:
  enum class Priority { normal, highest };
  // Non-blocking: never waits for the legacy default stream. `highest`: the
  // device's greatest stream priority (its CTAs are scheduled first).
  explicit Stream(Priority priority = Priority::normal);
  cudaStream_t get() const noexcept { return stream_.get(); }

 private:
  kernels::Handle<kernels::StreamTraits> stream_;
};

class Event {
 public:
  explicit Event(bool timing = false);
  cudaEvent_t get() const noexcept { return event_.get(); }

 private:
  kernels::Handle<kernels::EventTraits> event_;
};

// Sums the device time between start/stop pairs (read after the work finished).
class EventTimer {
 public:
  // Creates the events of `spans` start/stop pairs now, so that start() in a
  // loop creates none (creating events there stalled a load's thread).
  void reserve(std::size_t spans);
  void start(cudaStream_t stream);
  void stop(cudaStream_t stream);
  double seconds() const;

 private:
  std::vector<std::pair<Event, Event>> spans_;
  std::size_t used_ = 0;  // spans_[0, used_) have been started
};

// Waits for streams when destroyed (nothrow), so buffers declared before it
// are never freed under work in flight on an error path.
class StreamDrain {
 public:
  explicit StreamDrain(std::vector<cudaStream_t> streams) : streams_(std::move(streams)) {}
  ~StreamDrain();
  StreamDrain(const StreamDrain&) = delete;
  StreamDrain& operator=(const StreamDrain&) = delete;

 private:
  std::vector<cudaStream_t> streams_;
};

// Stream-ordered scratch of a product call (cudaMallocAsync / cudaFreeAsync).
class ScratchBuffer {
 public:
  ScratchBuffer(std::size_t bytes, cudaStream_t stream);  // throws kernels::OutOfDeviceMemory
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data());
  }
  void* data() const noexcept { return memory_.get().data; }

 private:
  kernels::Handle<kernels::StreamMemoryTraits> memory_;
};

// Throws Error(internal) naming the resident `name` and the kernel `what`
// when a kernel's malformed-group flag is set.
void throw_if_malformed(std::uint32_t error_flag, const std::string& name, const char* what);

// Free and total bytes of the current device.
kernels::DeviceMemoryInfo memory_info();

// The least free device memory seen at checkpoints (cudaMemGetInfo), for the
// measured peak of a load. checkpoint() may be called from any thread that has
// bound the device (the loader and its encode worker).
class FreeMemoryLowWater {
 public:
  FreeMemoryLowWater();  // the first checkpoint: free memory now
  void checkpoint();
  // Free bytes at construction minus the least seen since (0 if never lower).
  std::uint64_t peak_used_bytes() const noexcept;

 private:
  std::uint64_t free_at_start_;
  std::atomic<std::uint64_t> least_free_;
};

}  // namespace quantem::backend::cuda
