#pragma once
// Carves one device scratch allocation into aligned parts: each part is
// appended at the next 256-byte boundary, so every part suits any element
// type and coalesced access. Used by the ANS encoder's batch scratch and by
// the CUDA resident's per-request scratch. CUDA-free (host arithmetic only).
#include <cstddef>
#include <cstdint>

namespace quantem::kernels {

class ScratchLayout {
 public:
  static constexpr std::size_t kAlignment = 256;

  static constexpr std::size_t aligned(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

  // Appends a part of `bytes` bytes and returns its offset from the base.
  std::size_t add(std::size_t bytes) {
    const std::size_t offset = total_;
    total_ = aligned(total_ + bytes);
    return offset;
  }

  // Bytes the whole scratch needs (a multiple of kAlignment).
  std::size_t total() const { return total_; }

 private:
  std::size_t total_ = 0;
};

// The part at `offset` of a scratch allocation starting at `base`.
template <class T>
T* scratch_part(void* base, std::size_t offset) {
  return reinterpret_cast<T*>(static_cast<std::uint8_t*>(base) + offset);
}

}  // namespace quantem::kernels
