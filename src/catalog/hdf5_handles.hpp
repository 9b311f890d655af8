#pragma once
// Thin RAII wrappers over the HDF5 C API used by the catalog (private header).
//
// One class per handle kind (file, group, dataset, dataspace, datatype,
// attribute, property list); each closes its id in the destructor and is
// move-only. HDF5's automatic error printing is silenced for the calling
// thread before any call, and every failure throws quantem::HdfError whose
// message is "<what>: <HDF5's message>", HDF5's message being formatted like
// h5py's ("Unable to open file (file signature not found)").
//
// Files are always opened read-only with file locking disabled
// (H5Pset_file_locking(fapl, false, true)), so a file that a writer holds open
// neither blocks nor fails the open.
#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace quantem::catalog::hdf5 {

// libhdf5 built without --enable-threadsafe (the default of a source build;
// Debian's package reports H5is_library_threadsafe = 1) must never be called
// from two threads at once: every catalog entry point that calls HDF5
// (inspect_master, read_shard_storage) holds this process-wide lock for its
// whole run, so inspections and the loaders' index builds never overlap in
// HDF5 whatever the build. Recursive: an entry point may call another. (The
// daemon runs both in its inspector worker, decision 0012.)
std::recursive_mutex& library_mutex();

// Silences HDF5's automatic error printing for the calling thread (the setting
// is per thread in thread-safe builds). Cheap; called by every wrapper.
void silence_error_printing();

// HDF5's current error stack as one line (h5py style), then clears the stack.
// Empty when the stack is empty.
std::string take_error_message();

// Throws HdfError("<what>: <HDF5 message>").
[[noreturn]] void throw_error(const std::string& what);

template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  hid_t id() const noexcept { return id_; }
  bool valid() const noexcept { return id_ >= 0; }

 protected:
  void reset() noexcept {
    if (id_ >= 0) {
      Close(id_);  // non-throwing: a close failure leaves nothing to recover
      H5Eclear2(H5E_DEFAULT);
    }
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

class PropertyList : public Handle<H5Pclose> {
 public:
  using Handle::Handle;
  // A file access list with file locking disabled.
  static PropertyList file_access_without_locking();
};

class Datatype : public Handle<H5Tclose> {
 public:
  using Handle::Handle;
  H5T_class_t type_class() const;
  std::size_t size() const;
  bool is_signed() const;          // integers only
  bool is_little_endian() const;   // integers and floats
  bool is_variable_string() const; // strings only
  // numpy's dtype.str for this type ("<u2", "|u1", "<f4", "|S8", "|O", "|V12"...).
  std::string numpy_str() const;
};

class Dataspace : public Handle<H5Sclose> {
 public:
  using Handle::Handle;
  // Dimensions of a simple dataspace; empty for a scalar one.
  std::vector<hsize_t> dims() const;
  bool is_scalar() const;
  hsize_t element_count() const;
};

class Attribute : public Handle<H5Aclose> {
 public:
  using Handle::Handle;
  Datatype type() const;
  Dataspace space() const;
};

// Numeric and string values read through HDF5's conversions (attributes and
// small datasets share these readers).
struct Value {
  std::vector<std::int64_t> integers;  // integer class (unsigned values above INT64_MAX are clamped)
  std::vector<double> reals;           // integer or float class
  std::optional<std::string> text;     // string class, scalar or first element
  bool is_integer = false;
  bool is_real = false;
};

class Dataset : public Handle<H5Dclose> {
 public:
  using Handle::Handle;
  Datatype type() const;
  Dataspace space() const;
  PropertyList creation_properties() const;
  // Address of the dataset's object header, relative to the file's base address.
  haddr_t object_header_address() const;
  // Number of allocated (written) chunks of a chunked dataset.
  hsize_t allocated_chunk_count() const;
  // Absolute file offset of a contiguous dataset's data; nullopt when unallocated.
  std::optional<haddr_t> contiguous_offset() const;
};

class Group : public Handle<H5Gclose> {
 public:
  using Handle::Handle;
};

class File : public Handle<H5Fclose> {
 public:
  using Handle::Handle;
  // Opens read-only, file locking disabled. Throws HdfError on failure.
  static File open_read_only(const std::string& path);
  // Size in bytes of addresses and lengths in this file, and its user block size.
  std::size_t offset_size() const;
  std::size_t length_size() const;
  hsize_t user_block_size() const;
};

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

}  // namespace quantem::catalog::hdf5
