#include "quantem/backend/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <exception>

namespace quantem::backend {

struct ThreadPool::Loop {
  std::size_t count = 0;
  std::size_t grain = 1;
  std::size_t chunks = 0;
  const Body* body = nullptr;
  std::atomic<std::size_t> next_chunk{0};
  std::atomic<unsigned> next_participant{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::condition_variable finished;
  std::size_t chunks_done = 0;  // guarded by mutex
  std::exception_ptr error;     // guarded by mutex
};

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  participants_ = threads;
  workers_.reserve(threads - 1);
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_main(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::worker_main() {
  for (;;) {
    std::shared_ptr<Loop> loop;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !tickets_.empty(); });
      if (tickets_.empty()) return;  // stopping
      loop = std::move(tickets_.front());
      tickets_.pop_front();
    }
    take_part(*loop);
  }
}

void ThreadPool::take_part(Loop& loop) {
  const unsigned participant = loop.next_participant.fetch_add(1);
  std::size_t done = 0;
  std::exception_ptr error;
  for (;;) {
    const std::size_t chunk = loop.next_chunk.fetch_add(1);
    if (chunk >= loop.chunks) break;
    if (!loop.failed.load(std::memory_order_relaxed)) {
      const std::size_t begin = chunk * loop.grain;
      const std::size_t end = std::min(loop.count, begin + loop.grain);
      try {
        (*loop.body)(begin, end, participant);
      } catch (...) {
        if (!error) error = std::current_exception();
        loop.failed = true;
      }
    }
    ++done;
  }
  if (done == 0 && !error) return;
  std::lock_guard<std::mutex> lock(loop.mutex);
  if (error && !loop.error) loop.error = error;
  loop.chunks_done += done;
  if (loop.chunks_done == loop.chunks) loop.finished.notify_all();
}

void ThreadPool::parallel_for(std::size_t count, std::size_t grain, const Body& body) {
  if (count == 0) return;
  grain = std::max<std::size_t>(1, grain);
  auto loop = std::make_shared<Loop>();
  loop->count = count;
  loop->grain = grain;
  loop->chunks = (count + grain - 1) / grain;
  loop->body = &body;
  const std::size_t helpers = std::min<std::size_t>(workers_.size(), loop->chunks - 1);
  if (helpers > 0) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (std::size_t i = 0; i < helpers; ++i) tickets_.push_back(loop);
    }
    if (helpers == 1) {
      wake_.notify_one();
    } else {
      wake_.notify_all();
    }
  }
  take_part(*loop);
  std::unique_lock<std::mutex> lock(loop->mutex);
  loop->finished.wait(lock, [&] { return loop->chunks_done == loop->chunks; });
  if (loop->error) std::rethrow_exception(loop->error);
}

}  // namespace quantem::backend
