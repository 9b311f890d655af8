#pragma once
// Page-aligned, zero-filled host memory for a resident's codes, from anonymous
// mmap and returned to the system on destruction. Huge pages are not requested:
// their first touch was slower than that of 4 KiB pages on the CI machine
// (docs/benchmarks.md, "Code decisions and their measurements"); the kernel's
// THP policy still applies where it is "always".
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

  // Faults in the pages of [offset, offset + bytes) for writing in one system
  // call (MADV_POPULATE_WRITE), cheaper than one page fault per page; a
  // best-effort hint that does nothing on kernels without it.
  void populate(std::size_t offset, std::size_t bytes) noexcept;

  // Bytes of every HostBuffer alive in the process.
  static std::uint64_t bytes_in_use() noexcept;

 private:
  void release() noexcept;
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace quantem::backend::cpu
