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
  const std::uint64_t count = image.height * image.width;
  WireImage wire;
  wire.width = image.width;
  wire.height = image.height;
  wire.value_divisor = std::max<std::uint64_t>(1, image.value_divisor);

  // One allocation of the final size: values already in the wire's layout
  // (floats and narrowed counts on a little-endian host) are copied once, the
  // rest written by plain loops over raw pointers (nothing aliases the output).
  const char* const size_mismatch = "Remote compute produced an image whose size does not match its shape.";
  std::string data;
  if (image.is_float) {
    if (image.values.size() != count) throw internal_error(size_mismatch);
    wire.dtype = "<f4";
    static_assert(sizeof(std::uint32_t) == sizeof(float), "float32 expected");
    if constexpr (kLittleEndianHost) {
      data.assign(reinterpret_cast<const char*>(image.values.data()), count * 4);
    } else {
      data.assign(count * 4, '\0');
      for (std::uint64_t i = 0; i < count; ++i) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, &image.values[i], sizeof(bits));
        store_u32_le(data.data() + 4 * i, bits);
      }
    }
  } else if (!image.narrow_counts.empty()) {
    if (image.narrow_counts.size() != count) throw internal_error(size_mismatch);
    wire.dtype = "<u4";
    if constexpr (kLittleEndianHost) {
      data.assign(reinterpret_cast<const char*>(image.narrow_counts.data()), count * 4);
    } else {
      data.assign(count * 4, '\0');
      for (std::uint64_t i = 0; i < count; ++i) store_u32_le(data.data() + 4 * i, image.narrow_counts[i]);
    }
  } else {
    if (image.counts.size() != count) throw internal_error(size_mismatch);
    wire.dtype = "<u4";
    const std::uint64_t* const in = image.counts.data();
    std::uint64_t high_bits = 0;  // any bit above the 32nd of any count
    for (std::uint64_t i = 0; i < count; ++i) high_bits |= in[i] >> 32;
    if (high_bits != 0) throw conflict(kCountOverflowMessage);
    data.assign(count * 4, '\0');
    char* const out = data.data();
    for (std::uint64_t i = 0; i < count; ++i) store_u32_le(out + 4 * i, static_cast<std::uint32_t>(in[i]));
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
