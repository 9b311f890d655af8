#include "quantem/catalog/frame_index_cache.hpp"

#include <algorithm>
#include <utility>

namespace quantem::catalog {

namespace {
std::size_t index_bytes(const FrameIndex& index) {
  std::size_t bytes = index.frames.size() * sizeof(FrameLocation);
  for (const auto& path : index.shard_paths) bytes += sizeof(path) + path.size();
  return bytes;
}
}  // namespace

FrameIndexCache::FrameIndexCache(std::size_t max_entries, std::size_t max_bytes)
    : max_entries_(std::max<std::size_t>(1, max_entries)), max_bytes_(max_bytes) {}

std::shared_ptr<const FrameIndex> FrameIndexCache::get(const Acquisition& acquisition) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->master_path != acquisition.master_path) continue;
      if (it->signature == acquisition.signature && restat_signature(it->signature) == it->signature) {
        entries_.splice(entries_.begin(), entries_, it);
        return entries_.front().index;
      }
      break;  // another signature, or the files changed since: never used again
    }
    drop_locked(acquisition.master_path);
  }
  auto index = std::make_shared<const FrameIndex>(build_frame_index(acquisition));
  const std::size_t bytes = index_bytes(*index);
  std::lock_guard<std::mutex> lock(mutex_);
  ++builds_;
  drop_locked(acquisition.master_path);  // another thread may have kept one meanwhile
  if (acquisition.signature.empty() || bytes > max_bytes_) return index;
  entries_.push_front(Entry{acquisition.master_path, acquisition.signature, index, bytes});
  bytes_ += bytes;
  while (entries_.size() > max_entries_ || bytes_ > max_bytes_) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
  return index;
}

void FrameIndexCache::drop_locked(const std::string& master_path) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->master_path == master_path) {
      bytes_ -= it->bytes;
      entries_.erase(it);
      return;
    }
  }
}

bool FrameIndexCache::prefetch(const Acquisition& acquisition) noexcept {
  try {
    (void)get(acquisition);
    return true;
  } catch (...) {
    return false;
  }
}

std::size_t FrameIndexCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

std::size_t FrameIndexCache::builds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return builds_;
}

void FrameIndexCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
  bytes_ = 0;
}

}  // namespace quantem::catalog
