#include "quantem/protocol/body_pool.hpp"

#include <algorithm>
#include <iterator>
#include <mutex>
#include <vector>

namespace quantem::protocol {

struct BodyPool::State {
  explicit State(BodyPoolLimits limits_) : limits(limits_) {
    free.reserve(std::min<std::size_t>(limits.max_free_buffers, 64));
  }

  // release() and the deleters of share(). Never throws: a buffer that
  // cannot be kept is freed.
  void give_back(std::string buffer) noexcept {
    const std::uint64_t bytes = buffer.capacity();
    if (limits.max_free_buffers == 0 || bytes > limits.max_free_bytes) return;
    buffer.clear();
    std::vector<std::string> evicted;  // freed after the mutex is let go
    try {
      std::lock_guard<std::mutex> lock(mutex);
      // Oldest first, until the buffer fits both bounds (it fits an empty pool).
      std::size_t drop = 0;
      std::uint64_t kept_bytes = free_bytes;
      while (free.size() - drop >= limits.max_free_buffers || kept_bytes + bytes > limits.max_free_bytes) {
        kept_bytes -= free[drop].capacity();
        ++drop;
      }
      if (drop > 0) {
        evicted.reserve(drop);
        std::move(free.begin(), free.begin() + static_cast<std::ptrdiff_t>(drop), std::back_inserter(evicted));
        free.erase(free.begin(), free.begin() + static_cast<std::ptrdiff_t>(drop));
        free_bytes = kept_bytes;
      }
      free.push_back(std::move(buffer));
      free_bytes += bytes;
    } catch (...) {
      // An allocation for the bookkeeping failed: the buffer is freed instead.
    }
  }

  const BodyPoolLimits limits;
  mutable std::mutex mutex;
  std::vector<std::string> free;  // most recently returned last
  std::uint64_t free_bytes = 0;
  std::uint64_t reused = 0;
  std::uint64_t allocated = 0;
};

// Back to the pool while it exists.
struct BodyPool::ReturnToPool {
  std::weak_ptr<State> pool;
  void operator()(const std::string* body) const noexcept {
    // The string was made non-const by share(); only its owners saw it const.
    std::unique_ptr<std::string> owned(const_cast<std::string*>(body));
    if (const auto state = pool.lock()) state->give_back(std::move(*owned));
  }
};

BodyPool::BodyPool(BodyPoolLimits limits) : state_(std::make_shared<State>(limits)) {}

BodyPool::~BodyPool() = default;

std::string BodyPool::acquire(std::size_t min_bytes) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto& free = state_->free;
    const std::uint32_t ratio = state_->limits.max_capacity_ratio;
    for (auto it = free.rbegin(); it != free.rend(); ++it) {
      if (it->capacity() < min_bytes) continue;
      if (ratio != 0 && it->capacity() / ratio > min_bytes) continue;  // far larger than asked
      std::string buffer = std::move(*it);
      free.erase(std::next(it).base());
      state_->free_bytes -= buffer.capacity();
      ++state_->reused;
      return buffer;
    }
    ++state_->allocated;
  }
  std::string buffer;
  buffer.reserve(min_bytes);
  return buffer;
}

void BodyPool::release(std::string buffer) noexcept { state_->give_back(std::move(buffer)); }

std::shared_ptr<const std::string> BodyPool::share(std::string body) {
  // On an allocation failure of the control block the deleter runs (the
  // string goes back to the pool).
  return std::shared_ptr<const std::string>(new std::string(std::move(body)), ReturnToPool{state_});
}

BodyPool::Stats BodyPool::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  Stats stats;
  stats.free_buffers = state_->free.size();
  stats.free_bytes = state_->free_bytes;
  stats.reused = state_->reused;
  stats.allocated = state_->allocated;
  return stats;
}

}  // namespace quantem::protocol
