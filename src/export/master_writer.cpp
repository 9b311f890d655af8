#include "master_writer.hpp"

#include <array>
#include <ctime>

#include "quantem/core/clock.hpp"
#include "quantem/core/version.hpp"
#include "quantem/export/arina_writer.hpp"

namespace quantem::exporter::detail {

std::vector<std::uint32_t> binned_pixel_mask(const catalog::Acquisition& source, const plan::PlanGeometry& g,
                                             std::vector<std::uint32_t>& masked_source_pixels) {
  masked_source_pixels.assign(g.detector_pixels(), 0);
  std::vector<std::uint32_t> covered(g.detector_pixels(), 0);
  for (std::uint64_t r = 0; r < source.detector_rows; ++r) {
    for (std::uint64_t c = 0; c < source.detector_cols; ++c) {
      const std::uint64_t bin = (r / g.detector_bin) * g.detector_cols + c / g.detector_bin;
      ++covered[bin];
      if (!source.pixel_mask.empty() && source.pixel_mask[r * source.detector_cols + c] != 0) {
        ++masked_source_pixels[bin];
      }
    }
  }
  std::vector<std::uint32_t> mask(g.detector_pixels(), 0);
  for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = masked_source_pixels[i] == covered[i] ? 1u : 0u;
  return mask;
}

namespace {

void write_u64_array(hid_t object, const char* name, const std::vector<std::uint64_t>& values) {
  arina::write_attribute(object, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, values.data(), values.size());
}

// entry/quantem_export: where the export came from and how it was made.
void write_plan_record(hid_t entry, const MasterFacts& facts) {
  const catalog::Acquisition& source = facts.source;
  const plan::PlanGeometry& g = facts.layout.geometry;
  hdf5::Group record = arina::create_group(entry, "quantem_export", "NXcollection");
  const hid_t group = record.id();
  arina::write_string_attribute(group, "source_master", source.master_path);
  arina::write_string_attribute(group, "source_name", source.name);
  arina::write_string_attribute(group, "source_identity", facts.request.source_identity);
  write_u64_array(group, "source_shape", {source.scan_rows, source.scan_cols, source.detector_rows, source.detector_cols});
  arina::write_string_attribute(group, "source_dtype", dtype_name(*source.dtype));
  // Half-open (row_start, row_stop, col_start, col_stop), the image routes' scan_crop.
  write_u64_array(group, "scan_crop", {g.region.row_start, g.region.row_stop, g.region.col_start, g.region.col_stop});
  write_u64_array(group, "scan_bin", {g.scan_bin});
  write_u64_array(group, "detector_bin", {g.detector_bin});
  write_u64_array(group, "shape", {g.scan_rows, g.scan_cols, g.detector_rows, g.detector_cols});
  arina::write_string_attribute(group, "dtype", dtype_name(facts.layout.dtype));
  arina::write_string_attribute(group, "bad_pixels", "zeroed, as the resident holds them");
  arina::write_string_attribute(group, "encoder", facts.encoder);
  arina::write_string_attribute(group, "implementation_revision", facts.request.implementation_revision.empty()
                                                                      ? build_git_revision()
                                                                      : facts.request.implementation_revision);
  arina::write_string_attribute(group, "software_version", std::string("quantem-gpu ") + version_string());
  arina::write_string_attribute(group, "created_utc", utc_timestamp_now());
}

void write_detector(hid_t entry, const MasterFacts& facts) {
  const plan::PlanGeometry& g = facts.layout.geometry;
  std::vector<std::uint32_t> masked_source_pixels;
  const std::vector<std::uint32_t> mask = binned_pixel_mask(facts.source, g, masked_source_pixels);
  std::uint32_t excluded = 0;
  for (const std::uint32_t value : mask) excluded += value != 0;
  const auto bits = static_cast<std::uint16_t>(dtype_size(facts.layout.dtype) * 8);

  hdf5::Group instrument = arina::create_group(entry, "instrument", "NXinstrument");
  hdf5::Group detector = arina::create_group(instrument.id(), "detector", "NXdetector");
  arina::write_text(detector.id(), "description", "quantem-gpu export of " + facts.source.name);
  arina::write_u16(detector.id(), "bit_depth_image", bits);
  arina::write_i8(detector.id(), "pixel_mask_applied", 1);
  hdf5::Group specific = arina::create_group(detector.id(), "detectorSpecific", "NXcollection");
  arina::write_u64(specific.id(), "nimages", 1);
  arina::write_u64(specific.id(), "ntrigger", g.positions());
  arina::write_u64(specific.id(), "x_pixels_in_detector", g.detector_cols);
  arina::write_u64(specific.id(), "y_pixels_in_detector", g.detector_rows);
  arina::write_text(specific.id(), "compression", "bslz4");
  arina::write_u32(specific.id(), "number_of_excluded_pixels", excluded);
  arina::write_text(specific.id(), "software_version", std::string("quantem-gpu ") + version_string());
  arina::write_u32_image(specific.id(), "pixel_mask", mask, g.detector_rows, g.detector_cols);
  arina::write_u32_image(specific.id(), "masked_source_pixels", masked_source_pixels, g.detector_rows,
                         g.detector_cols);
  specific.close("H5Gclose detectorSpecific");
  detector.close("H5Gclose detector");
  instrument.close("H5Gclose instrument");
}

}  // namespace

void write_export_master(const std::string& path, const MasterFacts& facts) {
  const plan::PlanGeometry& g = facts.layout.geometry;
  arina::RecordedFile file = arina::create_file(path);
  arina::write_string_attribute(file.id(), "default", "entry");
  // The plan's scan shape, read first by every reader of this layout.
  const std::array<std::int64_t, 2> scan_shape = {static_cast<std::int64_t>(g.scan_rows),
                                                  static_cast<std::int64_t>(g.scan_cols)};
  arina::write_attribute(file.id(), "scan_shape", H5T_STD_I64LE, H5T_NATIVE_INT64, scan_shape.data(), 2);
  hdf5::Group entry = arina::create_group(file.id(), "entry", "NXentry");
  arina::write_string_attribute(entry.id(), "default", "data");
  arina::write_text(entry.id(), "definition", "NXmx");
  {
    hdf5::Group data = arina::create_group(entry.id(), "data", "NXdata");
    arina::write_data_links(data.id(), facts.data_file_names);
    // Calibrations that still hold, scaled by the bins.
    if (facts.source.scan_sampling_A) {
      const double value = *facts.source.scan_sampling_A * static_cast<double>(g.scan_bin);
      arina::write_attribute(data.id(), "scan_sampling_A", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
    }
    if (facts.source.k_pixel_size_mrad) {
      const double value = *facts.source.k_pixel_size_mrad * static_cast<double>(g.detector_bin);
      arina::write_attribute(data.id(), "k_pixel_size_mrad", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
    }
  }
  write_detector(entry.id(), facts);
  write_plan_record(entry.id(), facts);
  entry.close("H5Gclose entry");
  file.close("H5Fclose " + path);
}

}  // namespace quantem::exporter::detail
