#pragma once
// A small fixed pool for data-parallel loops, the one thread pool of both
// backends: the CPU resident's primitives and the CPU load run on it, the CUDA
// load's preads and host decodes too. The calling thread always takes part in
// its own loop, so parallel_for never deadlocks when the workers are busy with
// other callers' loops (several requests, or loads on several devices, share
// one pool).
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace quantem::backend {

class ThreadPool {
 public:
  // `threads` participants per loop in total (the caller plus threads-1
  // workers); 0 means the hardware concurrency.
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return participants_; }

  // Calls body(begin, end, participant) for consecutive chunks of `grain`
  // items covering [0, count). `participant` is unique among the threads
  // running this loop at one time and < size(), so it can index per-thread
  // scratch. Returns when every chunk has run; rethrows the first exception
  // (the remaining chunks are skipped).
  using Body = std::function<void(std::size_t begin, std::size_t end, unsigned participant)>;
  void parallel_for(std::size_t count, std::size_t grain, const Body& body);

 private:
  struct Loop;
  void worker_main();
  static void take_part(Loop& loop);

  unsigned participants_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Loop>> tickets_;  // one entry per invited worker
  bool stopping_ = false;
};

}  // namespace quantem::backend
