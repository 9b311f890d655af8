#include "quantem/hdf5/read.hpp"

#include <limits>

#include "quantem/core/error.hpp"
#include "quantem/hdf5/error.hpp"

namespace quantem::hdf5 {

bool path_exists(hid_t loc, const std::string& path) {
  silence_error_printing();
  if (path.empty()) return false;
  // H5Lexists fails (instead of answering false) when an intermediate
  // component is missing, so test one component at a time, each from the
  // group the previous one opened: linear in the depth (testing each whole
  // prefix from `loc` is quadratic, which a hostile deeply nested path exploits).
  std::vector<hid_t> opened;
  const auto close_opened = [&opened] {
    for (auto it = opened.rbegin(); it != opened.rend(); ++it) H5Oclose(*it);
  };
  hid_t current = loc;
  if (!path.empty() && path.front() == '/') {
    current = H5Oopen(loc, "/", H5P_DEFAULT);
    if (current < 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    opened.push_back(current);
  }
  std::size_t position = 0;
  bool exists = true;
  while (exists && position < path.size()) {
    std::size_t slash = path.find('/', position);
    if (slash == std::string::npos) slash = path.size();
    const std::string component = path.substr(position, slash - position);
    position = slash + 1;
    if (component.empty() || component == ".") continue;
    const bool last = path.find_first_not_of("/.", slash) == std::string::npos;
    if (H5Lexists(current, component.c_str(), H5P_DEFAULT) <= 0) {
      exists = false;
    } else if (last) {
      // The last link exists; does it resolve (a dangling soft/external link does not)?
      exists = H5Oexists_by_name(current, component.c_str(), H5P_DEFAULT) > 0;
    } else {
      const hid_t next = H5Oopen(current, component.c_str(), H5P_DEFAULT);
      if (next < 0) {
        exists = false;
      } else {
        opened.push_back(next);
        current = next;
      }
    }
  }
  H5Eclear2(H5E_DEFAULT);
  close_opened();
  return exists;
}

bool link_exists(hid_t group, const std::string& name) {
  silence_error_printing();
  const htri_t exists = H5Lexists(group, name.c_str(), H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
  return exists > 0;
}

H5O_type_t object_type(hid_t loc, const std::string& path) {
  if (!path_exists(loc, path)) return H5O_TYPE_UNKNOWN;
  H5O_info_t info{};
  if (H5Oget_info_by_name2(loc, path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return H5O_TYPE_UNKNOWN;
  }
  return info.type;
}

Group open_group(hid_t loc, const std::string& path) {
  silence_error_printing();
  const hid_t id = H5Gopen2(loc, path.c_str(), H5P_DEFAULT);
  if (id < 0) throw_error("H5Gopen(" + path + ")");
  return Group(id);
}

Dataset open_dataset(hid_t loc, const std::string& path) {
  silence_error_printing();
  const hid_t id = H5Dopen2(loc, path.c_str(), H5P_DEFAULT);
  if (id < 0) throw_error("H5Dopen(" + path + ")");
  return Dataset(id);
}

bool attribute_exists(hid_t object, const std::string& name) {
  silence_error_printing();
  const htri_t exists = H5Aexists(object, name.c_str());
  H5Eclear2(H5E_DEFAULT);
  return exists > 0;
}

Attribute open_attribute(hid_t object, const std::string& name) {
  silence_error_printing();
  const hid_t id = H5Aopen(object, name.c_str(), H5P_DEFAULT);
  if (id < 0) throw_error("H5Aopen(" + name + ")");
  return Attribute(id);
}

namespace {

// Reads every element of an attribute or dataset as the requested memory type.
template <typename Reader>
Value read_value_with(const Datatype& type, const Dataspace& space, Reader&& read) {
  Value value;
  const hsize_t count = space.element_count();
  constexpr hsize_t kMaxMetadataElements = 1u << 20;  // metadata values only, never frames
  if (count > kMaxMetadataElements) throw HdfError("metadata value has too many elements");
  const H5T_class_t type_class = type.type_class();
  if (type_class == H5T_INTEGER || type_class == H5T_ENUM) {
    const bool is_signed = type_class == H5T_INTEGER ? type.is_signed() : true;
    if (is_signed) {
      value.integers.resize(count);
      read(H5T_NATIVE_INT64, value.integers.data());
    } else {
      std::vector<std::uint64_t> unsigned_values(count);
      read(H5T_NATIVE_UINT64, unsigned_values.data());
      value.integers.reserve(count);
      for (const auto v : unsigned_values) {
        value.integers.push_back(v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
                                     ? std::numeric_limits<std::int64_t>::max()
                                     : static_cast<std::int64_t>(v));
      }
      value.reals.assign(unsigned_values.begin(), unsigned_values.end());
    }
    if (value.reals.empty()) value.reals.assign(value.integers.begin(), value.integers.end());
    value.is_integer = true;
    value.is_real = true;
  } else if (type_class == H5T_FLOAT) {
    value.reals.resize(count);
    read(H5T_NATIVE_DOUBLE, value.reals.data());
    value.is_real = true;
  } else if (type_class == H5T_STRING && count >= 1) {
    // HDF5 converts strings only between types of the same character set.
    const H5T_cset_t cset = H5Tget_cset(type.id());
    if (type.is_variable_string()) {
      Datatype memory(H5Tcopy(H5T_C_S1));
      H5Tset_size(memory.id(), H5T_VARIABLE);
      H5Tset_cset(memory.id(), cset);
      std::vector<char*> strings(count, nullptr);
      read(memory.id(), strings.data());
      if (strings[0]) value.text = std::string(strings[0]);
      for (char* s : strings) {
        if (s) H5free_memory(s);
      }
    } else {
      const std::size_t bytes = type.size();
      Datatype memory(H5Tcopy(H5T_C_S1));
      H5Tset_size(memory.id(), bytes);
      H5Tset_cset(memory.id(), cset);
      std::vector<char> buffer(bytes * count);
      read(memory.id(), buffer.data());
      std::string text(buffer.data(), bytes);
      const auto end = text.find('\0');
      if (end != std::string::npos) text.resize(end);
      value.text = text;
    }
  }
  return value;
}

}  // namespace

Value read_value(const Attribute& attribute) {
  const Datatype type = attribute.type();
  const Dataspace space = attribute.space();
  return read_value_with(type, space, [&](hid_t memory_type, void* buffer) {
    checked(H5Aread(attribute.id(), memory_type, buffer), "H5Aread");
  });
}

Value read_value(const Dataset& dataset) {
  const Datatype type = dataset.type();
  const Dataspace space = dataset.space();
  return read_value_with(type, space, [&](hid_t memory_type, void* buffer) {
    checked(H5Dread(dataset.id(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer), "H5Dread");
  });
}

namespace {
herr_t collect_member(hid_t /*group*/, const char* name, const H5L_info_t* /*info*/, void* client_data) {
  static_cast<std::vector<std::string>*>(client_data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> member_names(hid_t group) {
  silence_error_printing();
  std::vector<std::string> names;
  hsize_t index = 0;
  checked(H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &index, collect_member, &names), "H5Literate");
  return names;
}

LinkInfo link_info(hid_t group, const std::string& name) {
  silence_error_printing();
  LinkInfo result;
  H5L_info_t info{};
  checked(H5Lget_info(group, name.c_str(), &info, H5P_DEFAULT), ("H5Lget_info(" + name + ")").c_str());
  result.type = info.type;
  if (info.type == H5L_TYPE_EXTERNAL) {
    std::vector<char> value(info.u.val_size + 1, '\0');
    checked(H5Lget_val(group, name.c_str(), value.data(), info.u.val_size, H5P_DEFAULT),
            ("H5Lget_val(" + name + ")").c_str());
    unsigned flags = 0;
    const char* file = nullptr;
    const char* object = nullptr;
    checked(H5Lunpack_elink_val(value.data(), info.u.val_size, &flags, &file, &object),
            ("H5Lunpack_elink_val(" + name + ")").c_str());
    result.external_file = file ? file : "";
    result.external_object = object ? object : "";
  }
  return result;
}

}  // namespace quantem::hdf5
