#pragma once
// CPU reference of the lossless ANS resident codec (format: ans_format.hpp,
// design: docs/kernels.md). Host memory only; the CUDA kernels
// (include/quantem/kernels/ans.hpp) produce and read byte-identical groups.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quantem/ans/ans_format.hpp"
#include "quantem/core/dtype.hpp"

namespace quantem::ans {

// Dense frames in host memory: frame_count frames of detector_rows x
// detector_cols little-endian elements of `dtype`, frame-major, row-major.
struct HostFrames {
  const void* data = nullptr;
  DType dtype = DType::uint16;
  std::uint32_t frame_count = 0;
  std::uint32_t detector_rows = 0;
  std::uint32_t detector_cols = 0;
};

// Encodes one group. Throws quantem::Error(bad_request) for an empty shape.
std::vector<std::uint8_t> encode_group(const HostFrames& frames);

// Validates the header and the fixed layout of a blob of `bytes` bytes.
// Throws CorruptChunk when they are inconsistent.
AnsGroupHeader read_group_header(const std::uint8_t* blob, std::size_t bytes);

// Decodes a group into `out` (frame_count * pixels elements of out_dtype).
// out_dtype uint8 needs every value < 256, uint16 needs raw_words == 1 and
// uint32 takes anything; a value that does not fit throws bad_request.
// Throws CorruptChunk for a malformed blob (a stream read past its end, a
// final state other than kAnsStateLower, an out-of-range class or offset).
void decode_group(const std::uint8_t* blob, std::size_t bytes, DType out_dtype, void* out);

// For each frame of the group, the sum of the values at pixels whose mask byte
// is non-zero (mask: detector_rows * detector_cols bytes). Exact uint64.
std::vector<std::uint64_t> masked_sum_group(const std::uint8_t* blob, std::size_t bytes,
                                            const std::uint8_t* detector_mask);

}  // namespace quantem::ans
