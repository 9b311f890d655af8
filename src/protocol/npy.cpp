#include "quantem/protocol/npy.hpp"

#include "quantem/core/error.hpp"

namespace quantem::protocol {

namespace {
constexpr std::size_t magic_length = 6;       // "\x93NUMPY"
constexpr std::size_t array_align = 64;        // numpy.lib.format.ARRAY_ALIGN
constexpr std::size_t growth_axis_digits = 21; // numpy.lib.format.GROWTH_AXIS_MAX_DIGITS

std::string shape_repr(const std::vector<std::uint64_t>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  if (shape.size() == 1) text += ",";
  text += ")";
  return text;
}
}  // namespace

std::string npy_header(const std::string& descr, const std::vector<std::uint64_t>& shape) {
  std::string dictionary = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape_repr(shape) + ", }";
  if (!shape.empty()) {
    const std::size_t first_axis_digits = std::to_string(shape.front()).size();
    if (first_axis_digits < growth_axis_digits) dictionary.append(growth_axis_digits - first_axis_digits, ' ');
  }
  // Version 1.0 stores the header length in two little-endian bytes.
  const std::size_t header_length = dictionary.size() + 1;  // + '\n'
  const std::size_t padding = array_align - ((magic_length + 2 + 2 + header_length) % array_align);
  const std::size_t stored_length = header_length + padding;
  if (stored_length > 0xFFFF) throw internal_error("npy header does not fit format version 1.0");

  std::string header;
  header.reserve(10 + stored_length);
  header += "\x93NUMPY";
  header.push_back('\x01');
  header.push_back('\x00');
  header.push_back(static_cast<char>(stored_length & 0xFF));
  header.push_back(static_cast<char>((stored_length >> 8) & 0xFF));
  header += dictionary;
  header.append(padding, ' ');
  header.push_back('\n');
  return header;
}

std::string encode_npy(const std::string& descr, std::size_t item_size, const std::vector<std::uint64_t>& shape,
                       std::string_view data) {
  std::uint64_t count = 1;
  for (auto extent : shape) count *= extent;
  if (count * item_size != data.size()) {
    throw internal_error("npy payload has " + std::to_string(data.size()) + " bytes, expected " +
                         std::to_string(count * item_size));
  }
  std::string out = npy_header(descr, shape);
  out.append(data.data(), data.size());
  return out;
}

}  // namespace quantem::protocol
