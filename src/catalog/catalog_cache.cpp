// The catalog cache file: catalog_cache.hpp describes its place and format.
#include "quantem/catalog/catalog_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include <spdlog/spdlog.h>
#include <zlib.h>

#include "quantem/catalog/catalog.hpp"
#include "quantem/core/error.hpp"

namespace quantem::catalog {

namespace {

constexpr char kMagic[8] = {'Q', 'G', 'C', 'A', 'T', 'A', 'L', 'G'};
constexpr std::size_t kHeaderBytes = sizeof kMagic + 4 + 8 + 4;
constexpr std::uint64_t kMaxStringBytes = 1u << 20;

static_assert(sizeof(double) == 8 && std::numeric_limits<double>::is_iec559, "doubles are stored as IEEE 754 binary64");

std::uint64_t fnv1a64(const std::string& text) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::uint32_t crc32_of(const char* data, std::size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {
    const uInt piece = static_cast<uInt>(std::min<std::size_t>(size, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), piece);
    data += piece;
    size -= piece;
  }
  return static_cast<std::uint32_t>(crc);
}

// ---- writing ------------------------------------------------------------------

class Writer {
 public:
  template <typename T>
  void number(T value) {
    static_assert(std::is_arithmetic_v<T>);
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));  // the daemon's hosts are little-endian
    out_.append(bytes, sizeof(T));
  }
  void text(const std::string& value) {
    number<std::uint32_t>(static_cast<std::uint32_t>(value.size()));
    out_ += value;
  }
  void optional_unsigned(const std::optional<std::uint64_t>& value) {
    number<std::uint8_t>(value ? 1 : 0);
    number<std::uint64_t>(value.value_or(0));
  }
  void optional_double(const std::optional<double>& value) {
    number<std::uint8_t>(value ? 1 : 0);
    number<double>(value.value_or(0.0));
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

void write_acquisition(Writer& w, const Acquisition& a) {
  w.text(a.master_path);
  w.text(a.name);
  w.text(a.stem);
  for (const std::uint64_t value : {a.scan_rows, a.scan_cols, a.detector_rows, a.detector_cols}) w.number(value);
  w.text(a.scan_shape_basis);
  w.number<std::uint8_t>(a.dtype ? static_cast<std::uint8_t>(1 + static_cast<unsigned>(*a.dtype)) : 0);
  w.number<std::uint8_t>(static_cast<std::uint8_t>(a.chunk_format.filter));
  w.number<std::uint64_t>(a.chunk_format.element_size);
  w.number<std::uint64_t>(a.shards.size());
  for (const auto& shard : a.shards) {
    w.text(shard.link_name);
    w.text(shard.file_path);
    w.text(shard.dataset_path);
    w.number<std::uint8_t>((shard.external ? 1 : 0) | (shard.exists ? 2 : 0));
    w.number(shard.frame_count);
  }
  w.number(a.stored_frames);
  w.optional_unsigned(a.expected_frames);
  w.optional_unsigned(a.ntrigger);
  w.optional_unsigned(a.nimages);
  // The mask as alternating runs of unmasked and masked pixels.
  std::vector<std::uint64_t> runs;
  std::uint8_t current = 0;
  std::uint64_t length = 0;
  for (const std::uint8_t pixel : a.pixel_mask) {
    const std::uint8_t masked = pixel ? 1 : 0;
    if (masked != current) {
      runs.push_back(length);
      current = masked;
      length = 0;
    }
    ++length;
  }
  if (!a.pixel_mask.empty()) runs.push_back(length);
  w.number<std::uint64_t>(a.pixel_mask.size());
  w.number<std::uint64_t>(runs.size());
  for (const std::uint64_t run : runs) w.number(run);
  w.number(a.masked_pixel_count);
  w.number(a.size_bytes);
  w.number<std::uint8_t>(a.status.loadable ? 1 : 0);
  w.text(a.status.reason);
  w.text(a.status.action);
  w.optional_double(a.scan_sampling_A);
  w.optional_double(a.k_pixel_size_mrad);
  w.number<std::uint64_t>(a.signature.size());
  for (const auto& entry : a.signature) {
    w.text(entry.path);
    w.number<std::uint8_t>(entry.exists ? 1 : 0);
    w.number(entry.size_bytes);
    w.number(entry.mtime_ns);
    w.number(entry.ctime_ns);
    w.number(entry.device);
    w.number(entry.inode);
  }
}

// ---- reading ------------------------------------------------------------------

class Reader {
 public:
  explicit Reader(const std::string& bytes, std::size_t position) : bytes_(bytes), position_(position) {}

  template <typename T>
  T number() {
    static_assert(std::is_arithmetic_v<T>);
    need(sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + position_, sizeof(T));
    position_ += sizeof(T);
    return value;
  }
  std::string text() {
    const std::uint32_t size = number<std::uint32_t>();
    if (size > kMaxStringBytes) fail("a text longer than allowed");
    need(size);
    std::string value = bytes_.substr(position_, size);
    position_ += size;
    return value;
  }
  bool flag() {
    const auto value = number<std::uint8_t>();
    if (value > 1) fail("a flag that is neither 0 nor 1");
    return value == 1;
  }
  std::optional<std::uint64_t> optional_unsigned() {
    const bool present = flag();
    const auto value = number<std::uint64_t>();
    return present ? std::optional<std::uint64_t>(value) : std::nullopt;
  }
  std::optional<double> optional_double() {
    const bool present = flag();
    const auto value = number<double>();
    return present ? std::optional<double>(value) : std::nullopt;
  }
  // A count of items of at least `item_bytes` each that the rest of the file can hold.
  std::uint64_t count(std::size_t item_bytes) {
    const auto value = number<std::uint64_t>();
    if (value > (bytes_.size() - position_) / std::max<std::size_t>(item_bytes, 1)) fail("a count beyond the file");
    return value;
  }
  bool at_end() const { return position_ == bytes_.size(); }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorKind::corrupt_data, "catalog cache: " + what + " at byte " + std::to_string(position_));
  }

