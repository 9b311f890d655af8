#pragma once
// Detector count types. Sources are always unsigned little-endian integers.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace quantem {

enum class DType : std::uint8_t { uint8, uint16, uint32 };

std::size_t dtype_size(DType dtype) noexcept;           // 1, 2, 4
const char* dtype_name(DType dtype) noexcept;           // "uint8", "uint16", "uint32"
const char* dtype_numpy_str(DType dtype) noexcept;      // "<u1", "<u2", "<u4"
std::uint32_t dtype_max(DType dtype) noexcept;          // 2^bits - 1
std::optional<DType> dtype_from_size(std::size_t bytes) noexcept;
std::optional<DType> dtype_from_name(const std::string& name) noexcept;

}  // namespace quantem
