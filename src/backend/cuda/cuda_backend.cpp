// The CUDA backend: devices, admission estimates, and the file loader that
// turns an acquisition's stored chunks into one ANS resident on one GPU
// (pipeline: include/quantem/backend/cuda_backend.hpp).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "cuda_resident.hpp"
#include "cuda_support.hpp"
#include "load_pipeline.hpp"
#include "cuda_load_plan.hpp"
#include "resident_encoder.hpp"
#include "quantem/backend/cuda_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/clock.hpp"
#include "quantem/core/error.hpp"
#include "quantem/plan/plan.hpp"
#include "quantem/kernels/cuda_error.hpp"
#include "quantem/kernels/device.hpp"

namespace quantem::backend {
namespace {

using namespace cuda;

// Idle release: hands the memory this process caches on the device but no
// longer uses back to the driver: the free blocks of the device's default
// memory pool, which the products' stream-ordered scratch allocates from.
void return_cached_device_memory(int device_index) {
  kernels::set_device(device_index);
  cudaMemPool_t pool = nullptr;
  QUANTEM_CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, device_index));
  QUANTEM_CUDA_TRY(cudaDeviceSynchronize());  // frees enqueued by finished requests have run
  QUANTEM_CUDA_TRY(cudaMemPoolTrimTo(pool, 0));
}

// Every product kernel once on a tiny resident, so that the runtime's lazy
// module loading happens at start-up and not in a user's first request.
void warm_up_kernels(int device_index) {
  catalog::Acquisition acquisition;
  acquisition.name = "start-up warm-up";
  acquisition.scan_rows = 4;
  acquisition.scan_cols = 6;
  acquisition.detector_rows = 16;
  acquisition.detector_cols = 18;
  acquisition.dtype = DType::uint16;
  std::vector<std::uint16_t> counts(acquisition.frame_count() * acquisition.frame_pixels());
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = static_cast<std::uint16_t>((i * 2654435761u) % 97);
  CudaResidentOptions options;
  options.device_index = device_index;
  const auto resident = make_cuda_resident(acquisition, counts.data(), counts.size() * 2, options);
  const plan::PlanGeometry geometry = plan::resolve_plan({}, 4, 6, 16, 18);
  std::vector<std::uint8_t> mask(geometry.detector_pixels(), 1);
  (void)resident->masked_sum(geometry, mask);
  mask.assign(mask.size(), 0);
  mask[40] = 1;
  (void)resident->masked_sum(geometry, mask);
  (void)resident->center_of_mass_sums(geometry);
  (void)resident->frame(geometry, 1, 2);
  (void)resident->region_reduce(geometry, {0, 7}, RegionReduce::sum);
  (void)resident->region_reduce(geometry, {0, 7}, RegionReduce::max);
  const plan::PlanGeometry binned = plan::resolve_plan({std::nullopt, 2, 2}, 4, 6, 16, 18);
  (void)resident->region_reduce(binned, {0, 1}, RegionReduce::max);
  (void)resident->pattern_sum(binned);
}

class CudaBackendImpl final : public CudaBackend {
 public:
  explicit CudaBackendImpl(const CudaBackendOptions& options) : options_(options) {
    const int count = kernels::device_count();
    if (count == 0) {
      throw unavailable(
          "CUDA unavailable: no CUDA device is visible to this process (cudaGetDeviceCount found none); start with "
          "--backend cpu to serve from the CPU backend explicitly");
    }
    if (!(options.budget_fraction > 0.0 && options.budget_fraction <= 1.0)) {
      throw bad_request("the CUDA device budget fraction must be in (0, 1]");
    }
    std::vector<int> indices = options.device_indices;
    if (indices.empty()) {
      for (int i = 0; i < count; ++i) indices.push_back(i);
    }
    for (const int index : indices) {
      if (index < 0 || index >= count) {
        throw unavailable("CUDA unavailable: GPU " + std::to_string(index) + " was requested but " +
                          std::to_string(count) + " CUDA device" + (count == 1 ? " is" : "s are") +
                          " visible (indices 0.." + std::to_string(count - 1) + ")");
      }
      if (std::find_if(devices_.begin(), devices_.end(), [&](const DeviceInfo& d) { return d.index == index; }) !=
          devices_.end()) {
        continue;
      }
      DeviceInfo info;
      info.index = index;
      cudaDeviceProp properties{};
      QUANTEM_CUDA_TRY(cudaGetDeviceProperties(&properties, index));
      info.name = properties.name;
      info.total_memory_bytes = properties.totalGlobalMem;
      info.budget_bytes = options.budget_bytes != 0
                              ? options.budget_bytes
                              : static_cast<std::uint64_t>(static_cast<double>(info.total_memory_bytes) *
                                                           options.budget_fraction);
      info.budget_fraction = options.budget_bytes != 0 ? 0.0 : options.budget_fraction;
      devices_.push_back(info);
    }
    unsigned threads = options.read_threads;
    if (threads == 0) threads = std::min(32u, std::max(1u, std::thread::hardware_concurrency()));
    pool_ = std::make_unique<ThreadPool>(threads);
  }

