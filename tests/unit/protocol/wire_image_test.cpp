#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "quantem/core/error.hpp"
#include "quantem/protocol/npy.hpp"
#include "quantem/protocol/wire_image.hpp"

using namespace quantem::protocol;
using quantem::products::Image;

TEST(WireImage, CountsAreLittleEndianUint32WithoutFloatRounding) {
  Image image;
  image.height = 1;
  image.width = 3;
  image.counts = {16777217, 40000001, 4294967295ULL};
  const auto wire = encode_wire_image(image, PayloadFormat::raw);
  EXPECT_EQ(wire.dtype, "<u4");
  EXPECT_EQ(wire.width, 3u);
  EXPECT_EQ(wire.height, 1u);
  EXPECT_EQ(wire.value_divisor, 1u);
  EXPECT_EQ(wire.content_type, "application/octet-stream");
  ASSERT_EQ(wire.body.size(), 12u);
  EXPECT_EQ(wire.body.substr(0, 4), std::string("\x01\x00\x00\x01", 4));
  EXPECT_EQ(wire.body.substr(4, 4), std::string("\x01\x5a\x62\x02", 4));
  EXPECT_EQ(wire.body.substr(8, 4), std::string("\xff\xff\xff\xff", 4));
}

TEST(WireImage, CountAboveUint32IsTheReferenceConflict) {
  Image image;
  image.height = 1;
  image.width = 2;
  image.counts = {1, 4294967296ULL};
  try {
    encode_wire_image(image, PayloadFormat::raw);
    FAIL() << "expected a conflict";
  } catch (const quantem::Error& error) {
    EXPECT_EQ(error.kind(), quantem::ErrorKind::conflict);
    EXPECT_STREQ(error.what(),
                 "Exact detector counts exceed uint32 display capacity. Use a smaller scan bin or detector aperture.");
  }
}

TEST(WireImage, FloatsKeepTheirBitsIncludingNan) {
  Image image;
  image.height = 2;
  image.width = 1;
  image.is_float = true;
  image.values = {1.5f, std::numeric_limits<float>::quiet_NaN()};
  const auto wire = encode_wire_image(image, PayloadFormat::raw);
  EXPECT_EQ(wire.dtype, "<f4");
  ASSERT_EQ(wire.body.size(), 8u);
  float first = 0, second = 0;
  std::memcpy(&first, wire.body.data(), 4);
  std::memcpy(&second, wire.body.data() + 4, 4);
  EXPECT_EQ(first, 1.5f);
  EXPECT_TRUE(std::isnan(second));
}

TEST(WireImage, NarrowCountsEncodeAsTheirUint64Equivalents) {
  Image wide;
  wide.height = 2;
  wide.width = 3;
  wide.counts = {0, 1, 65536, 16777217, 4294967295ULL, 7};
  Image narrow = wide;
  narrow.counts.clear();
  narrow.narrow_counts = {0, 1, 65536, 16777217, 4294967295u, 7};
  for (const auto format : {PayloadFormat::raw, PayloadFormat::npy}) {
    const auto a = encode_wire_image(wide, format);
    const auto b = encode_wire_image(narrow, format);
    EXPECT_EQ(a.body, b.body);
    EXPECT_EQ(a.dtype, "<u4");
    EXPECT_EQ(b.dtype, "<u4");
  }
  narrow.narrow_counts.pop_back();
  EXPECT_THROW(encode_wire_image(narrow, PayloadFormat::raw), quantem::Error);  // size does not match the shape
}

TEST(WireImage, NpyCarriesTheSameValuesAfterANumpyHeader) {
  Image image;
  image.height = 2;
  image.width = 2;
  image.counts = {1, 2, 3, 4};
  image.value_divisor = 4;
  const auto raw = encode_wire_image(image, PayloadFormat::raw);
  const auto npy = encode_wire_image(image, PayloadFormat::npy);
  EXPECT_EQ(npy.content_type, "application/x-npy");
  EXPECT_EQ(npy.value_divisor, 4u);
  EXPECT_EQ(npy.body, npy_header("<u4", {2, 2}) + raw.body);
}

TEST(WireImage, DivisorIsAtLeastOne) {
  Image image;
  image.height = 1;
  image.width = 1;
  image.counts = {0};
  image.value_divisor = 0;
  EXPECT_EQ(encode_wire_image(image, PayloadFormat::raw).value_divisor, 1u);
}

TEST(WireImage, MismatchedShapeIsInternal) {
  Image image;
  image.height = 2;
  image.width = 2;
  image.counts = {1, 2, 3};
  EXPECT_THROW(encode_wire_image(image, PayloadFormat::raw), quantem::Error);
}

