// What a cold daemon pays before its first load can read: CUDA's
// initialisation, the device's context, and pinning the 3 staging slots —
// pinned by cudaMallocHost, or populated first (as start-up could do before
// the context exists) and then registered (cudaHostRegister), with and
// without transparent huge pages. Then a host-to-device copy from each kind,
// so that a faster way to pin is not a slower way to copy. JSON on stdout.
//   pinned_host_bench [--slot-mib 64] [--slots 3]
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

void* map_populated(std::size_t bytes, bool huge, int threads) {
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  if (huge) madvise(memory, bytes, MADV_HUGEPAGE);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      const std::size_t share = (bytes / threads + 4095) / 4096 * 4096;
      const std::size_t begin = std::min(bytes, share * t), end = std::min(bytes, begin + share);
      std::memset(static_cast<char*>(memory) + begin, 0, end - begin);
    });
  }
  for (auto& worker : workers) worker.join();
  return memory;
}

double copy_gbps(void* host, void* device, std::size_t bytes, cudaStream_t stream) {
  check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), "warm copy");
  check(cudaStreamSynchronize(stream), "sync");
  const auto start = Clock::now();
  for (int i = 0; i < 5; ++i) check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), "copy");
  check(cudaStreamSynchronize(stream), "sync");
  return 5.0 * bytes / seconds_since(start) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t slot_mib = 64;
  int slots = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--slot-mib") slot_mib = std::strtoul(argv[i + 1], nullptr, 10);
    if (std::string(argv[i]) == "--slots") slots = std::atoi(argv[i + 1]);
  }
  const std::size_t bytes = slot_mib << 20;
  auto start = Clock::now();
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  const double init_s = seconds_since(start);
  start = Clock::now();
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  const double properties_s = seconds_since(start);
  // Populated before the context exists (what start-up could do meanwhile).
  start = Clock::now();
  std::vector<void*> populated;
  for (int s = 0; s < slots; ++s) populated.push_back(map_populated(bytes, false, 1));
  const double populate_s = seconds_since(start);
  start = Clock::now();
  std::vector<void*> populated_huge;
  for (int s = 0; s < slots; ++s) populated_huge.push_back(map_populated(bytes, true, 1));
  const double populate_huge_s = seconds_since(start);
  start = Clock::now();
  std::vector<void*> populated_threads;
  for (int s = 0; s < slots; ++s) populated_threads.push_back(map_populated(bytes, true, 8));
  const double populate_huge_8_threads_s = seconds_since(start);

  start = Clock::now();
  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaFree(nullptr), "cudaFree(nullptr)");
  const double context_s = seconds_since(start);

  start = Clock::now();
  std::vector<void*> allocated(slots);
  for (auto& pointer : allocated) check(cudaMallocHost(&pointer, bytes), "cudaMallocHost");
  const double malloc_host_s = seconds_since(start);
  start = Clock::now();
  for (void* pointer : populated) check(cudaHostRegister(pointer, bytes, cudaHostRegisterDefault), "register");
  const double register_s = seconds_since(start);
  start = Clock::now();
  for (void* pointer : populated_huge) check(cudaHostRegister(pointer, bytes, cudaHostRegisterDefault), "register");
  const double register_huge_s = seconds_since(start);
  // Not populated at all: registering faults the pages in.
  start = Clock::now();
  void* fresh = mmap(nullptr, bytes * slots, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  madvise(fresh, bytes * slots, MADV_HUGEPAGE);
  check(cudaHostRegister(fresh, bytes * slots, cudaHostRegisterDefault), "register fresh");
  const double register_unpopulated_huge_s = seconds_since(start);

  void* device = nullptr;
  check(cudaMalloc(&device, bytes), "cudaMalloc");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "stream");
  const double gbps_malloc_host = copy_gbps(allocated[0], device, bytes, stream);
  const double gbps_registered = copy_gbps(populated[0], device, bytes, stream);
  const double gbps_registered_huge = copy_gbps(populated_huge[0], device, bytes, stream);
  std::printf(
      "{\"gpu\": \"%s\", \"slot_bytes\": %zu, \"slots\": %d, \"cuda_init_s\": %.4f, \"device_properties_s\": %.4f, "
      "\"context_s\": %.4f, \"populate_s\": %.4f, \"populate_huge_s\": %.4f, \"populate_huge_8_threads_s\": %.4f, "
      "\"cuda_malloc_host_s\": %.4f, \"register_populated_s\": %.4f, \"register_populated_huge_s\": %.4f, "
      "\"register_unpopulated_huge_s\": %.4f, \"h2d_gbps_malloc_host\": %.1f, \"h2d_gbps_registered\": %.1f, "
      "\"h2d_gbps_registered_huge\": %.1f}\n",
      properties.name, bytes, slots, init_s, properties_s, context_s, populate_s, populate_huge_s,
      populate_huge_8_threads_s, malloc_host_s, register_s, register_huge_s, register_unpopulated_huge_s,
      gbps_malloc_host, gbps_registered, gbps_registered_huge);
  return 0;
}
