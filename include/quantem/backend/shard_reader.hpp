#pragma once
// Reading stored chunks straight from the shard files with pread, for every
// backend's loader (the frame index says where each chunk lives).
#include <cstdint>
#include <string>
#include <vector>

namespace quantem::backend {

// Open read-only file descriptors of an acquisition's shards, closed on every
// exit path. Throws IoError naming the file that cannot be opened.
class ShardFiles {
 public:
  explicit ShardFiles(const std::vector<std::string>& paths);
  ~ShardFiles();
  ShardFiles(const ShardFiles&) = delete;
  ShardFiles& operator=(const ShardFiles&) = delete;
  int fd(std::size_t shard) const { return fds_.at(shard); }

 private:
  void close_all() noexcept;
  std::vector<int> fds_;
};

// Reads exactly `bytes` bytes at `offset` of a shard into `out` (host memory),
// retrying short reads. Throws IoError on a read failure and CorruptChunk when
// the file ends inside the read (`first_frame` names the first frame it holds).
void read_exactly(int fd, std::uint8_t* out, std::uint64_t bytes, std::uint64_t offset, const std::string& path,
                  std::uint64_t first_frame);

}  // namespace quantem::backend
