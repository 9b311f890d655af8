// What a data file's direct chunk writes cost in libhdf5, by chunk index and
// file driver, beside writing the same bytes with one sequential write: the
// floor of an export's write stage (decision 0023). Prints JSON.
//
//   bench_chunk_writes [FOLDER] [CHUNKS] [CHUNK_BYTES]
//
// Variants: "btree_v1" (what an export writes: 1.8 format bounds, unlimited
// frame axis, a v1 B-tree chunk index, as DECTRIS writes), "fixed_array"
// (1.10 bounds, a fixed frame axis: a fixed-array chunk index), and
// "btree_v1_core" (the same file built in memory by the core driver and
// written at close), and "export_writer": what an export's data-file writer
// does (arina::ShardFile, a fixed array, the recording file driver, the bytes
// written by DeferredRawWrites' thread while the next batch is indexed).
// Each file is removed after it is timed.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/export/arina_writer.hpp"
#include "quantem/export/deferred_raw_writes.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Variant {
  const char* name;
  bool fixed_array;
  bool core_driver;
};

nlohmann::json time_variant(const Variant& variant, const std::string& path, std::uint64_t chunks,
                            const std::vector<std::uint8_t>& bytes) {
  const auto start = Clock::now();
  const hid_t access = H5Pcreate(H5P_FILE_ACCESS);
  const H5F_libver_t bound = variant.fixed_array ? H5F_LIBVER_V110 : H5F_LIBVER_V18;
  H5Pset_libver_bounds(access, bound, bound);
  if (variant.core_driver) H5Pset_fapl_core(access, std::size_t{64} << 20, 1);
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access);
  const hsize_t dims[3] = {chunks, 192, 192};
  const hsize_t max_dims[3] = {variant.fixed_array ? chunks : H5S_UNLIMITED, 192, 192};
  const hsize_t chunk[3] = {1, 192, 192};
  const hid_t space = H5Screate_simple(3, dims, max_dims);
  const hid_t creation = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(creation, 3, chunk);
  H5Pset_alloc_time(creation, H5D_ALLOC_TIME_INCR);
  const hid_t dataset = H5Dcreate2(file, "data", H5T_STD_U16LE, space, H5P_DEFAULT, creation, H5P_DEFAULT);
  const double create = seconds_since(start);
  const auto write_start = Clock::now();
  bool ok = dataset >= 0;
  for (std::uint64_t i = 0; ok && i < chunks; ++i) {
    const hsize_t offset[3] = {i, 0, 0};
    ok = H5Dwrite_chunk(dataset, H5P_DEFAULT, 0, offset, bytes.size(), bytes.data()) >= 0;
  }
  const double write = seconds_since(write_start);
  const auto close_start = Clock::now();
  H5Dclose(dataset);
  H5Pclose(creation);
  H5Sclose(space);
  ok = H5Fclose(file) >= 0 && ok;
  H5Pclose(access);
  const double close = seconds_since(close_start);
  std::remove(path.c_str());
  return {{"variant", variant.name},      {"ok", ok},
          {"create_seconds", create},     {"write_seconds", write},
          {"close_seconds", close},       {"total_seconds", seconds_since(start)},
          {"microseconds_per_chunk", seconds_since(start) / static_cast<double>(chunks) * 1e6}};
}

// The export's writer: batches of 4096 chunks indexed by libhdf5 while the
// writer thread writes the batch before.
nlohmann::json time_export_writer(const std::string& path, std::uint64_t chunks,
                                  const std::vector<std::uint8_t>& bytes) {
  constexpr std::uint64_t kBatch = 4096;
  const auto start = Clock::now();
  quantem::arina::BitshuffleFilterRegistration filter;
  quantem::arina::DeferredRawWrites raw_writes;
  double index_seconds = 0;
  {
    quantem::arina::ShardFile shard(path, 1, chunks, 192, 192, quantem::DType::uint16, &raw_writes,
                                    quantem::arina::ChunkIndex::fixed_array);
    std::uint64_t previous = 0;
    for (std::uint64_t first = 0; first < chunks; first += kBatch) {
      const auto index_start = Clock::now();
      for (std::uint64_t i = first; i < std::min(chunks, first + kBatch); ++i) {
        shard.write_chunk(i, bytes.data(), bytes.size());
      }
      index_seconds += seconds_since(index_start);
      const std::uint64_t ticket = raw_writes.flush();
      raw_writes.wait_for(previous);
      previous = ticket;
    }
    raw_writes.wait_for_all();
    shard.close();
  }
  std::remove(path.c_str());
  return {{"variant", "export_writer"},
          {"ok", true},
          {"index_seconds", index_seconds},
          {"total_seconds", seconds_since(start)},
          {"microseconds_per_chunk", seconds_since(start) / static_cast<double>(chunks) * 1e6},
          {"index_microseconds_per_chunk", index_seconds / static_cast<double>(chunks) * 1e6}};
}

double sequential_write_seconds(const std::string& path, std::uint64_t total) {
  const std::vector<std::uint8_t> block(std::size_t{8} << 20, 0x5a);
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (std::uint64_t left = total; fd >= 0 && left > 0;) {
    const std::size_t n = left < block.size() ? static_cast<std::size_t>(left) : block.size();
    if (::write(fd, block.data(), n) != static_cast<ssize_t>(n)) break;
    left -= n;
  }
  if (fd >= 0) ::close(fd);
  const double seconds = seconds_since(start);
  std::remove(path.c_str());
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string folder = argc > 1 ? argv[1] : "/tmp";
  const std::uint64_t chunks = argc > 2 ? std::stoull(argv[2]) : 100000;
  const std::size_t chunk_bytes = argc > 3 ? std::stoull(argv[3]) : 10240;
  std::vector<std::uint8_t> bytes(chunk_bytes);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i * 131 + 7);
  nlohmann::json out = {{"benchmark", "chunk_writes"}, {"chunks", chunks}, {"chunk_bytes", chunk_bytes}};
  out["sequential_write_seconds"] = sequential_write_seconds(folder + "/.floor", chunks * chunk_bytes);
  for (const Variant& variant : {Variant{"btree_v1", false, false}, Variant{"fixed_array", true, false},
                                 Variant{"btree_v1_core", false, true}}) {
    out["variants"].push_back(time_variant(variant, folder + "/.chunk-writes.h5", chunks, bytes));
  }
  out["variants"].push_back(time_export_writer(folder + "/.chunk-writes.h5", chunks, bytes));
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}
