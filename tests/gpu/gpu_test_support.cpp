#include "gpu_test_support.hpp"

#include <hdf5.h>

#include <algorithm>
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

GpuDecodeResult decode_on_gpu(const std::vector<Bytes>& chunks, std::size_t element_size, std::size_t elements,
                              std::size_t block_elements, bool staged_backwards,
                              const kernels::BitshuffleLz4Tuning& tuning) {
  Bytes staged;
  std::vector<std::uint64_t> offsets(chunks.size());
  std::vector<std::uint32_t> sizes(chunks.size());
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    const std::size_t i = staged_backwards ? chunks.size() - 1 - k : k;
    offsets[i] = staged.size();
    sizes[i] = static_cast<std::uint32_t>(chunks[i].size());
    staged.insert(staged.end(), chunks[i].begin(), chunks[i].end());
  }
  const std::size_t frame_bytes = elements * element_size;
  kernels::DeviceBuffer d_stored(std::max<std::size_t>(staged.size(), 1));
  kernels::DeviceBuffer d_offsets(offsets.size() * sizeof(std::uint64_t));
  kernels::DeviceBuffer d_sizes(sizes.size() * sizeof(std::uint32_t));
  kernels::DeviceBuffer d_decoded(chunks.size() * frame_bytes);
  kernels::DeviceBuffer d_status(chunks.size() * sizeof(std::uint32_t));
  kernels::copy_to_device(d_stored.data(), staged.data(), staged.size());
  kernels::copy_to_device(d_offsets.data(), offsets.data(), d_offsets.size());
  kernels::copy_to_device(d_sizes.data(), sizes.data(), d_sizes.size());
  kernels::fill_device(d_decoded.data(), 0xA5, d_decoded.size());  // poison: every byte must be written
  kernels::fill_device(d_status.data(), 0xFF, d_status.size());

  kernels::BitshuffleLz4Batch batch;
  batch.d_stored = d_stored.as<std::uint8_t>();
  batch.stored_bytes = staged.size();
  batch.d_chunk_offsets = d_offsets.as<std::uint64_t>();
  batch.d_chunk_sizes = d_sizes.as<std::uint32_t>();
  batch.chunk_count = chunks.size();
  batch.element_size = element_size;
  batch.elements_per_chunk = elements;
  batch.block_elements = block_elements;
  batch.d_decoded = d_decoded.as<std::uint8_t>();
  batch.d_status = d_status.as<std::uint32_t>();
  kernels::DeviceBuffer d_scratch(std::max<std::size_t>(kernels::bitshuffle_lz4_scratch_bytes(batch), 1));
  kernels::decode_bitshuffle_lz4(batch, d_scratch.data(), d_scratch.size(), nullptr, tuning);
  kernels::synchronize_device();

  GpuDecodeResult result;
  Bytes all(d_decoded.size());
  kernels::copy_to_host(all.data(), d_decoded.data(), all.size());
  std::vector<std::uint32_t> status(chunks.size());
  kernels::copy_to_host(status.data(), d_status.data(), d_status.size());
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    result.frames.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(i * frame_bytes),
                               all.begin() + static_cast<std::ptrdiff_t>((i + 1) * frame_bytes));
    result.status.push_back(static_cast<kernels::ChunkStatus>(status[i]));
  }
  return result;
}


}  // namespace quantem::gpu_test
