#pragma once
// The Arina layout as written by `synth` and `export` (library
// quantem_arina_writer): data files of pre-compressed bitshuffle/LZ4 chunks
// written with H5Dwrite_chunk, the master with external links and
// detectorSpecific metadata, and the small HDF5 helpers both masters use.
// Not thread-safe: HDF5 is not built thread-safe here, so a process makes
// every call from one thread at a time (the export holds the one lock of
// libhdf5, hdf5::LibraryLock, like the readers). Handles and errors come from the one
// HDF5 layer (quantem/hdf5/): failures throw quantem::HdfError carrying
// HDF5's error stack (hdf5::throw_error_with_trace; HDF5's own printing is
// silenced by hdf5::ErrorSilencer).
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "quantem/core/dtype.hpp"
#include "quantem/hdf5/error.hpp"
#include "quantem/hdf5/handle.hpp"

namespace quantem::arina {

namespace detail {
struct WriteFailure;
}
class DeferredRawWrites;  // deferred_raw_writes.hpp

// The chunk index of a data file: the v1 B-tree real Arina files have (HDF5
// 1.8 format, an unlimited frame axis; what synth writes), or a fixed array
// (HDF5 1.10 format, the frame count fixed), which costs libhdf5 a quarter
// less per direct chunk write (decision 0023; what exports write).
enum class ChunkIndex { btree_v1, fixed_array };

// A file made by create_file: its handle and the record of the system calls
// that failed on it. Its file driver never reports an I/O error to HDF5 (a
// failed H5Fclose leaves libhdf5 1.10 unsafe for the whole process); the
// error surfaces here instead, as a typed error.
class RecordedFile {
 public:
  RecordedFile();
  RecordedFile(RecordedFile&& other) noexcept;
  RecordedFile& operator=(RecordedFile&& other) noexcept;
  ~RecordedFile();
  hid_t id() const noexcept { return handle_.id(); }
  // Throws if a system call on the file failed: payload_too_large when the
  // disk, the quota or the file size limit is full (ENOSPC, EDQUOT, EFBIG),
  // IoError otherwise (EIO, EROFS, ...), naming the file and the error.
  void check_writes() const;
  // Closes (flushes) the file, then check_writes; HdfError if HDF5 fails.
  void close(const std::string& what);

 private:
  friend RecordedFile create_file(const std::string& path, DeferredRawWrites* raw_writes, ChunkIndex index);
  std::unique_ptr<detail::WriteFailure> failure_;  // before handle_: outlives the close
  std::string path_;
  hdf5::File handle_;
};

// Registers, for its lifetime, a class for filter 32008 (bitshuffle) whose
// filter function refuses to run. It lets a dataset carry 32008 as a mandatory
// filter (flags 0, as real Arina files do) with exactly the cd_values we choose,
// without the official plugin's set_local rewriting them; every chunk is then
// written pre-compressed with H5Dwrite_chunk. It replaces the official plugin
// in this process while alive: do not read 32008 data through HDF5 meanwhile.
// Throws unavailable once an H5Fclose of this process failed
// (hdf5::file_close_failed()): filters are no longer unregistered then, and
// no writer starts.
class BitshuffleFilterRegistration {
 public:
  BitshuffleFilterRegistration();
  ~BitshuffleFilterRegistration();
  BitshuffleFilterRegistration(const BitshuffleFilterRegistration&) = delete;
  BitshuffleFilterRegistration& operator=(const BitshuffleFilterRegistration&) = delete;
};

constexpr unsigned kBitshuffleFilterId = 32008;

// One `<prefix>_data_NNNNNN.h5`: /entry/data/data (frames, rows, cols), chunk
// (1, rows, cols), filter 32008 with cd_values {0, 3, element_size, 0, 2},
// fill value all-ones, the chunk index `index` (a v1 B-tree by default), image_nr_low/high attributes.
class ShardFile {
 public:
  // `raw_writes` (may be null): the chunks' bytes are written by that pool
  // (deferred_raw_writes.hpp); the caller keeps each chunk's buffer alive
  // until its ticket is waited for, and close() waits for every write.
  ShardFile(const std::string& path, std::uint64_t first_image_number, std::uint64_t frames,
            std::uint64_t detector_rows, std::uint64_t detector_cols, DType dtype,
            DeferredRawWrites* raw_writes = nullptr, ChunkIndex index = ChunkIndex::btree_v1);
  // Writes frame `local_index` (0-based within the shard) as one stored chunk.
  void write_chunk(std::uint64_t local_index, const std::uint8_t* stored, std::size_t stored_bytes);
  // Flushes and closes; throws on failure (a failed raw write first). The
  // destructor closes silently.
  void close();

 private:
  std::string path_;
  DeferredRawWrites* raw_writes_ = nullptr;
  RecordedFile file_;
  hdf5::Dataset dataset_;
};

struct MasterContents {
  std::vector<std::string> shard_basenames;  // data_000001 ... in order
  std::uint64_t scan_rows = 0;
  std::uint64_t scan_cols = 0;
  std::uint64_t detector_rows = 0;
  std::uint64_t detector_cols = 0;
  DType dtype = DType::uint16;
  std::uint32_t saturation_count = 0;
  std::vector<std::uint32_t> pixel_mask;  // detector_rows * detector_cols
  std::uint32_t excluded_pixels = 0;
  std::optional<double> scan_sampling_A;    // entry/data attributes, written when set
  std::optional<double> k_pixel_size_mrad;
  double photon_energy_eV = 300000.0;  // detectorSpecific/photon_energy: the electrons' energy
};

void write_master(const std::string& path, const MasterContents& contents);

// --- Helpers for masters (fixed-length ASCII strings like DECTRIS writes) ----

// A file with the v1 B-tree chunk index of real Arina files and no times,
// written through the recording driver (RecordedFile); its chunks' bytes by
// `raw_writes` when given.
RecordedFile create_file(const std::string& path, DeferredRawWrites* raw_writes = nullptr,
                         ChunkIndex index = ChunkIndex::btree_v1);
hdf5::Group create_group(hid_t parent, const char* name, const char* nx_class);
void write_string_attribute(hid_t object, const char* name, const std::string& value);
// An attribute of `count` elements; count 0 means a scalar dataspace.
void write_attribute(hid_t object, const char* name, hid_t file_type, hid_t memory_type, const void* value,
                     hsize_t count = 0);
void write_u64(hid_t group, const char* name, std::uint64_t value);
void write_u32(hid_t group, const char* name, std::uint32_t value);
void write_u16(hid_t group, const char* name, std::uint16_t value);
void write_i8(hid_t group, const char* name, std::int8_t value);
void write_f64(hid_t group, const char* name, double value, const char* units);
void write_text(hid_t group, const char* name, const std::string& value);
// A contiguous, unfiltered 2-D uint32 dataset (a pixel_mask, as Neggia requires).
void write_u32_image(hid_t group, const char* name, const std::vector<std::uint32_t>& values, std::uint64_t rows,
                     std::uint64_t cols);
// External links data_000001... in `data_group` to /entry/data/data of each file.
void write_data_links(hid_t data_group, const std::vector<std::string>& shard_basenames);

// `<prefix>.h5`: group "/STEM Metadata" with NumPixelsX/Y and a few plausible
// microscope attributes, typed like the real Arina sidecar.
struct StemMetadata {
  std::uint64_t scan_rows = 0;
  std::uint64_t scan_cols = 0;
  double high_tension_V = 300000.0;
  double camera_length_m = 0.115;
};
void write_stem_metadata(const std::string& path, const StemMetadata& metadata);

}  // namespace quantem::arina
