#pragma once
// Runtime files: each running daemon writes `server-<pid>.json` (mode 0600 in
// a 0700 directory) saying where it listens and, in token mode, its token;
// `quantem-gpu info` and clients read them (Jupyter's discovery pattern).
//
// Directory: $QUANTEM_GPU_RUNTIME_DIR, else $XDG_RUNTIME_DIR/quantem-gpu
// (the systemd unit's RuntimeDirectory=), else
// ~/.local/share/quantem-gpu/runtime, else /tmp/quantem-gpu-<uid>; a shared
// sticky folder (1777, like /tmp) gets a private subfolder quantem-gpu-<uid>.
//
// A daemon killed without a chance to clean up (SIGKILL, OOM killer, a crash)
// leaves its file behind; the next daemon removes such stale files at start,
// and readers skip them, so a dead daemon's file is never taken for a live one.
#include <sys/types.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace quantem::server {

// $QUANTEM_GPU_RUNTIME_DIR, else $XDG_RUNTIME_DIR/quantem-gpu, else
// ~/.local/share/quantem-gpu/runtime, else /tmp/quantem-gpu-<uid>.
std::string configured_runtime_directory();

// Where this user's runtime files are: the configured folder, or, when that
// is a shared sticky folder such as /tmp (mode 1777), the private subfolder
// `quantem-gpu-<uid>` inside it.
std::string runtime_directory();

// Makes `directory` ready for this daemon's runtime file. A missing folder is
// created with mode 0700 (its missing parents with the usual mode); an
// existing one is used as it is, never chmod-ed: it is refused when it is not
// a folder, belongs to another user, or others may write it without the
// sticky bit. Returns the refusal (a configuration error), empty when usable.
std::string prepare_runtime_directory(const std::string& directory);

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
