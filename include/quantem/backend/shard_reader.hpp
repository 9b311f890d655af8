#pragma once
// Reading stored chunks straight from the shard files with pread, for every
// backend's loader (the frame index says where each chunk lives).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace quantem::catalog {
struct Acquisition;
struct FrameIndex;
}  // namespace quantem::catalog

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

// "frame F (scan row R, column C) of SHARD does not decode (chunk at byte O,
// N stored bytes)": how every backend names a chunk that fails to decode.
std::string describe_undecodable_frame(const catalog::Acquisition& acquisition, const catalog::FrameIndex& index,
                                       std::uint64_t frame);

// Decodes one frame's stored chunk on the host (a chunk whose filter-mask bit
// 0 is set was stored unfiltered). Throws CorruptChunk naming the frame, its
// scan position and its file.
void decode_stored_frame(const catalog::Acquisition& acquisition, const catalog::FrameIndex& index,
                         std::uint64_t frame, const std::uint8_t* stored, std::uint8_t* out,
                         std::uint64_t frame_bytes);

// Fault injection for tests (docs/testing.md): when installed, the hook runs
// before every pread of read_exactly with the shard's path, the read's offset
// and size. It may act on the file (truncate, delete or rewrite it) or sleep;
// returning a non-zero errno value makes that pread fail with it (EIO: a read
// error), returning 0 lets the read run. Install and remove (an empty hook)
// only while no load reads; the check costs one relaxed atomic load per read.
using ShardReadHook = std::function<int(const std::string& path, std::uint64_t offset, std::uint64_t bytes)>;
void set_shard_read_hook_for_testing(ShardReadHook hook);

}  // namespace quantem::backend
