#include "gpu_test_support.hpp"

#include <hdf5.h>

#include <stdexcept>

namespace quantem::gpu_test {

namespace {
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Handle() {
    if (id >= 0) close(id);
  }
};
}  // namespace

StoredDataset read_stored_dataset(const std::string& path, const std::string& dataset_name) {
  Handle file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  if (file.id < 0) throw std::runtime_error("cannot open " + path);
  Handle dataset{H5Dopen2(file.id, dataset_name.c_str(), H5P_DEFAULT), H5Dclose};
  if (dataset.id < 0) throw std::runtime_error("cannot open " + dataset_name + " in " + path);
  Handle space{H5Dget_space(dataset.id), H5Sclose};
  Handle type{H5Dget_type(dataset.id), H5Tclose};
  Handle plist{H5Dget_create_plist(dataset.id), H5Pclose};
  hsize_t dims[3] = {0, 0, 0};
  if (H5Sget_simple_extent_ndims(space.id) != 3) throw std::runtime_error(path + ": dataset is not 3-D");
  H5Sget_simple_extent_dims(space.id, dims, nullptr);
  StoredDataset result;
  result.element_size = H5Tget_size(type.id);
  result.frame_elements = static_cast<std::size_t>(dims[1] * dims[2]);
  if (H5Pget_nfilters(plist.id) > 0) {
    unsigned flags = 0;
    std::size_t cd_count = 0;
    result.filter_id = H5Pget_filter2(plist.id, 0, &flags, &cd_count, nullptr, 0, nullptr, nullptr);
  }
  for (hsize_t frame = 0; frame < dims[0]; ++frame) {
    const hsize_t offset[3] = {frame, 0, 0};
    hsize_t stored_bytes = 0;
    if (H5Dget_chunk_storage_size(dataset.id, offset, &stored_bytes) < 0)
      throw std::runtime_error(path + ": no chunk for frame " + std::to_string(frame));
    StoredChunk chunk;
    chunk.bytes.resize(static_cast<std::size_t>(stored_bytes));
    if (H5Dread_chunk(dataset.id, H5P_DEFAULT, offset, &chunk.filter_mask, chunk.bytes.data()) < 0)
      throw std::runtime_error(path + ": H5Dread_chunk failed for frame " + std::to_string(frame));
    result.chunks.push_back(std::move(chunk));
  }
  return result;
}

std::vector<std::uint8_t> random_frame(std::mt19937_64& rng, std::size_t elements, std::size_t element_size,
                                       const std::string& pattern) {
  std::vector<std::uint8_t> bytes(elements * element_size, 0);
  const std::uint64_t max_value = element_size == 4 ? 0xffffffffull : (1ull << (8 * element_size)) - 1;
  std::poisson_distribution<std::uint32_t> sparse(0.3);
  std::poisson_distribution<std::uint32_t> bright(40.0);
  std::uniform_int_distribution<std::uint64_t> uniform(0, max_value);
  for (std::size_t i = 0; i < elements; ++i) {
    std::uint64_t value = 0;
    if (pattern == "zero") value = 0;
    else if (pattern == "max") value = max_value;
    else if (pattern == "uniform") value = uniform(rng);
    else if (pattern == "sparse") value = sparse(rng);
    else if (pattern == "disc") value = (i % 192 > 64 && i % 192 < 128 && (i / 192) % 192 > 64 && (i / 192) % 192 < 128) ? bright(rng) : sparse(rng);
    else throw std::runtime_error("unknown pattern " + pattern);
    value = value > max_value ? max_value : value;
    for (std::size_t b = 0; b < element_size; ++b) bytes[i * element_size + b] = static_cast<std::uint8_t>(value >> (8 * b));
  }
  return bytes;
}

}  // namespace quantem::gpu_test
