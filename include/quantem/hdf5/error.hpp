#pragma once
// HDF5's errors, for every reader and writer of the project (library
// quantem_hdf5): HDF5's own printing silenced, its error stack turned into the
// text of a typed quantem::HdfError.
#include <hdf5.h>

#include <string>

namespace quantem::hdf5 {

// Turns HDF5's automatic error printing off for the calling thread for its
// lifetime (the setting is per thread in thread-safe builds), then restores
// what was set before.
class ErrorSilencer {
 public:
  ErrorSilencer();
  ~ErrorSilencer();
  ErrorSilencer(const ErrorSilencer&) = delete;
  ErrorSilencer& operator=(const ErrorSilencer&) = delete;

 private:
  H5E_auto2_t previous_function_ = nullptr;
  void* previous_data_ = nullptr;
};

// Turns HDF5's automatic error printing off for the calling thread for good.
// Cheap after the first call on a thread; every reader of read.hpp calls it.
void silence_error_printing();

// HDF5's current error stack as one line in h5py's style ("Unable to open
// file (file signature not found)"), then clears the stack. Empty when the
// stack is empty.
std::string take_error_message();

// HDF5's current error stack, innermost first, as " [function: description;
// ...]", then clears the stack. Empty when the stack is empty.
std::string take_error_trace();

// Throws HdfError("<what>: <take_error_message()>"), "HDF5 call failed" when
// the stack is empty (the readers' errors, shown to users like h5py's).
[[noreturn]] void throw_error(const std::string& what);

// Throws HdfError("HDF5: <what><take_error_trace()>") (the writers' errors).
[[noreturn]] void throw_error_with_trace(const std::string& what);

// Checks an HDF5 return value (negative means failure) with throw_error.
template <typename T>
T checked(T value, const char* what) {
  if (value < 0) throw_error(what);
  return value;
}

// Whether an H5Fclose of this process ever failed (Handle records it).
// libhdf5 1.10 then keeps a freed file registered, and any call that walks the
// open files (H5Zunregister, the next H5Fclose, H5close at exit) crashes.
bool file_close_failed() noexcept;

}  // namespace quantem::hdf5
