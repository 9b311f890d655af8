#include "quantem/protocol/bundle.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include "quantem/core/error.hpp"
#include "quantem/protocol/npy.hpp"

namespace quantem::protocol {

namespace {

void put16(std::string& out, std::uint32_t value) {
  out.push_back(static_cast<char>(value & 0xFF));
  out.push_back(static_cast<char>((value >> 8) & 0xFF));
}

void put32(std::string& out, std::uint32_t value) {
  put16(out, value & 0xFFFF);
  put16(out, value >> 16);
}

// zlib's crc32 takes at most 4 GiB - 1 bytes a call: feed it in slices.
std::uint32_t crc32_of(std::uint32_t crc, std::string_view bytes) {
  constexpr std::size_t kSlice = 1u << 30;
  for (std::size_t offset = 0; offset < bytes.size(); offset += kSlice) {
    const std::size_t length = std::min(kSlice, bytes.size() - offset);
    crc = static_cast<std::uint32_t>(
        ::crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + offset), static_cast<uInt>(length)));
  }
  return crc;
}

constexpr std::uint32_t kZipLimit = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint32_t kVersion = 20;   // 2.0: the version numpy's zipfile writes
constexpr std::uint32_t kDosDate = (0u << 9) | (1u << 5) | 1u;  // 1980-01-01
constexpr std::uint32_t kDosTime = 0;

struct Member {
  std::string name;
  std::uint32_t crc = 0;
  std::uint32_t size = 0;
  std::uint32_t offset = 0;
};

void local_header(std::string& out, const Member& m) {
  put32(out, 0x04034b50);
  put16(out, kVersion);
  put16(out, 0);  // flags
  put16(out, 0);  // stored
  put16(out, kDosTime);
  put16(out, kDosDate);
  put32(out, m.crc);
  put32(out, m.size);  // compressed size
  put32(out, m.size);
  put16(out, static_cast<std::uint32_t>(m.name.size()));
  put16(out, 0);  // extra field length
  out += m.name;
}

void central_header(std::string& out, const Member& m) {
  put32(out, 0x02014b50);
  put16(out, kVersion);  // made by (MS-DOS attributes)
  put16(out, kVersion);  // needed
  put16(out, 0);
  put16(out, 0);
  put16(out, kDosTime);
  put16(out, kDosDate);
  put32(out, m.crc);
  put32(out, m.size);
  put32(out, m.size);
  put16(out, static_cast<std::uint32_t>(m.name.size()));
  put16(out, 0);  // extra
  put16(out, 0);  // comment
  put16(out, 0);  // disk number
  put16(out, 0);  // internal attributes
  put32(out, 0);  // external attributes
  put32(out, m.offset);
  out += m.name;
}

[[noreturn]] void too_large() {
  throw payload_too_large("the npz bundle would pass the 4 GiB a zip holds; ask for fewer modes or a binned plan");
}

}  // namespace

namespace {

constexpr char kBase64Alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// The two characters of every 12-bit value: 3 bytes become 2 lookups (the
// bundle's bodies are megabytes; one lookup per character is twice the work).
struct Base64Pairs {
  char pairs[4096][2];
  Base64Pairs() {
    for (unsigned v = 0; v < 4096; ++v) {
      pairs[v][0] = kBase64Alphabet[v >> 6];
      pairs[v][1] = kBase64Alphabet[v & 63];
    }
  }
};

}  // namespace

std::string base64_encode(std::string_view bytes) {
  static const Base64Pairs table;
  std::string out;
  out.resize((bytes.size() + 2) / 3 * 4);
  const auto* in = reinterpret_cast<const unsigned char*>(bytes.data());
  char* o = out.data();
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3, o += 4) {
    const std::uint32_t v = (std::uint32_t{in[i]} << 16) | (std::uint32_t{in[i + 1]} << 8) | in[i + 2];
    std::memcpy(o, table.pairs[v >> 12], 2);
    std::memcpy(o + 2, table.pairs[v & 4095], 2);
  }
  const std::size_t rest = bytes.size() - i;
  if (rest > 0) {
    const std::uint32_t v = (std::uint32_t{in[i]} << 16) | (rest == 2 ? std::uint32_t{in[i + 1]} << 8 : 0);
    o[0] = kBase64Alphabet[v >> 18];
    o[1] = kBase64Alphabet[(v >> 12) & 63];
    o[2] = rest == 2 ? kBase64Alphabet[(v >> 6) & 63] : '=';
    o[3] = '=';
  }
  return out;
}

