#pragma once
// Recycled response bodies. Writing a 1 MB image body into memory the process
// has not touched yet pays a page fault per 4 KiB page; writing it into a
// buffer that held the previous body does not (docs/benchmarks.md,
// bench_host_memory). The pool keeps the strings of bodies that are no longer
// sent or cached and hands them out again, the most recently returned first
// (its pages are the likeliest to be resident and in cache).
//
// Thread-safe: acquire(), release() and the deleters of share() may run on
// any thread at once. A body shared with share() may outlive the pool: its
// string is then simply freed.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace quantem::protocol {

struct BodyPoolLimits {
  std::size_t max_free_buffers = 16;         // strings kept for reuse...
  std::uint64_t max_free_bytes = 64ull << 20;  // ...holding at most this many bytes of capacity
  // A free buffer serves a request only when its capacity is at most this
  // many times the bytes asked for (0: any larger buffer), so a small body
  // does not hold a large buffer for long (e.g. in the image cache, which
  // counts its bodies' sizes, not their capacity).
  std::uint32_t max_capacity_ratio = 2;
};

class BodyPool {
 public:
  struct Stats {
    std::size_t free_buffers = 0;
    std::uint64_t free_bytes = 0;  // capacity of the free buffers
    std::uint64_t reused = 0;      // acquire() answered from a free buffer
    std::uint64_t allocated = 0;   // acquire() answered with a new allocation
  };

  explicit BodyPool(BodyPoolLimits limits = {});
  ~BodyPool();
  BodyPool(const BodyPool&) = delete;
  BodyPool& operator=(const BodyPool&) = delete;

  // An empty string whose capacity() is at least `min_bytes`: the most
  // recently returned free buffer that is large enough (and not more than
  // max_capacity_ratio times too large), else a new allocation of exactly
  // `min_bytes` (whose pages are not touched yet). Throws std::bad_alloc like
  // any allocation.
  std::string acquire(std::size_t min_bytes);

  // Takes a string back for reuse; its contents are discarded. The oldest
  // free buffers are freed while the pool holds more than max_free_buffers or
  // max_free_bytes; a string larger than max_free_bytes is freed at once.
  void release(std::string buffer) noexcept;

  // `body` as shared const bytes (HttpResponse::shared_body, the image
  // cache): when the last owner lets go, the string returns to this pool, or
  // is freed when the pool no longer exists.
  std::shared_ptr<const std::string> share(std::string body);

  Stats stats() const;

 private:
  struct State;
  struct ReturnToPool;            // the deleter of share()'s bodies
  std::shared_ptr<State> state_;  // the deleters hold a weak_ptr to it
};

}  // namespace quantem::protocol
