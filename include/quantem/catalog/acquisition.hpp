#pragma once
// What the catalog knows about one Arina/Eiger acquisition (one *_master.h5).
// Inspection reads HDF5 headers only, never frames, and never throws for a bad
// file: the problem is reported in `status` (docs/protocol.md, 'Masters, sessions and readiness').
//
// Readiness runs the reference's checks in their order, then these
// tightenings, then the check that no file changed during the inspection:
//   - the stored dtype is uint8, uint16 or uint32 (little-endian);
//   - every source is contiguous or chunked one frame per chunk (1, ..., rows, cols);
//   - every source's filter pipeline is bitshuffle-LZ4 (32008, cd_values[2] =
//     element size, cd_values[4] = 2), LZ4 (32004) or empty, and all agree;
//   - every chunk of every source is written (H5Dget_num_chunks), and a
//     contiguous source has its storage allocated;
//   - a known scan shape covers exactly the stored frames.
// Scan shape: the first positive 2-vector `scan_shape` (root dataset, root
// attribute, entry/data attribute, the first source's attribute), else the Arina
// sidecar <stem>.h5 (/STEM Metadata NumPixelsY rows x NumPixelsX cols, or
// NumPixelsX + NumPixelsPrescan cols, whichever matches the frame total), else
// the square root of the frame total (ntrigger x nimages, or the stored frames
// when there is no ntrigger), else unknown (0, 0).
// A pixel_mask whose shape differs from the detector, or that is not an
// integer dataset, is ignored with a logged warning: the frames stay usable.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/dtype.hpp"

namespace quantem::catalog {

// Readiness as shown to users: the reference's exact reason/action texts.
struct LoadStatus {
  bool loadable = false;
  std::string reason;
  std::string action;
};

// One file's identity for staleness checks: a resident or cached image built
// from a signature is never served once any entry changes.
// Stats follow symlinks; a file that cannot be stat'ed is recorded as missing
// (exists = false, every other field 0).
struct SignatureEntry {
  std::string path;  // absolute
  bool exists = false;
  std::int64_t size_bytes = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;  // also catches an atomic replace that keeps size and mtime
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  bool operator==(const SignatureEntry& other) const {
    return path == other.path && exists == other.exists && size_bytes == other.size_bytes &&
           mtime_ns == other.mtime_ns && ctime_ns == other.ctime_ns && device == other.device &&
           inode == other.inode;
  }
  bool operator!=(const SignatureEntry& other) const { return !(*this == other); }
};
using SourceSignature = std::vector<SignatureEntry>;  // master first, then linked files in link order

// One data source of a master: an external link's target, or the inline dataset.
struct Shard {
  std::string link_name;     // "data_000001", or "data" for an inline master
  std::string file_path;     // absolute path of the file that holds the dataset
  std::string dataset_path;  // object path inside file_path, e.g. "/entry/data/data"
  bool external = false;
  bool exists = false;
  std::uint64_t frame_count = 0;  // stored frames (product of all but the last two dims)
};

struct Acquisition {
  std::string master_path;  // absolute, not symlink-resolved
  std::string name;         // file name, "sample_master.h5"
  std::string stem;         // name without "_master.h5"

  // [scan rows, scan cols, detector rows, detector cols]; 0 where unknown.
  std::uint64_t scan_rows = 0;
  std::uint64_t scan_cols = 0;
  std::uint64_t detector_rows = 0;
  std::uint64_t detector_cols = 0;
  std::string scan_shape_basis;  // where the scan shape came from, e.g. "STEM Metadata sidecar test_00.h5"

  std::optional<DType> dtype;       // stored element type; nullopt when unknown or unsupported
  codec::ChunkFormat chunk_format;  // the common filter of every source
  std::vector<Shard> shards;
  std::uint64_t stored_frames = 0;                 // summed over the sources that were read
  std::optional<std::uint64_t> expected_frames;   // ntrigger x nimages, else the scan_shape product
  std::optional<std::uint64_t> ntrigger;
  std::optional<std::uint64_t> nimages;

  // Bad-pixel mask at detector resolution, row-major, 1 = masked (NXdetector
  // rule: any of the low 16 bits of pixel_mask set). Empty when the master has none.
  std::vector<std::uint8_t> pixel_mask;
  std::uint64_t masked_pixel_count = 0;

  std::uint64_t size_bytes = 0;  // master + every distinct linked file that exists
  LoadStatus status;
  std::optional<double> scan_sampling_A;
  std::optional<double> k_pixel_size_mrad;
  SourceSignature signature;  // master, then every distinct linked file, stat'ed during inspection

  bool scan_shape_known() const { return scan_rows > 0 && scan_cols > 0; }
  bool detector_shape_known() const { return detector_rows > 0 && detector_cols > 0; }
  std::uint64_t frame_count() const { return scan_rows * scan_cols; }
  std::uint64_t frame_pixels() const { return detector_rows * detector_cols; }
};

// Inspects one master. Never throws for a malformed, missing, growing or
// unreadable file; never hangs on one.
Acquisition inspect_master(const std::string& master_path);

// An acquisition that names `master_path` and knows nothing else: master_path
// made absolute (no symlink resolution), name and stem filled in. Inspection
// starts from it; the inspector (inspector/inspector.hpp) reports a file it
// could not inspect with it.
Acquisition named_acquisition(const std::string& master_path);

// `path` made absolute against the working directory and lexically normal,
// with no trailing slash (no symlink resolution).
std::string lexically_absolute(const std::string& path);

// Stats every file of a signature again (cheap: no HDF5).
SourceSignature restat_signature(const SourceSignature& signature);

// Where each frame's stored chunk lives. Built from the chunk B-tree read
// directly from the file (no per-chunk HDF5 index calls, which are O(N) each on
// HDF5 1.10.8), so building it for 262,144 frames takes milliseconds.
struct FrameLocation {
  std::uint32_t shard = 0;        // index into FrameIndex::shard_paths
  std::uint32_t filter_mask = 0;  // HDF5 filter mask of the chunk (bit 0 set: stored unfiltered)
  std::uint64_t file_offset = 0;  // byte offset of the chunk in its file
  std::uint64_t stored_bytes = 0; // stored (compressed) size of the chunk
};

struct FrameIndex {
  std::vector<std::string> shard_paths;  // absolute
  std::vector<FrameLocation> frames;     // global frame order (row-major scan order)
  std::uint64_t stored_bytes_total = 0;  // sum of stored_bytes
};

// Builds the frame index of a loadable acquisition. Chunked sources: the chunk
// index is read from the file (v1 B-tree, single chunk, implicit and fixed
// array indexes); other index kinds fall back to H5Dget_chunk_info with a
// logged warning (correct, O(N^2)). Contiguous sources: frame i at the data
// offset + i x frame bytes.
// Throws quantem::Error: conflict when the acquisition is not loadable or a
// shard changed since inspection; corrupt_data when a chunk index is malformed,
// a frame has no chunk, or a chunk lies outside its file; HdfError / IoError
// when a file cannot be opened or read.
FrameIndex build_frame_index(const Acquisition& acquisition);

}  // namespace quantem::catalog
