#include "quantem/protocol/wire_image.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "quantem/core/error.hpp"
#include "quantem/protocol/npy.hpp"

namespace quantem::protocol {

const char* const kCountOverflowMessage =
    "Exact detector counts exceed uint32 display capacity. Use a smaller scan bin or detector aperture.";

namespace {

void append_u32_le(std::string& out, std::uint32_t value) {
  const char bytes[4] = {static_cast<char>(value & 0xFF), static_cast<char>((value >> 8) & 0xFF),
                         static_cast<char>((value >> 16) & 0xFF), static_cast<char>((value >> 24) & 0xFF)};
  out.append(bytes, 4);
}

}  // namespace

WireImage encode_wire_image(const products::Image& image, PayloadFormat format) {
  const std::uint64_t count = image.height * image.width;
  WireImage wire;
  wire.width = image.width;
  wire.height = image.height;
  wire.value_divisor = std::max<std::uint64_t>(1, image.value_divisor);

  std::string data;
  data.reserve(count * 4);
  if (image.is_float) {
    if (image.values.size() != count) throw internal_error("Remote compute produced an image whose size does not match its shape.");
    wire.dtype = "<f4";
    for (float value : image.values) {
      std::uint32_t bits = 0;
      static_assert(sizeof(bits) == sizeof(value), "float32 expected");
      std::memcpy(&bits, &value, sizeof(bits));
      append_u32_le(data, bits);
    }
  } else {
    if (image.counts.size() != count) throw internal_error("Remote compute produced an image whose size does not match its shape.");
    wire.dtype = "<u4";
    for (std::uint64_t value : image.counts) {
      if (value > std::numeric_limits<std::uint32_t>::max()) throw conflict(kCountOverflowMessage);
      append_u32_le(data, static_cast<std::uint32_t>(value));
    }
  }

  if (format == PayloadFormat::npy) {
    wire.content_type = "application/x-npy";
    wire.body = encode_npy(wire.dtype, 4, {image.height, image.width}, data);
  } else {
    wire.content_type = "application/octet-stream";
    wire.body = std::move(data);
  }
  return wire;
}

}  // namespace quantem::protocol