 private:
  void need(std::size_t size) const {
    if (bytes_.size() - position_ < size) fail("it ends early");
  }
  const std::string& bytes_;
  std::size_t position_;
};

Acquisition read_acquisition(Reader& r) {
  Acquisition a;
  a.master_path = r.text();
  a.name = r.text();
  a.stem = r.text();
  a.scan_rows = r.number<std::uint64_t>();
  a.scan_cols = r.number<std::uint64_t>();
  a.detector_rows = r.number<std::uint64_t>();
  a.detector_cols = r.number<std::uint64_t>();
  a.scan_shape_basis = r.text();
  const auto dtype = r.number<std::uint8_t>();
  if (dtype > 3) r.fail("an unknown dtype");
  if (dtype != 0) a.dtype = static_cast<DType>(dtype - 1);
  const auto filter = r.number<std::uint8_t>();
  if (filter > static_cast<std::uint8_t>(codec::ChunkFilter::lz4)) r.fail("an unknown chunk filter");
  a.chunk_format.filter = static_cast<codec::ChunkFilter>(filter);
  a.chunk_format.element_size = r.number<std::uint64_t>();
  if (a.chunk_format.element_size == 0 || a.chunk_format.element_size > 8) r.fail("an element size out of range");
  const std::uint64_t shards = r.count(4 * 3 + 1 + 8);
  a.shards.resize(shards);
  for (auto& shard : a.shards) {
    shard.link_name = r.text();
    shard.file_path = r.text();
    shard.dataset_path = r.text();
    const auto flags = r.number<std::uint8_t>();
    if (flags > 3) r.fail("unknown shard flags");
    shard.external = (flags & 1) != 0;
    shard.exists = (flags & 2) != 0;
    shard.frame_count = r.number<std::uint64_t>();
  }
  a.stored_frames = r.number<std::uint64_t>();
  a.expected_frames = r.optional_unsigned();
  a.ntrigger = r.optional_unsigned();
  a.nimages = r.optional_unsigned();
  const auto mask_pixels = r.number<std::uint64_t>();
  if (mask_pixels != 0 && mask_pixels != a.detector_rows * a.detector_cols) r.fail("a mask that is not the detector's size");
  const std::uint64_t runs = r.count(8);
  std::uint64_t covered = 0, masked = 0;
  a.pixel_mask.reserve(mask_pixels);
  for (std::uint64_t i = 0; i < runs; ++i) {
    const auto run = r.number<std::uint64_t>();
    if (run > mask_pixels - covered) r.fail("mask runs beyond the mask");
    a.pixel_mask.insert(a.pixel_mask.end(), run, static_cast<std::uint8_t>(i % 2));
    covered += run;
    if (i % 2) masked += run;
  }
  if (covered != mask_pixels) r.fail("mask runs that do not cover the mask");
  a.masked_pixel_count = r.number<std::uint64_t>();
  if (a.masked_pixel_count != masked) r.fail("a masked pixel count that differs from the mask");
  a.size_bytes = r.number<std::uint64_t>();
  a.status.loadable = r.flag();
  a.status.reason = r.text();
  a.status.action = r.text();
  a.scan_sampling_A = r.optional_double();
  a.k_pixel_size_mrad = r.optional_double();
  const std::uint64_t entries = r.count(4 + 1 + 5 * 8);
  a.signature.resize(entries);
  for (auto& entry : a.signature) {
    entry.path = r.text();
    entry.exists = r.flag();
    entry.size_bytes = r.number<std::int64_t>();
    entry.mtime_ns = r.number<std::int64_t>();
    entry.ctime_ns = r.number<std::int64_t>();
    entry.device = r.number<std::uint64_t>();
    entry.inode = r.number<std::uint64_t>();
  }
  if (a.signature.empty() || a.signature.front().path != a.master_path) r.fail("a signature that does not start with its master");
  return a;
}

