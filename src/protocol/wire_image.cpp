#include "quantem/protocol/wire_image.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr bool kLittleEndianHost = true;
#else
constexpr bool kLittleEndianHost = false;
#endif

#include "quantem/core/error.hpp"
#include "quantem/protocol/npy.hpp"

namespace quantem::protocol {

const char* const kCountOverflowMessage =
    "Exact detector counts exceed uint32 display capacity. Use a smaller scan bin or detector aperture.";

namespace {

// Little-endian u32 at `out` (memcpy on little-endian hosts, which the
// compiler turns into plain stores).
inline void store_u32_le(char* out, std::uint32_t value) {
  if constexpr (kLittleEndianHost) {
    std::memcpy(out, &value, 4);
  } else {
    out[0] = static_cast<char>(value & 0xFF);
    out[1] = static_cast<char>((value >> 8) & 0xFF);
    out[2] = static_cast<char>((value >> 16) & 0xFF);
    out[3] = static_cast<char>((value >> 24) & 0xFF);
  }
}

}  // namespace

WireImage encode_wire_image(const products::Image& image, PayloadFormat format) {
  return encode_wire_image(image, format, std::string());
}

WireImage encode_wire_image(const products::Image& image, PayloadFormat format, std::string into) {
  const std::uint64_t count = image.height * image.width;
  WireImage wire;
  wire.width = image.width;
  wire.height = image.height;
  wire.value_divisor = std::max<std::uint64_t>(1, image.value_divisor);

  // Checks first (nothing is written for an image that cannot be sent).
  const char* const size_mismatch = "Remote compute produced an image whose size does not match its shape.";
  if (image.is_float) {
    if (image.values.size() != count) throw internal_error(size_mismatch);
    wire.dtype = "<f4";
  } else if (!image.narrow_counts.empty()) {
    if (image.narrow_counts.size() != count) throw internal_error(size_mismatch);
    wire.dtype = "<u4";
  } else {
    if (image.counts.size() != count) throw internal_error(size_mismatch);
    wire.dtype = "<u4";
    const std::uint64_t* const in = image.counts.data();
    std::uint64_t high_bits = 0;  // any bit above the 32nd of any count
    for (std::uint64_t i = 0; i < count; ++i) high_bits |= in[i] >> 32;
    if (high_bits != 0) throw conflict(kCountOverflowMessage);
  }

  // The body in one buffer of the final size (`into`'s own when it is large
  // enough): the .npy header, then the values. Values already in the wire's
  // layout (floats and narrowed counts on a little-endian host) are copied
  // once, the rest written by plain loops over raw pointers (nothing aliases
  // the output).
  std::string& body = wire.body;
  body = std::move(into);
  body.clear();
  std::string header;
  if (format == PayloadFormat::npy) {
    wire.content_type = "application/x-npy";
    header = npy_header(wire.dtype, {image.height, image.width});
  } else {
    wire.content_type = "application/octet-stream";
  }
  body.reserve(header.size() + count * 4);
  body.append(header);
  const std::size_t offset = body.size();
  static_assert(sizeof(std::uint32_t) == sizeof(float), "float32 expected");
  if (image.is_float) {
    if constexpr (kLittleEndianHost) {
      body.append(reinterpret_cast<const char*>(image.values.data()), count * 4);
    } else {
      body.resize(offset + count * 4);
      char* const out = body.data() + offset;
      for (std::uint64_t i = 0; i < count; ++i) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, &image.values[i], sizeof(bits));
        store_u32_le(out + 4 * i, bits);
      }
    }
  } else if (!image.narrow_counts.empty()) {
    if constexpr (kLittleEndianHost) {
      body.append(reinterpret_cast<const char*>(image.narrow_counts.data()), count * 4);
    } else {
      body.resize(offset + count * 4);
      char* const out = body.data() + offset;
      for (std::uint64_t i = 0; i < count; ++i) store_u32_le(out + 4 * i, image.narrow_counts[i]);
    }
  } else {
    body.resize(offset + count * 4);
    const std::uint64_t* const in = image.counts.data();
    char* const out = body.data() + offset;
    for (std::uint64_t i = 0; i < count; ++i) store_u32_le(out + 4 * i, static_cast<std::uint32_t>(in[i]));
  }
  return wire;
}

std::optional<WireImageInPlace> wire_image_in_place(products::Image& image, PayloadFormat format) {
  if (!kLittleEndianHost || format != PayloadFormat::raw) return std::nullopt;
  const std::uint64_t count = image.height * image.width;
  const bool floats = image.is_float;
  if (!floats && image.narrow_counts.empty()) return std::nullopt;
  const std::size_t held = floats ? image.values.size() : image.narrow_counts.size();
  if (held != count) throw internal_error("Remote compute produced an image whose size does not match its shape.");
  WireImageInPlace out;
  out.wire.width = image.width;
  out.wire.height = image.height;
  out.wire.value_divisor = std::max<std::uint64_t>(1, image.value_divisor);
  out.wire.dtype = floats ? "<f4" : "<u4";
  out.wire.content_type = "application/octet-stream";
  out.body = floats ? SharedBytes::of(std::move(image.values)) : SharedBytes::of(std::move(image.narrow_counts));
  return out;
}

std::size_t wire_body_bytes(const products::Image& image, PayloadFormat format) {
  const std::size_t values = static_cast<std::size_t>(image.height * image.width) * 4;
  if (format == PayloadFormat::raw) return values;
  return npy_header(image.is_float ? "<f4" : "<u4", {image.height, image.width}).size() + values;
}

}  // namespace quantem::protocol
