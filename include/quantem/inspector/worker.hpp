#pragma once
// `quantem-gpu inspect-worker`: the child process that inspects masters for
// the daemon (decision 0012). It reads request lines (inspector/wire.hpp) on
// stdin and writes one reply line per request on stdout, until stdin ends.
// Logs go to stderr (the daemon's).
//
// Test hooks, read from the environment at start (never set by the daemon):
//   QUANTEM_TEST_INSPECTOR_ABORT_ON=NAME  abort() when asked about a file
//                                         named NAME (a master to inspect or
//                                         whose metadata to read, or a
//                                         shard whose storage to read);
//   QUANTEM_TEST_INSPECTOR_HANG_ON=NAME   never answer about that file;
//   QUANTEM_TEST_INSPECTOR_ABORT_ONCE=NAME:MARKER
//                                         abort() when asked about NAME while
//                                         the file MARKER does not exist
//                                         (created first: one crash in all).
#include <cstdint>
#include <string>

namespace quantem::inspector {

struct WorkerOptions {
  // RLIMIT_AS set before the first request (0: unchanged), so a malloc of a
  // size read from a crafted file fails instead of swapping.
  std::uint64_t address_space_limit_bytes = 0;
  // The daemon that started it: the worker asks for SIGKILL when its parent
  // goes (PR_SET_PDEATHSIG) and exits at once when the parent is already
  // another process (the daemon died before the request took effect). 0: not checked.
  long parent_pid = 0;
};

// The reply line (no newline) to one request line. Never throws.
std::string answer_request(const std::string& line);

// The worker's loop on stdin/stdout; returns the process exit status.
int run_inspect_worker(const WorkerOptions& options);

}  // namespace quantem::inspector
