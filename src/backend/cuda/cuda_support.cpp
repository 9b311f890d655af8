#include "cuda_support.hpp"

#include <algorithm>

#include "quantem/backend/cuda_backend.hpp"
#include "quantem/core/error.hpp"

namespace quantem::backend::cuda {
namespace {

// The allocation fault of set_device_allocation_failure_for_testing. `armed`
// is the only state production reads; the rest is under the mutex.
struct AllocationFault {
  std::atomic<bool> armed{false};
  std::mutex mutex;
  std::uint64_t counted = 0;
  std::uint64_t fail_at = 0;
  bool injected = false;
};

AllocationFault& allocation_fault() {
  static AllocationFault fault;
  return fault;
}

// Counts one allocation while the fault is armed; true when it is the one to fail.
bool allocation_fails_for_testing() {
  AllocationFault& fault = allocation_fault();
  if (!fault.armed.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(fault.mutex);
  ++fault.counted;
  if (fault.counted != fault.fail_at) return false;
  fault.injected = true;
  return true;
}

kernels::DeviceBuffer allocate_device_buffer(std::size_t bytes) {
  if (bytes > 0 && allocation_fails_for_testing()) {
    kernels::detail::throw_cuda_error(cudaErrorMemoryAllocation, "cudaMalloc (failure injected for testing)", __FILE__,
                                   __LINE__);
  }
  return kernels::DeviceBuffer(bytes);
}

}  // namespace

std::atomic<std::uint64_t>& process_bytes_in_use() noexcept {
  static std::atomic<std::uint64_t> bytes{0};
  return bytes;
}

void Ledger::add(std::uint64_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t live = live_.load() + bytes;
  live_.store(live);
  if (live > peak_.load()) peak_.store(live);
}

void Ledger::remove(std::uint64_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  live_.store(live_.load() - std::min(bytes, live_.load()));
}

TrackedBuffer::TrackedBuffer(std::size_t bytes, std::shared_ptr<Ledger> ledger)
    : buffer_(allocate_device_buffer(bytes)), ledger_(std::move(ledger)) {
  process_bytes_in_use() += bytes;
  if (ledger_) ledger_->add(bytes);
}

TrackedBuffer& TrackedBuffer::operator=(TrackedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    buffer_ = std::move(other.buffer_);
    ledger_ = std::move(other.ledger_);
  }
  return *this;
}

void TrackedBuffer::release() noexcept {
  const std::size_t bytes = buffer_.size();
  if (buffer_.data() == nullptr && bytes == 0) return;
  buffer_ = kernels::DeviceBuffer();  // cudaFree (checked, never throws)
  process_bytes_in_use() -= bytes;
  if (ledger_) ledger_->remove(bytes);
  ledger_.reset();
}

Stream::Stream(Priority priority) {
  cudaStream_t stream = nullptr;
  if (priority == Priority::normal) {
    QUANTEM_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  } else {
    int least = 0;
    int greatest = 0;
    QUANTEM_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    QUANTEM_CUDA_TRY(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  }
  stream_ = kernels::Handle<kernels::StreamTraits>(stream);
}

Event::Event(bool timing) {
  cudaEvent_t event = nullptr;
  QUANTEM_CUDA_TRY(cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
  event_ = kernels::Handle<kernels::EventTraits>(event);
}

void EventTimer::reserve(std::size_t spans) {
  spans_.reserve(spans);
  while (spans_.size() < spans) spans_.emplace_back(Event(true), Event(true));
}

void EventTimer::start(cudaStream_t stream) {
  if (used_ == spans_.size()) spans_.emplace_back(Event(true), Event(true));
  QUANTEM_CUDA_TRY(cudaEventRecord(spans_[used_].first.get(), stream));
  ++used_;
}

void EventTimer::stop(cudaStream_t stream) {
  if (used_ == 0) return;  // never started
  QUANTEM_CUDA_TRY(cudaEventRecord(spans_[used_ - 1].second.get(), stream));
}

double EventTimer::seconds() const {
  double total = 0.0;
  for (std::size_t i = 0; i < used_; ++i) {
    const auto& [begin, end] = spans_[i];
    float milliseconds = 0.0f;
    if (cudaEventElapsedTime(&milliseconds, begin.get(), end.get()) == cudaSuccess) total += milliseconds;
    else (void)cudaGetLastError();  // an unrecorded pair (an error path) counts nothing
  }
  return total / 1000.0;
}

StreamDrain::~StreamDrain() {
  for (cudaStream_t stream : streams_) QUANTEM_CUDA_TRY_NOTHROW(cudaStreamSynchronize(stream));
}

ScratchBuffer::ScratchBuffer(std::size_t bytes, cudaStream_t stream) {
  void* data = nullptr;
  QUANTEM_CUDA_TRY(cudaMallocAsync(&data, bytes == 0 ? 16 : bytes, stream));
  memory_ = kernels::Handle<kernels::StreamMemoryTraits>({data, stream});
}

kernels::DeviceMemoryInfo memory_info() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  QUANTEM_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

FreeMemoryLowWater::FreeMemoryLowWater() : free_at_start_(memory_info().free_bytes), least_free_(free_at_start_) {}

void FreeMemoryLowWater::checkpoint() {
  const std::uint64_t free_now = memory_info().free_bytes;
  std::uint64_t least = least_free_.load();
  while (free_now < least && !least_free_.compare_exchange_weak(least, free_now)) {
  }
}

std::uint64_t FreeMemoryLowWater::peak_used_bytes() const noexcept {
  const std::uint64_t least = least_free_.load();
  return free_at_start_ > least ? free_at_start_ - least : 0;
}

void throw_if_malformed(std::uint32_t error_flag, const std::string& name, const char* what) {
  if (error_flag != 0) {
    throw internal_error("the CUDA resident of " + name + " holds a malformed ANS group (found by " + what + ")");
  }
}

}  // namespace quantem::backend::cuda

namespace quantem::backend {

void set_device_allocation_failure_for_testing(std::uint64_t fail_at) {
  cuda::AllocationFault& fault = cuda::allocation_fault();
  std::lock_guard<std::mutex> lock(fault.mutex);
  fault.counted = 0;
  fault.fail_at = fail_at;
  fault.injected = false;
  fault.armed.store(true, std::memory_order_relaxed);
}

DeviceAllocationFaultReport clear_device_allocation_failure_for_testing() {
  cuda::AllocationFault& fault = cuda::allocation_fault();
  std::lock_guard<std::mutex> lock(fault.mutex);
  fault.armed.store(false, std::memory_order_relaxed);
  DeviceAllocationFaultReport report;
  report.allocations_counted = fault.counted;
  report.failure_injected = fault.injected;
  fault.counted = 0;
  fault.fail_at = 0;
  fault.injected = false;
  return report;
}

}  // namespace quantem::backend
