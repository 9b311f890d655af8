// Host-side device utilities and the CUDA error plumbing.
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "quantem/kernels/device.hpp"
#include "quantem/kernels/cuda_check.hpp"

namespace quantem::kernels {
namespace detail {

namespace {
std::string describe(cudaError_t status, const char* expression, const char* file, int line) {
  return std::string(expression) + " failed: " + cudaGetErrorName(status) + " (" +
         cudaGetErrorString(status) + ") at " + file + ":" + std::to_string(line);
}
}  // namespace

void throw_cuda_error(int status_value, const char* expression, const char* file, int line) {
  const auto status = static_cast<cudaError_t>(status_value);
  const std::string message = describe(status, expression, file, line);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // allocation failures are not sticky: clear them
    throw OutOfDeviceMemory(message);
  }
  throw CudaError(message);
}

void report_cuda_error_nothrow(int status, const char* expression, const char* file, int line) noexcept {
  std::fprintf(stderr, "quantem-gpu: %s\n", describe(static_cast<cudaError_t>(status), expression, file, line).c_str());
}

void check_launch(StreamHandle stream, const char* kernel_name, const char* file, int line) {
  const cudaError_t launch_status = cudaGetLastError();
  if (launch_status != cudaSuccess) throw_cuda_error(launch_status, kernel_name, file, line);
  if (debug_sync_enabled()) {
    const cudaError_t sync_status = cudaStreamSynchronize(stream);
    if (sync_status != cudaSuccess) throw_cuda_error(sync_status, kernel_name, file, line);
  }
}

}  // namespace detail

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::string device_name(int index) {
  cudaDeviceProp properties{};
  QUANTEM_CUDA_TRY(cudaGetDeviceProperties(&properties, index));
  return properties.name;
}

bool debug_sync_enabled() noexcept {
  static const bool enabled = [] {
    const char* value = std::getenv("QUANTEM_DEBUG_SYNC");
    return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

void set_device(int index) { QUANTEM_CUDA_TRY(cudaSetDevice(index)); }

void create_context(int index) {
  QUANTEM_CUDA_TRY(cudaSetDevice(index));
  QUANTEM_CUDA_TRY(cudaFree(nullptr));
}

int current_sm_count() {
  int device = 0;
  QUANTEM_CUDA_TRY(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<int, int> counts;  // per device, asked once
  std::lock_guard<std::mutex> lock(mutex);
  auto it = counts.find(device);
  if (it == counts.end()) {
    int sms = 0;
    QUANTEM_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    it = counts.emplace(device, sms).first;
  }
  return it->second;
}

void synchronize_device() { QUANTEM_CUDA_TRY(cudaDeviceSynchronize()); }

void synchronize_stream(StreamHandle stream) { QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream)); }

DeviceMemoryInfo device_memory_info() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  QUANTEM_CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

void StreamTraits::release(StreamHandle stream) noexcept { QUANTEM_CUDA_TRY_NOTHROW(cudaStreamDestroy(stream)); }

void EventTraits::release(EventHandle event) noexcept { QUANTEM_CUDA_TRY_NOTHROW(cudaEventDestroy(event)); }

void DeviceMemoryTraits::release(const Allocation& memory) noexcept { QUANTEM_CUDA_TRY_NOTHROW(cudaFree(memory.data)); }

void StreamMemoryTraits::release(const StreamAllocation& memory) noexcept {
  QUANTEM_CUDA_TRY_NOTHROW(cudaFreeAsync(memory.data, memory.stream));
}

void PinnedMemoryTraits::release(const Allocation& memory) noexcept {
  QUANTEM_CUDA_TRY_NOTHROW(cudaFreeHost(memory.data));
}

void MappedPagesTraits::release(const Allocation& memory) noexcept { ::munmap(memory.data, memory.bytes); }

void RegisteredPagesTraits::release(const Allocation& memory) noexcept {
  QUANTEM_CUDA_TRY_NOTHROW(cudaHostUnregister(memory.data));
  MappedPagesTraits::release(memory);
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  void* data = nullptr;
  QUANTEM_CUDA_TRY(cudaMalloc(&data, bytes));
  memory_ = Handle<DeviceMemoryTraits>({data, bytes});
}

HostPages::HostPages(std::size_t bytes, unsigned threads) {
  if (bytes == 0) return;
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) throw std::bad_alloc();
  pages_ = Handle<MappedPagesTraits>({memory, bytes});
  (void)madvise(memory, bytes, MADV_HUGEPAGE);  // advice only: 4 KiB pages where huge ones are off
  (void)madvise(memory, bytes, MADV_DONTFORK);  // a forked child (the inspector) neither copies nor shares it
  constexpr std::size_t kPage = std::size_t{2} << 20;
  const std::size_t pages = (bytes + kPage - 1) / kPage;
  const unsigned workers = static_cast<unsigned>(std::max<std::size_t>(1, std::min<std::size_t>(threads, pages)));
  const std::size_t share = (pages + workers - 1) / workers * kPage;
  auto touch = [memory, bytes, share](unsigned worker) {
    const std::size_t begin = std::min(bytes, share * worker), end = std::min(bytes, begin + share);
    std::memset(static_cast<char*>(memory) + begin, 0, end - begin);
  };
  std::vector<std::thread> helpers;
  try {
    for (unsigned w = 1; w < workers; ++w) helpers.emplace_back(touch, w);
  } catch (...) {  // no thread to spare: the pages the missing helpers would have touched fault in on use
    for (auto& helper : helpers) helper.join();
    helpers.clear();
    touch(0);
    return;
  }
  touch(0);
  for (auto& helper : helpers) helper.join();
}

namespace {
constexpr std::size_t kRegisteredPinnedMinBytes = std::size_t{4} << 20;
constexpr unsigned kPinnedFaultThreads = 8;
}  // namespace

PinnedBuffer::PinnedBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  if (bytes >= kRegisteredPinnedMinBytes) {
    HostPages pages(bytes, kPinnedFaultThreads);
    if (cudaHostRegister(pages.data(), bytes, cudaHostRegisterPortable) == cudaSuccess) {
      registered_ = Handle<RegisteredPagesTraits>(pages.release());
      return;
    }
    (void)cudaGetLastError();  // registration refused here: the driver's own pinned allocation instead
  }
  void* data = nullptr;
  QUANTEM_CUDA_TRY(cudaMallocHost(&data, bytes));
  allocated_ = Handle<PinnedMemoryTraits>({data, bytes});
}

PinnedBuffer::PinnedBuffer(HostPages pages) {
  if (pages.size() == 0) return;
  QUANTEM_CUDA_TRY(cudaHostRegister(pages.data(), pages.size(), cudaHostRegisterPortable));
  registered_ = Handle<RegisteredPagesTraits>(pages.release());
}

void copy_to_device(void* d_destination, const void* host_source, std::size_t bytes) {
  if (bytes == 0) return;
  QUANTEM_CUDA_TRY(cudaMemcpy(d_destination, host_source, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* host_destination, const void* d_source, std::size_t bytes) {
  if (bytes == 0) return;
  QUANTEM_CUDA_TRY(cudaMemcpy(host_destination, d_source, bytes, cudaMemcpyDeviceToHost));
}

void fill_device(void* d_destination, int byte_value, std::size_t bytes) {
  if (bytes == 0) return;
  QUANTEM_CUDA_TRY(cudaMemset(d_destination, byte_value, bytes));
}

}  // namespace quantem::kernels
