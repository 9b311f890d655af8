#pragma once
// Saves one plan (scan crop x scan bin x detector bin) of a resident
// acquisition as an Arina-style acquisition: `<name>_master.h5` with external
// links `entry/data/data_000001...` to `<name>_data_000001.h5...`, each data
// file's /entry/data/data chunked one frame per chunk, filter 32008
// (bitshuffle/LZ4), written with H5Dwrite_chunk (docs/protocol.md "Export";
// decision 0016).
//
// Exactness: the exported frames are the plan's frames as the resident holds
// them (bad pixels zeroed): the source's dtype when nothing is binned, uint32
// when a bin sums counts (a value above 2^32 - 1 fails the export with
// conflict, nothing is clipped); partial edge bins are kept (plan library).
//
// Never half-written: everything is written below a hidden folder
// `.<name>.incomplete-export` of the output folder (the catalog skips hidden
// folders) that holds a lock for as long as its writer lives, and the folder
// is renamed to `<name>/` (never replacing anything) only when every file is
// complete. A folder left by a writer that died (it holds the export's marker,
// its lock is free) is removed by the next export into the same output folder;
// nothing without that marker is ever removed.
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "quantem/backend/backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/core/dtype.hpp"
#include "quantem/plan/plan.hpp"

namespace quantem::exporter {

enum class ExportStage : int { queued, writing, finishing, done, failed, cancelled };
const char* export_stage_name(ExportStage stage) noexcept;  // "queued", "writing", ...

// Shared between a running export and its observers (the job route, the CLI's
// progress bar, cancellation).
struct ExportProgress {
  std::atomic<std::uint64_t> frames_done{0};
  std::atomic<std::uint64_t> frames_total{0};
  std::atomic<std::uint64_t> bytes_written{0};  // stored chunk bytes handed to HDF5
  std::atomic<ExportStage> stage{ExportStage::queued};
  std::atomic<bool> cancel_requested{false};
};

struct ExportRequest {
  plan::BrowsePlan plan;
  std::string output_folder;            // must exist; the export is written as <output_folder>/<name>/
  std::uint64_t frames_per_file = 0;    // frames per data file; 0: 100000 (as synth)
  unsigned threads = 0;                 // read+encode workers; 0: hardware concurrency
  std::uint64_t positions_per_batch = 0;  // plan positions one worker reads and encodes at a time; 0: 32
  std::string source_identity;          // recorded with the plan (the daemon's signature digest); may be empty
  std::string implementation_revision;  // recorded with the plan
};

// Seconds spent per stage. read and encode are summed over the workers (CPU
// time of the stage, not wall time); write is the one writer thread's time in
// HDF5; total is the wall time of export_plan.
struct ExportStageSeconds {
  double read = 0.0;
  double encode = 0.0;
  double write = 0.0;
  double write_index = 0.0;    // of write: libhdf5 indexing the chunks (the bytes go out on another thread)
  double write_starved = 0.0;  // the writer waiting for the next encoded batch (not in write)
  double finish = 0.0;  // master, source check, rename
  double total = 0.0;
};

// The stage clocks as a JSON object (nlohmann's json or ordered_json): the
// job's result and the CLI's report carry the same fields.
template <class Json>
Json stage_seconds_document(const ExportStageSeconds& seconds) {
  return Json{{"read", seconds.read},
              {"encode", seconds.encode},
              {"write", seconds.write},
              {"write_index", seconds.write_index},
              {"write_starved", seconds.write_starved},
              {"finish", seconds.finish},
              {"total", seconds.total}};
}

struct ExportReport {
  std::string name;         // "<stem>_<plan>"
  std::string folder;       // <output_folder>/<name>, absolute
  std::string master_path;  // <folder>/<name>_master.h5
  std::uint64_t frames = 0;
  std::uint64_t data_files = 0;
  DType dtype = DType::uint16;
  std::uint64_t scan_rows = 0, scan_cols = 0, detector_rows = 0, detector_cols = 0;
  std::uint64_t stored_bytes = 0;   // sum of the chunks written
  std::uint64_t output_bytes = 0;   // every file of the export on disk
  std::uint64_t source_bytes = 0;   // the source's files (catalog size_bytes)
  std::uint64_t dense_bytes = 0;    // frames x pixels x element size of the export
  std::string encoder;              // "host": frames read with Resident::frames_u32, encoded on the CPU;
                                    // "device": Resident::encode_export_chunks
  ExportStageSeconds seconds;
};

// What the export will write, resolved before anything is touched.
struct ExportLayout {
  plan::PlanGeometry geometry;
  DType dtype = DType::uint16;  // the source's when nothing is binned, else uint32
  std::string name;             // made from the source stem and the plan, a plain file name
  std::uint64_t frames_per_file = 0;
  std::uint64_t data_files = 0;
  std::uint64_t working_bytes = 0;         // the export's own host memory at most (batches in flight)
  std::uint64_t estimated_output_bytes = 0;  // the source's stored bytes scaled to the plan (free-space check)
};

// The output name of a plan: "<stem>" for the whole acquisition unbinned,
// else "<stem>" + "_crop<r0>-<r1>x<c0>-<c1>" (when cropped) + "_scanbin<N>" +
// "_detbin<N>" (when binned). Only [A-Za-z0-9._-] survive from the stem.
std::string export_name(const std::string& source_stem, const plan::PlanGeometry& geometry);

// Resolves the request against the source. Throws quantem::Error:
// bad_request for a bad plan or option, or a name whose files' longest name
// (.<name>.incomplete-export) exceeds the output folder's NAME_MAX;
// unprocessable for a source without a usable shape or dtype.
ExportLayout plan_export(const catalog::Acquisition& source, const ExportRequest& request);

// Exports `layout` (from plan_export for this source and request) from
// `resident`, whose source() must be `source` at the same signature.
// `lock_compute` (may be empty) is taken around each batch of frame reads, so
// requests on the same resident interleave with the export. Runs worker
// threads; makes its HDF5 calls on the calling thread under the one lock of
// libhdf5 (hdf5::LibraryLock). Throws quantem::Error:
//   not_found          the output folder does not exist;
//   io                 the output folder is not writable, or a file cannot be written;
//   conflict           <name>/ already exists (never overwritten), an export of the
//                      same name is running, the source's files changed (before or
//                      during the export), or a binned value exceeds 2^32 - 1;
//   payload_too_large  the free space of the output folder cannot hold the
//                      estimated output, or runs out while writing, or the
//                      working memory cannot be had;
//   unavailable        progress.cancel_requested was set (cancelled).
// On any failure nothing of the export remains but, at most, its hidden
// incomplete folder when the process dies; progress.stage ends done, failed
// or cancelled.
ExportReport export_plan(backend::Resident& resident, const catalog::Acquisition& source, const ExportLayout& layout,
                         const ExportRequest& request, ExportProgress& progress,
                         const std::function<std::unique_lock<std::mutex>()>& lock_compute = {});

// Throws conflict, naming why, unless `folder` exists, is a folder and is
// writable (the export routes check it at each POST).
void check_export_folder(const std::string& folder);

// Removes the incomplete folders of exports whose writer is gone from
// `output_folder`: real folders (never a symlink or a regular file) holding an
// export's marker whose lock is free. Nothing else is ever removed. Returns how many were removed. Never throws.
std::size_t remove_abandoned_exports(const std::string& output_folder) noexcept;

// The suffix of an incomplete export's folder (".<name>" + this).
extern const char* const kIncompleteSuffix;

// Test hook: when the environment variable QUANTEM_EXPORT_FREE_BYTES_FOR_TESTING
// holds a byte count, the free-space checks use it instead of statvfs.
extern const char* const kFreeBytesTestVariable;

}  // namespace quantem::exporter
