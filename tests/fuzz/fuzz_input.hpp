#pragma once
// Helpers shared by the libFuzzer targets: reading little-endian fields off the
// front of a fuzz input, and an in-memory file (memfd) that code which opens
// paths can read through /proc/self/fd/N without touching the disk.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace quantem::fuzz {

// Consumes fields from the front of the input; a field past the end reads as 0.
class InputReader {
 public:
  InputReader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  template <typename T>
  T take() {
    T value{};
    const std::size_t n = sizeof(T) <= size_ - used_ ? sizeof(T) : size_ - used_;
    std::memcpy(&value, data_ + used_, n);  // little-endian host
    used_ += n;
    return value;
  }
  const std::uint8_t* rest() const { return data_ + used_; }
  std::size_t rest_size() const { return size_ - used_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t used_ = 0;
};

// One memfd, rewritten with each input; path() opens it again by name.
class MemoryFile {
 public:
  MemoryFile() : fd_(memfd_create("quantem-fuzz", 0)) {
    if (fd_ < 0) std::abort();
  }
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  void assign(const std::uint8_t* data, std::size_t size) {
    if (ftruncate(fd_, 0) != 0) std::abort();
    std::size_t done = 0;
    while (done < size) {
      const ssize_t wrote = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (wrote <= 0) std::abort();
      done += static_cast<std::size_t>(wrote);
    }
  }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace quantem::fuzz
