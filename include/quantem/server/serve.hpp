#pragma once
// `quantem-gpu serve`: the daemon's start-up, serving and shutdown.
//
// Start-up: options validated (a refusal exits 78, exit_status::configuration,
// with the reference's texts on stderr at error priority), a non-loopback
// --host refused unless --allow-non-loopback (then a warning), the runtime
// folder made ready (created 0700, or an existing one checked and never
// chmod-ed; runtime_files.hpp), the backend created (--backend cuda without a
// usable GPU exits 78 with "CUDA unavailable: ..."; the CPU backend only when
// asked for), the port bound (a second daemon on the same port fails here,
// exit 1), the runtime files of dead daemons removed and this one's written
// (0600, with the token in token mode), then the catalog is built in the
// background, /api/health/ready turns 200 and systemd gets READY=1
// (service_manager.hpp). Token mode refuses short tokens, token files that
// others can read and token files that are not regular files (security.hpp).
// Healthy operation prints nothing on stdout; logs go to stderr, and a log
// stream that closes never stops the daemon.
// SIGTERM/SIGINT: STOPPING=1, ready -> false, the HTTP server stops, loads
// are cancelled, residents released, the runtime file removed, exit 0.
// SIGHUP: the catalog is read again (systemctl reload); a hang-up of the
// terminal the daemon was started on stops it like SIGTERM. With
// --exit-on-stdin-close the end of stdin stops it like SIGTERM.
// SIGUSR1: the status line (state, residents, budgets) is logged.
#include <string>
#include <vector>

#include "quantem/server/serve_options.hpp"

namespace CLI {
class App;
}

namespace quantem::server {

// Declares serve's arguments on a CLI11 subcommand; they fill `options`.
void add_serve_options(CLI::App& serve, ServeOptions& options);

// argparse's allow_abbrev, which the service we replace has on: a long option
// may be given by a unique prefix of its name ("--implementation" for
// "--implementation-revision", also as "--implementation=REV"). Returns
// `arguments` (the subcommand's, after its name) with each such prefix
// replaced by the full name; an exact name always wins, and nothing after a
// bare "--" is touched. A prefix of several names sets `error` to argparse's
// "ambiguous option: --p could match --port, --port-file" (a usage error,
// exit 2) and leaves the arguments unchanged. Unknown names are left for the
// parser to reject.
struct ExpandedArguments {
  std::vector<std::string> arguments;
  std::string error;
};
ExpandedArguments expand_option_prefixes(const CLI::App& command, const std::vector<std::string>& arguments);

// Runs the daemon until it is stopped. Returns the process exit status
// (quantem/core/exit_codes.hpp).
int run_serve(const ServeOptions& options);

}  // namespace quantem::server
