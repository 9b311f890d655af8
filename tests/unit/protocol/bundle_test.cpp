// The products route's query and its bundle bodies: base64 against RFC 4648's
// vectors, the json document's layout, and the npz read back by numpy.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "quantem/core/error.hpp"
#include "quantem/protocol/bundle.hpp"
#include "quantem/protocol/npy.hpp"
#include "quantem/protocol/requests.hpp"
#include "test_support.hpp"

using namespace quantem::protocol;
using quantem::ErrorKind;

namespace {

std::string bad_request_text(const std::string& query) {
  try {
    parse_products_query(parse_query_string(query));
  } catch (const QueryValidationError& error) {
    return "422:" + error.details().dump();
  } catch (const quantem::Error& error) {
    if (error.kind() != ErrorKind::bad_request) return std::string("kind:") + quantem::error_kind_name(error.kind());
    return error.what();
  }
  return "no error";
}

}  // namespace

TEST(ProductsQuery, DefaultsToTheSixViewerModesAsJson) {
  const auto query = parse_products_query(parse_query_string("session=s&file=f_master.h5"));
  EXPECT_EQ(query.mode_names, (std::vector<std::string>{"BF", "ABF", "ADF", "CoMx", "CoMy", "iCoM"}));
  ASSERT_EQ(query.requests.size(), 6u);
  EXPECT_EQ(query.requests[1].mode, quantem::products::RealspaceMode::ABF);
  EXPECT_EQ(query.requests[1].inner, 0.0);
  EXPECT_EQ(query.requests[1].outer, 1.0);
  EXPECT_FALSE(query.requests[0].center_row.has_value());
  EXPECT_EQ(query.bundle_format, BundleFormat::json);
  EXPECT_EQ(query.format, PayloadFormat::raw);
  EXPECT_FALSE(query.ensure_resident);
}

TEST(ProductsQuery, KeepsTheOrderAndGivesEachModeItsRadii) {
  const auto query = parse_products_query(parse_query_string(
      "session=s&file=f&modes=iCoM,ADF,BF,HAADF&inner=0.2&outer=2&cx=3.5&cy=4.5&inner_ADF=1&outer_ADF=3"
      "&outer_BF=0.9&inner_ABF=0.5&format=npz&scan_bin=2&det_bin=3&row_start=1&row_stop=5&column_start=0"
      "&column_stop=4"));
  EXPECT_EQ(query.mode_names, (std::vector<std::string>{"iCoM", "ADF", "BF", "HAADF"}));
  EXPECT_EQ(query.requests[1].inner, 1.0);  // inner_ADF
  EXPECT_EQ(query.requests[1].outer, 3.0);
  EXPECT_EQ(query.requests[2].inner, 0.2);  // the shared inner
  EXPECT_EQ(query.requests[2].outer, 0.9);  // outer_BF
  EXPECT_EQ(query.requests[3].inner, 0.2);  // HAADF: the shared radii
  EXPECT_EQ(query.requests[3].outer, 2.0);
  for (const auto& r : query.requests) {
    EXPECT_EQ(r.center_col, 3.5);
    EXPECT_EQ(r.center_row, 4.5);
  }
  EXPECT_EQ(query.bundle_format, BundleFormat::npz);
  EXPECT_EQ(query.plan.scan_bin, 2u);
  EXPECT_EQ(query.plan.detector_bin, 3u);
  ASSERT_TRUE(query.plan.crop.has_value());
  EXPECT_EQ(query.plan.crop->row_stop, 5u);
}

TEST(ProductsQuery, RejectsDuplicatesUnknownOrEmptyModesAndOtherFormats) {
  EXPECT_EQ(bad_request_text("session=s&file=f&modes=BF,ADF,BF"), "modes names the mode 'BF' more than once");
  EXPECT_EQ(bad_request_text("session=s&file=f&modes=BF,bf"), "unknown virtual-image mode: 'bf'");
  EXPECT_EQ(bad_request_text("session=s&file=f&modes=BF,,ADF"), "unknown virtual-image mode: ''");
  EXPECT_EQ(bad_request_text("session=s&file=f&modes="), "modes must name at least one virtual-image mode");
  EXPECT_EQ(bad_request_text("session=s&file=f&format=npy"), "format must be json, npz or raw");
  EXPECT_EQ(bad_request_text("session=s&file=f&format=RAW"), "format must be json, npz or raw");
  EXPECT_EQ(bad_request_text("session=s&file=f&inner_ADF=nan"), "detector center and radii must be finite");
  EXPECT_EQ(bad_request_text("session=s&file=f&row_start=1"), kCropIncompleteMessage);
  EXPECT_EQ(bad_request_text("session=s&file=f&modes=BF&outer_ADF=x"),
            "422:"
            R"([{"type":"float_parsing","loc":["query","outer_ADF"],"msg":"Input should be a valid number, unable to parse string as a number","input":"x"}])");
}

TEST(Base64, Rfc4648TestVectors) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(base64_encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode(std::string("\xff\xfe\x00", 3)), "//4A");
}

TEST(Base64, AgreesWithABitByBitEncoderOnEveryLengthAndByte) {
  const char* const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  for (int i = 0; i < 3 * 256 + 2; ++i) bytes.push_back(static_cast<char>((i * 167 + i / 256) & 0xFF));
  for (std::size_t length : {bytes.size(), bytes.size() - 1, bytes.size() - 2}) {
    std::string expected;
    unsigned bits = 0;
    int count = 0;
    for (std::size_t i = 0; i < length; ++i) {
      bits = ((bits << 8) | static_cast<unsigned char>(bytes[i])) & 0xFFFFu;  // at most 13 pending bits
      count += 8;
      while (count >= 6) {
        expected.push_back(alphabet[(bits >> (count - 6)) & 63]);
        count -= 6;
      }
    }
    if (count > 0) expected.push_back(alphabet[(bits << (6 - count)) & 63]);
    while (expected.size() % 4 != 0) expected.push_back('=');
    EXPECT_EQ(base64_encode(std::string_view(bytes).substr(0, length)), expected) << length;
  }
}

