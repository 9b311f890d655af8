// `serve --unix-socket PATH` through the real binary: every
// route over the socket with the Host and token rules as over TCP, the file's
// mode and its directory's, stale sockets of dead daemons replaced, a live one
// refused, the file removed on stop.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "daemon.hpp"
#include "raw_http.hpp"

using quantem::test::Daemon;
using quantem::test::run_quantem;
using json = nlohmann::json;
namespace fs = std::filesystem;
namespace qt = quantem::test;

namespace {

class ServeUnixSocket : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto synth = run_quantem({"synth", data.file("sess"), "--prefix", "a", "--scan", "4x5", "--detector", "8x8",
                                    "--threads", "1"});
    ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  }
  std::optional<qt::RawResponse> over_socket(const Daemon& daemon, const std::string& method, const std::string& target,
                                             const std::string& host = "127.0.0.1:8780", const std::string& extra = "") {
    return qt::exchange_unix(daemon.socket_path(), qt::request_text(method, target, host, extra));
  }
  static unsigned mode_of(const std::string& path) {
    struct stat info {};
    if (::lstat(path.c_str(), &info) != 0) return 0;
    return info.st_mode & 07777;
  }
  quantem::test::TempDir data;
  quantem::test::TempDir sockets;
};

// A socket file whose listener is gone: what a killed daemon leaves behind.
void leave_stale_socket(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ::close(fd);  // the file stays; connect() is now refused
  ASSERT_TRUE(fs::is_socket(path));
}

}  // namespace

TEST_F(ServeUnixSocket, EveryRouteAnswersOverTheSocketWithTheHostRule) {
  const std::string directory = sockets.file("run/quantem-gpu");  // missing: created 0700
  const std::string path = directory + "/quantem.sock";
  auto daemon = Daemon::start_unix(data.path(), path);
  ASSERT_NE(daemon, nullptr);
  EXPECT_EQ(mode_of(path) & 0777, 0600u);
  EXPECT_TRUE(fs::is_socket(path));
  EXPECT_EQ(mode_of(directory), 0700u);

  const std::string source = "session=sess&file=a_master.h5";
  const std::vector<std::tuple<std::string, std::string, int>> routes = {
      {"GET", "/api/health/live", 200},
      {"GET", "/api/health/ready", 200},
      {"GET", "/api/browse/capabilities", 200},
      {"GET", "/api/browse/sessions", 200},
      {"GET", "/api/browse/acquisitions?session=sess", 200},
      {"GET", "/api/browse/realspace?" + source, 200},
      {"GET", "/api/browse/realspace?" + source + "&mode=ADF&inner=0.5&outer=2&format=npy", 200},
      {"GET", "/api/browse/realspace-shape?" + source + "&shape=annulus&cx=4&cy=4&inner=1&outer=3", 200},
      {"GET", "/api/browse/cbed?" + source + "&sx=3&sy=2", 200},
      {"GET", "/api/browse/cbed-region?" + source + "&cx=2&cy=2&radius=1.5&reduce=sum", 200},
      {"GET", "/api/browse/residency?" + source, 200},
      {"GET", "/metrics", 200},
      {"DELETE", "/api/browse/resident?" + source, 200},
      {"POST", "/api/browse/load?" + source, 202},
      {"GET", "/api/browse/nothing", 404},
      {"PUT", "/api/browse/capabilities", 405},
  };
  for (const auto& [method, target, status] : routes) {
    const auto response = over_socket(*daemon, method, target);
    ASSERT_TRUE(response) << method << " " << target;
    if (status == 202) {
      EXPECT_TRUE(response->status == 202 || response->status == 200) << method << " " << target << ": " << response->body;
    } else {
      EXPECT_EQ(response->status, status) << method << " " << target << ": " << response->body;
    }
    EXPECT_EQ(response->header("content-length"), std::to_string(response->body.size()));
  }
  const auto image = over_socket(*daemon, "GET", "/api/browse/realspace?" + source);
  ASSERT_TRUE(image);
  EXPECT_EQ(image->header("x-width"), "5");
  EXPECT_EQ(image->header("x-height"), "4");
  EXPECT_EQ(image->body.size(), 4u * 5u * 4u);

  // The Host rule: what `ssh -L 8780:/path/sock host` and curl --unix-socket send passes; a foreign name does not.
  for (const char* host : {"127.0.0.1:8780", "localhost:8780", "localhost", "[::1]:8780"}) {
    const auto allowed = over_socket(*daemon, "GET", "/api/browse/capabilities", host);
    ASSERT_TRUE(allowed);
    EXPECT_EQ(allowed->status, 200) << host;
  }
  const auto foreign = over_socket(*daemon, "GET", "/api/browse/capabilities", "attacker.example:8780");
  ASSERT_TRUE(foreign);
  EXPECT_EQ(foreign->status, 403);
  const auto twice = qt::exchange_unix(path, "GET /api/health/live HTTP/1.1\r\nHost: localhost\r\nHost: evil.com\r\n\r\n");
  ASSERT_TRUE(twice);
  EXPECT_EQ(twice->status, 400);

  // The runtime file names the socket and no TCP port.
  std::ifstream in(daemon->runtime_dir() + "/server-" + std::to_string(daemon->pid()) + ".json");
  const json runtime = json::parse(in);
  EXPECT_EQ(runtime["unix_socket"], path);
  EXPECT_TRUE(runtime["port"].is_null());

  EXPECT_EQ(daemon->stop(), 0) << daemon->stderr_text();
  EXPECT_FALSE(fs::exists(path)) << "the socket file outlived the daemon";
}