TEST(WireImage, ImagesLargerThanTheStagingBufferKeepEveryValueInOrder) {
  // 97 x 131 values: several staging blocks and a partial last one.
  Image counts;
  counts.height = 97;
  counts.width = 131;
  Image floats = counts;
  floats.is_float = true;
  for (std::uint64_t i = 0; i < counts.height * counts.width; ++i) {
    counts.counts.push_back(i * 2654435761ULL % 4294967296ULL);
    floats.values.push_back(static_cast<float>(i) * -0.37f);
  }
  const auto count_wire = encode_wire_image(counts, PayloadFormat::raw);
  const auto float_wire = encode_wire_image(floats, PayloadFormat::raw);
  ASSERT_EQ(count_wire.body.size(), counts.counts.size() * 4);
  ASSERT_EQ(float_wire.body.size(), floats.values.size() * 4);
  for (std::size_t i = 0; i < counts.counts.size(); ++i) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(count_wire.body.data() + 4 * i);
    const std::uint64_t value = bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (std::uint64_t(bytes[3]) << 24);
    ASSERT_EQ(value, counts.counts[i]) << i;
    float decoded = 0;
    std::uint32_t bits = 0;
    const auto* fbytes = reinterpret_cast<const unsigned char*>(float_wire.body.data() + 4 * i);
    bits = fbytes[0] | (fbytes[1] << 8) | (fbytes[2] << 16) | (std::uint32_t(fbytes[3]) << 24);
    std::memcpy(&decoded, &bits, 4);
    ASSERT_EQ(decoded, floats.values[i]) << i;
  }
  counts.counts.back() = 4294967296ULL;  // the last value, in the last partial block
  EXPECT_THROW(encode_wire_image(counts, PayloadFormat::raw), quantem::Error);
}

TEST(WireImage, WritesIntoAGivenBufferLargeEnoughWithoutReallocating) {
  Image counts;
  counts.height = 16;
  counts.width = 32;
  Image narrow = counts;
  Image floats = counts;
  floats.is_float = true;
  for (std::uint64_t i = 0; i < counts.height * counts.width; ++i) {
    counts.counts.push_back(i * 977);
    narrow.narrow_counts.push_back(static_cast<std::uint32_t>(i * 977));
    floats.values.push_back(static_cast<float>(i) * 0.25f);
  }
  for (const Image* image : {&counts, &narrow, &floats}) {
    for (const auto format : {PayloadFormat::raw, PayloadFormat::npy}) {
      const std::size_t bytes = wire_body_bytes(*image, format);
      std::string buffer = "stale contents of an earlier body";
      buffer.reserve(bytes + 100);
      const char* const memory = buffer.data();
      const auto into = encode_wire_image(*image, format, std::move(buffer));
      const auto fresh = encode_wire_image(*image, format);
      EXPECT_EQ(into.body, fresh.body);
      EXPECT_EQ(into.body.size(), bytes);
      EXPECT_EQ(fresh.body.size(), bytes);
      EXPECT_EQ(into.body.data(), memory) << "the given buffer was reallocated";
      EXPECT_EQ(into.dtype, fresh.dtype);
      EXPECT_EQ(into.content_type, fresh.content_type);
    }
  }
}

TEST(WireImage, WritesIntoABufferTooSmallByGrowingIt) {
  Image image;
  image.height = 4;
  image.width = 4;
  image.counts.assign(16, 5);
  std::string small = "x";
  const auto wire = encode_wire_image(image, PayloadFormat::npy, std::move(small));
  EXPECT_EQ(wire.body, encode_wire_image(image, PayloadFormat::npy).body);
  EXPECT_EQ(wire.body.size(), npy_header("<u4", {4, 4}).size() + 64);
}

TEST(WireImage, ValuesAlreadyInTheWireLayoutAreSentInPlaceWithTheSameBytesAndHeaders) {
  Image narrow;
  narrow.height = 2;
  narrow.width = 3;
  narrow.narrow_counts = {0, 1, 65536, 16777217, 4294967295u, 7};
  Image floats;
  floats.height = 1;
  floats.width = 3;
  floats.is_float = true;
  floats.values = {1.5f, -0.0f, std::numeric_limits<float>::quiet_NaN()};
  floats.value_divisor = 0;
  for (Image* image : {&narrow, &floats}) {
    const Image copy = *image;
    const WireImage encoded = encode_wire_image(copy, PayloadFormat::raw);
    const auto* values_before = image->is_float ? static_cast<const void*>(image->values.data())
                                                : static_cast<const void*>(image->narrow_counts.data());
    auto in_place = wire_image_in_place(*image, PayloadFormat::raw);
    ASSERT_TRUE(in_place.has_value());
    EXPECT_EQ(static_cast<const void*>(in_place->body.data), values_before);  // the image's own memory, moved
    EXPECT_EQ(in_place->body.view(), encoded.body);
    EXPECT_TRUE(in_place->wire.body.empty());
    EXPECT_EQ(in_place->wire.dtype, encoded.dtype);
    EXPECT_EQ(in_place->wire.width, encoded.width);
    EXPECT_EQ(in_place->wire.height, encoded.height);
    EXPECT_EQ(in_place->wire.value_divisor, encoded.value_divisor);
    EXPECT_EQ(in_place->wire.content_type, encoded.content_type);
  }
}

TEST(WireImage, CountsToNarrowAndNpyAreNotSentInPlace) {
  Image wide;
  wide.height = 1;
  wide.width = 2;
  wide.counts = {3, 4};
  EXPECT_FALSE(wire_image_in_place(wide, PayloadFormat::raw).has_value());
  EXPECT_EQ(wide.counts.size(), 2u);  // untouched
  Image narrow;
  narrow.height = 1;
  narrow.width = 2;
  narrow.narrow_counts = {3, 4};
  EXPECT_FALSE(wire_image_in_place(narrow, PayloadFormat::npy).has_value());
  EXPECT_EQ(narrow.narrow_counts.size(), 2u);
  narrow.narrow_counts.pop_back();
  EXPECT_THROW(wire_image_in_place(narrow, PayloadFormat::raw), quantem::Error);  // size does not match the shape
}
