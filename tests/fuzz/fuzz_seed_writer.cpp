// Writes the seed corpora of the fuzz targets (not a fuzz target itself):
//   fuzz_seed_writer OUT_DIR [HDF5 FILE...]
// OUT_DIR/<target>/ receives
//   chunk_decoder:  chunks from our encoder (bitshuffle-LZ4 at several element
//                   and block sizes, LZ4, none) and the first stored chunks of
//                   every given file's /entry/data/data (real detector chunks);
//   ans_reader:     ANS groups from the CPU reference encoder (8-, 16-, 32-bit,
//                   odd shapes, escapes);
//   chunk_index:    every given file with a /entry/data/data (at most 4 MiB)
//                   behind the header fuzz_chunk_index.cpp reads, filled in
//                   from what HDF5 reports for it;
//   inspect_master: every given *_master.h5 (at most 1 MiB);
//   inspector_reply: the worker's reply to an inspection of each of those,
//                   written for the path fuzz_inspector_reply asks for (a 0
//                   selector byte first), and its reply to a storage request
//                   for each of their shards (a 1 selector byte first);
//   query:          queries of every route.
// A synthesized acquisition (prefix "fuzz", the stem fuzz_inspect_master
// keeps its shards under) is written to OUT_DIR/synth and used like a given file.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chunk_index.hpp"
#include "dataset_storage.hpp"
#include "quantem/hdf5/error.hpp"
#include "quantem/hdf5/read.hpp"
#include "quantem/ans/ans_codec.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/shard_storage.hpp"
#include "quantem/core/error.hpp"
#include "quantem/inspector/wire.hpp"
#include "quantem/synth/synth.hpp"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;
using namespace quantem;

void write_seed(const fs::path& directory, const std::string& name, const Bytes& bytes) {
  fs::create_directories(directory);
  std::ofstream out(directory / name, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw IoError("cannot write " + (directory / name).string());
}

template <typename T>
void append(Bytes& bytes, T value) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
  bytes.insert(bytes.end(), p, p + sizeof(T));  // little-endian host
}

Bytes read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The inspector's reply for `master`, as if it lay at /fuzz/fuzz_master.h5.
Bytes reply_seed(const std::string& master) {
  catalog::Acquisition acquisition = catalog::inspect_master(master);
  acquisition.master_path = "/fuzz/fuzz_master.h5";
  acquisition.name = "fuzz_master.h5";
  acquisition.stem = "fuzz";
  const std::string line =
      std::string(1, '\0') + nlohmann::json({{"acquisition", inspector::acquisition_to_json(acquisition)}})
                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return Bytes(line.begin(), line.end());
}

// The inspector's replies to storage requests for the shards of `master`.
std::vector<Bytes> storage_reply_seeds(const std::string& master) {
  std::vector<Bytes> seeds;
  for (const auto& shard : catalog::inspect_master(master).shards) {
    nlohmann::json reply;
    try {
      reply = {{"storage", inspector::shard_storage_to_json(catalog::read_shard_storage(shard.file_path, shard.dataset_path))}};
    } catch (const Error& error) {
      reply = {{"failed", {{"kind", error_kind_name(error.kind())}, {"message", error.what()}}}};
    }
    const std::string line = std::string(1, '\1') + reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    seeds.emplace_back(line.begin(), line.end());
  }
  return seeds;
}

// fuzz_chunk_decoder's selector: filter + 3 * index of the element size in {1, 2, 4, 3, 8}.
std::uint8_t decoder_selector(codec::ChunkFilter filter, std::size_t element_size) {
  const std::size_t sizes[] = {1, 2, 4, 3, 8};
  std::size_t index = 0;
  while (index < 5 && sizes[index] != element_size) ++index;
  return static_cast<std::uint8_t>(static_cast<unsigned>(filter) + 3 * (index % 5));
}

Bytes decoder_seed(codec::ChunkFilter filter, std::size_t element_size, std::size_t decoded_bytes, const Bytes& stored) {
  Bytes seed;
  append<std::uint8_t>(seed, decoder_selector(filter, element_size));
  append<std::uint32_t>(seed, static_cast<std::uint32_t>(decoded_bytes));
  seed.insert(seed.end(), stored.begin(), stored.end());
  return seed;
}

// Sparse detector-like counts: mostly 0 and 1, a few large values.
Bytes counts(std::size_t elements, std::size_t element_size, unsigned seed) {
  Bytes bytes(elements * element_size);
  std::uint32_t state = 2463534242u + seed;
  for (std::size_t i = 0; i < elements; ++i) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    std::uint64_t value = (state % 7 == 0) ? state % 5 : 0;
    if (state % 97 == 0) value = state;
    for (std::size_t b = 0; b < element_size; ++b) bytes[i * element_size + b] = static_cast<std::uint8_t>(value >> (8 * b));
  }
  return bytes;
}

