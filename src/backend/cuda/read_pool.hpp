#pragma once
// Internal: a small pool of host threads for preads and host decodes. run()
// hands items out one at a time and returns when all are done, rethrowing the
// first exception. The threads never call CUDA.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace quantem::backend::cuda {

class ReadPool {
 public:
  explicit ReadPool(unsigned threads);
  ~ReadPool();
  ReadPool(const ReadPool&) = delete;
  ReadPool& operator=(const ReadPool&) = delete;

  unsigned size() const noexcept { return static_cast<unsigned>(workers_.size()) + 1; }
  // Calls work(item, participant) for item in [0, items); the caller takes part
  // as participant 0. One run at a time.
  void run(std::size_t items, const std::function<void(std::size_t, unsigned)>& work);

 private:
  void worker_loop(unsigned participant);
  void take_items(unsigned participant);

  std::mutex run_mutex_;  // one run at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  const std::function<void(std::size_t, unsigned)>* work_ = nullptr;
  std::size_t items_ = 0;
  std::size_t next_ = 0;
  std::size_t finished_ = 0;
  unsigned busy_ = 0;
  std::uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
};

}  // namespace quantem::backend::cuda