TEST_F(ServeUnixSocket, TheTokenRuleAppliesOverTheSocket) {
  const std::string path = sockets.file("quantem.sock");
  auto daemon = Daemon::start_unix(data.path(), path, {"--auth", "token"}, {{"QUANTEM_GPU_TOKEN", "socket-token-1234"}});
  ASSERT_NE(daemon, nullptr);
  const auto anonymous = over_socket(*daemon, "GET", "/api/browse/capabilities");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 403);
  const auto accepted = over_socket(*daemon, "GET", "/api/browse/capabilities", "localhost:8780",
                                    "Authorization: Bearer socket-token-1234\r\n");
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->status, 200);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeUnixSocket, AStaleSocketIsReplacedALiveOneAndOtherFilesAreRefused) {
  const std::string path = sockets.file("quantem.sock");
  leave_stale_socket(path);
  auto daemon = Daemon::start_unix(data.path(), path);
  ASSERT_NE(daemon, nullptr) << "a dead daemon's socket blocked the start";
  EXPECT_EQ(mode_of(path) & 0777, 0600u);

  const auto second = run_quantem({"serve", data.path(), "--backend", "cpu", "--unix-socket", path}, {}, 30);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.stderr_text.find("another daemon already listens on the unix socket " + path), std::string::npos)
      << second.stderr_text;
  // The first daemon keeps its socket and answers.
  const auto live = qt::exchange_unix(path, qt::request_text("GET", "/api/health/live", "localhost"));
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  EXPECT_EQ(daemon->stop(), 0);
  EXPECT_FALSE(fs::exists(path));

  const std::string regular = sockets.file("not-a-socket");
  std::ofstream(regular) << "keep me\n";
  const auto refused = run_quantem({"serve", data.path(), "--backend", "cpu", "--unix-socket", regular}, {}, 30);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.stderr_text.find("is not a socket"), std::string::npos) << refused.stderr_text;
  std::ifstream kept(regular);
  std::string content;
  std::getline(kept, content);
  EXPECT_EQ(content, "keep me");

  // TCP options have no meaning with a Unix socket.
  const auto both = run_quantem({"serve", data.path(), "--backend", "cpu", "--unix-socket", path, "--port", "8999"}, {}, 30);
  EXPECT_NE(both.exit_code, 0);
}
