#pragma once
// The daemon's crash-isolated master inspection (decision 0012). libhdf5 can
// crash on a crafted master, so the daemon never opens a data-folder master
// with libhdf5 itself: one long-lived child, `quantem-gpu inspect-worker`
// (worker.hpp), started with posix_spawn of the executable (never a bare fork
// of the threaded daemon), inspects them one at a time over a socket pair
// (one JSON line each way, wire.hpp).
//
// Supervision:
//  - a pool of options.workers workers (the daemon: bounded by the cores and
//    --inspect-workers); each request takes a free worker, so one slow or
//    hung file occupies one worker and the others keep answering;
//  - every request has a deadline (options.deadline; a shard's storage:
//    options.storage_deadline);
//  - a worker that dies or breaks the protocol while inspecting a master is
//    a strike against that master: the master is tried again at once on a
//    fresh worker, and only options.strikes_to_condemn strikes in a row (at
//    one signature) condemn it. A worker killed from outside (an OOM killer,
//    an operator) therefore costs nothing; a master that crashes libhdf5
//    every time is condemned on its second crash. A missed deadline condemns
//    at once (a retry would double the stall);
//  - a condemned master is reported not loadable with the reason
//    "master file is not readable HDF5: PATH (the inspector stopped on this
//    file)", and remembered by the master's own signature: asked again, the
//    inspector answers the same without a worker until the master file
//    changes (size, times, inode), forget_failures() is called (a catalog
//    refresh) or forget_failure(master) is (a load asked for by a user);
//  - a worker is restarted on the next request, never more often than once
//    per options.restart_interval per pool slot; a worker that does not start
//    (no hello line within the deadline, three times in a row) makes
//    inspect() throw quantem::Error (unavailable) without remembering the
//    master;
//  - workers are spawned from one long-lived thread of the inspector and ask
//    the kernel for SIGKILL when that thread's process goes (PR_SET_PDEATHSIG,
//    checked against the expected parent after), so a SIGKILLed daemon leaves
//    no worker behind;
//  - shutdown() stops every worker at once, including those in the middle of
//    a request (their callers get quantem::Error unavailable at once), so a
//    hung read never holds up the daemon's shutdown;
//  - each worker runs with RLIMIT_AS = options.address_space_limit_bytes.
// The same workers read the libhdf5 facts build_frame_index needs about each
// shard (shard_storage), under options.storage_deadline.
// Thread-safe; requests run in parallel up to the pool size.
#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <vector>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/catalog.hpp"
#include "quantem/catalog/master_metadata.hpp"
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
  std::size_t workers = 1;         // worker processes (at least 1)
  unsigned strikes_to_condemn = 2;  // crashes in a row on one master before it is condemned (at least 1)
};

// Workers the daemon runs by default: one per core, at most `limit`.
std::size_t default_inspect_workers(std::size_t limit = 8);

// The reason given for a master the worker stopped on.
std::string stopped_reason(const std::string& master_path);

class Inspector {
 public:
  explicit Inspector(InspectorOptions options = {});
  ~Inspector();  // ends the workers (closes their input; SIGKILL after a grace period)
  Inspector(const Inspector&) = delete;
  Inspector& operator=(const Inspector&) = delete;

  // Inspects one master in a worker: what catalog::inspect_master would
  // return, or the stopped reason above. Throws quantem::Error (unavailable)
  // only when no worker can be started or after shutdown().
  catalog::Acquisition inspect(const std::string& master_path);
  // inspect() as a catalog::InspectFunction (valid while this object lives).
  catalog::InspectFunction inspect_function();

  // catalog::read_shard_storage in a worker, for build_frame_index. Throws
  // what it throws there (quantem::Error: io, corrupt_data, conflict,
  // not_found); corrupt_data "the inspector stopped ..." when the worker dies,
  // misses the deadline or breaks the protocol (not remembered: a load is
  // asked for, not retried in a loop); unavailable when no worker starts or
  // after shutdown().
  catalog::ShardStorage shard_storage(const std::string& file_path, const std::string& dataset_path);
  catalog::ShardStorageFunction shard_storage_function();

