#pragma once
// Reading HDF5 metadata (library quantem_hdf5): paths, links, groups,
// datasets, attributes and small values, for the catalog's inspection and the
// frame index. Every call silences HDF5's error printing for the calling
// thread first (silence_error_printing) and throws quantem::HdfError whose
// message is "<what>: <HDF5's message>" in h5py's style (throw_error).
#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quantem/hdf5/handle.hpp"

namespace quantem::hdf5 {

// Does every component of `path` (relative to loc, "a/b/c") exist as a link
// that resolves to an object? Never throws; false on any error.
bool path_exists(hid_t loc, const std::string& path);

// Does the link `name` (one component) exist in group? Does not follow it.
bool link_exists(hid_t group, const std::string& name);

// Type of the object at path (H5O_TYPE_UNKNOWN when it does not exist or fails to open).
H5O_type_t object_type(hid_t loc, const std::string& path);

Group open_group(hid_t loc, const std::string& path);
Dataset open_dataset(hid_t loc, const std::string& path);
bool attribute_exists(hid_t object, const std::string& name);
Attribute open_attribute(hid_t object, const std::string& name);

// Numeric and string values read through HDF5's conversions (attributes and
// small datasets share these readers).
struct Value {
  std::vector<std::int64_t> integers;  // integer class (unsigned values above INT64_MAX are clamped)
  std::vector<double> reals;           // integer or float class
  std::optional<std::string> text;     // string class, scalar or first element
  bool is_integer = false;
  bool is_real = false;
};

// Reads a whole attribute or dataset (intended for small metadata values).
Value read_value(const Attribute& attribute);
Value read_value(const Dataset& dataset);

// Names of the members of a group, in HDF5's name order.
std::vector<std::string> member_names(hid_t group);

// Link kinds and external-link values of a group member.
struct LinkInfo {
  H5L_type_t type = H5L_TYPE_ERROR;
  std::string external_file;    // external links only
  std::string external_object;  // external links only
};
LinkInfo link_info(hid_t group, const std::string& name);

}  // namespace quantem::hdf5
