#include "quantem/export/deferred_raw_writes.hpp"

#include <H5FDpublic.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <climits>
#include <cstring>
#include <new>

#include "quantem/core/error.hpp"

namespace quantem::arina {
namespace {

// The driver's file: HDF5's public part first (libhdf5 fills it).
struct DriverFile {
  H5FD_t pub;
  int fd;
  char* path;  // strdup'ed: the struct stays standard-layout
  haddr_t eoa;
  haddr_t eof;
  DeferredRawWrites* writes;
};
static_assert(offsetof(DriverFile, pub) == 0, "libhdf5 hands the driver its H5FD_t: the file's first member");

// What a file access list carries to open(): the pool.
struct DriverInfo {
  DeferredRawWrites* writes;
};

DriverFile* as_file(H5FD_t* file) { return reinterpret_cast<DriverFile*>(file); }
const DriverFile* as_file(const H5FD_t* file) { return reinterpret_cast<const DriverFile*>(file); }

H5FD_t* driver_open(const char* name, unsigned flags, hid_t access, haddr_t) {
  const auto* info = static_cast<const DriverInfo*>(H5Pget_driver_info(access));
  if (info == nullptr || info->writes == nullptr) return nullptr;
  int mode = (flags & H5F_ACC_RDWR) != 0 ? O_RDWR : O_RDONLY;
  if ((flags & H5F_ACC_CREAT) != 0) mode |= O_CREAT;
  if ((flags & H5F_ACC_TRUNC) != 0) mode |= O_TRUNC;
  if ((flags & H5F_ACC_EXCL) != 0) mode |= O_EXCL;
  const int fd = ::open(name, mode | O_CLOEXEC, 0666);
  if (fd < 0) return nullptr;
  struct stat status{};
  if (::fstat(fd, &status) != 0) {
    ::close(fd);
    return nullptr;
  }
  auto* file = new (std::nothrow) DriverFile();
  char* path = ::strdup(name);
  if (file == nullptr || path == nullptr) {
    delete file;
    std::free(path);
    ::close(fd);
    return nullptr;
  }
  std::memset(&file->pub, 0, sizeof file->pub);
  file->fd = fd;
  file->path = path;
  file->eoa = 0;
  file->eof = static_cast<haddr_t>(status.st_size);
  file->writes = info->writes;
  return &file->pub;
}

herr_t driver_close(H5FD_t* handle) {
  DriverFile* file = as_file(handle);
  try {
    file->writes->wait_for_all();  // its chunks are on disk (or their error kept for the caller)
  } catch (...) {
  }
  const int status = ::close(file->fd);
  std::free(file->path);
  delete file;
  return status == 0 ? 0 : -1;
}

herr_t driver_query(const H5FD_t*, unsigned long* flags) {
  *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
           H5FD_FEAT_AGGREGATE_SMALLDATA;
  return 0;
}

haddr_t driver_get_eoa(const H5FD_t* file, H5FD_mem_t) { return as_file(file)->eoa; }

herr_t driver_set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t address) {
  as_file(file)->eoa = address;
  return 0;
}

haddr_t driver_get_eof(const H5FD_t* file, H5FD_mem_t) { return as_file(file)->eof; }

herr_t driver_read(H5FD_t* handle, H5FD_mem_t, hid_t, haddr_t address, size_t size, void* buffer) {
  DriverFile* file = as_file(handle);
  auto* out = static_cast<unsigned char*>(buffer);
  while (size > 0) {
    const ssize_t got = ::pread(file->fd, out, size, static_cast<off_t>(address));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) {  // past the end of the file: zeros, as sec2
      std::memset(out, 0, size);
      break;
    }
    out += got;
    address += static_cast<haddr_t>(got);
    size -= static_cast<size_t>(got);
  }
  return 0;
}

herr_t driver_write(H5FD_t* handle, H5FD_mem_t type, hid_t, haddr_t address, size_t size, const void* buffer) {
  DriverFile* file = as_file(handle);
  if (type == H5FD_MEM_DRAW) {
    file->writes->record(file->fd, file->path, address, buffer, size);
  } else {
    const auto* in = static_cast<const unsigned char*>(buffer);
    for (std::size_t left = size, at = address; left > 0;) {
      const ssize_t put = ::pwrite(file->fd, in, left, static_cast<off_t>(at));
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) return -1;
      in += put;
      at += static_cast<std::size_t>(put);
      left -= static_cast<std::size_t>(put);
    }
  }
  if (address + size > file->eof) file->eof = address + size;
  return 0;
}

herr_t driver_truncate(H5FD_t* handle, hid_t, hbool_t) {
  DriverFile* file = as_file(handle);
  try {
    file->writes->wait_for_all();
  } catch (...) {
  }
  if (file->eoa == file->eof) return 0;
  if (::ftruncate(file->fd, static_cast<off_t>(file->eoa)) != 0) return -1;
  file->eof = file->eoa;
  return 0;
}

