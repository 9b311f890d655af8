#pragma once
// Page-aligned host memory for a resident's codes. Large buffers come from
// anonymous mmap with transparent huge pages requested, so first touch is
// cheap and TLB misses are rare; the memory is returned to the system on
// destruction.
#include <cstddef>
#include <cstdint>

namespace quantem::backend::cpu {

class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(std::size_t bytes);  // throws std::bad_alloc when the memory is not available
  ~HostBuffer();
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  std::uint8_t* data() { return data_; }
  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void release() noexcept;
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace quantem::backend::cpu
