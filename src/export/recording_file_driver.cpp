#include "recording_file_driver.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "quantem/core/error.hpp"
#include "quantem/export/deferred_raw_writes.hpp"

namespace quantem::arina::detail {

namespace {

// The driver's file-access information: where to record failures.
struct DriverInfo {
  WriteFailure* failure = nullptr;
  DeferredRawWrites* deferred = nullptr;  // raw-data writes recorded there, made by its writer thread
};

struct RecordingFile {
  H5FD_t pub;  // first: HDF5 hands this struct's address to every callback
  int fd = -1;
  haddr_t eoa = 0;
  haddr_t eof = 0;
  dev_t device = 0;
  ino_t inode = 0;
  WriteFailure* failure = nullptr;
  DeferredRawWrites* deferred = nullptr;
  std::string path;  // for the deferred writes' errors
  // Writes the file did not take (after the first failure), in order.
  std::vector<std::pair<haddr_t, std::vector<std::uint8_t>>> kept;
};

RecordingFile* as_file(H5FD_t* file) { return reinterpret_cast<RecordingFile*>(file); }
const RecordingFile* as_file(const H5FD_t* file) { return reinterpret_cast<const RecordingFile*>(file); }

void record(RecordingFile& file, const char* operation, int error) {
  if (file.failure && file.failure->error == 0) {
    file.failure->error = error == 0 ? EIO : error;
    file.failure->operation = operation;
  }
}

bool failed(const RecordingFile& file) { return file.failure && file.failure->error != 0; }

void* copy_info(const void* info) {
  auto* copy = static_cast<DriverInfo*>(std::malloc(sizeof(DriverInfo)));
  if (copy && info) std::memcpy(copy, info, sizeof(DriverInfo));
  return copy;
}

herr_t free_info(void* info) {
  std::free(info);
  return 0;
}

void* file_info(H5FD_t* file) {
  const DriverInfo info{as_file(file)->failure, as_file(file)->deferred};
  return copy_info(&info);
}

H5FD_t* open_file(const char* name, unsigned flags, hid_t fapl, haddr_t /*maxaddr*/) {
  const auto* info = static_cast<const DriverInfo*>(H5Pget_driver_info(fapl));
  int open_flags = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_TRUNC) open_flags |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) open_flags |= O_CREAT;
  if (flags & H5F_ACC_EXCL) open_flags |= O_EXCL;
  const int fd = ::open(name, open_flags | O_CLOEXEC, 0666);
  struct stat status {};
  if (fd < 0 || ::fstat(fd, &status) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    // Reported to HDF5, not recorded: a failed open leaves no file behind in
    // libhdf5, and H5Fcreate first tries an open without O_CREAT (ENOENT).
    H5Epush2(H5E_DEFAULT, __FILE__, "open_file", __LINE__, H5E_ERR_CLS, H5E_VFL, H5E_CANTOPENFILE, "open %s: %s",
             name, std::strerror(error));
    return nullptr;
  }
  auto* file = new RecordingFile();
  file->fd = fd;
  file->eof = static_cast<haddr_t>(status.st_size);
  file->device = status.st_dev;
  file->inode = status.st_ino;
  file->failure = info ? info->failure : nullptr;
  file->deferred = info ? info->deferred : nullptr;
  file->path = name;
  return &file->pub;
}

// Makes the file's deferred chunk writes before anything else touches the
// descriptor (their errors are the DeferredRawWrites' to report).
void make_deferred_writes(RecordingFile& file) {
  if (file.deferred == nullptr) return;
  try {
    file.deferred->wait_for_all();
  } catch (const Error&) {
  }
}

herr_t close_file(H5FD_t* handle) {
  RecordingFile* file = as_file(handle);
  make_deferred_writes(*file);
  if (::close(file->fd) != 0) record(*file, "close", errno);
  delete file;
  return 0;
}

int compare_files(const H5FD_t* a, const H5FD_t* b) {
  const RecordingFile* x = as_file(a);
  const RecordingFile* y = as_file(b);
  if (x->device != y->device) return x->device < y->device ? -1 : 1;
  if (x->inode != y->inode) return x->inode < y->inode ? -1 : 1;
  return 0;
}

herr_t query(const H5FD_t* /*file*/, unsigned long* flags) {
  if (flags) {
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
             H5FD_FEAT_AGGREGATE_SMALLDATA;
  }
  return 0;
}

haddr_t get_eoa(const H5FD_t* file, H5FD_mem_t /*type*/) { return as_file(file)->eoa; }

herr_t set_eoa(H5FD_t* file, H5FD_mem_t /*type*/, haddr_t address) {
  as_file(file)->eoa = address;
  return 0;
}

haddr_t get_eof(const H5FD_t* file, H5FD_mem_t /*type*/) { return as_file(file)->eof; }

