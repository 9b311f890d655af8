#include "quantem/hdf5/handle.hpp"

#include <atomic>

#include "quantem/core/error.hpp"
#include "quantem/hdf5/error.hpp"

namespace quantem::hdf5 {

namespace {

std::atomic<bool> any_file_close_failed{false};

herr_t close_id(hid_t id, Handle::Closer closer) {
  const herr_t status = closer(id);
  if (status < 0 && closer == &H5Fclose) any_file_close_failed = true;
  return status;
}

}  // namespace

bool file_close_failed() noexcept { return any_file_close_failed.load(); }

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = std::exchange(other.id_, H5I_INVALID_HID);
    closer_ = other.closer_;
  }
  return *this;
}

void Handle::reset() noexcept {
  if (id_ >= 0 && closer_ && close_id(id_, closer_) < 0) H5Eclear2(H5E_DEFAULT);
  id_ = H5I_INVALID_HID;
}

void Handle::close(const std::string& what) {
  if (id_ < 0) return;
  const hid_t id = std::exchange(id_, H5I_INVALID_HID);
  if (close_id(id, closer_) < 0) throw_error_with_trace(what);
}

PropertyList PropertyList::file_access_without_locking() {
  silence_error_printing();
  PropertyList fapl(checked(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate(file access)"));
  checked(H5Pset_file_locking(fapl.id(), false, true), "H5Pset_file_locking");
  return fapl;
}

H5T_class_t Datatype::type_class() const {
  const H5T_class_t type_class = H5Tget_class(id());
  if (type_class == H5T_NO_CLASS) throw_error("H5Tget_class");
  return type_class;
}

std::size_t Datatype::size() const {
  const std::size_t bytes = H5Tget_size(id());
  if (bytes == 0) throw_error("H5Tget_size");
  return bytes;
}

bool Datatype::is_signed() const { return checked(H5Tget_sign(id()), "H5Tget_sign") == H5T_SGN_2; }

bool Datatype::is_little_endian() const {
  const H5T_order_t order = H5Tget_order(id());
  if (order == H5T_ORDER_ERROR) throw_error("H5Tget_order");
  return order != H5T_ORDER_BE;
}

bool Datatype::is_variable_string() const {
  return checked(H5Tis_variable_str(id()), "H5Tis_variable_str") > 0;
}

std::string Datatype::numpy_str() const {
  const std::size_t bytes = size();
  const auto order = [&]() -> std::string { return bytes == 1 ? "|" : (is_little_endian() ? "<" : ">"); };
  switch (type_class()) {
    case H5T_INTEGER:
      return order() + (is_signed() ? "i" : "u") + std::to_string(bytes);
    case H5T_FLOAT:
      return order() + "f" + std::to_string(bytes);
    case H5T_STRING:
      return is_variable_string() ? "|O" : "|S" + std::to_string(bytes);
    case H5T_ENUM: {
      Datatype base(H5Tget_super(id()));
      if (!base.valid()) throw_error("H5Tget_super");
      return base.numpy_str();
    }
    default:
      return "|V" + std::to_string(bytes);
  }
}

std::vector<hsize_t> Dataspace::dims() const {
  const int rank = checked(H5Sget_simple_extent_ndims(id()), "H5Sget_simple_extent_ndims");
  std::vector<hsize_t> dimensions(static_cast<std::size_t>(rank));
  if (rank > 0) checked(H5Sget_simple_extent_dims(id(), dimensions.data(), nullptr), "H5Sget_simple_extent_dims");
  return dimensions;
}

bool Dataspace::is_scalar() const {
  return checked(H5Sget_simple_extent_type(id()), "H5Sget_simple_extent_type") == H5S_SCALAR;
}

hsize_t Dataspace::element_count() const {
  const hssize_t count = H5Sget_simple_extent_npoints(id());
  if (count < 0) throw_error("H5Sget_simple_extent_npoints");
  return static_cast<hsize_t>(count);
}

Datatype Attribute::type() const { return Datatype(checked(H5Aget_type(id()), "H5Aget_type")); }
Dataspace Attribute::space() const { return Dataspace(checked(H5Aget_space(id()), "H5Aget_space")); }

Datatype Dataset::type() const { return Datatype(checked(H5Dget_type(id()), "H5Dget_type")); }
Dataspace Dataset::space() const { return Dataspace(checked(H5Dget_space(id()), "H5Dget_space")); }
PropertyList Dataset::creation_properties() const {
  return PropertyList(checked(H5Dget_create_plist(id()), "H5Dget_create_plist"));
}

haddr_t Dataset::object_header_address() const {
  H5O_info_t info{};
  checked(H5Oget_info2(id(), &info, H5O_INFO_BASIC), "H5Oget_info");
  return info.addr;
}

hsize_t Dataset::allocated_chunk_count() const {
  Dataspace file_space = space();
  hsize_t chunks = 0;
  checked(H5Dget_num_chunks(id(), file_space.id(), &chunks), "H5Dget_num_chunks");
  return chunks;
}

std::optional<haddr_t> Dataset::contiguous_offset() const {
  const haddr_t offset = H5Dget_offset(id());
  H5Eclear2(H5E_DEFAULT);  // HADDR_UNDEF (unallocated) may leave an error on the stack
  if (offset == HADDR_UNDEF) return std::nullopt;
  return offset;
}

File File::open_read_only(const std::string& path) {
  silence_error_printing();
  const PropertyList fapl = PropertyList::file_access_without_locking();
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.id());
  if (id < 0) throw_error("H5Fopen(" + path + ")");
  return File(id);
}

std::size_t File::offset_size() const {
  PropertyList fcpl(checked(H5Fget_create_plist(id()), "H5Fget_create_plist"));
  std::size_t offsets = 0, lengths = 0;
  checked(H5Pget_sizes(fcpl.id(), &offsets, &lengths), "H5Pget_sizes");
  return offsets;
}

std::size_t File::length_size() const {
  PropertyList fcpl(checked(H5Fget_create_plist(id()), "H5Fget_create_plist"));
  std::size_t offsets = 0, lengths = 0;
  checked(H5Pget_sizes(fcpl.id(), &offsets, &lengths), "H5Pget_sizes");
  return lengths;
}

hsize_t File::user_block_size() const {
  PropertyList fcpl(checked(H5Fget_create_plist(id()), "H5Fget_create_plist"));
  hsize_t bytes = 0;
  checked(H5Pget_userblock(fcpl.id(), &bytes), "H5Pget_userblock");
  return bytes;
}

}  // namespace quantem::hdf5
