// Frame -> (shard, file offset, stored bytes, filter mask), read from each
// shard's chunk index without per-chunk HDF5 calls (see chunk_index.hpp).
//
// libhdf5 is not called here: each shard's facts come from a
// ShardStorageFunction (shard_storage.cpp, decision 0012). Everything here is pread.
// Threads: the shards' facts are fetched by the calling thread, one shard
// after the other. The chunk indexes read directly are then
// cut into parts (B-tree subtrees, entry ranges) that worker threads walk at
// once; each writes the frames its chunks hold into the one result, every frame
// claimed once (atomically). Errors are reported in shard order, as a serial
// walk would; within one malformed index, the first failing part's error.
#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>

#include "chunk_index.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/shard_storage.hpp"
#include "quantem/core/error.hpp"

namespace quantem::catalog {

namespace {

// A thread walks at least this many frames: starting one costs tens of
// microseconds, walking the index entries of 4096 frames a few hundred.
constexpr std::uint64_t kFramesPerThread = 4096;
// A shard's index is cut into this many parts per thread that could walk it,
// so that threads finishing early take the parts left.
constexpr std::size_t kPartsPerThread = 4;

unsigned hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

// Threads worth using for `frames` frames.
std::size_t useful_threads(std::uint64_t frames) {
  return static_cast<std::size_t>(
      std::max<std::uint64_t>(1, std::min<std::uint64_t>(hardware_threads(), frames / kFramesPerThread)));
}

// One shard, opened by the calling thread and ready to be walked.
struct ShardWalk {
  std::string where;  // "<file>:<dataset>" for messages
  std::uint32_t shard_number = 0;
  std::vector<std::uint64_t> dims;
  std::uint64_t frame_count = 0;
  std::uint64_t first_frame = 0;  // of this shard in FrameIndex::frames
  std::uint64_t file_size = 0;
  std::unique_ptr<detail::RawFile> raw;
  // Exactly one of: the chunk index read directly (cut into parts), the
  // chunks HDF5 listed (H5Dget_chunk_info fallback), contiguous data.
  std::optional<detail::ChunkIndexParts> chunk_index;
  detail::FileAddressing addressing;
  bool hdf5_fallback = false;
  std::vector<ShardChunk> listed_chunks;
  bool contiguous = false;
  std::uint64_t contiguous_offset = 0;
  std::uint64_t frame_bytes = 0;
  std::vector<std::uint64_t> contiguous_part_starts;  // first frame of each part, then frame_count
  std::exception_ptr error;  // the first error of the HDF5 fallback

  std::size_t part_count() const {
    if (chunk_index) return chunk_index->parts.size();
    if (contiguous) return contiguous_part_starts.size() - 1;
    return 0;
  }
};

// The frames of every shard in one FrameIndex::frames; each frame can be
// claimed once. add() may be called from several threads at once.
class FrameSink {
 public:
  explicit FrameSink(std::vector<FrameLocation>& frames) : frames_(frames), claimed_(frames.size()) {}

  // Stores a chunk of `shard` by its element offsets; returns its stored bytes
  // (0 for a chunk beyond the shard's current extent, which is skipped).
  std::uint64_t add(const ShardWalk& shard, const std::uint64_t* element_offsets, std::uint64_t file_offset,
                    std::uint64_t stored_bytes, std::uint32_t filter_mask) {
    const std::size_t rank = shard.dims.size();
    std::uint64_t frame = 0;
    for (std::size_t d = 0; d + 2 < rank; ++d) {
      if (element_offsets[d] >= shard.dims[d]) return 0;  // beyond the current extent (dataset shrunk): not a frame
      frame = frame * shard.dims[d] + element_offsets[d];
    }
    if (element_offsets[rank - 2] != 0 || element_offsets[rank - 1] != 0) {
      throw Error(ErrorKind::corrupt_data, shard.where + ": chunk offsets are not frame-aligned");
    }
    return add_frame(shard, frame, file_offset, stored_bytes, filter_mask);
  }

  std::uint64_t add_frame(const ShardWalk& shard, std::uint64_t frame, std::uint64_t file_offset,
                          std::uint64_t stored_bytes, std::uint32_t filter_mask) {
    if (stored_bytes == 0 || file_offset > shard.file_size || stored_bytes > shard.file_size - file_offset) {
      throw Error(ErrorKind::corrupt_data, shard.where + ": the chunk of frame " + std::to_string(frame) + " (" +
                                               std::to_string(stored_bytes) + " bytes at " +
                                               std::to_string(file_offset) + ") lies outside the file");
    }
    const std::uint64_t slot = shard.first_frame + frame;
    if (claimed_[slot].exchange(1, std::memory_order_relaxed) != 0) {
      throw Error(ErrorKind::corrupt_data, shard.where + ": frame " + std::to_string(frame) + " has two chunks");
    }
    FrameLocation& location = frames_[slot];
    location.shard = shard.shard_number;
    location.file_offset = file_offset;
    location.stored_bytes = stored_bytes;
    location.filter_mask = filter_mask;
    return stored_bytes;
  }