H5FD_class_t make_driver_class() {
  H5FD_class_t c{};
  c.name = "quantem_deferred_raw_writes";
  c.maxaddr = static_cast<haddr_t>(INT64_MAX);
  c.fc_degree = H5F_CLOSE_WEAK;
  c.fapl_size = sizeof(DriverInfo);
  c.open = driver_open;
  c.close = driver_close;
  c.query = driver_query;
  c.get_eoa = driver_get_eoa;
  c.set_eoa = driver_set_eoa;
  c.get_eof = driver_get_eof;
  c.read = driver_read;
  c.write = driver_write;
  c.truncate = driver_truncate;
  const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
  for (int i = 0; i < H5FD_MEM_NTYPES; ++i) c.fl_map[i] = map[i];
  return c;
}

// Registered once per process (HDF5 keeps the class).
hid_t driver_id() {
  static const H5FD_class_t driver_class = make_driver_class();
  static const hid_t id = H5FDregister(&driver_class);
  if (id < 0) throw HdfError("H5FDregister: the deferred raw-write driver");
  return id;
}

}  // namespace

DeferredRawWrites::DeferredRawWrites() : writer_([this] { work(); }) {}

DeferredRawWrites::~DeferredRawWrites() {
  flush();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    work_done_.wait(lock, [&] { return completed_ == tickets_; });
    stopping_ = true;
  }
  work_ready_.notify_all();
  writer_.join();
}

hid_t DeferredRawWrites::make_file_access() const {
  const hid_t access = H5Pcreate(H5P_FILE_ACCESS);
  if (access < 0) throw HdfError("H5Pcreate(file access)");
  const DriverInfo info{const_cast<DeferredRawWrites*>(this)};
  if (H5Pset_driver(access, driver_id(), &info) < 0) {
    H5Pclose(access);
    throw HdfError("H5Pset_driver: the deferred raw-write driver");
  }
  return access;
}

std::uint64_t DeferredRawWrites::flush() {
  std::uint64_t ticket = 0;
  bool handed = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!recorded_.empty()) {
      jobs_.push_back(std::move(recorded_));
      recorded_.clear();
      ++tickets_;
      handed = true;
    }
    ticket = tickets_;
  }
  if (handed) work_ready_.notify_one();
  return ticket;
}

void DeferredRawWrites::wait_for(std::uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return completed_ >= ticket; });
  if (error_number_ == 0) return;
  const std::string text = "writing " + error_path_ + ": " + std::strerror(error_number_);
  if (error_number_ == ENOSPC || error_number_ == EDQUOT) {
    throw payload_too_large("the export folder ran out of space (" + text + ")");
  }
  throw IoError(text);
}

void DeferredRawWrites::record(int fd, const char* path, std::uint64_t offset, const void* bytes, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  recorded_.push_back(Write{fd, path, offset, bytes, size});
}

void DeferredRawWrites::work() {
  for (;;) {
    std::vector<Write> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    make_writes(job);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++completed_;
    }
    work_done_.notify_all();
  }
}

void DeferredRawWrites::fail(int error_number, const char* path) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_number_ == 0) {
    error_number_ = error_number;
    error_path_ = path;
  }
}

// Runs of writes that continue each other in one file go out as one pwritev
// of up to IOV_MAX pieces (chunks are placed one after another at the end of
// the file); a short write continues from where it stopped.
void DeferredRawWrites::make_writes(const std::vector<Write>& writes) {
  std::vector<iovec> pieces;
  for (std::size_t first = 0; first < writes.size();) {
    std::size_t end = first + 1;
    while (end < writes.size() && end - first < IOV_MAX && writes[end].fd == writes[first].fd &&
           writes[end].offset == writes[end - 1].offset + writes[end - 1].size) {
      ++end;
    }
    pieces.clear();
    for (std::size_t i = first; i < end; ++i) pieces.push_back(iovec{const_cast<void*>(writes[i].bytes), writes[i].size});
    std::uint64_t at = writes[first].offset;
    std::size_t piece = 0;
    while (piece < pieces.size()) {
      const ssize_t put = ::pwritev(writes[first].fd, pieces.data() + piece, static_cast<int>(pieces.size() - piece),
                                    static_cast<off_t>(at));
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) {
        fail(put < 0 ? errno : ENOSPC, writes[first].path);
        return;
      }
      at += static_cast<std::uint64_t>(put);
      for (std::size_t left = static_cast<std::size_t>(put); left > 0;) {  // skip what was written
        const std::size_t step = std::min(left, pieces[piece].iov_len);
        pieces[piece].iov_base = static_cast<unsigned char*>(pieces[piece].iov_base) + step;
        pieces[piece].iov_len -= step;
        left -= step;
        if (pieces[piece].iov_len == 0) ++piece;
      }
    }
    first = end;
  }
}

}  // namespace quantem::arina
