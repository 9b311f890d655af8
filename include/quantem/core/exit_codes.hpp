#pragma once
// The exit statuses of quantem-gpu (docs/deploy.md "Exit statuses"). The
// systemd unit names the configuration statuses in RestartPreventExitStatus=:
// restarting cannot fix them.
namespace quantem::exit_status {

constexpr int ok = 0;
// Something failed that a restart may fix: the port or socket is taken, a
// file could not be written, the server stopped on its own.
constexpr int failure = 1;
// The command line cannot be parsed (unknown or ambiguous option, missing
// argument), as argparse and CLI11 report it.
constexpr int usage = 2;
// The configuration is refused (sysexits.h EX_CONFIG): an option value out of
// range, no usable GPU for --backend cuda, a token or token file that is
// refused, an unsafe runtime folder.
constexpr int configuration = 78;

}  // namespace quantem::exit_status
