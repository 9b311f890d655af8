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

  // Staged through a small stack buffer: one allocation of the final size,
  // no zero-fill of the body and no per-value appends.
  std::string data;
  data.reserve(count * 4);
  char staging[16384];
  constexpr std::uint64_t kPerStage = sizeof staging / 4;
  auto encode = [&](auto&& bits_of) {
    for (std::uint64_t first = 0; first < count; first += kPerStage) {
      const std::uint64_t n = std::min(kPerStage, count - first);
      for (std::uint64_t i = 0; i < n; ++i) store_u32_le(staging + 4 * i, bits_of(first + i));
      data.append(staging, n * 4);
    }
  };
  if (image.is_float) {
    if (image.values.size() != count) throw internal_error("Remote compute produced an image whose size does not match its shape.");
    wire.dtype = "<f4";
    static_assert(sizeof(std::uint32_t) == sizeof(float), "float32 expected");
    encode([&](std::uint64_t i) {
      std::uint32_t bits = 0;
      std::memcpy(&bits, &image.values[i], sizeof(bits));
      return bits;
    });
  } else {
    if (image.counts.size() != count) throw internal_error("Remote compute produced an image whose size does not match its shape.");
    wire.dtype = "<u4";
    const std::uint64_t largest = count == 0 ? 0 : *std::max_element(image.counts.begin(), image.counts.end());
    if (largest > std::numeric_limits<std::uint32_t>::max()) throw conflict(kCountOverflowMessage);
    encode([&](std::uint64_t i) { return static_cast<std::uint32_t>(image.counts[i]); });
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
