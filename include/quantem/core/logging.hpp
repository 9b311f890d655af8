#pragma once
// Where quantem-gpu's log lines go and how they look: stderr only (stdout
// stays quiet). Under systemd ($JOURNAL_STREAM set: stderr is the journal)
// each line starts with its sd-daemon(3) priority prefix ("<3>" error ...
// "<7>" debug) and carries no time (the journal adds it); on a terminal with
// colours; otherwise plain lines with a time stamp and the level.
//
// A log stream that goes away (a closed pipe, a closed terminal) never stops
// the process: the caller ignores SIGPIPE (ignore_broken_pipes) and the
// lines are written with write(2), whose EPIPE/EBADF/EIO are dropped.
#include <optional>
#include <string>

namespace quantem::logging {

enum class Level { trace, debug, info, warn, error };

// "trace", "debug", "info", "warn" (or "warning"), "error"; case-insensitive;
// nullopt for anything else.
std::optional<Level> parse_level(const std::string& name);

// The level names as a user writes them: "trace|debug|info|warn|error".
const char* level_names();

// The environment variable that sets the level of every subcommand
// (a command-line --log-level wins).
constexpr const char* kLevelVariable = "QUANTEM_GPU_LOG_LEVEL";

// Makes the default spdlog logger write to stderr as described above, at
// $QUANTEM_GPU_LOG_LEVEL when it names a level, else info.
void configure();

void set_level(Level level);

// SIGPIPE ignored: a write to a closed pipe or socket returns EPIPE instead
// of killing the process. Inherited by the children (the inspector worker).
void ignore_broken_pipes();

// True when the lines carry the journal's priority prefix.
bool journal_mode();

// A message that ends the process (a refused start-up): at error priority
// under systemd ("<3>" on every line), otherwise the bare text on stderr
// (what the replaced service printed, without time or level).
void fatal(const std::string& message);

}  // namespace quantem::logging