  // Throws when a frame of `shard` has no chunk (call after every walk has joined).
  void require_complete(const ShardWalk& shard) const {
    for (std::uint64_t frame = 0; frame < shard.frame_count; ++frame) {
      if (claimed_[shard.first_frame + frame].load(std::memory_order_relaxed) == 0) {
        throw Error(ErrorKind::corrupt_data, shard.where + ": frame " + std::to_string(frame) + " has no stored chunk");
      }
    }
  }

 private:
  std::vector<FrameLocation>& frames_;
  std::vector<std::atomic<std::uint8_t>> claimed_;
};

// Checks a shard's facts against the inspection and opens it for pread.
// Reads the top of its chunk index to cut it into parts.
ShardWalk open_shard(const Shard& shard, const Acquisition& acquisition, std::uint32_t shard_number,
                     const ShardStorageFunction& storage_source) {
  ShardWalk walk;
  walk.where = shard.file_path + ":" + shard.dataset_path;
  walk.shard_number = shard_number;
  const std::string& where = walk.where;
  ShardStorage storage = storage_source(shard.file_path, shard.dataset_path);
  const std::size_t rank = storage.dims.size();
  if (rank < 3) throw Error(ErrorKind::conflict, where + " changed since inspection (rank)");
  if (storage.max_dims.size() != rank) throw Error(ErrorKind::corrupt_data, where + ": extent and maximum differ in rank");
  walk.dims = storage.dims;
  if (walk.dims[rank - 2] != acquisition.detector_rows || walk.dims.back() != acquisition.detector_cols) {
    throw Error(ErrorKind::conflict, where + " changed since inspection (detector shape)");
  }

  walk.addressing.offset_size = static_cast<std::size_t>(storage.offset_size);
  walk.addressing.length_size = static_cast<std::size_t>(storage.length_size);
  walk.addressing.base_address = storage.base_address;
  walk.raw = std::make_unique<detail::RawFile>(shard.file_path, walk.addressing);
  walk.file_size = walk.raw->size();

  walk.frame_count = 1;
  for (std::size_t d = 0; d + 2 < rank; ++d) {
    // Every frame needs at least one stored byte: a larger count is a corrupt header.
    if (walk.dims[d] != 0 && walk.frame_count > walk.file_size / walk.dims[d]) {
      throw Error(ErrorKind::corrupt_data, where + ": more frames than bytes in the file");
    }
    walk.frame_count *= walk.dims[d];
  }
  if (walk.frame_count > walk.file_size) {
    throw Error(ErrorKind::corrupt_data, where + ": more frames than bytes in the file");
  }
  if (walk.frame_count != shard.frame_count) {
    throw Error(ErrorKind::conflict, where + " changed since inspection (" + std::to_string(walk.frame_count) +
                                         " frames, inspected " + std::to_string(shard.frame_count) + ")");
  }
  const std::size_t element_size = dtype_size(acquisition.dtype.value());
  const std::size_t wanted_parts = kPartsPerThread * useful_threads(walk.frame_count);

  if (storage.layout == ShardLayout::contiguous) {
    if (!storage.contiguous_offset) throw Error(ErrorKind::conflict, where + " has no data written");
    const std::uint64_t offset = *storage.contiguous_offset;
    walk.frame_bytes = acquisition.detector_rows * acquisition.detector_cols * element_size;
    if (walk.frame_bytes == 0 || offset > walk.file_size ||
        walk.frame_count > (walk.file_size - offset) / walk.frame_bytes) {
      throw Error(ErrorKind::corrupt_data, where + ": the contiguous data extends beyond the end of the file");
    }
    walk.contiguous = true;
    walk.contiguous_offset = offset;
    const std::uint64_t part_frames = std::max<std::uint64_t>(kFramesPerThread, walk.frame_count / wanted_parts + 1);
    for (std::uint64_t first = 0; first < walk.frame_count; first += part_frames) {
      walk.contiguous_part_starts.push_back(first);
    }
    walk.contiguous_part_starts.push_back(walk.frame_count);
  } else if (storage.layout == ShardLayout::chunked) {
    const detail::DataLayout layout = detail::read_data_layout(*walk.raw, storage.object_header_address);
    if (layout.layout_class != 2 || layout.element_size != element_size || layout.chunk_dims != storage.chunk_dims) {
      throw Error(ErrorKind::corrupt_data, where + ": the data layout message disagrees with HDF5's chunk shape");
    }
    walk.chunk_index = detail::split_chunk_index(*walk.raw, layout, walk.dims, storage.max_dims, wanted_parts);
    if (!walk.chunk_index) {
      if (!storage.chunks_listed) {
        throw Error(ErrorKind::corrupt_data, where + ": chunk index kind '" +
                                                 detail::chunk_index_kind_name(layout.index_kind) +
                                                 "' is not read directly and HDF5 listed no chunks");
      }
      for (const auto& chunk : storage.chunks) {
        if (chunk.element_offsets.size() != rank) {
          throw Error(ErrorKind::corrupt_data, where + ": a listed chunk's offsets differ in rank");
        }
      }
      walk.hdf5_fallback = true;
      walk.listed_chunks = std::move(storage.chunks);
    }
  } else {
    throw Error(ErrorKind::conflict, where + " changed since inspection (storage layout)");
  }
  return walk;
}

// One part of one shard's walk.
struct Task {
  std::size_t shard = 0;
  std::size_t part = 0;
  std::uint64_t stored_bytes = 0;
  std::exception_ptr error;
};

void run_task(const ShardWalk& shard, FrameSink& sink, Task& task) {
  if (shard.contiguous) {
    for (std::uint64_t frame = shard.contiguous_part_starts[task.part];
         frame < shard.contiguous_part_starts[task.part + 1]; ++frame) {
      task.stored_bytes += sink.add_frame(shard, frame, shard.contiguous_offset + frame * shard.frame_bytes,
                                          shard.frame_bytes, 0);
    }
    return;
  }
  detail::visit_chunk_index_part(*shard.raw, *shard.chunk_index, task.part,
                                 [&](const std::uint64_t* element_offsets, std::uint64_t file_offset,
                                     std::uint64_t stored_bytes, std::uint32_t filter_mask) {
                                   task.stored_bytes +=
                                       sink.add(shard, element_offsets, file_offset, stored_bytes, filter_mask);
                                 });
}

// Runs every task on up to `threads` threads (the calling one included). Tasks
// are taken in order; after one fails no new one starts, so every task before
// the first failure (in order) has run.
void run_tasks(const std::vector<ShardWalk>& shards, FrameSink& sink, std::vector<Task>& tasks, std::size_t threads) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  const auto work = [&] {
    for (std::size_t i = next.fetch_add(1); i < tasks.size() && !failed.load(); i = next.fetch_add(1)) {
      try {
        run_task(shards[tasks[i].shard], sink, tasks[i]);
      } catch (...) {
        tasks[i].error = std::current_exception();
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> workers;
  for (std::size_t t = 1; t < threads; ++t) {
    try {
      workers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads: the ones started (and this one) do the rest
    }
  }
  work();
  for (auto& worker : workers) worker.join();
}


}  // namespace

FrameIndex build_frame_index(const Acquisition& acquisition, const ShardStorageFunction& storage) {
  if (!acquisition.status.loadable || !acquisition.dtype || !acquisition.detector_shape_known()) {
    throw conflict("acquisition is not loadable: " + acquisition.master_path + " (" + acquisition.status.reason + ")");
  }
  FrameIndex index;
  // Open every shard (its facts fetched by this thread), up to the first that fails:
  // that error comes after any error of the shards before it.
  std::vector<ShardWalk> shards;
  shards.reserve(acquisition.shards.size());
  std::exception_ptr open_error;
  std::uint64_t total_frames = 0;
  for (const auto& shard : acquisition.shards) {
    const auto found = std::find(index.shard_paths.begin(), index.shard_paths.end(), shard.file_path);
    const auto shard_number = static_cast<std::uint32_t>(found - index.shard_paths.begin());
    if (found == index.shard_paths.end()) index.shard_paths.push_back(shard.file_path);
    try {
      shards.push_back(open_shard(shard, acquisition, shard_number, storage));
    } catch (...) {
      open_error = std::current_exception();
      break;
    }
    shards.back().first_frame = total_frames;
    total_frames += shards.back().frame_count;
  }

  index.frames.resize(total_frames);
  FrameSink sink(index.frames);
  for (auto& shard : shards) {
    if (!shard.hdf5_fallback) continue;
    try {
      for (const auto& chunk : shard.listed_chunks) {
        index.stored_bytes_total +=
            sink.add(shard, chunk.element_offsets.data(), chunk.file_offset, chunk.stored_bytes, chunk.filter_mask);
      }
    } catch (...) {
      shard.error = std::current_exception();
    }
  }

  std::vector<Task> tasks;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    for (std::size_t part = 0; part < shards[s].part_count(); ++part) {
      Task task;
      task.shard = s;
      task.part = part;
      tasks.push_back(task);
    }
  }
  run_tasks(shards, sink, tasks, std::min(tasks.size(), useful_threads(total_frames)));

  // Errors in shard order: a shard's walk, its missing frames, then the open
  // that failed.
  std::size_t task = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    if (shards[s].error) std::rethrow_exception(shards[s].error);
    for (; task < tasks.size() && tasks[task].shard == s; ++task) {
      if (tasks[task].error) std::rethrow_exception(tasks[task].error);
      index.stored_bytes_total += tasks[task].stored_bytes;
    }
    sink.require_complete(shards[s]);
  }
  if (open_error) std::rethrow_exception(open_error);
  if (index.frames.size() != acquisition.stored_frames) {
    throw conflict(acquisition.master_path + " changed since inspection (" + std::to_string(index.frames.size()) +
                   " frames indexed, " + std::to_string(acquisition.stored_frames) + " inspected)");
  }
  return index;
}

}  // namespace quantem::catalog
