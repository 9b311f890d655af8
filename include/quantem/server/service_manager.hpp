#pragma once
// Notifications to the service manager (systemd Type=notify, sd_notify(3)):
// READY=1 once the daemon is ready (the moment /api/health/ready turns 200),
// STATUS=<one line> (residents, budgets), STOPPING=1 at the start of the
// shutdown, WATCHDOG=1 when the unit sets WatchdogSec=.
//
// Sent through libsystemd when the build has it (QUANTEM_HAVE_SYSTEMD, Debian
// libsystemd-dev); without $NOTIFY_SOCKET every call does nothing. A build
// without libsystemd sends nothing and warns once when $NOTIFY_SOCKET is set.
// Thread-safe; never throws.
#include <chrono>
#include <string>

namespace quantem::server {

class ServiceManagerNotifier {
 public:
  ServiceManagerNotifier();

  static bool available_in_build() noexcept;
  bool active() const noexcept { return active_; }  // built with libsystemd and $NOTIFY_SOCKET set

  void ready(const std::string& status) noexcept;
  void status(const std::string& status) noexcept;
  void stopping() noexcept;
  void watchdog() noexcept;

  // Half of $WATCHDOG_USEC (as systemd recommends) when the unit asks for a
  // watchdog for this process; zero otherwise.
  std::chrono::microseconds watchdog_period() const noexcept { return watchdog_period_; }

 private:
  void send(const std::string& state) noexcept;
  bool active_ = false;
  std::chrono::microseconds watchdog_period_{0};
};

}  // namespace quantem::server