std::string encode_bundle_json(const std::vector<BundleImage>& images, const std::string& provenance_json) {
  std::size_t size = provenance_json.size() + 64;
  for (const auto& image : images) size += (image.bytes.size() + 2) / 3 * 4 + 160 + image.mode.size();
  std::string out;
  out.reserve(size);
  out += "{\"images\":[";
  for (std::size_t i = 0; i < images.size(); ++i) {
    const BundleImage& image = images[i];
    nlohmann::ordered_json meta;
    meta["mode"] = image.mode;
    meta["shape"] = nlohmann::ordered_json::array({image.height, image.width});
    meta["dtype"] = image.dtype;
    meta["value_divisor"] = image.value_divisor;
    meta["encoding"] = "base64";
    std::string text = meta.dump();
    text.pop_back();  // the closing brace: "data" follows
    if (i > 0) out += ',';
    out += text;
    out += ",\"data\":\"";
    out += base64_encode(image.bytes);
    out += "\"}";
  }
  out += "],\"provenance\":";
  out += provenance_json;
  out += '}';
  return out;
}

std::size_t bundle_raw_bytes(const std::vector<BundleImage>& images) {
  std::size_t size = 0;
  for (const auto& image : images) size += image.bytes.size();
  return size;
}

std::string encode_bundle_raw(const std::vector<BundleImage>& images, std::string into) {
  into.clear();
  into.reserve(bundle_raw_bytes(images));
  for (const auto& image : images) into.append(image.bytes.data(), image.bytes.size());
  return into;
}

std::string bundle_index_json(const std::vector<BundleImage>& images) {
  nlohmann::ordered_json index = nlohmann::ordered_json::array();
  std::uint64_t offset = 0;
  for (const auto& image : images) {
    nlohmann::ordered_json entry;
    entry["mode"] = image.mode;
    entry["shape"] = nlohmann::ordered_json::array({image.height, image.width});
    entry["dtype"] = image.dtype;
    entry["value_divisor"] = image.value_divisor;
    entry["offset"] = offset;
    entry["bytes"] = image.bytes.size();
    offset += image.bytes.size();
    index.push_back(std::move(entry));
  }
  return index.dump();
}

std::string stored_zip(const std::vector<ZipMember>& members) {
  std::uint64_t total = 22;
  for (const auto& member : members) {
    total += 30 + 46 + 2 * member.name.size() + member.head.size() + member.body.size();
  }
  if (total > kZipLimit || members.size() > 0xFFFF) too_large();
  std::string out;
  out.reserve(total);
  std::vector<Member> written;
  for (const auto& member : members) {
    Member m;
    m.name = member.name;
    m.crc = crc32_of(crc32_of(0, member.head), member.body);
    m.size = static_cast<std::uint32_t>(member.head.size() + member.body.size());
    m.offset = static_cast<std::uint32_t>(out.size());
    local_header(out, m);
    out.append(member.head.data(), member.head.size());
    out.append(member.body.data(), member.body.size());
    written.push_back(std::move(m));
  }
  const auto directory_offset = static_cast<std::uint32_t>(out.size());
  for (const Member& m : written) central_header(out, m);
  const auto directory_size = static_cast<std::uint32_t>(out.size() - directory_offset);
  put32(out, 0x06054b50);
  put16(out, 0);  // this disk
  put16(out, 0);  // the directory's disk
  put16(out, static_cast<std::uint32_t>(written.size()));
  put16(out, static_cast<std::uint32_t>(written.size()));
  put32(out, directory_size);
  put32(out, directory_offset);
  put16(out, 0);  // comment length
  return out;
}

std::string encode_bundle_npz(const std::vector<BundleImage>& images) {
  std::vector<std::string> headers;
  headers.reserve(images.size());
  for (const auto& image : images) headers.push_back(npy_header(image.dtype, {image.height, image.width}));
  std::vector<ZipMember> members;
  for (std::size_t i = 0; i < images.size(); ++i) {
    members.push_back({images[i].mode + ".npy", headers[i], images[i].bytes});
  }
  return stored_zip(members);
}

}  // namespace quantem::protocol
