#include "quantem/backend/shard_reader.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "quantem/core/error.hpp"

namespace quantem::backend {

ShardFiles::ShardFiles(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      close_all();
      throw IoError("cannot open " + path + ": " + std::strerror(error));
    }
    fds_.push_back(fd);
  }
}

ShardFiles::~ShardFiles() { close_all(); }

void ShardFiles::close_all() noexcept {
  for (const int fd : fds_) ::close(fd);
  fds_.clear();
}

void read_exactly(int fd, std::uint8_t* out, std::uint64_t bytes, std::uint64_t offset, const std::string& path,
                  std::uint64_t first_frame) {
  std::uint64_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw IoError("reading " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + " of " +
                    path + ": " + std::strerror(errno));
    }
    if (got == 0) {
      throw CorruptChunk(path + " ends at byte " + std::to_string(offset + done) + ", inside the stored chunk of frame " +
                         std::to_string(first_frame) + " or a later frame of the same read (offset " +
                         std::to_string(offset) + ", " + std::to_string(bytes) + " stored bytes)");
    }
    done += static_cast<std::uint64_t>(got);
  }
}

}  // namespace quantem::backend