  std::string name() const override { return "cuda"; }
  std::vector<DeviceInfo> devices() const override { return devices_; }

  std::optional<std::uint64_t> free_bytes(int device_index) const override {
    check_device(device_index);
    kernels::set_device(device_index);
    return memory_info().free_bytes;
  }

  LoadEstimate estimate_load(const catalog::Acquisition& acquisition) const override {
    check_loadable_shape(acquisition, /*max_detector_axis=*/0, name());
    const CudaLoadPlan plan = plan_cuda_load(acquisition, options_.tuning);
    return {plan.provisional_resident_bytes, plan.admitted_bytes(true), plan.transition_peak_bytes(true)};
  }

  using Backend::load;
  // The reservation holds the working buffers and the provisional resident;
  // the load grows it before each resident allocation that would go past it.
  std::shared_ptr<Resident> load(const catalog::Acquisition& acquisition, int device_index, LoadProgress& progress,
                                 LoadReservation& reservation) override {
    check_device(device_index);
    return run_load(acquisition, progress, /*max_detector_axis=*/0, name(),
                    "stage the load of " + acquisition.name, [&]() -> std::shared_ptr<Resident> {
                      try {
                        return load_from_files(acquisition, device_index, progress, reservation);
                      } catch (const kernels::OutOfDeviceMemory& error) {
                        throw payload_too_large("not enough device memory on GPU " + std::to_string(device_index) +
                                                " to load " + acquisition.name + ": " + error.what());
                      }
                    });
  }

  void prepare_devices() override {
    using clock = std::chrono::steady_clock;
    for (const DeviceInfo& device : devices_) {
      // The context is created while another thread faults the staging
      // slots' pages in; they are pinned (registered) once it exists.
      auto start = clock::now();
      double context_seconds = 0.0;
      pinned_pool_.fill(default_device_slot_bytes(options_.tuning), [&] {
        kernels::create_context(device.index);
        context_seconds = seconds_since(start);
      });
      const double pinned_seconds = seconds_since(start) - context_seconds;
      start = clock::now();
      // QUANTEM_SKIP_KERNEL_WARM_UP=1: a benchmark knob (what the warm-up costs a
      // cold start's first load, and saves its first request).
      static const bool skip_warm_up = [] {
        const char* value = std::getenv("QUANTEM_SKIP_KERNEL_WARM_UP");
        return value != nullptr && std::string(value) == "1";
      }();
      if (!skip_warm_up) warm_up_kernels(device.index);
      spdlog::info("GPU {} prepared: context {:.3f} s, then the pinned staging slots {:.3f} s, kernels warmed {:.3f} s",
                   device.index, context_seconds, pinned_seconds, seconds_since(start));
    }
  }

  void trim_device_memory(int device_index) override {
    check_device(device_index);
    return_cached_device_memory(device_index);
  }

  CudaLoadReport last_load_report() const override {
    std::lock_guard<std::mutex> lock(report_mutex_);
    return report_;
  }

 private:
  void check_device(int device_index) const {
    for (const DeviceInfo& device : devices_) {
      if (device.index == device_index) return;
    }
    throw bad_request("GPU " + std::to_string(device_index) + " is not one of this backend's CUDA devices");
  }

