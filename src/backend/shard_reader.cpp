#include "quantem/backend/shard_reader.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/codec/chunk_codec.hpp"
#include "quantem/core/error.hpp"

namespace quantem::backend {
namespace {

// The installed test hook; null in production. Replaced hooks are kept (a
// read in flight could still hold one); tests install a handful at most.
std::atomic<const ShardReadHook*> installed_read_hook{nullptr};

ssize_t pread_with_hook(int fd, std::uint8_t* out, std::uint64_t bytes, std::uint64_t offset, const std::string& path) {
  if (const ShardReadHook* hook = installed_read_hook.load(std::memory_order_acquire)) {
    if (const int injected = (*hook)(path, offset, bytes); injected != 0) {
      errno = injected;
      return -1;
    }
  }
  return ::pread(fd, out, bytes, static_cast<off_t>(offset));
}

}  // namespace

void set_shard_read_hook_for_testing(ShardReadHook hook) {
  static std::vector<std::unique_ptr<const ShardReadHook>> kept;
  const ShardReadHook* installed = nullptr;
  if (hook) {
    kept.push_back(std::make_unique<const ShardReadHook>(std::move(hook)));
    installed = kept.back().get();
  }
  installed_read_hook.store(installed, std::memory_order_release);
}

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
    const ssize_t got = pread_with_hook(fd, out + done, bytes - done, offset + done, path);
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

std::string describe_undecodable_frame(const catalog::Acquisition& acquisition, const catalog::FrameIndex& index,
                                       std::uint64_t frame) {
  const catalog::FrameLocation& location = index.frames[frame];
  return "frame " + std::to_string(frame) + " (scan row " + std::to_string(frame / acquisition.scan_cols) +
         ", column " + std::to_string(frame % acquisition.scan_cols) + ") of " + index.shard_paths[location.shard] +
         " does not decode (chunk at byte " + std::to_string(location.file_offset) + ", " +
         std::to_string(location.stored_bytes) + " stored bytes)";
}

void decode_stored_frame(const catalog::Acquisition& acquisition, const catalog::FrameIndex& index,
                         std::uint64_t frame, const std::uint8_t* stored, std::uint8_t* out,
                         std::uint64_t frame_bytes) {
  const catalog::FrameLocation& location = index.frames[frame];
  codec::ChunkFormat format = acquisition.chunk_format;
  if ((location.filter_mask & 1u) != 0) format.filter = codec::ChunkFilter::none;
  try {
    codec::decode_chunk(format, stored, location.stored_bytes, out, frame_bytes);
  } catch (const Error& error) {
    throw CorruptChunk(describe_undecodable_frame(acquisition, index, frame) + ": " + error.what());
  }
}

}  // namespace quantem::backend
