#include "quantem/backend/derived_cache.hpp"

namespace quantem::backend {

std::shared_ptr<const void> DerivedCache::get_or_compute_erased(
    const std::string& key, const std::function<std::shared_ptr<const void>()>& compute) {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = entries_.find(key);
    if (found != entries_.end()) {
      recency_.splice(recency_.begin(), recency_, found->second.position);
      entry = found->second.entry;
    } else {
      recency_.push_front(key);
      entry = std::make_shared<Entry>();
      entries_.emplace(key, Slot{entry, recency_.begin()});
      while (entries_.size() > capacity_) {
        entries_.erase(recency_.back());
        recency_.pop_back();
      }
    }
  }
  // Waiters on the same key block here while the first caller computes.
  std::lock_guard<std::mutex> compute_lock(entry->compute_mutex);
  if (!entry->value) {
    entry->value = compute();
    std::lock_guard<std::mutex> lock(mutex_);
    ++computations_;
  }
  return entry->value;
}

void DerivedCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
  recency_.clear();
}

std::size_t DerivedCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

std::uint64_t DerivedCache::computations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return computations_;
}

}  // namespace quantem::backend
