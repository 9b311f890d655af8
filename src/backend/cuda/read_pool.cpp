#include "read_pool.hpp"

namespace quantem::backend::cuda {

ReadPool::ReadPool(unsigned threads) {
  const unsigned workers = threads > 1 ? threads - 1 : 0;
  for (unsigned i = 0; i < workers; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
}

ReadPool::~ReadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ReadPool::take_items(unsigned participant) {
  for (;;) {
    std::size_t item = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (next_ >= items_ || error_) return;
      item = next_++;
    }
    try {
      (*work_)(item, participant);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++finished_;
  }
}

void ReadPool::worker_loop(unsigned participant) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      ++busy_;
    }
    take_items(participant);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_;
    }
    done_.notify_all();
  }
}

void ReadPool::run(std::size_t items, const std::function<void(std::size_t, unsigned)>& work) {
  if (items == 0) return;
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    work_ = &work;
    items_ = items;
    next_ = 0;
    finished_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  if (items > 1) wake_.notify_all();
  take_items(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // Every item handed out has finished and no worker is still inside this run.
    done_.wait(lock, [&] { return busy_ == 0 && (finished_ == next_); });
    items_ = 0;
    work_ = nullptr;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace quantem::backend::cuda

