// The frame indexes of recently loaded acquisitions, kept so that a load of
// the same files again (after an eviction, an idle release or a failed load)
// does not walk their chunk indexes again, and so that the index of a load
// can be built before the load is admitted (Backend::prepare_load) while the
// request waits for its device.
//
// An entry is the index of one master at one source signature. It is used
// only while the files still stat as that signature (checked on every use: a
// few stat calls, no HDF5); a changed file gets a new index. Errors are never
// kept: a build that throws is tried again by the next use.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "quantem/catalog/acquisition.hpp"

namespace quantem::catalog {

class FrameIndexCache {
 public:
  explicit FrameIndexCache(std::size_t max_entries = 8, std::size_t max_bytes = std::size_t{256} << 20);

  // The frame index of `acquisition` (build_frame_index): the kept one when
  // its master and signature match and the files still stat as that
  // signature, otherwise built now and kept. Throws what build_frame_index
  // throws. Thread-safe; builds run outside the lock (two threads that miss
  // at once may both build; the later one is kept).
  std::shared_ptr<const FrameIndex> get(const Acquisition& acquisition);

  // The same, but never throws: an acquisition whose index cannot be built is
  // left for the load, which reports the error. Returns whether an index is
  // now kept for it.
  bool prefetch(const Acquisition& acquisition) noexcept;

  std::size_t size() const;
  std::size_t builds() const;  // indexes built since construction (kept-entry hits do not count)
  void clear();

 private:
  struct Entry {
    std::string master_path;
    SourceSignature signature;
    std::shared_ptr<const FrameIndex> index;
    std::size_t bytes = 0;
  };
  void drop_locked(const std::string& master_path);  // the kept entry of this master, if any

  const std::size_t max_entries_;
  const std::size_t max_bytes_;
  mutable std::mutex mutex_;
  std::list<Entry> entries_;  // most recently used first
  std::size_t bytes_ = 0;     // of the kept entries
  std::size_t builds_ = 0;
};

}  // namespace quantem::catalog