  // catalog::read_master_metadata in a worker, under options.deadline, for
  // GET /api/browse/metadata. Throws what it throws there (quantem::Error:
  // not_found, corrupt_data, io); corrupt_data "the inspector stopped ..."
  // at once for a condemned master (unchanged since), and when the worker
  // dies, misses the deadline or breaks the protocol (the master is not
  // condemned for it: a metadata request is asked for, not retried in a
  // loop); unavailable when no worker starts or after shutdown().
  catalog::MasterMetadata master_metadata(const std::string& master_path);
  using MetadataFunction = std::function<catalog::MasterMetadata(const std::string& master_path)>;
  MetadataFunction master_metadata_function();

  // Condemned masters are tried again by their next inspection.
  void forget_failures();
  // The same for one master; true when it was condemned.
  bool forget_failure(const std::string& master_path);
  // Stops every worker now (requests in flight end with unavailable) and
  // refuses later requests. Idempotent.
  void shutdown();

  // For tests and metrics.
  std::size_t workers() const { return options_.workers; }
  std::uint64_t worker_starts() const;
  std::uint64_t worker_failures() const;     // deaths, missed deadlines, protocol violations
  std::size_t remembered_failures() const;   // masters answered without a worker
  pid_t worker_pid() const;                  // a running worker's pid (the first slot's first), 0 when none runs
  std::vector<pid_t> worker_pids() const;    // every running worker

 private:
  struct Remembered {
    catalog::SignatureEntry master;
    catalog::Acquisition acquisition;
  };
  struct Slot {
    pid_t pid = 0;
    int socket = -1;
    std::string buffer;
    bool busy = false;
    std::chrono::steady_clock::time_point last_start{};
  };
  class Spawner;
  // not_sent: no worker took the request (it died before; never a strike).
  enum class Outcome { answered, died, missed_deadline, not_sent };

  std::size_t lease_slot();             // blocks until a slot is free; throws unavailable after shutdown()
  // Sends `request` to a leased worker and returns parse(reply). The worker's
  // typed answer about a file is thrown as it came; a reply that breaks the
  // protocol, a refusal, a death or a missed deadline stops that worker and
  // throws corrupt_data naming `what` (never a strike against a master).
  template <class Parse>
  auto ask_worker(const std::string& request, std::chrono::milliseconds deadline, const std::string& what,
                  const Parse& parse) -> decltype(parse(std::string()));
  void release_slot(std::size_t slot);
  bool start_worker(std::size_t slot, std::string& problem);
  // Starts the slot's worker when it has none; throws unavailable when it cannot.
  void ensure_worker(std::size_t slot);
  // Starts the slot's worker when none runs (throws unavailable when it
  // cannot), sends one request and reads the reply.
  Outcome round_trip(std::size_t slot, const std::string& request, std::chrono::milliseconds deadline,
                     std::string& reply, std::string& why);
  void stop_worker(std::size_t slot, const std::string& why);
  // One line from the slot's worker within `limit`; false (with why) otherwise.
  bool read_line(std::size_t slot, std::chrono::milliseconds limit, std::string& line, std::string& why,
                 bool& timed_out);
  // One attempt on a leased slot: the acquisition, or nullopt with why (and whether it timed out).
  std::optional<catalog::Acquisition> inspect_once(const std::string& path, std::string& why, bool& timed_out,
                                                   bool& sent);
  // The verdict kept for a master condemned earlier while the file is unchanged
  // (its signature still `master`); a verdict about an older file is forgotten.
  std::optional<catalog::Acquisition> remembered_verdict(const std::string& master_path,
                                                         const catalog::SignatureEntry& master);
  catalog::Acquisition condemn(const std::string& master_path, const catalog::SignatureEntry& master,
                               const std::string& why);
  void throw_if_stopping() const;

  const InspectorOptions options_;
  std::unique_ptr<Spawner> spawner_;
  mutable std::mutex mutex_;  // the pool's state; never held across a request
  std::condition_variable slot_freed_;
  std::vector<Slot> slots_;
  bool stopping_ = false;
  std::uint64_t starts_ = 0;
  std::uint64_t failures_ = 0;
  std::map<std::string, Remembered> remembered_;
};

}  // namespace quantem::inspector
