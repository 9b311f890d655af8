#include "quantem/export/deferred_raw_writes.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <climits>
#include <cstring>

#include "quantem/core/error.hpp"

namespace quantem::arina {

DeferredRawWrites::DeferredRawWrites() : writer_([this] { work(); }) {}

DeferredRawWrites::~DeferredRawWrites() {
  flush();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    work_done_.wait(lock, [&] { return completed_ == tickets_; });
    stopping_ = true;
  }
  work_ready_.notify_all();
  writer_.join();
}

std::uint64_t DeferredRawWrites::flush() {
  std::uint64_t ticket = 0;
  bool handed = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!recorded_.empty()) {
      jobs_.push_back(std::move(recorded_));
      recorded_.clear();
      ++tickets_;
      handed = true;
    }
    ticket = tickets_;
  }
  if (handed) work_ready_.notify_one();
  return ticket;
}

void DeferredRawWrites::wait_for(std::uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return completed_ >= ticket; });
  if (error_number_ == 0) return;
  // As the recording driver's File::check_writes words them.
  if (error_number_ == ENOSPC || error_number_ == EDQUOT || error_number_ == EFBIG) {
    throw payload_too_large("the disk holding " + error_path_ + " is full: " + std::strerror(error_number_) +
                            " (pwritev)");
  }
  throw IoError("cannot write " + error_path_ + ": " + std::strerror(error_number_) + " (pwritev)");
}

void DeferredRawWrites::record(int fd, const char* path, std::uint64_t offset, const void* bytes, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  recorded_.push_back(Write{fd, path, offset, bytes, size});
}

void DeferredRawWrites::work() {
  for (;;) {
    std::vector<Write> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    make_writes(job);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++completed_;
    }
    work_done_.notify_all();
  }
}

void DeferredRawWrites::fail(int error_number, const char* path) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_number_ == 0) {
    error_number_ = error_number;
    error_path_ = path;
  }
}

// Runs of writes that continue each other in one file go out as one pwritev
// of up to IOV_MAX pieces (chunks are placed one after another at the end of
// the file); a short write continues from where it stopped.
void DeferredRawWrites::make_writes(const std::vector<Write>& writes) {
  std::vector<iovec> pieces;
  for (std::size_t first = 0; first < writes.size();) {
    std::size_t end = first + 1;
    while (end < writes.size() && end - first < IOV_MAX && writes[end].fd == writes[first].fd &&
           writes[end].offset == writes[end - 1].offset + writes[end - 1].size) {
      ++end;
    }
    pieces.clear();
    for (std::size_t i = first; i < end; ++i) pieces.push_back(iovec{const_cast<void*>(writes[i].bytes), writes[i].size});
    std::uint64_t at = writes[first].offset;
    std::size_t piece = 0;
    while (piece < pieces.size()) {
      const ssize_t put = ::pwritev(writes[first].fd, pieces.data() + piece, static_cast<int>(pieces.size() - piece),
                                    static_cast<off_t>(at));
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) {
        fail(put < 0 ? errno : ENOSPC, writes[first].path);
        return;
      }
      at += static_cast<std::uint64_t>(put);
      for (std::size_t left = static_cast<std::size_t>(put); left > 0;) {  // skip what was written
        const std::size_t step = std::min(left, pieces[piece].iov_len);
        pieces[piece].iov_base = static_cast<unsigned char*>(pieces[piece].iov_base) + step;
        pieces[piece].iov_len -= step;
        left -= step;
        if (pieces[piece].iov_len == 0) ++piece;
      }
    }
    first = end;
  }
}

}  // namespace quantem::arina
