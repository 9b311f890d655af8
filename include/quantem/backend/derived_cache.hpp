#pragma once
// Values derived from a Resident by the layers above it (the products module
// keeps its per-plan bright-field fit and CoM maps here), stored on the
// Resident so that they live exactly as long as the data they came from and
// can never be served for another acquisition or a reloaded one.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <typeinfo>
#include <unordered_map>

namespace quantem::backend {

// Thread-safe keyed store with least-recently-used eviction. A value is
// computed once even when several threads ask for the same key at the same
// time (the others wait for it); a computation that throws stores nothing.
class DerivedCache {
 public:
  explicit DerivedCache(std::size_t capacity = 32) : capacity_(capacity == 0 ? 1 : capacity) {}
  DerivedCache(const DerivedCache&) = delete;
  DerivedCache& operator=(const DerivedCache&) = delete;

  // The value stored under (T, key), computing it with compute() when absent.
  template <class T, class Compute>
  std::shared_ptr<const T> get_or_compute(const std::string& key, Compute&& compute) {
    auto erased = get_or_compute_erased(std::string(typeid(T).name()) + '\n' + key, [&compute]() {
      return std::shared_ptr<const void>(std::make_shared<const T>(compute()));
    });
    return std::static_pointer_cast<const T>(erased);
  }

  void clear();
  std::size_t size() const;
  std::uint64_t computations() const;  // how many values were computed (for tests and metrics)

 private:
  struct Entry {
    std::mutex compute_mutex;
    std::shared_ptr<const void> value;
  };
  std::shared_ptr<const void> get_or_compute_erased(const std::string& key,
                                                    const std::function<std::shared_ptr<const void>()>& compute);

  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::list<std::string> recency_;  // most recently used first
  struct Slot {
    std::shared_ptr<Entry> entry;
    std::list<std::string>::iterator position;
  };
  std::unordered_map<std::string, Slot> entries_;
  std::uint64_t computations_ = 0;
};

}  // namespace quantem::backend
