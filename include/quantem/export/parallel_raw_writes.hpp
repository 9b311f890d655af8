#pragma once
// Part of quantem_arina_writer: an HDF5 file driver whose raw-data writes
// (the chunks of H5Dwrite_chunk) are done by a pool of threads, while libhdf5
// goes on with the next chunk's index and space bookkeeping (decision 0023).
// Metadata is read and written synchronously, as by HDF5's sec2 driver; the
// files are ordinary HDF5 files (the driver stores nothing in them).
//
// The caller keeps every chunk buffer it passed to H5Dwrite_chunk alive until
// the writes that read it are done: ticket() after the calls, then
// wait_for(ticket). A failed write (EIO, ENOSPC, ...) is kept, and the next
// wait throws it: Error(payload_too_large) when the disk or a quota is full,
// else IoError; libhdf5 never sees it, so no HDF5 close ever fails on it.
#include <hdf5.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace quantem::arina {

class ParallelRawWrites {
 public:
  explicit ParallelRawWrites(unsigned threads);
  // Waits for every write (errors are dropped: the caller failed already).
  ~ParallelRawWrites();
  ParallelRawWrites(const ParallelRawWrites&) = delete;
  ParallelRawWrites& operator=(const ParallelRawWrites&) = delete;

  // A file access list for H5Fcreate whose driver sends this pool the raw
  // writes (libver bounds still to be set by the caller).
  hid_t make_file_access() const;

  // Writes submitted so far; wait_for(ticket) returns once they are done.
  std::uint64_t ticket() const;
  // Throws the first failed write (see above), once every write up to the ticket is done.
  void wait_for(std::uint64_t ticket);
  void wait_for_all() { wait_for(ticket()); }

  // The driver's side.
  void submit(int fd, const char* path, std::uint64_t offset, const void* bytes, std::size_t size);

 private:
  struct Write {
    int fd;
    const char* path;
    std::uint64_t offset;
    const void* bytes;
    std::size_t size;
  };
  void work();
  void write_one(const Write& write);

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::deque<Write> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t completed_ = 0;
  bool stopping_ = false;
  int error_number_ = 0;
  std::string error_path_;
  std::vector<std::thread> threads_;
};

}  // namespace quantem::arina
