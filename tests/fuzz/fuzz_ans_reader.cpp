// libFuzzer target: the CPU reference reader of the ANS resident format
// (read_group_header, decode_group, masked_sum_group) on arbitrary blobs.
// Contract (ans_codec.hpp): a malformed blob throws CorruptChunk (or
// bad_request for a value the output type cannot hold), never reads out of
// bounds; a blob that decodes gives masked sums equal to summing the decoded
// values under the same mask.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_input.hpp"
#include "quantem/ans/ans_codec.hpp"
#include "quantem/core/error.hpp"

namespace {

constexpr std::uint64_t kMaxDecodedValues = std::uint64_t{1} << 22;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace quantem;
  std::vector<std::uint8_t> blob(data, data + size);  // exactly sized: ASan sees any over-read
  ans::AnsGroupHeader header{};
  try {
    header = ans::read_group_header(blob.data(), blob.size());
  } catch (const CorruptChunk&) {
    return 0;
  }
  const std::uint64_t pixels = std::uint64_t{header.detector_rows} * header.detector_cols;
  const std::uint64_t values = pixels * header.frame_count;
  if (values == 0 || values > kMaxDecodedValues) return 0;  // keeps one execution small

  std::vector<std::uint32_t> decoded(values);
  try {
    ans::decode_group(blob.data(), blob.size(), DType::uint32, decoded.data());
  } catch (const CorruptChunk&) {
    return 0;
  }
  // Every other pixel in the mask; the sums must agree with the decoded values.
  std::vector<std::uint8_t> mask(pixels);
  for (std::uint64_t p = 0; p < pixels; ++p) mask[p] = static_cast<std::uint8_t>(p % 2);
  std::vector<std::uint64_t> sums;
  try {
    sums = ans::masked_sum_group(blob.data(), blob.size(), mask.data());
  } catch (const CorruptChunk&) {
    std::abort();  // decode_group accepted the blob, the masked sum must too
  }
  if (sums.size() != header.frame_count) std::abort();
  for (std::uint64_t f = 0; f < header.frame_count; ++f) {
    std::uint64_t expected = 0;
    for (std::uint64_t p = 0; p < pixels; ++p) {
      if (mask[p] != 0) expected += decoded[f * pixels + p];
    }
    if (sums[f] != expected) std::abort();
  }
  return 0;
}
