#include "quantem/core/dtype.hpp"

namespace quantem {

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::uint8: return 1;
    case DType::uint16: return 2;
    case DType::uint32: return 4;
  }
  return 0;
}

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::uint8: return "uint8";
    case DType::uint16: return "uint16";
    case DType::uint32: return "uint32";
  }
  return "unknown";
}

const char* dtype_numpy_str(DType dtype) noexcept {
  switch (dtype) {
    case DType::uint8: return "<u1";
    case DType::uint16: return "<u2";
    case DType::uint32: return "<u4";
  }
  return "";
}

std::uint32_t dtype_max(DType dtype) noexcept {
  switch (dtype) {
    case DType::uint8: return 0xFFu;
    case DType::uint16: return 0xFFFFu;
    case DType::uint32: return 0xFFFFFFFFu;
  }
  return 0;
}

std::optional<DType> dtype_from_size(std::size_t bytes) noexcept {
  switch (bytes) {
    case 1: return DType::uint8;
    case 2: return DType::uint16;
    case 4: return DType::uint32;
    default: return std::nullopt;
  }
}

std::optional<DType> dtype_from_name(const std::string& name) noexcept {
  if (name == "uint8") return DType::uint8;
  if (name == "uint16") return DType::uint16;
  if (name == "uint32") return DType::uint32;
  return std::nullopt;
}

}  // namespace quantem
