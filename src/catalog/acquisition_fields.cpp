#include "quantem/catalog/acquisition_fields.hpp"

namespace quantem::catalog {

std::vector<std::uint64_t> pixel_mask_runs(const std::vector<std::uint8_t>& mask) {
  std::vector<std::uint64_t> runs;
  if (mask.empty()) return runs;
  std::uint64_t run = 0;
  std::uint8_t current = 0;  // runs start with unmasked pixels
  for (const std::uint8_t pixel : mask) {
    const std::uint8_t value = pixel != 0 ? 1 : 0;
    if (value != current) {
      runs.push_back(run);
      run = 0;
      current = value;
    }
    ++run;
  }
  runs.push_back(run);
  return runs;
}

const char* pixel_mask_from_runs(const std::vector<std::uint64_t>& runs, std::uint64_t pixels,
                                 std::vector<std::uint8_t>& mask, std::uint64_t& masked_pixels) {
  mask.clear();
  masked_pixels = 0;
  if (runs.empty()) return nullptr;
  mask.reserve(pixels);
  std::uint8_t value = 0;
  for (const std::uint64_t length : runs) {
    if (length > pixels - mask.size()) return "the pixel mask runs exceed the detector's pixels";
    mask.insert(mask.end(), length, value);
    if (value) masked_pixels += length;
    value ^= 1;
  }
  if (mask.size() != pixels) return "the pixel mask runs do not cover the detector";
  return nullptr;
}

}  // namespace quantem::catalog
