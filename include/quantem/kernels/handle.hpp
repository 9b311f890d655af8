#pragma once
// The CUDA runtime layer's one ownership rule: Handle<Traits> owns one
// resource (a stream, an event, a device, pinned or stream-ordered
// allocation, mapped host pages), is move-only, and releases it once through
// Traits::release, which never throws (a failure is reported, like
// QUANTEM_CUDA_TRY_NOTHROW). Every owning class of the CUDA side is built from
// it (DeviceBuffer, HostPages, PinnedBuffer in quantem/kernels/device.hpp; the
// CUDA backend's streams, events and scratch), as the catalog's HDF5 handles
// are built from its Handle<Close>.
//
// CUDA-free: the runtime's handle types are named by their opaque structs,
// and the releases are implemented in kernels/common/device.cu.
#include <cstddef>
#include <utility>

struct CUstream_st;  // cudaStream_t is CUstream_st*
struct CUevent_st;   // cudaEvent_t is CUevent_st*

namespace quantem::kernels {

// A CUDA stream handle (cudaStream_t). nullptr is the legacy default stream.
using StreamHandle = CUstream_st*;
using EventHandle = CUevent_st*;

template <class Traits>
class Handle {
 public:
  using value_type = typename Traits::value_type;

  Handle() = default;
  explicit Handle(value_type value) noexcept : value_(value) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept : value_(std::exchange(other.value_, value_type{})) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      value_ = std::exchange(other.value_, value_type{});
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  const value_type& get() const noexcept { return value_; }
  bool held() const noexcept { return Traits::held(value_); }
  // Gives the resource up without releasing it.
  value_type release() noexcept { return std::exchange(value_, value_type{}); }
  void reset() noexcept {
    if (Traits::held(value_)) Traits::release(value_);
    value_ = value_type{};
  }

 private:
  value_type value_{};
};

// Memory with its size (size() of an empty handle is 0).
struct Allocation {
  void* data = nullptr;
  std::size_t bytes = 0;
};
// Stream-ordered device memory (cudaMallocAsync), freed on its stream.
struct StreamAllocation {
  void* data = nullptr;
  StreamHandle stream = nullptr;
};

namespace handle_traits {
template <class Value>
struct Pointer {
  using value_type = Value;
  static bool held(Value value) noexcept { return value != nullptr; }
};
template <class Value>
struct Memory {
  using value_type = Value;
  static bool held(const Value& value) noexcept { return value.data != nullptr; }
};
}  // namespace handle_traits

// cudaStreamDestroy.
struct StreamTraits : handle_traits::Pointer<StreamHandle> {
  static void release(StreamHandle stream) noexcept;
};
// cudaEventDestroy.
struct EventTraits : handle_traits::Pointer<EventHandle> {
  static void release(EventHandle event) noexcept;
};
// cudaFree.
struct DeviceMemoryTraits : handle_traits::Memory<Allocation> {
  static void release(const Allocation& memory) noexcept;
};
// cudaFreeAsync on the allocation's stream.
struct StreamMemoryTraits : handle_traits::Memory<StreamAllocation> {
  static void release(const StreamAllocation& memory) noexcept;
};
// cudaFreeHost.
struct PinnedMemoryTraits : handle_traits::Memory<Allocation> {
  static void release(const Allocation& memory) noexcept;
};
// munmap of anonymous pages.
struct MappedPagesTraits : handle_traits::Memory<Allocation> {
  static void release(const Allocation& memory) noexcept;
};
// cudaHostUnregister, then munmap: pages pinned after they were mapped.
struct RegisteredPagesTraits : handle_traits::Memory<Allocation> {
  static void release(const Allocation& memory) noexcept;
};

}  // namespace quantem::kernels
