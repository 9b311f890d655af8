#pragma once
// What inspection learned about a data folder's masters, kept between runs of
// the daemon so that a restart inspects only what changed.
//
// One file per data folder, by default
//   ${XDG_CACHE_HOME:-~/.cache}/quantem-gpu/catalog-<16 hex>.bin
// where the hex is the FNV-1a 64 hash of the data folder's absolute path as
// the catalog spells it (catalog::absolute_folder: no symlink resolution).
// The file holds, per master, the whole Acquisition (the catalog entry and
// everything build_frame_index starts from: shards, dtype, chunk format,
// shapes, pixel mask, signature). Format (little-endian):
//   "QGCATALG" (8 bytes), u32 format version, u64 payload bytes,
//   u32 CRC-32 of the payload, then the payload: the data folder (u32 length +
//   bytes), u64 entry count, the entries: each Acquisition's fields in the
//   order of the field table (acquisition_fields.hpp), encoded as
//   catalog_cache.cpp's FieldWriter describes (the pixel mask as run lengths).
// A change of the table changes the bytes: the version is raised with it, and
// a file of another version is ignored and rewritten.
// A file that is missing, unreadable, truncated, of another version, of
// another data folder or whose checksum or contents do not add up is ignored
// as a whole (logged once) and replaced by the next write; never fatal.
// Writes are atomic: a temporary file in the same folder, then rename(2).
// An entry is reused only while the master and every file its signature
// names still stat the same (size, mtime, ctime, device, inode, existence).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "quantem/catalog/acquisition.hpp"

namespace quantem::catalog {

inline constexpr std::uint32_t kCatalogCacheVersion = 2;

// The default cache file of `data_folder` (empty when neither
// $XDG_CACHE_HOME nor $HOME names a folder).
std::string default_catalog_cache_path(const std::string& data_folder);

// A cache file larger than this is neither read (it is ignored, and
// replaced after the build) nor written: reading it whole would cost its size
// in memory before any check.
constexpr std::uint64_t kMaxCatalogCacheBytes = 256ull << 20;

struct CatalogCacheContents {
  std::map<std::string, Acquisition> entries;  // by master path
  std::string problem;                         // why the file was ignored; empty when read or absent
};

// Reads the cache of `data_folder` from `path`. Never throws.
CatalogCacheContents read_catalog_cache(const std::string& path, const std::string& data_folder);

// Writes `acquisitions` as the cache of `data_folder` to `path` atomically,
// creating its folder (mode 0700) when missing. Throws quantem::Error (io).
void write_catalog_cache(const std::string& path, const std::string& data_folder,
                         const std::vector<const Acquisition*>& acquisitions);

// The bytes write_catalog_cache writes and read_catalog_cache reads (tests).
std::string encode_catalog_cache(const std::string& data_folder, const std::vector<const Acquisition*>& acquisitions);
// Throws quantem::Error (corrupt_data) naming what does not add up.
std::map<std::string, Acquisition> decode_catalog_cache(const std::string& bytes, const std::string& data_folder);

// True when every file of the signature still stats as recorded.
bool signature_unchanged(const SourceSignature& signature);

}  // namespace quantem::catalog
