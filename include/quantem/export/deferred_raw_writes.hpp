#pragma once
// Part of quantem_arina_writer: the raw-data writes of H5Dwrite_chunk (the
// chunks' bytes), recorded by the writer's file driver (ShardFile with
// DeferredRawWrites) instead of made, so that libhdf5's per-chunk index and
// space bookkeeping is all the calling thread does; flush() hands the
// recorded writes to a writer thread, which makes them in file order, runs of
// adjacent chunks in one pwritev (decision 0023). The files are ordinary HDF5
// files.
//
// The caller keeps every chunk buffer it passed to H5Dwrite_chunk alive until
// the writes that read it are done: flush() returns their ticket, wait_for()
// waits for it. A failed write (EIO, ENOSPC, ...) is kept, and the next wait
// throws it: Error(payload_too_large) when the disk, a quota or the file size
// limit is full, else IoError; libhdf5 never sees it, so no HDF5 close ever
// fails on it. One thread makes the HDF5 calls (HDF5 is serialised anyway).
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace quantem::arina {

class DeferredRawWrites {
 public:
  DeferredRawWrites();
  // Makes every recorded write (errors are dropped: the caller failed already).
  ~DeferredRawWrites();
  DeferredRawWrites(const DeferredRawWrites&) = delete;
  DeferredRawWrites& operator=(const DeferredRawWrites&) = delete;

  // Hands the writes recorded so far to the writer thread; returns the ticket
  // that wait_for() takes for them.
  std::uint64_t flush();
  // Throws the first failed write (see above) once the writes of `ticket` are done.
  void wait_for(std::uint64_t ticket);
  void wait_for_all() { wait_for(flush()); }

  // The driver's side: a raw write to make later.
  void record(int fd, const char* path, std::uint64_t offset, const void* bytes, std::size_t size);

 private:
  struct Write {
    int fd;
    const char* path;
    std::uint64_t offset;
    const void* bytes;
    std::size_t size;
  };
  void work();
  void make_writes(const std::vector<Write>& writes);
  void fail(int error_number, const char* path);

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::vector<Write> recorded_;
  std::deque<std::vector<Write>> jobs_;
  std::uint64_t tickets_ = 0;    // jobs handed over
  std::uint64_t completed_ = 0;  // jobs made
  bool stopping_ = false;
  int error_number_ = 0;
  std::string error_path_;
  std::thread writer_;
};

}  // namespace quantem::arina
