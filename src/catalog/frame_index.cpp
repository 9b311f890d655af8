// Frame -> (shard, file offset, stored bytes, filter mask), read from each
// shard's chunk index without per-chunk HDF5 calls (see chunk_index.hpp).
//
// Threads: every HDF5 call (opening shards, the H5Dget_chunk_info fallback)
// is made by the calling thread, one shard after the other, because the
// system's HDF5 is not thread-safe. The chunk indexes read directly are then
// cut into parts (B-tree subtrees, entry ranges) that worker threads walk at
// once; each writes the frames its chunks hold into the one result, every frame
// claimed once (atomically). Errors are reported in shard order, as a serial
// walk would; within one malformed index, the first failing part's error.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>

#include "chunk_index.hpp"
#include "dataset_storage.hpp"
#include "hdf5_handles.hpp"
#include "quantem/catalog/acquisition.hpp"
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
  // H5Dget_chunk_info fallback (the handles kept open for it), contiguous data.
  std::optional<detail::ChunkIndexParts> chunk_index;
  hdf5::File file;
  hdf5::Dataset dataset;
  detail::FileAddressing addressing;
  bool hdf5_fallback = false;
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

// O(N^2) on HDF5 1.10.8, but correct for every index kind HDF5 supports.
void visit_chunks_with_hdf5(const hdf5::Dataset& dataset, const detail::FileAddressing& addressing,
                            std::size_t rank, const detail::ChunkVisitor& visit) {
  const hdf5::Dataspace space = dataset.space();
  hsize_t chunk_count = 0;
  if (H5Dget_num_chunks(dataset.id(), space.id(), &chunk_count) < 0) hdf5::throw_error("H5Dget_num_chunks");
  std::vector<hsize_t> offsets(rank);
  std::vector<std::uint64_t> element_offsets(rank);
  for (hsize_t i = 0; i < chunk_count; ++i) {
    unsigned filter_mask = 0;
    haddr_t address = HADDR_UNDEF;
    hsize_t stored_bytes = 0;
    if (H5Dget_chunk_info(dataset.id(), space.id(), i, offsets.data(), &filter_mask, &address, &stored_bytes) < 0) {
      hdf5::throw_error("H5Dget_chunk_info");
    }
    if (address == HADDR_UNDEF) continue;
    std::copy(offsets.begin(), offsets.end(), element_offsets.begin());
    // H5Dget_chunk_info reports addresses relative to the base address (1.10.8).
    visit(element_offsets.data(), addressing.base_address + address, stored_bytes, filter_mask);
  }
}

