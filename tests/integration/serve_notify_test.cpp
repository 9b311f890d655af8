// The systemd notify protocol of the real `quantem-gpu serve`, received on a
// datagram socket of the test's own ($NOTIFY_SOCKET), as systemd would.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon.hpp"

using quantem::test::Daemon;
using quantem::test::run_quantem;

namespace {

// An AF_UNIX datagram socket bound to a path, like the service manager's.
class NotifySocket {
 public:
  explicit NotifySocket(std::string path) : path_(std::move(path)) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path_.c_str(), sizeof address.sun_path - 1);
    bound_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  }
  ~NotifySocket() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool bound() const { return bound_; }
  const std::string& path() const { return path_; }

  // The next datagram, or "" when none arrives within `timeout`.
  std::string receive(std::chrono::milliseconds timeout) {
    timeval limit{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    char buffer[4096];
    const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
    return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string();
  }

  // Datagrams until one contains `line` as a whole line (all of them kept in
  // `seen`); false when `deadline` passes first.
  bool receive_until(const std::string& line, std::chrono::seconds deadline, std::vector<std::string>& seen) {
    const auto end = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < end) {
      const std::string datagram = receive(std::chrono::milliseconds(200));
      if (datagram.empty()) continue;
      seen.push_back(datagram);
      if (("\n" + datagram + "\n").find("\n" + line + "\n") != std::string::npos) return true;
    }
    return false;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

bool build_notifies_systemd() {
  const auto info = run_quantem({"info", "--json"});
  return info.exit_code == 0 && nlohmann::json::parse(info.stdout_text).value("systemd_notify", false);
}

class ServeNotify : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!build_notifies_systemd()) {
      GTEST_SKIP() << "this build has no libsystemd (install libsystemd-dev and reconfigure): serve sends no "
                      "notifications";
    }
    const auto synth = run_quantem({"synth", data.file("sess"), "--prefix", "a", "--scan", "4x5", "--detector", "8x8",
                                    "--threads", "1"});
    ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  }
  quantem::test::TempDir data;
  quantem::test::TempDir sockets;
};

}  // namespace

TEST_F(ServeNotify, ReadyAfterReadinessAndStoppingOnSigterm) {
  NotifySocket notify(sockets.file("notify"));
  ASSERT_TRUE(notify.bound()) << std::strerror(errno);
  auto daemon = Daemon::start(data.path(), {}, {{"NOTIFY_SOCKET", notify.path()}, {"WATCHDOG_USEC", ""}},
                              /*wait_ready=*/false);
  ASSERT_NE(daemon, nullptr);

  std::vector<std::string> seen;
  ASSERT_TRUE(notify.receive_until("READY=1", std::chrono::seconds(60), seen)) << daemon->stderr_text();
  // READY=1 is sent only once /api/health/ready answers 200.
  auto ready = daemon->get("/api/health/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200) << ready->body;
  const std::string& ready_datagram = seen.back();
  EXPECT_NE(ready_datagram.find("STATUS=ready; 0 residents"), std::string::npos) << ready_datagram;
  EXPECT_NE(ready_datagram.find("budget"), std::string::npos) << ready_datagram;
  for (std::size_t i = 0; i + 1 < seen.size(); ++i) EXPECT_EQ(seen[i].find("READY=1"), std::string::npos) << seen[i];

  EXPECT_EQ(daemon->stop(SIGTERM), 0);
  std::vector<std::string> after;
  EXPECT_TRUE(notify.receive_until("STOPPING=1", std::chrono::seconds(5), after)) << daemon->stderr_text();
}

TEST_F(ServeNotify, StatusFollowsTheResidents) {
  NotifySocket notify(sockets.file("notify"));
  ASSERT_TRUE(notify.bound());
  auto daemon = Daemon::start(data.path(), {}, {{"NOTIFY_SOCKET", notify.path()}, {"WATCHDOG_USEC", ""}});
  ASSERT_NE(daemon, nullptr);
  std::vector<std::string> seen;
  ASSERT_TRUE(notify.receive_until("READY=1", std::chrono::seconds(30), seen));
  auto image = daemon->get("/api/browse/realspace?session=sess&file=a_master.h5");
  ASSERT_TRUE(image);
  ASSERT_EQ(image->status, 200) << image->body;
  bool one_resident = false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!one_resident && std::chrono::steady_clock::now() < end) {
    const std::string datagram = notify.receive(std::chrono::milliseconds(500));
    one_resident = datagram.find("STATUS=ready; 1 resident,") != std::string::npos;
  }
  EXPECT_TRUE(one_resident) << "no STATUS= line with the resident";
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
}

TEST_F(ServeNotify, WatchdogPingsWhenTheUnitAsksForThem) {
  NotifySocket notify(sockets.file("notify"));
  ASSERT_TRUE(notify.bound());
  // WatchdogSec=0.4s: systemd sets WATCHDOG_USEC (and WATCHDOG_PID, optional).
  auto daemon = Daemon::start(data.path(), {}, {{"NOTIFY_SOCKET", notify.path()}, {"WATCHDOG_USEC", "400000"}});
  ASSERT_NE(daemon, nullptr);
  int pings = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (pings < 3 && std::chrono::steady_clock::now() < end) {
    if (notify.receive(std::chrono::milliseconds(500)).find("WATCHDOG=1") != std::string::npos) ++pings;
  }
  EXPECT_GE(pings, 3);
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
}

TEST_F(ServeNotify, NothingIsSentWithoutNotifySocket) {
  // The daemon started by hand: no $NOTIFY_SOCKET, nothing to tell, no warning.
  auto daemon = Daemon::start(data.path(), {}, {{"NOTIFY_SOCKET", ""}});
  ASSERT_NE(daemon, nullptr);
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
  EXPECT_EQ(daemon->stderr_text().find("sd_notify"), std::string::npos) << daemon->stderr_text();
}