  // Binds the device on this thread and runs one LoadPipeline.
  std::shared_ptr<Resident> load_from_files(const catalog::Acquisition& acquisition, int device_index,
                                            LoadProgress& progress, LoadReservation& reservation) {
    kernels::set_device(device_index);  // this thread's CUDA work goes to the load's device
    const auto index_start = std::chrono::steady_clock::now();
    std::shared_ptr<const catalog::FrameIndex> index = frame_index(acquisition);
    const double index_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - index_start).count();
    const CudaLoadPlan plan = plan_cuda_load(acquisition, options_.tuning);
    LoadPipeline pipeline(acquisition, std::move(index), device_index, progress, reservation, plan, *pool_,
                          pinned_pool_);
    auto resident = pipeline.run();
    CudaLoadReport report = pipeline.report();
    report.index_seconds += index_seconds;
    report.seconds += index_seconds;
    // Where a load's time went, in the daemon's log (a first load that is
    // slower than later ones shows which stage pays).
    spdlog::info("CUDA load of {} on GPU {}: {:.3f} s (frame index {:.3f} s, set-up {:.3f} s, reads {:.3f} s, loader "
                 "waits {:.3f} s, finish {:.3f} s; GPU decode {:.3f} s, encode {:.3f} s)",
                 acquisition.name, device_index, report.seconds, report.index_seconds, report.setup_seconds,
                 report.read_seconds, report.wait_seconds, report.finish_seconds, report.gpu_decode_seconds,
                 report.gpu_encode_seconds);
    std::lock_guard<std::mutex> lock(report_mutex_);
    report_ = report;
    return resident;
  }

  CudaBackendOptions options_;
  std::vector<DeviceInfo> devices_;
  std::unique_ptr<ThreadPool> pool_;
  PinnedSlotPool pinned_pool_;
  mutable std::mutex report_mutex_;
  CudaLoadReport report_;
};

}  // namespace

std::unique_ptr<CudaBackend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackendImpl>(options);
}

int cuda_device_count() noexcept { return kernels::device_count(); }

CudaSystemReport cuda_system_report(const CudaBackendOptions& options) {
  CudaSystemReport report;
  report.built_with_cuda = true;
  if (cudaDriverGetVersion(&report.driver_version) != cudaSuccess) report.driver_version = 0;
  if (cudaRuntimeGetVersion(&report.runtime_version) != cudaSuccess) report.runtime_version = 0;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    report.error = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    (void)cudaGetLastError();
    return report;
  }
  for (int index = 0; index < count; ++index) {
    CudaDeviceReport device;
    device.index = index;
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, index) != cudaSuccess || cudaSetDevice(index) != cudaSuccess) {
      (void)cudaGetLastError();
      report.error = "device " + std::to_string(index) + " could not be queried";
      continue;
    }
    device.name = properties.name;
    std::size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      total_bytes = properties.totalGlobalMem;
    }
    device.total_bytes = total_bytes;
    device.free_bytes = free_bytes;
    device.budget_bytes = options.budget_bytes != 0
                              ? options.budget_bytes
                              : static_cast<std::uint64_t>(static_cast<double>(total_bytes) * options.budget_fraction);
    report.devices.push_back(std::move(device));
  }
  return report;
}

std::uint64_t cuda_resident_bytes_in_use() noexcept { return process_bytes_in_use().load(); }

std::shared_ptr<Resident> make_cuda_resident(const catalog::Acquisition& acquisition, const void* counts,
                                             std::size_t count_bytes, const CudaResidentOptions& options) {
  check_dense_counts(acquisition, count_bytes, /*max_detector_axis=*/0);
  const std::uint64_t frame_bytes = acquisition.frame_pixels() * dtype_size(*acquisition.dtype);
  if (kernels::device_count() == 0) {
    throw unavailable("CUDA unavailable: no CUDA device is visible to this process");
  }
  kernels::set_device(options.device_index);
  try {
    const CudaLoadPlan plan = plan_cuda_load(acquisition, options.tuning);
    Stream stream;
    // Synchronous, from one dense slot: each encode_batch returns once the
    // sizes are known, and the next copy into the slot is ordered after the
    // write on the same stream.
    ResidentEncoder encoder(acquisition, plan, /*dense_slots=*/1, stream.get(), std::make_shared<Ledger>(),
                            ResidentReservation(nullptr, 0));
    StreamDrain drain({stream.get()});
    const auto* bytes = static_cast<const std::uint8_t*>(counts);
    for (std::uint64_t first = 0; first < plan.frames; first += plan.batch_frames) {
      const std::uint64_t count = std::min(plan.batch_frames, plan.frames - first);
      QUANTEM_CUDA_TRY(cudaMemcpyAsync(encoder.dense_batch(0), bytes + first * frame_bytes, count * frame_bytes,
                                       cudaMemcpyHostToDevice, stream.get()));
      encoder.encode_batch(0, first, count);
    }
    return encoder.finish(options.device_index, "");
  } catch (const kernels::OutOfDeviceMemory& error) {
    throw payload_too_large("not enough device memory on GPU " + std::to_string(options.device_index) + " to hold " +
                            acquisition.name + ": " + error.what());
  }
}

}  // namespace quantem::backend
