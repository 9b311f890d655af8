#pragma once
// NumPy .npy (format version 1.0) encoding for `format=npy` responses.
// The bytes are identical to numpy.save() of a C-order array of the same
// dtype and shape (numpy >= 1.23 layout: the header is padded with spaces for
// in-place growth of the first axis and aligned so data starts at a multiple
// of 64 bytes).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace quantem::protocol {

// Magic, version, header length and the padded header dictionary.
// descr is a NumPy type string such as "<u4" or "<f4".
std::string npy_header(const std::string& descr, const std::vector<std::uint64_t>& shape);

// Header followed by `data` (row-major little-endian values). Throws
// quantem::Error(internal) when data's size does not match shape × item size.
std::string encode_npy(const std::string& descr, std::size_t item_size, const std::vector<std::uint64_t>& shape,
                       std::string_view data);

}  // namespace quantem::protocol
