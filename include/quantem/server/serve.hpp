#pragma once
// `quantem-gpu serve`: the daemon's start-up, serving and shutdown.
//
// Start-up: options validated (exit 1 with the reference's texts), a
// non-loopback --host refused unless --allow-non-loopback (then a warning),
// the backend created (--backend cuda without a CUDA backend exits 1 with
// "CUDA unavailable: ..."; the CPU backend only when asked for), the port
// bound (a second daemon on the same port fails here, exit 1), the runtime
// files of dead daemons removed and this one's written (0600, with the token
// in token mode; runtime_files.hpp), then the catalog is built in the
// background, /api/health/ready turns 200 and systemd gets READY=1
// (service_manager.hpp). Token mode refuses short tokens and token files
// that others can read (security.hpp).
// Healthy operation prints nothing on stdout; logs go to stderr.
// SIGTERM/SIGINT/SIGHUP: STOPPING=1, ready -> false, the HTTP server stops,
// loads are cancelled, residents released, the runtime file removed, exit 0.
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

// Runs the daemon until SIGTERM/SIGINT/SIGHUP. Returns the process exit code.
int run_serve(const ServeOptions& options);

}  // namespace quantem::server
