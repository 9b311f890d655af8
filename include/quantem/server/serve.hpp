#pragma once
// `quantem-gpu serve`: the daemon's start-up, serving and shutdown.
//
// Start-up: options validated (exit 1 with the reference's texts), a
// non-loopback --host refused unless --allow-non-loopback (then a warning),
// the backend created (--backend cuda without a CUDA backend exits 1 with
// "CUDA unavailable: ..."; the CPU backend only when asked for), the port
// bound (a second daemon on the same port fails here, exit 1), the runtime
// file written (0600, with the token in token mode), then the catalog is
// built in the background and /api/health/ready turns 200.
// Healthy operation prints nothing on stdout; logs go to stderr.
// SIGTERM/SIGINT: ready -> false, the HTTP server stops, loads are cancelled,
// residents released, the runtime file removed, exit 0.
#include "quantem/server/serve_options.hpp"

namespace CLI {
class App;
}

namespace quantem::server {

// Declares serve's arguments on a CLI11 subcommand; they fill `options`.
void add_serve_options(CLI::App& serve, ServeOptions& options);

// Runs the daemon until SIGTERM/SIGINT. Returns the process exit code.
int run_serve(const ServeOptions& options);

}  // namespace quantem::server
