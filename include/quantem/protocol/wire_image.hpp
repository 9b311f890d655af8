#pragma once
// The binary image payload of the array routes (docs/protocol.md#array-responses):
// a raw row-major little-endian body (`<u4` for exact counts, `<f4` for the
// CoM family), or the same values as a NumPy .npy.
#include <cstdint>
#include <optional>
#include <string>

#include "quantem/products/products.hpp"
#include "quantem/protocol/shared_bytes.hpp"

namespace quantem::protocol {

enum class PayloadFormat { raw, npy };

// The reference's exact 409 text for an integer result above 2^32 - 1.
extern const char* const kCountOverflowMessage;

struct WireImage {
  std::uint64_t width = 0;   // x-width (columns)
  std::uint64_t height = 0;  // x-height (rows)
  std::string dtype;         // x-dtype: "<u4" or "<f4"
  std::uint64_t value_divisor = 1;
  std::string content_type;  // application/octet-stream or application/x-npy
  std::string body;
};

// Encodes an image. Throws quantem::Error(conflict, kCountOverflowMessage)
// when an integer value exceeds 2^32 - 1 (never wraps), and
// Error(internal) when the image's value count does not match its shape.
WireImage encode_wire_image(const products::Image& image, PayloadFormat format);

// The same, with the body written into `into` (its contents are discarded):
// a recycled string (BodyPool::acquire) whose capacity is at least
// wire_body_bytes() is written in place, without a new allocation. On a
// throw, `into` is freed.
WireImage encode_wire_image(const products::Image& image, PayloadFormat format, std::string into);

// An image whose values already are the raw format's bytes (narrowed uint32
// counts or float32 values, on a little-endian host) sent without a copy: the
// image's value vector moves into `body` and the returned WireImage carries
// the headers (its own body stays empty). nullopt, with the image untouched,
// for the .npy format or counts that still need narrowing; the checks of
// encode_wire_image apply either way.
struct WireImageInPlace {
  WireImage wire;
  SharedBytes body;
};
std::optional<WireImageInPlace> wire_image_in_place(products::Image& image, PayloadFormat format);

// The size of encode_wire_image's body for this image and format (the .npy
// header included), from the shape alone.
std::size_t wire_body_bytes(const products::Image& image, PayloadFormat format);

}  // namespace quantem::protocol
