#include "dataset_storage.hpp"

#include <array>

#include "quantem/core/error.hpp"

namespace quantem::catalog::detail {

namespace {

constexpr H5Z_filter_t kBitshuffleFilter = 32008;
constexpr H5Z_filter_t kLz4Filter = 32004;
constexpr unsigned kBitshuffleLz4Compression = 2;
constexpr unsigned kBitshuffleZstdCompression = 3;

std::string filter_name(H5Z_filter_t id) {
  switch (id) {
    case H5Z_FILTER_DEFLATE: return "deflate (1)";
    case H5Z_FILTER_SHUFFLE: return "shuffle (2)";
    case H5Z_FILTER_FLETCHER32: return "fletcher32 (3)";
    case H5Z_FILTER_SZIP: return "szip (4)";
    case H5Z_FILTER_NBIT: return "nbit (5)";
    case H5Z_FILTER_SCALEOFFSET: return "scaleoffset (6)";
    case 307: return "bzip2 (307)";
    case 32000: return "lzf (32000)";
    case 32001: return "blosc (32001)";
    case kLz4Filter: return "LZ4 (32004)";
    case kBitshuffleFilter: return "bitshuffle (32008)";
    case 32015: return "zstd (32015)";
    case 32026: return "blosc2 (32026)";
    default: return "filter " + std::to_string(id);
  }
}

}  // namespace

const char* chunk_filter_name(codec::ChunkFilter filter) noexcept {
  switch (filter) {
    case codec::ChunkFilter::bitshuffle_lz4: return "bitshuffle-LZ4";
    case codec::ChunkFilter::lz4: return "LZ4";
    case codec::ChunkFilter::none: return "none";
  }
  return "unknown";
}

std::string python_tuple(const std::vector<unsigned long long>& values) {
  std::string text = "(";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(values[i]);
  }
  if (values.size() == 1) text += ",";
  return text + ")";
}

DatasetStorage describe_storage(const hdf5::Dataset& dataset, std::size_t element_size) {
  DatasetStorage storage;
  const hdf5::PropertyList dcpl = dataset.creation_properties();
  storage.layout = H5Pget_layout(dcpl.id());
  if (storage.layout == H5D_LAYOUT_ERROR) hdf5::throw_error("H5Pget_layout");
  if (storage.layout == H5D_CHUNKED) {
    std::array<hsize_t, H5S_MAX_RANK> dims{};
    const int rank = H5Pget_chunk(dcpl.id(), H5S_MAX_RANK, dims.data());
    if (rank < 0) hdf5::throw_error("H5Pget_chunk");
    storage.chunk_dims.assign(dims.begin(), dims.begin() + rank);
  }

  const int filter_count = H5Pget_nfilters(dcpl.id());
  if (filter_count < 0) hdf5::throw_error("H5Pget_nfilters");
  if (filter_count == 0) {
    storage.filter = codec::ChunkFilter::none;
    storage.filter_description = "no filter";
    return storage;
  }
  std::string description;
  std::optional<codec::ChunkFilter> single;
  for (int i = 0; i < filter_count; ++i) {
    unsigned flags = 0;
    std::array<unsigned, 16> cd_values{};
    std::size_t cd_count = cd_values.size();
    std::array<char, 256> name{};
    unsigned config = 0;
    const H5Z_filter_t id = H5Pget_filter2(dcpl.id(), static_cast<unsigned>(i), &flags, &cd_count, cd_values.data(),
                                           name.size(), name.data(), &config);
    if (id < 0) hdf5::throw_error("H5Pget_filter2");
    std::string this_description = filter_name(id);
    if (id == kBitshuffleFilter) {
      const bool has_compression = cd_count > 4;
      const unsigned compression = has_compression ? cd_values[4] : 0;
      if (cd_count > 2 && cd_values[2] != element_size) {
        this_description += " with element size " + std::to_string(cd_values[2]) + " for " +
                            std::to_string(element_size) + "-byte data";
      } else if (compression == kBitshuffleLz4Compression) {
        this_description = "bitshuffle-LZ4 (32008)";
        single = codec::ChunkFilter::bitshuffle_lz4;
      } else if (compression == kBitshuffleZstdCompression) {
        this_description += " with zstd compression";
      } else if (compression == 0) {
        this_description += " without compression";
      } else {
        this_description += " with compression " + std::to_string(compression);
      }
    } else if (id == kLz4Filter) {
      single = codec::ChunkFilter::lz4;
    }
    if (i) description += ", ";
    description += this_description;
  }
  storage.filter_description = description;
  if (filter_count == 1 && single) storage.filter = single;
  return storage;
}

}  // namespace quantem::catalog::detail
