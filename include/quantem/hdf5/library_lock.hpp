#pragma once
// The one lock of libhdf5 in a process (library quantem_hdf5): every reader's
// and writer's entry point that calls HDF5 holds it for its whole run.
#include <mutex>

namespace quantem::hdf5 {

// libhdf5 built without --enable-threadsafe (the default of a source build;
// Debian's package reports H5is_library_threadsafe = 1) must never be called
// from two threads at once, and its state (open identifiers, registered
// filters and drivers, the error stack) is one for the whole process, readers
// and writers alike: the catalog's entry points (inspect_master,
// read_master_metadata, read_shard_storage) and an export's HDF5 calls all
// hold this lock, so none of them overlaps another in HDF5 whatever the build.
// Recursive: an entry point may call another. (The daemon runs the readers in
// its inspector worker, decision 0012; a thread that holds the lock never
// waits for one that needs it: an export's raw-data writer thread makes no
// HDF5 call and never takes it.)
std::recursive_mutex& library_mutex();

// Holds library_mutex() for its lifetime: `const hdf5::LibraryLock hdf5_lock;`.
class LibraryLock {
 public:
  LibraryLock() : lock_(library_mutex()) {}

 private:
  std::lock_guard<std::recursive_mutex> lock_;
};

}  // namespace quantem::hdf5