namespace {

// Two 2 x 3 images: counts and floats, as the raw format's bytes.
struct TwoImages {
  std::string counts, floats;
  std::vector<BundleImage> images;
  TwoImages() {
    for (std::uint32_t v : {1u, 2u, 70000u, 0u, 4294967295u, 9u}) counts.append(reinterpret_cast<const char*>(&v), 4);
    for (float v : {0.5f, -1.25f, 3.0f, 1e-7f, -0.0f, 123456.789f}) floats.append(reinterpret_cast<const char*>(&v), 4);
    images.push_back({"BF", 2, 3, "<u4", 1, counts});
    images.push_back({"CoMx", 2, 3, "<f4", 1, floats});
  }
};

}  // namespace

TEST(BundleJson, EveryImageWithItsShapeDtypeDivisorAndBase64BytesThenTheProvenance) {
  const TwoImages two;
  const std::string body = encode_bundle_json(two.images, R"({"session":"s","geometry":{"modes":["BF","CoMx"]}})");
  const auto doc = nlohmann::json::parse(body);
  ASSERT_EQ(doc["images"].size(), 2u);
  EXPECT_EQ(doc["images"][0]["mode"], "BF");
  EXPECT_EQ(doc["images"][0]["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(doc["images"][0]["dtype"], "<u4");
  EXPECT_EQ(doc["images"][0]["value_divisor"], 1);
  EXPECT_EQ(doc["images"][0]["encoding"], "base64");
  EXPECT_EQ(doc["images"][0]["data"], base64_encode(two.counts));
  EXPECT_EQ(doc["images"][1]["mode"], "CoMx");
  EXPECT_EQ(doc["images"][1]["dtype"], "<f4");
  EXPECT_EQ(doc["images"][1]["data"], base64_encode(two.floats));
  EXPECT_EQ(doc["provenance"]["session"], "s");
  EXPECT_EQ(body.find(' '), std::string::npos);  // compact, as every JSON body
}

TEST(ProductsQuery, RawIsABundleFormat) {
  EXPECT_EQ(parse_products_query(parse_query_string("session=s&file=f&format=raw")).bundle_format,
            BundleFormat::raw);
}

TEST(BundleRaw, TheBytesBackToBackAndAnIndexThatLocatesEachImage) {
  const TwoImages two;
  const std::string body = encode_bundle_raw(two.images);
  EXPECT_EQ(body, two.counts + two.floats);
  EXPECT_EQ(bundle_raw_bytes(two.images), body.size());
  // Into a recycled body: its old contents dropped, its memory reused.
  std::string recycled(4096, 'x');
  const char* memory = recycled.data();
  const std::string again = encode_bundle_raw(two.images, std::move(recycled));
  EXPECT_EQ(again, body);
  EXPECT_EQ(again.data(), memory);
  const auto index = nlohmann::json::parse(bundle_index_json(two.images));
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index[0]["mode"], "BF");
  EXPECT_EQ(index[0]["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(index[0]["dtype"], "<u4");
  EXPECT_EQ(index[0]["value_divisor"], 1);
  EXPECT_EQ(index[0]["offset"], 0);
  EXPECT_EQ(index[0]["bytes"], two.counts.size());
  EXPECT_EQ(index[1]["mode"], "CoMx");
  EXPECT_EQ(index[1]["dtype"], "<f4");
  EXPECT_EQ(index[1]["offset"], two.counts.size());
  EXPECT_EQ(index[1]["bytes"], two.floats.size());
}

TEST(BundleNpz, NumpyLoadsEveryImageAsNumpySaveWouldWriteIt) {
  const TwoImages two;
  quantem::test::TempDir dir;
  const std::string body = encode_bundle_npz(two.images);
  const std::string path = dir.file("bundle.npz");
  std::ofstream(path, std::ios::binary) << body;
  quantem::test::run_python_script("bundle_reference.py", path + " " + dir.path());
  const auto names = quantem::test::read_file(dir.file("names.txt"));
  EXPECT_EQ(std::string(names.begin(), names.end()), "BF\nCoMx\n");
  for (const auto& image : two.images) {
    const auto saved = quantem::test::read_file(dir.file(image.mode + ".npy"));
    EXPECT_EQ(std::string(saved.begin(), saved.end()), encode_npy(image.dtype, 4, {2, 3}, image.bytes)) << image.mode;
  }
  // The same images, the same bytes (no timestamps).
  EXPECT_EQ(encode_bundle_npz(two.images), body);
}

TEST(StoredZip, LayoutAndCrc32OfAKnownMember) {
  const std::string zip = stored_zip({{"a.txt", "hello ", "world"}});
  // Local header: signature, version 20, stored, the zip epoch, CRC-32 of
  // "hello world" (0x0d4a1185), sizes 11, the name, the bytes.
  const std::string local = zip.substr(0, 30);
  EXPECT_EQ(local.substr(0, 4), std::string("PK\x03\x04", 4));
  EXPECT_EQ(local.substr(14, 4), std::string("\x85\x11\x4a\x0d", 4));
  EXPECT_EQ(local.substr(18, 8), std::string("\x0b\0\0\0\x0b\0\0\0", 8));
  EXPECT_EQ(zip.substr(30, 5 + 11), "a.txthello world");
  EXPECT_EQ(zip.substr(zip.size() - 22, 4), std::string("PK\x05\x06", 4));
  EXPECT_EQ(zip.size(), 30u + 5 + 11 + 46 + 5 + 22);
}
