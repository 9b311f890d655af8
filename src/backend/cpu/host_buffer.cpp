#include "cpu/host_buffer.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <utility>

namespace quantem::backend::cpu {
namespace {
std::atomic<std::uint64_t> g_bytes_in_use{0};
}  // namespace

std::uint64_t HostBuffer::bytes_in_use() noexcept { return g_bytes_in_use.load(); }

HostBuffer::HostBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  data_ = static_cast<std::uint8_t*>(mapped);
  size_ = bytes;
  g_bytes_in_use += bytes;
}

HostBuffer::~HostBuffer() { release(); }

void HostBuffer::populate(std::size_t offset, std::size_t bytes) noexcept {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14
#endif
  if (data_ == nullptr || offset >= size_) return;
  bytes = std::min(bytes, size_ - offset);
  const std::uintptr_t page = 4096;
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(data_ + offset) & ~(page - 1);
  const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(data_ + offset + bytes);
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void HostBuffer::release() noexcept {
  if (data_ != nullptr) {
    munmap(data_, size_);
    g_bytes_in_use -= size_;
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace quantem::backend::cpu