bool read_whole_file(const std::string& path, std::string& bytes, std::string& problem) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno != ENOENT) problem = std::string("cannot open it: ") + std::strerror(errno);
    return false;
  }
  struct stat status {};
  if (::fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    problem = "it is not a regular file";
    ::close(fd);
    return false;
  }
  if (static_cast<std::uint64_t>(status.st_size) > kMaxCatalogCacheBytes) {
    problem = "it holds " + std::to_string(status.st_size) + " bytes, more than the cap of " +
              std::to_string(kMaxCatalogCacheBytes);
    ::close(fd);
    return false;
  }
  try {
    bytes.resize(static_cast<std::size_t>(status.st_size));
  } catch (const std::bad_alloc&) {
    problem = "no memory for its " + std::to_string(status.st_size) + " bytes";
    ::close(fd);
    return false;
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (done != bytes.size()) {
    problem = "it could not be read whole";
    return false;
  }
  return true;
}

void write_all(int fd, const std::string& bytes, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(ErrorKind::io, "cannot write " + path + ": " + std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

std::string default_catalog_cache_path(const std::string& data_folder) {
  std::string base;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && xdg[0] == '/') {
    base = xdg;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    base = std::string(home) + "/.cache";
  } else {
    return {};
  }
  char name[32];
  std::snprintf(name, sizeof name, "catalog-%016llx.bin",
                static_cast<unsigned long long>(fnv1a64(absolute_folder(data_folder))));
  return base + "/quantem-gpu/" + name;
}

bool signature_unchanged(const SourceSignature& signature) { return restat_signature(signature) == signature; }

std::string encode_catalog_cache(const std::string& data_folder, const std::vector<const Acquisition*>& acquisitions) {
  Writer payload;
  payload.text(data_folder);
  payload.number<std::uint64_t>(acquisitions.size());
  for (const Acquisition* acquisition : acquisitions) write_acquisition(payload, *acquisition);
  Writer file;
  file.bytes().append(kMagic, sizeof kMagic);
  file.number<std::uint32_t>(kCatalogCacheVersion);
  file.number<std::uint64_t>(payload.bytes().size());
  file.number<std::uint32_t>(crc32_of(payload.bytes().data(), payload.bytes().size()));
  file.bytes() += payload.bytes();
  return std::move(file.bytes());
}

std::map<std::string, Acquisition> decode_catalog_cache(const std::string& bytes, const std::string& data_folder) {
  Reader header(bytes, 0);
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    header.fail("not a catalog cache file");
  }
  Reader fields(bytes, sizeof kMagic);
  const auto version = fields.number<std::uint32_t>();
  if (version != kCatalogCacheVersion) {
    fields.fail("format version " + std::to_string(version) + ", not " + std::to_string(kCatalogCacheVersion));
  }
  const auto payload_bytes = fields.number<std::uint64_t>();
  const auto crc = fields.number<std::uint32_t>();
  if (payload_bytes != bytes.size() - kHeaderBytes) fields.fail("a payload size that differs from the file's");
  if (crc32_of(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes) != crc) fields.fail("a checksum mismatch");
  Reader r(bytes, kHeaderBytes);
  if (r.text() != data_folder) r.fail("the cache of another data folder");
  const std::uint64_t count = r.count(4 * 3);
  std::map<std::string, Acquisition> entries;
  for (std::uint64_t i = 0; i < count; ++i) {
    Acquisition acquisition = read_acquisition(r);
    std::string key = acquisition.master_path;
    entries.insert_or_assign(std::move(key), std::move(acquisition));
  }
  if (!r.at_end()) r.fail("bytes after the last entry");
  return entries;
}

