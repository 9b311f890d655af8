// The CUDA backend's entry points in a build without CUDA: every one says so.
// There is no CPU fallback here; the CPU backend is chosen only explicitly.
#include "quantem/backend/cuda_backend.hpp"
#include "quantem/core/error.hpp"

namespace quantem::backend {
namespace {
const char* const kNoCudaSupport =
    "CUDA unavailable: this build of quantem-gpu has no CUDA support; start it with --backend cpu to serve from "
    "the CPU backend explicitly";
}  // namespace

std::unique_ptr<CudaBackend> make_cuda_backend(const CudaBackendOptions&) { throw unavailable(kNoCudaSupport); }

int cuda_device_count() noexcept { return 0; }

CudaSystemReport cuda_system_report(const CudaBackendOptions&) { return {}; }

std::uint64_t cuda_resident_bytes_in_use() noexcept { return 0; }

std::shared_ptr<Resident> make_cuda_resident(const catalog::Acquisition&, const void*, std::size_t,
                                             const CudaResidentOptions&) {
  throw unavailable(kNoCudaSupport);
}

void set_device_allocation_failure_for_testing(std::uint64_t) {}

DeviceAllocationFaultReport clear_device_allocation_failure_for_testing() { return {}; }

}  // namespace quantem::backend