// Opens a shard and checks it against the inspection (HDF5 calls: the calling
// thread only). Reads the top of its chunk index to cut it into parts.
ShardWalk open_shard(const Shard& shard, const Acquisition& acquisition, std::uint32_t shard_number) {
  ShardWalk walk;
  walk.where = shard.file_path + ":" + shard.dataset_path;
  walk.shard_number = shard_number;
  const std::string& where = walk.where;
  walk.file = hdf5::File::open_read_only(shard.file_path);
  walk.dataset = hdf5::open_dataset(walk.file.id(), shard.dataset_path);
  const hdf5::Dataspace space = walk.dataset.space();
  const int rank = H5Sget_simple_extent_ndims(space.id());
  if (rank < 3) throw Error(ErrorKind::conflict, where + " changed since inspection (rank)");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), max_dims(static_cast<std::size_t>(rank));
  if (H5Sget_simple_extent_dims(space.id(), dims.data(), max_dims.data()) < 0) {
    hdf5::throw_error("H5Sget_simple_extent_dims");
  }
  walk.dims.assign(dims.begin(), dims.end());
  const std::vector<std::uint64_t> max_dims64(max_dims.begin(), max_dims.end());
  if (walk.dims[walk.dims.size() - 2] != acquisition.detector_rows || walk.dims.back() != acquisition.detector_cols) {
    throw Error(ErrorKind::conflict, where + " changed since inspection (detector shape)");
  }

  walk.addressing.offset_size = walk.file.offset_size();
  walk.addressing.length_size = walk.file.length_size();
  walk.addressing.base_address = walk.file.user_block_size();
  walk.raw = std::make_unique<detail::RawFile>(shard.file_path, walk.addressing);
  walk.file_size = walk.raw->size();

  walk.frame_count = 1;
  for (std::size_t d = 0; d + 2 < walk.dims.size(); ++d) walk.frame_count *= walk.dims[d];
  // Every frame needs at least one stored byte: a larger count is a corrupt header.
  if (walk.frame_count > walk.file_size) {
    throw Error(ErrorKind::corrupt_data, where + ": more frames than bytes in the file");
  }
  if (walk.frame_count != shard.frame_count) {
    throw Error(ErrorKind::conflict, where + " changed since inspection (" + std::to_string(walk.frame_count) +
                                         " frames, inspected " + std::to_string(shard.frame_count) + ")");
  }
  const std::size_t element_size = dtype_size(acquisition.dtype.value());
  const std::size_t wanted_parts = kPartsPerThread * useful_threads(walk.frame_count);

  const auto storage = detail::describe_storage(walk.dataset, element_size);
  if (storage.layout == H5D_CONTIGUOUS) {
    const auto offset = walk.dataset.contiguous_offset();
    if (!offset) throw Error(ErrorKind::conflict, where + " has no data written");
    walk.frame_bytes = acquisition.detector_rows * acquisition.detector_cols * element_size;
    if (walk.frame_bytes == 0 || *offset > walk.file_size ||
        walk.frame_count > (walk.file_size - *offset) / walk.frame_bytes) {
      throw Error(ErrorKind::corrupt_data, where + ": the contiguous data extends beyond the end of the file");
    }
    walk.contiguous = true;
    walk.contiguous_offset = *offset;
    const std::uint64_t part_frames = std::max<std::uint64_t>(kFramesPerThread, walk.frame_count / wanted_parts + 1);
    for (std::uint64_t first = 0; first < walk.frame_count; first += part_frames) {
      walk.contiguous_part_starts.push_back(first);
    }
    walk.contiguous_part_starts.push_back(walk.frame_count);
  } else if (storage.layout == H5D_CHUNKED) {
    const detail::DataLayout layout = detail::read_data_layout(*walk.raw, walk.dataset.object_header_address());
    if (layout.layout_class != 2 || layout.element_size != element_size ||
        layout.chunk_dims != std::vector<std::uint64_t>(storage.chunk_dims.begin(), storage.chunk_dims.end())) {
      throw Error(ErrorKind::corrupt_data, where + ": the data layout message disagrees with HDF5's chunk shape");
    }
    walk.chunk_index = detail::split_chunk_index(*walk.raw, layout, walk.dims, max_dims64, wanted_parts);
    if (!walk.chunk_index) {
      spdlog::warn("catalog: {}: chunk index kind '{}' is not read directly; using H5Dget_chunk_info (slow for many "
                   "chunks)",
                   where, detail::chunk_index_kind_name(layout.index_kind));
      walk.hdf5_fallback = true;
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

FrameIndex build_frame_index(const Acquisition& acquisition) {
  if (!acquisition.status.loadable || !acquisition.dtype || !acquisition.detector_shape_known()) {
    throw conflict("acquisition is not loadable: " + acquisition.master_path + " (" + acquisition.status.reason + ")");
  }
  // HDF5 runs on this thread only, under the process-wide lock (the shard
  // handles close before it is released); the chunk-index walkers never call it.
  const std::lock_guard<std::recursive_mutex> hdf5_lock(hdf5::library_mutex());
  FrameIndex index;
  // Open every shard (HDF5: this thread only), up to the first that fails:
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
      shards.push_back(open_shard(shard, acquisition, shard_number));
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
      visit_chunks_with_hdf5(shard.dataset, shard.addressing, shard.dims.size(),
                             [&](const std::uint64_t* element_offsets, std::uint64_t file_offset,
                                 std::uint64_t stored_bytes, std::uint32_t filter_mask) {
                               index.stored_bytes_total +=
                                   sink.add(shard, element_offsets, file_offset, stored_bytes, filter_mask);
                             });
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
