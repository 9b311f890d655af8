#pragma once
// The HDF5 file driver of every file the Arina writer creates (private to
// quantem_arina_writer). It writes with pwrite like HDF5's sec2 driver, but a
// failed system call (EIO, EROFS, ENOSPC, EDQUOT, EFBIG, ...) is recorded in
// the file's WriteFailure and never reported to HDF5: the failed write's bytes
// are kept in memory, so later reads of them see what HDF5 wrote, and HDF5's
// state stays consistent until the file is closed.
//
// Why: libhdf5 1.10 leaves a file whose H5Fclose failed registered with its
// memory freed; the next call that walks the open files (H5Zunregister, the
// next H5Fclose, H5close at exit) crashes the process. With this driver no
// close fails on an I/O error; the writer checks the record after each write
// and after the close and throws a typed error instead.
#include <hdf5.h>

#include <string>

namespace quantem::arina {
class DeferredRawWrites;
}

namespace quantem::arina::detail {

// The first failed system call of one file; empty while none failed.
struct WriteFailure {
  int error = 0;          // errno
  std::string operation;  // "pwrite", "ftruncate", "close", ...
};

// A file-access property list using the driver; failures go to `failure`,
// which must outlive the file. With `deferred`, raw-data writes (the chunks
// of H5Dwrite_chunk) are recorded there and made by its writer thread
// (deferred_raw_writes.hpp); the file's close and truncate make them first.
hid_t make_recording_access_list(WriteFailure* failure, DeferredRawWrites* deferred = nullptr);

}  // namespace quantem::arina::detail
