#pragma once
// The one owner of HDF5 identifiers for reading and writing (library
// quantem_hdf5): Handle closes its identifier with the matching H5?close when
// it goes, and is move-only; one typed handle per HDF5 module adds what the
// readers ask of it. Failures throw quantem::HdfError (error.hpp).
#include <hdf5.h>

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace quantem::hdf5 {

class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) noexcept : id_(id), closer_(closer) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)), closer_(other.closer_) {}
  Handle& operator=(Handle&& other) noexcept;
  ~Handle() { reset(); }

  hid_t id() const noexcept { return id_; }
  bool valid() const noexcept { return id_ >= 0; }
  // Closes now and never throws: a close failure leaves nothing to recover,
  // and its error is cleared from HDF5's stack.
  void reset() noexcept;
  // Closes now and throws HdfError (throw_error_with_trace) if closing fails:
  // a file's close flushes it.
  void close(const std::string& what);

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

class PropertyList : public Handle {
 public:
  PropertyList() = default;
  explicit PropertyList(hid_t id) noexcept : Handle(id, H5Pclose) {}
  // A file access list with file locking disabled.
  static PropertyList file_access_without_locking();
};

class Datatype : public Handle {
 public:
  Datatype() = default;
  explicit Datatype(hid_t id) noexcept : Handle(id, H5Tclose) {}
  H5T_class_t type_class() const;
  std::size_t size() const;
  bool is_signed() const;          // integers only
  bool is_little_endian() const;   // integers and floats
  bool is_variable_string() const; // strings only
  // numpy's dtype.str for this type ("<u2", "|u1", "<f4", "|S8", "|O", "|V12"...).
  std::string numpy_str() const;
};

class Dataspace : public Handle {
 public:
  Dataspace() = default;
  explicit Dataspace(hid_t id) noexcept : Handle(id, H5Sclose) {}
  // Dimensions of a simple dataspace; empty for a scalar one.
  std::vector<hsize_t> dims() const;
  bool is_scalar() const;
  hsize_t element_count() const;
};

class Attribute : public Handle {
 public:
  Attribute() = default;
  explicit Attribute(hid_t id) noexcept : Handle(id, H5Aclose) {}
  Datatype type() const;
  Dataspace space() const;
};

class Dataset : public Handle {
 public:
  Dataset() = default;
  explicit Dataset(hid_t id) noexcept : Handle(id, H5Dclose) {}
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

class Group : public Handle {
 public:
  Group() = default;
  explicit Group(hid_t id) noexcept : Handle(id, H5Gclose) {}
};

class File : public Handle {
 public:
  File() = default;
  explicit File(hid_t id) noexcept : Handle(id, H5Fclose) {}
  // Opens read-only with file locking disabled (H5Pset_file_locking(fapl,
  // false, true)), so a file that a writer holds open neither blocks nor
  // fails the open. Throws HdfError on failure.
  static File open_read_only(const std::string& path);
  // Size in bytes of addresses and lengths in this file, and its user block size.
  std::size_t offset_size() const;
  std::size_t length_size() const;
  hsize_t user_block_size() const;
};

}  // namespace quantem::hdf5
