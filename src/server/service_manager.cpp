#include "quantem/server/service_manager.hpp"

#include <cstdint>
#include <cstdlib>

#include <spdlog/spdlog.h>

#if defined(QUANTEM_HAVE_SYSTEMD)
#include <systemd/sd-daemon.h>
#endif

namespace quantem::server {

bool ServiceManagerNotifier::available_in_build() noexcept {
#if defined(QUANTEM_HAVE_SYSTEMD)
  return true;
#else
  return false;
#endif
}

ServiceManagerNotifier::ServiceManagerNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  if (!socket || !*socket) return;
#if defined(QUANTEM_HAVE_SYSTEMD)
  active_ = true;
  std::uint64_t watchdog_usec = 0;
  if (sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0) {
    watchdog_period_ = std::chrono::microseconds(watchdog_usec / 2);
  }
#else
  spdlog::warn("$NOTIFY_SOCKET is set but this build has no libsystemd: no READY=1 will be sent "
               "(rebuild with libsystemd-dev, or use Type=simple in the unit)");
#endif
}

void ServiceManagerNotifier::send(const std::string& state) noexcept {
  if (!active_) return;
#if defined(QUANTEM_HAVE_SYSTEMD)
  const int result = sd_notify(0, state.c_str());
  if (result < 0) spdlog::warn("sd_notify failed ({}): {}", result, state.substr(0, state.find('\n')));
#else
  (void)state;
#endif
}

void ServiceManagerNotifier::ready(const std::string& status) noexcept { send("READY=1\nSTATUS=" + status); }
void ServiceManagerNotifier::status(const std::string& status) noexcept { send("STATUS=" + status); }
void ServiceManagerNotifier::stopping() noexcept { send("STOPPING=1\nSTATUS=stopping"); }
void ServiceManagerNotifier::watchdog() noexcept { send("WATCHDOG=1"); }

}  // namespace quantem::server
