#pragma once
// The daemon's crash-isolated master inspection (decision 0012). libhdf5 can
// crash on a crafted master, so the daemon never opens a data-folder master
// with libhdf5 itself: one long-lived child, `quantem-gpu inspect-worker`
// (worker.hpp), started with posix_spawn of the executable (never a bare fork
// of the threaded daemon), inspects them one at a time over a socket pair
// (one JSON line each way, wire.hpp).
//
// Supervision:
//  - every request has a deadline (options.deadline; a shard's storage:
//    options.storage_deadline);
//  - when the worker dies, misses the deadline or breaks the protocol, the
//    master in flight is reported not loadable with the reason
//    "master file is not readable HDF5: PATH (the inspector stopped on this
//    file)", and remembered by the master's own signature: asked again, the
//    inspector answers the same without a worker until the master file
//    changes (size, times, inode). A master that crashes the worker through a
//    linked file is retried only when the master itself changes;
//  - the worker is restarted on the next request, never more often than once
//    per options.restart_interval; a worker that does not start (no hello
//    line within the deadline, three times in a row) makes inspect() throw
//    quantem::Error (unavailable) without remembering the master;
//  - the worker runs with RLIMIT_AS = options.address_space_limit_bytes.
// The same worker reads the libhdf5 facts build_frame_index needs about each
// shard (shard_storage), under options.storage_deadline.
// Thread-safe; requests are serialised (one worker).
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/catalog.hpp"
#include "quantem/catalog/shard_storage.hpp"

namespace quantem::inspector {

struct InspectorOptions {
  std::string executable = "/proc/self/exe";  // a quantem-gpu binary (tests name the built one)
  std::chrono::milliseconds deadline{std::chrono::seconds(10)};  // an inspection, and the worker's start
  // A shard's storage: longer, since listing the chunks of an extensible
  // array or v2 B-tree through H5Dget_chunk_info is O(N^2) in the chunks (a
  // shard of tens of thousands takes far longer than an inspection), as it
  // was in-process.
  std::chrono::milliseconds storage_deadline{std::chrono::minutes(2)};
  std::uint64_t address_space_limit_bytes = std::uint64_t{4} << 30;  // 0: no limit
  std::chrono::milliseconds restart_interval{100};
};

// The reason given for a master the worker stopped on.
std::string stopped_reason(const std::string& master_path);

class Inspector {
 public:
  explicit Inspector(InspectorOptions options = {});
  ~Inspector();  // ends the worker (closes its input; SIGKILL after a grace period)
  Inspector(const Inspector&) = delete;
  Inspector& operator=(const Inspector&) = delete;

  // Inspects one master in the worker: what catalog::inspect_master would
  // return, or the stopped reason above. Throws quantem::Error (unavailable)
  // only when no worker can be started.
  catalog::Acquisition inspect(const std::string& master_path);
  // inspect() as a catalog::InspectFunction (valid while this object lives).
  catalog::InspectFunction inspect_function();

  // catalog::read_shard_storage in the worker, for build_frame_index. Throws
  // what it throws there (quantem::Error: io, corrupt_data, conflict,
  // not_found); corrupt_data "the inspector stopped ..." when the worker dies,
  // misses the deadline or breaks the protocol (not remembered: a load is
  // asked for, not retried in a loop); unavailable when no worker starts.
  catalog::ShardStorage shard_storage(const std::string& file_path, const std::string& dataset_path);
  catalog::ShardStorageFunction shard_storage_function();

  // For tests and metrics.
  std::uint64_t worker_starts() const;
  std::uint64_t worker_failures() const;     // deaths, missed deadlines, protocol violations
  std::size_t remembered_failures() const;   // masters answered without a worker
  pid_t worker_pid() const;                  // 0 when no worker runs

 private:
  struct Remembered {
    catalog::SignatureEntry master;
    catalog::Acquisition acquisition;
  };
  bool start_worker_locked(std::string& problem);
  // Starts the worker when none runs (throws unavailable when it cannot),
  // sends one request and reads the reply; false (with why) when the worker
  // failed, which is then stopped and counted.
  bool exchange_locked(const std::string& request, std::chrono::milliseconds deadline, std::string& reply,
                       std::string& why);
  void stop_worker_locked(const std::string& why);
  // One line from the worker within `limit`; false (with why) otherwise.
  bool read_line_locked(std::chrono::milliseconds limit, std::string& line, std::string& why);
  catalog::Acquisition failure_locked(const std::string& master_path, const catalog::SignatureEntry& master,
                                      const std::string& why);

  const InspectorOptions options_;
  mutable std::mutex mutex_;
  pid_t pid_ = 0;
  int socket_ = -1;
  std::string buffer_;
  std::chrono::steady_clock::time_point last_start_{};
  std::uint64_t starts_ = 0;
  std::uint64_t failures_ = 0;
  std::map<std::string, Remembered> remembered_;
};

}  // namespace quantem::inspector