void write_decoder_seeds(const fs::path& out) {
  int n = 0;
  for (const std::size_t element_size : {1, 2, 4, 3, 8}) {
    for (const std::size_t elements : {std::size_t{5}, std::size_t{64}, std::size_t{1000}, std::size_t{4099}}) {
      const Bytes data = counts(elements, element_size, static_cast<unsigned>(n));
      for (const std::size_t block : {std::size_t{0}, std::size_t{64}}) {
        write_seed(out, "bslz4_" + std::to_string(n++),
                   decoder_seed(codec::ChunkFilter::bitshuffle_lz4, element_size, data.size(),
                                codec::encode_bitshuffle_lz4(data.data(), elements, element_size, block)));
      }
      write_seed(out, "lz4_" + std::to_string(n++),
                 decoder_seed(codec::ChunkFilter::lz4, element_size, data.size(), codec::encode_lz4(data.data(), data.size())));
      write_seed(out, "lz4_blocks_" + std::to_string(n++),
                 decoder_seed(codec::ChunkFilter::lz4, element_size, data.size(),
                              codec::encode_lz4(data.data(), data.size(), 256)));
      write_seed(out, "none_" + std::to_string(n++), decoder_seed(codec::ChunkFilter::none, element_size, data.size(), data));
    }
  }
}

void write_ans_seeds(const fs::path& out) {
  struct Shape {
    DType dtype;
    std::uint32_t frames, rows, cols;
    unsigned seed;
  };
  const Shape shapes[] = {{DType::uint16, 1, 4, 4, 1}, {DType::uint16, 3, 5, 3, 2}, {DType::uint8, 4, 8, 8, 3},
                          {DType::uint32, 2, 6, 6, 4}, {DType::uint16, 8, 16, 16, 5}, {DType::uint32, 1, 1, 1, 6}};
  int n = 0;
  for (const Shape& shape : shapes) {
    const std::size_t element_size = dtype_size(shape.dtype);
    const Bytes frames = counts(std::size_t{shape.frames} * shape.rows * shape.cols, element_size, shape.seed);
    ans::HostFrames host{frames.data(), shape.dtype, shape.frames, shape.rows, shape.cols};
    write_seed(out, "group_" + std::to_string(n++), ans::encode_group(host));
  }
}

bool has_detector_dataset(const std::string& path) {
  try {
    const auto file = hdf5::File::open_read_only(path);
    return hdf5::path_exists(file.id(), "entry/data/data");
  } catch (const Error&) {
    return false;
  }
}

// The chunk-index seed and real stored chunks of one file's /entry/data/data.
void write_file_seeds(const std::string& path, const std::string& label, const fs::path& out) {
  if (!has_detector_dataset(path)) return;
  const auto file = hdf5::File::open_read_only(path);
  const auto dataset = hdf5::open_dataset(file.id(), "/entry/data/data");
  const int rank = H5Sget_simple_extent_ndims(dataset.space().id());
  if (rank < 1 || rank > 4) return;
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), max_dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(dataset.space().id(), dims.data(), max_dims.data());
  const std::size_t element_size = H5Tget_size(dataset.type().id());
  const std::string name = label + "_" + fs::path(path).filename().string();

  const catalog::detail::FileAddressing addressing{file.offset_size(), file.length_size(), file.user_block_size()};
  const std::uint64_t header_address = dataset.object_header_address();
  const Bytes image = read_whole(path);
  if (image.size() <= (std::size_t{4} << 20)) {
    Bytes seed;
    const auto size_code = [](std::size_t bytes) { return static_cast<std::uint8_t>(bytes == 8 ? 0 : bytes == 4 ? 1 : 2); };
    append<std::uint8_t>(seed, size_code(addressing.offset_size));
    append<std::uint8_t>(seed, size_code(addressing.length_size));
    append<std::uint8_t>(seed, static_cast<std::uint8_t>(rank - 1));
    append<std::uint8_t>(seed, static_cast<std::uint8_t>(max_dims[0] == H5S_UNLIMITED ? 1 : 0));
    append<std::uint32_t>(seed, static_cast<std::uint32_t>(addressing.base_address));
    append<std::uint64_t>(seed, header_address);
    for (const hsize_t d : dims) append<std::uint16_t>(seed, static_cast<std::uint16_t>(d));
    seed.insert(seed.end(), image.begin(), image.end());
    write_seed(out / "chunk_index", name, seed);
  }

  const auto storage = catalog::detail::describe_storage(dataset, element_size);
  if (storage.layout != H5D_CHUNKED || !storage.filter) return;
  const catalog::detail::RawFile raw(path, addressing);
  const auto layout = catalog::detail::read_data_layout(raw, header_address);
  std::uint64_t chunk_bytes = element_size;
  for (const hsize_t d : storage.chunk_dims) chunk_bytes *= d;
  int taken = 0;
  const std::vector<std::uint64_t> dims64(dims.begin(), dims.end()), max64(max_dims.begin(), max_dims.end());
  catalog::detail::visit_chunks(raw, layout, dims64, max64,
                                [&](const std::uint64_t*, std::uint64_t offset, std::uint64_t stored, std::uint32_t mask) {
                                  if (taken >= 3 || stored > (std::uint64_t{1} << 20)) return;
                                  const auto filter = (mask & 1u) != 0 ? codec::ChunkFilter::none : *storage.filter;
                                  const Bytes chunk(image.begin() + static_cast<std::ptrdiff_t>(offset),
                                                    image.begin() + static_cast<std::ptrdiff_t>(offset + stored));
                                  write_seed(out / "chunk_decoder", name + "_chunk" + std::to_string(taken++),
                                             decoder_seed(filter, element_size, chunk_bytes, chunk));
                                });
}