CatalogCacheContents read_catalog_cache(const std::string& path, const std::string& data_folder) {
  CatalogCacheContents contents;
  try {
    std::string bytes;
    if (!read_whole_file(path, bytes, contents.problem)) return contents;
    contents.entries = decode_catalog_cache(bytes, data_folder);
  } catch (const std::exception& e) {
    contents.problem = e.what();
  } catch (...) {
    contents.problem = "catalog cache: unreadable";
  }
  if (!contents.problem.empty()) contents.entries.clear();
  return contents;
}

void write_catalog_cache(const std::string& path, const std::string& data_folder,
                         const std::vector<const Acquisition*>& acquisitions) {
  const auto slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? std::string(".") : path.substr(0, std::max<std::size_t>(slash, 1));
  // Only the folders this creates get mode 0700; an existing one is left as it is.
  std::string partial;
  for (std::size_t at = 1; at <= folder.size(); ++at) {
    if (at != folder.size() && folder[at] != '/') continue;
    partial = folder.substr(0, at);
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      throw Error(ErrorKind::io, "cannot create " + partial + ": " + std::strerror(errno));
    }
  }
  const std::string bytes = encode_catalog_cache(data_folder, acquisitions);
  if (bytes.size() > kMaxCatalogCacheBytes) {
    throw Error(ErrorKind::io, "the catalog cache would hold " + std::to_string(bytes.size()) +
                                   " bytes, more than the cap of " + std::to_string(kMaxCatalogCacheBytes));
  }
  const std::string temporary = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw Error(ErrorKind::io, "cannot create " + temporary + ": " + std::strerror(errno));
  try {
    write_all(fd, bytes, temporary);
    if (::fdatasync(fd) != 0) throw Error(ErrorKind::io, "cannot flush " + temporary + ": " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string error = std::strerror(errno);
    ::unlink(temporary.c_str());
    throw Error(ErrorKind::io, "cannot rename " + temporary + " to " + path + ": " + error);
  }
}

}  // namespace quantem::catalog