herr_t get_handle(H5FD_t* file, hid_t /*fapl*/, void** handle) {
  *handle = &as_file(file)->fd;
  return 0;
}

// Copies the parts of the kept writes that overlap [address, address + size).
void overlay_kept(const RecordingFile& file, haddr_t address, std::size_t size, std::uint8_t* out) {
  for (const auto& [start, bytes] : file.kept) {
    const haddr_t begin = std::max<haddr_t>(start, address);
    const haddr_t end = std::min<haddr_t>(start + bytes.size(), address + size);
    if (begin < end) std::memcpy(out + (begin - address), bytes.data() + (begin - start), end - begin);
  }
}

herr_t read_file(H5FD_t* handle, H5FD_mem_t /*type*/, hid_t /*dxpl*/, haddr_t address, size_t size, void* buffer) {
  RecordingFile* file = as_file(handle);
  auto* out = static_cast<std::uint8_t*>(buffer);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t got = ::pread(file->fd, out + done, size - done, static_cast<off_t>(address + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) record(*file, "pread", errno);
    if (got <= 0) break;
    done += static_cast<std::size_t>(got);
  }
  std::memset(out + done, 0, size - done);  // past the end of the file, or unreadable
  overlay_kept(*file, address, size, out);
  return 0;
}

herr_t write_file(H5FD_t* handle, H5FD_mem_t type, hid_t /*dxpl*/, haddr_t address, size_t size,
                  const void* buffer) {
  RecordingFile* file = as_file(handle);
  if (type == H5FD_MEM_DRAW && file->deferred != nullptr) {
    file->deferred->record(file->fd, file->path.c_str(), address, buffer, size);
    file->eof = std::max<haddr_t>(file->eof, address + size);
    return 0;
  }
  const auto* bytes = static_cast<const std::uint8_t*>(buffer);
  std::size_t done = 0;
  while (!failed(*file) && done < size) {
    const ssize_t wrote = ::pwrite(file->fd, bytes + done, size - done, static_cast<off_t>(address + done));
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) {
      record(*file, "pwrite", wrote < 0 ? errno : ENOSPC);
      break;
    }
    done += static_cast<std::size_t>(wrote);
  }
  if (done < size) file->kept.emplace_back(address + done, std::vector<std::uint8_t>(bytes + done, bytes + size));
  file->eof = std::max<haddr_t>(file->eof, address + size);
  return 0;
}

herr_t truncate_file(H5FD_t* handle, hid_t /*dxpl*/, hbool_t /*closing*/) {
  RecordingFile* file = as_file(handle);
  make_deferred_writes(*file);
  if (file->eoa == file->eof) return 0;
  if (!failed(*file) && ::ftruncate(file->fd, static_cast<off_t>(file->eoa)) != 0) record(*file, "ftruncate", errno);
  file->eof = file->eoa;
  return 0;
}

const H5FD_class_t kDriverClass = {
    "quantem_recording",
    static_cast<haddr_t>(std::numeric_limits<off_t>::max()),
    H5F_CLOSE_WEAK,
    nullptr,  // terminate
    nullptr,  // sb_size
    nullptr,  // sb_encode
    nullptr,  // sb_decode
    sizeof(DriverInfo),
    file_info,
    copy_info,
    free_info,
    0,        // dxpl_size
    nullptr,  // dxpl_copy
    nullptr,  // dxpl_free
    open_file,
    close_file,
    compare_files,
    query,
    nullptr,  // get_type_map
    nullptr,  // alloc
    nullptr,  // free
    get_eoa,
    set_eoa,
    get_eof,
    get_handle,
    read_file,
    write_file,
    nullptr,  // flush: every write is a pwrite
    truncate_file,
    nullptr,  // lock
    nullptr,  // unlock
    H5FD_FLMAP_DICHOTOMY,
};

hid_t driver_id() {
  static std::mutex mutex;
  static hid_t id = -1;
  std::lock_guard<std::mutex> lock(mutex);
  if (id < 0 || H5Iis_valid(id) <= 0) id = H5FDregister(&kDriverClass);
  if (id < 0) throw HdfError("HDF5: cannot register the export's file driver");
  return id;
}

}  // namespace

hid_t make_recording_access_list(WriteFailure* failure, DeferredRawWrites* deferred) {
  const hid_t list = H5Pcreate(H5P_FILE_ACCESS);
  if (list < 0) throw HdfError("HDF5: H5Pcreate(H5P_FILE_ACCESS)");
  const DriverInfo info{failure, deferred};
  if (H5Pset_driver(list, driver_id(), &info) < 0) {
    H5Pclose(list);
    throw HdfError("HDF5: cannot select the export's file driver");
  }
  return list;
}

}  // namespace quantem::arina::detail
