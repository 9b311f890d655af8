#include <gtest/gtest.h>

#include <cstring>

#include "quantem/core/error.hpp"
#include "quantem/protocol/npy.hpp"
#include "test_support.hpp"

using namespace quantem::protocol;

namespace {

// The same values server_npy_reference.py writes, little-endian.
std::string reference_payload(const std::string& dtype, std::uint64_t rows, std::uint64_t cols, std::size_t& item) {
  std::string data;
  for (std::uint64_t i = 0; i < rows * cols; ++i) {
    const std::uint64_t wrapped = (i * 65537ULL) % (1ULL << 32);
    if (dtype == "<f4") {
      const float value = static_cast<float>(static_cast<double>(wrapped) / 7.0);
      char bytes[4];
      std::memcpy(bytes, &value, 4);
      data.append(bytes, 4);
      item = 4;
    } else {
      item = dtype == "<u1" ? 1 : dtype == "<u2" ? 2 : 4;
      for (std::size_t b = 0; b < item; ++b) data.push_back(static_cast<char>((wrapped >> (8 * b)) & 0xFF));
    }
  }
  return data;
}

}  // namespace

TEST(Npy, HeaderIsAlignedAndEndsWithNewline) {
  const std::string header = npy_header("<u4", {3, 4});
  EXPECT_EQ(header.size() % 64, 0u);
  EXPECT_EQ(header.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(header.back(), '\n');
  EXPECT_NE(header.find("{'descr': '<u4', 'fortran_order': False, 'shape': (3, 4), }"), std::string::npos);
  EXPECT_EQ(static_cast<unsigned char>(header[8]) + 256 * static_cast<unsigned char>(header[9]), header.size() - 10);
}

TEST(Npy, MatchesNumpySaveByteForByte) {
  quantem::test::TempDir dir;
  struct Case {
    const char* dtype;
    std::uint64_t rows, cols;
  };
  int index = 0;
  for (const Case& c : {Case{"<u4", 3, 4}, Case{"<f4", 5, 7}, Case{"<u4", 1, 1}, Case{"<u2", 17, 3},
                        Case{"<u4", 123456, 1}, Case{"<f4", 0, 5}}) {
    const std::string path = dir.file("reference_" + std::to_string(index++) + ".npy");
    quantem::test::run_python_script("server_npy_reference.py", path + " '" + c.dtype + "' " + std::to_string(c.rows) + " " +
                                                                    std::to_string(c.cols));
    const auto expected = quantem::test::read_file(path);
    std::size_t item = 4;
    const std::string payload = reference_payload(c.dtype, c.rows, c.cols, item);
    const std::string encoded = encode_npy(c.dtype, item, {c.rows, c.cols}, payload);
    EXPECT_EQ(encoded, std::string(expected.begin(), expected.end())) << c.dtype << " " << c.rows << "x" << c.cols;
  }
}

TEST(Npy, RejectsAPayloadThatDoesNotMatchTheShape) {
  EXPECT_THROW(encode_npy("<u4", 4, {2, 2}, std::string(15, '\0')), quantem::Error);
}
