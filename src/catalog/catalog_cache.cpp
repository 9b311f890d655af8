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

#include "quantem/catalog/acquisition_fields.hpp"
#include "quantem/catalog/catalog.hpp"
#include "quantem/core/error.hpp"
#include "quantem/core/io.hpp"

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
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

// Writes each field in the field table's order: numbers as they are, a flag as
// one byte 0/1, an optional as a flag and the value (0 when absent), a text as
// u32 length + bytes, a dtype or chunk filter as its u8 enumerator, the pixel
// mask as u64 run count + u64 runs (catalog::pixel_mask_runs), a list of
// records as u64 count + the records, a nested record's fields in place.
class FieldWriter {
 public:
  explicit FieldWriter(Writer& out) : out_(out) {}

  template <typename T>
  void operator()(const char*, const T& value) {
    if constexpr (has_fields_v<T>) {
      for_each_field(*this, value);
    } else if constexpr (is_record_list_v<T>) {
      out_.number<std::uint64_t>(value.size());
      for (const auto& record : value) for_each_field(*this, record);
    } else {
      write(value);
    }
  }

 private:
  void write(const std::string& value) { out_.text(value); }
  void write(bool value) { out_.number<std::uint8_t>(value ? 1 : 0); }
  void write(DType value) { out_.number<std::uint8_t>(static_cast<std::uint8_t>(value)); }
  void write(codec::ChunkFilter value) { out_.number<std::uint8_t>(static_cast<std::uint8_t>(value)); }
  void write(const std::vector<std::uint8_t>& pixel_mask) {
    const std::vector<std::uint64_t> runs = pixel_mask_runs(pixel_mask);
    out_.number<std::uint64_t>(runs.size());
    for (const std::uint64_t run : runs) out_.number(run);
  }
  template <typename T>
  void write(const std::optional<T>& value) {
    write(value.has_value());
    write(value.value_or(T{}));
  }
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  void write(T value) {
    out_.number(value);
  }

  Writer& out_;
};

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

// Reads what FieldWriter writes. The pixel mask's runs are kept aside, to be
// checked against the detector shape once it is read (read_acquisition).
class FieldReader {
 public:
  FieldReader(Reader& in, std::vector<std::uint64_t>& mask_runs) : in_(in), mask_runs_(mask_runs) {}

  template <typename T>
  void operator()(const char*, T& value) {
    if constexpr (has_fields_v<T>) {
      for_each_field(*this, value);
    } else if constexpr (is_record_list_v<T>) {
      value.resize(in_.count(min_record_bytes(value)));
      for (auto& record : value) for_each_field(*this, record);
    } else {
      read(value);
    }
  }

 private:
  // The fewest bytes a record takes (texts empty): bounds a count by the file's size.
  static std::size_t min_record_bytes(const std::vector<Shard>&) { return 3 * 4 + 2 + 8; }
  static std::size_t min_record_bytes(const std::vector<SignatureEntry>&) { return 4 + 1 + 5 * 8; }

  void read(std::string& value) { value = in_.text(); }
  void read(bool& value) { value = in_.flag(); }
  void read(DType& value) {
    const auto code = in_.number<std::uint8_t>();
    if (code > static_cast<std::uint8_t>(DType::uint32)) in_.fail("an unknown dtype");
    value = static_cast<DType>(code);
  }
  void read(codec::ChunkFilter& value) {
    const auto code = in_.number<std::uint8_t>();
    if (code > static_cast<std::uint8_t>(codec::ChunkFilter::lz4)) in_.fail("an unknown chunk filter");
    value = static_cast<codec::ChunkFilter>(code);
  }
  void read(std::vector<std::uint8_t>&) {
    mask_runs_.resize(in_.count(8));
    for (auto& run : mask_runs_) run = in_.number<std::uint64_t>();
  }
  template <typename T>
  void read(std::optional<T>& value) {
    const bool present = in_.flag();
    T stored{};
    read(stored);
    value = present ? std::optional<T>(stored) : std::nullopt;
  }
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  void read(T& value) {
    value = in_.number<T>();
  }

  Reader& in_;
  std::vector<std::uint64_t>& mask_runs_;
};

Acquisition read_acquisition(Reader& r) {
  Acquisition a;
  std::vector<std::uint64_t> mask_runs;
  FieldReader fields(r, mask_runs);
  for_each_field(fields, a);
  if (a.chunk_format.element_size == 0 || a.chunk_format.element_size > 8) r.fail("an element size out of range");
  std::uint64_t pixels = 0, masked = 0;
  if (__builtin_mul_overflow(a.detector_rows, a.detector_cols, &pixels)) r.fail("a detector shape that overflows");
  if (const char* problem = pixel_mask_from_runs(mask_runs, pixels, a.pixel_mask, masked)) r.fail(problem);
  if (a.masked_pixel_count != masked) r.fail("a masked pixel count that differs from the mask");
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
  if (!quantem::write_all(fd, bytes)) throw Error(ErrorKind::io, "cannot write " + path + ": " + std::strerror(errno));
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
  FieldWriter fields(payload);
  for (const Acquisition* acquisition : acquisitions) for_each_field(fields, *acquisition);
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
