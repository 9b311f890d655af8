#pragma once
// How a detector dataset is stored (private header): layout, chunk shape and
// the filter pipeline, read from its creation property list, and whether the
// daemon can read it directly (one frame per chunk; bitshuffle-LZ4, LZ4 or no
// filter: HDF5 filters 32008 and 32004, or none).
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "quantem/hdf5/error.hpp"
#include "quantem/hdf5/read.hpp"
#include "quantem/codec/chunk_codec.hpp"

namespace quantem::catalog::detail {

struct DatasetStorage {
  H5D_layout_t layout = H5D_LAYOUT_ERROR;
  std::vector<hsize_t> chunk_dims;  // chunked layout only
  // The filter pipeline as the codec knows it; nullopt when unsupported.
  std::optional<codec::ChunkFilter> filter;
  // Human description of the pipeline, e.g. "bitshuffle-LZ4 (32008)",
  // "deflate (1)", "bitshuffle (32008) with zstd compression".
  std::string filter_description;
};

// Reads layout, chunk shape and filters. `element_size` is the dataset's
// element size in bytes (bitshuffle's cd_values[2] must equal it).
DatasetStorage describe_storage(const hdf5::Dataset& dataset, std::size_t element_size);

// Short name of a supported filter for readiness texts: "bitshuffle-LZ4", "LZ4", "none".
const char* chunk_filter_name(codec::ChunkFilter filter) noexcept;

// Python tuple repr of integers: "(4, 4)", "(16,)", "()".
std::string python_tuple(const std::vector<unsigned long long>& values);

}  // namespace quantem::catalog::detail