void write_query_seeds(const fs::path& out) {
  const char* queries[] = {
      "session=s&file=a_master.h5&mode=BF",
      "session=s&file=a_master.h5&mode=ADF&inner=0.5&outer=2&scan_bin=2&det_bin=2&format=npy",
      "session=s&file=a_master.h5&mode=iCoM&scan_crop=0,4,0,4&det_crop=1,7,1,7&ensure_resident=true",
      "session=s&file=a_master.h5&shape=annulus&cx=3.5&cy=4&r_inner=1&r_outer=3",
      "session=s&file=a_master.h5&shape=rectangle&row0=1&row1=5&col0=0&col1=3&det_bin=1",
      "session=s&file=a_master.h5&sx=3&sy=4&format=raw",
      "session=s&file=a_master.h5&shape=circle&cx=1&cy=2&r=1.5&reduce=mean",
      "session=s&file=a%20b_master.h5&mode=CoMx&scan_bin=1_0&det_bin=+2",
      "refresh=true&refresh=no",
      "a=1&b=&c&&=x&%zz=%E2%82%AC&+=+&inner=1e3&outer=nan&scan_bin=1.0",
  };
  int n = 0;
  for (const char* query : queries) {
    write_seed(out, "query_" + std::to_string(n++), Bytes(query, query + std::strlen(query)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: fuzz_seed_writer OUT_DIR [HDF5 FILE...]\n";
    return 2;
  }
  const fs::path out = argv[1];
  try {
    write_decoder_seeds(out / "chunk_decoder");
    write_ans_seeds(out / "ans_reader");
    write_query_seeds(out / "query");

    synth::SynthOptions options;
    options.output_dir = (out / "synth").string();
    options.prefix = "fuzz";
    options.scan_rows = 3;
    options.scan_cols = 3;
    options.detector_rows = 8;
    options.detector_cols = 8;
    options.frames_per_shard = 5;
    options.threads = 1;
    options.bad_pixels = 1;
    synth::write_acquisition(options);

    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(out / "synth")) files.push_back(entry.path().string());
    for (int i = 2; i < argc; ++i) files.emplace_back(argv[i]);
    int masters = 0, n = 0;
    for (const std::string& path : files) {
      const std::string name = fs::path(path).filename().string();
      if (name.size() > 10 && name.compare(name.size() - 10, 10, "_master.h5") == 0 && fs::file_size(path) <= (1u << 20)) {
        write_seed(out / "inspect_master", std::to_string(masters) + "_" + name, read_whole(path));
        write_seed(out / "inspector_reply", std::to_string(masters) + "_" + name, reply_seed(path));
        int shard = 0;
        for (const Bytes& seed : storage_reply_seeds(path)) {
          write_seed(out / "inspector_reply", std::to_string(masters) + "_storage" + std::to_string(shard++) + "_" + name,
                     seed);
        }
        ++masters;
      }
      try {
        write_file_seeds(path, std::to_string(n++), out);
      } catch (const Error& error) {
        std::cerr << "fuzz_seed_writer: skipping " << path << ": " << error.what() << "\n";
      }
    }
  } catch (const std::exception& error) {
    std::cerr << "fuzz_seed_writer: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
