#pragma once
// Detector count types. Sources are always unsigned little-endian integers.
// Header-only: the kernels' launch headers name DType too.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace quantem {

enum class DType : std::uint8_t { uint8, uint16, uint32 };

namespace detail {

// What each dtype is, one row per dtype.
struct DTypeFacts {
  DType dtype;
  std::size_t size;       // bytes: 1, 2, 4
  const char* name;       // "uint8", "uint16", "uint32"
  const char* numpy_str;  // "<u1", "<u2", "<u4"
  std::uint32_t max;      // 2^bits - 1
};

inline constexpr DTypeFacts kDTypeFacts[] = {
    {DType::uint8, 1, "uint8", "<u1", 0xFFu},
    {DType::uint16, 2, "uint16", "<u2", 0xFFFFu},
    {DType::uint32, 4, "uint32", "<u4", 0xFFFFFFFFu},
};

// The row of `dtype`; a value outside the enum gets size 0, name "unknown".
constexpr DTypeFacts dtype_facts(DType dtype) noexcept {
  for (const DTypeFacts& facts : kDTypeFacts) {
    if (facts.dtype == dtype) return facts;
  }
  return DTypeFacts{dtype, 0, "unknown", "", 0};
}

}  // namespace detail

constexpr std::size_t dtype_size(DType dtype) noexcept { return detail::dtype_facts(dtype).size; }
constexpr const char* dtype_name(DType dtype) noexcept { return detail::dtype_facts(dtype).name; }
constexpr const char* dtype_numpy_str(DType dtype) noexcept { return detail::dtype_facts(dtype).numpy_str; }
constexpr std::uint32_t dtype_max(DType dtype) noexcept { return detail::dtype_facts(dtype).max; }

inline std::optional<DType> dtype_from_size(std::size_t bytes) noexcept {
  for (const detail::DTypeFacts& facts : detail::kDTypeFacts) {
    if (facts.size == bytes) return facts.dtype;
  }
  return std::nullopt;
}

inline std::optional<DType> dtype_from_name(const std::string& name) noexcept {
  for (const detail::DTypeFacts& facts : detail::kDTypeFacts) {
    if (name == facts.name) return facts.dtype;
  }
  return std::nullopt;
}

}  // namespace quantem
