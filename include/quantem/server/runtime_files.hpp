#pragma once
// Runtime files: each running daemon writes `server-<pid>.json` (mode 0600 in
// a 0700 directory) saying where it listens and, in token mode, its token;
// `quantem-gpu info` and clients read them (Jupyter's discovery pattern).
//
// Directory: $QUANTEM_GPU_RUNTIME_DIR, else $XDG_RUNTIME_DIR/quantem-gpu
// (the systemd unit's RuntimeDirectory=), else
// ~/.local/share/quantem-gpu/runtime, else /tmp/quantem-gpu-<uid>.
//
// A daemon killed without a chance to clean up (SIGKILL, OOM killer, a crash)
// leaves its file behind; the next daemon removes such stale files at start,
// and readers skip them, so a dead daemon's file is never taken for a live one.
#include <sys/types.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace quantem::server {

std::string runtime_directory();

// True when `pid` is a running quantem-gpu process (not a reused pid of
// another program).
bool is_live_daemon(pid_t pid);

// The runtime files of live daemons in `directory`, oldest pid first; each
// document as written (url, host, port, pid, version, ..., token). Unreadable
// or malformed files are skipped.
std::vector<nlohmann::ordered_json> live_runtime_files(const std::string& directory);

// Removes every `server-<pid>.json` in `directory` whose pid is not a live
// daemon (other than `own_pid`), logging each once. Returns the removed paths.
std::vector<std::string> remove_stale_runtime_files(const std::string& directory, pid_t own_pid);

}  // namespace quantem::server
