#pragma once
// The master of an export (private to src/export): the Arina layout a reader
// needs, the plan and its source recorded beside it (decision 0016).
#include <string>
#include <vector>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/export/export.hpp"

namespace quantem::exporter::detail {

struct MasterFacts {
  const catalog::Acquisition& source;
  const ExportLayout& layout;
  const ExportRequest& request;
  const std::vector<std::string>& data_file_names;
  std::string encoder;
};

// The binned pixel mask: a binned pixel is masked (1) only when every source
// pixel in its bin is, since its value is then 0 whatever a reader does; a
// partly masked bin holds the exact sum of its unmasked pixels and stays
// usable. `masked_source_pixels` receives, per binned pixel, how many masked
// source pixels it covers. Empty source mask: all zeros.
std::vector<std::uint32_t> binned_pixel_mask(const catalog::Acquisition& source, const plan::PlanGeometry& geometry,
                                             std::vector<std::uint32_t>& masked_source_pixels);

// Writes `path`; throws HdfError. Calls HDF5: hold hdf5::LibraryLock.
void write_export_master(const std::string& path, const MasterFacts& facts);

}  // namespace quantem::exporter::detail
