// The request edges an operator meets, through the real binary on the CPU
// backend: requests waiting for a load leave health answered; request bodies
// from a thousand connections take bounded memory; in token mode a body is
// refused before it is read; an absolute-form request line naming another
// host is refused like a foreign Host; a request still waiting for a load at
// the end of the shutdown grace is answered 503; cbed and cbed-region with
// ensure_resident=true make the acquisition the active one. Assertions are
// about the order of events (health answered while the load still runs), not
// about timings.
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon.hpp"
#include "raw_http.hpp"

using quantem::test::Daemon;
using quantem::test::run_quantem;
using json = nlohmann::json;

namespace qt = quantem::test;

namespace {

constexpr const char* kForeignHostMessage =
    "The Host header does not name a loopback address; quantem-gpu only answers localhost, 127.0.0.1 or [::1].";

class ServeRequestEdges : public ::testing::Test {
 protected:
  void write(const std::string& prefix, const std::string& scan, const std::string& detector) {
    const auto synth = run_quantem({"synth", data.file("sess"), "--prefix", prefix, "--scan", scan, "--detector",
                                    detector, "--threads", "2"},
                                   {}, 300);
    ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  }
  // An acquisition whose load on one CPU thread takes long enough for twenty
  // requests to queue behind it (a few hundred MB of frames).
  void write_slow_acquisition() { write("slow", "64x64", "256x256"); }
  static std::string source(const std::string& prefix) { return "session=sess&file=" + prefix + "_master.h5"; }
  static std::string state_of(const Daemon& daemon, const std::string& prefix) {
    auto response = daemon.get("/api/browse/residency?" + source(prefix));
    return response && response->status == 200 ? json::parse(response->body)["state"].get<std::string>() : "";
  }
  static bool eventually(const std::function<bool()>& condition, int seconds = 60) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (condition()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  quantem::test::TempDir data;
};

std::uint64_t resident_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

}  // namespace

TEST_F(ServeRequestEdges, HealthIsAnsweredWhileTwentyRequestsWaitForALoadOnTwoWorkers) {
  write_slow_acquisition();
  // Two HTTP workers, one CPU thread for the load: before waiting requests
  // moved off the workers, two of the twenty held both until the load ended.
  auto daemon = Daemon::start(data.path(), {"--http-threads", "2", "--cpu-threads", "1"});
  ASSERT_NE(daemon, nullptr);
  const std::string target = "/api/browse/realspace?" + source("slow") + "&mode=BF";
  std::vector<std::future<int>> waiting;
  for (int i = 0; i < 20; ++i) {
    waiting.push_back(std::async(std::launch::async, [&] {
      // The load may take long on a busy machine: wait for the answer as long as it takes.
      const int fd = qt::connect_tcp(daemon->port());
      if (fd < 0 || !qt::send_all(fd, qt::request_text("GET", target))) return -1;
      const auto response = qt::read_response(fd, 300000);
      ::close(fd);
      return response ? response->status : 0;
    }));
  }
  ASSERT_TRUE(eventually([&] { return state_of(*daemon, "slow") == "loading"; }))
      << "the load did not start, or nothing else was answered while the requests waited";
  // Let every request reach the daemon and park (no assertion rests on this pause).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto live = qt::exchange_tcp(daemon->port(), qt::request_text("GET", "/api/health/live"));
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  const auto catalog = daemon->get("/api/browse/acquisitions");
  ASSERT_TRUE(catalog);
  EXPECT_EQ(catalog->status, 200);
  // Both were answered before the load finished.
  EXPECT_EQ(state_of(*daemon, "slow"), "loading") << "the load ended before health was answered; the test proves nothing";
  for (auto& request : waiting) EXPECT_EQ(request.get(), 200);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeRequestEdges, BodiesFromAThousandConnectionsTakeBoundedMemoryAndHealthIsAnswered) {
  write("a", "4x5", "8x8");
  // A long request deadline: 1,000 bodies of 1 MiB take a while to send.
  auto daemon = Daemon::start(data.path(), {"--header-timeout", "300"});
  ASSERT_NE(daemon, nullptr);
  constexpr int kConnections = 1000;
  const std::string body(1 << 20, 'b');
  const std::string head =
      qt::request_text("POST", "/api/browse/load?" + source("a"), "127.0.0.1",
                       "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n");
  std::vector<int> sockets;
  for (int i = 0; i < kConnections; ++i) {
    const int fd = qt::connect_tcp(daemon->port());
    ASSERT_GE(fd, 0) << "connection " << i;
    ASSERT_TRUE(qt::send_all(fd, head));
    sockets.push_back(fd);
  }
  // Every connection sends all but the last byte of its body: the daemon is
  // reading 1,000 bodies at once. Its RSS is sampled until every request is
  // answered (much of a body may still sit in the kernel's socket buffers
  // when the sender returns).
  std::atomic<std::uint64_t> peak_kib{0};
  std::vector<std::thread> senders;
  std::atomic<int> sent{0};
  for (int part = 0; part < 4; ++part) {
    senders.emplace_back([&, part] {
      for (int i = part; i < kConnections; i += 4) {
        if (qt::send_all(sockets[i], body.substr(0, body.size() - 1))) ++sent;
      }
    });
  }
  std::atomic<bool> sending{true};
  std::thread sampler([&] {
    while (sending) {
      peak_kib = std::max<std::uint64_t>(peak_kib, resident_kib(daemon->pid()));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  for (auto& sender : senders) sender.join();
  ASSERT_EQ(sent.load(), kConnections);
  const auto live = qt::exchange_tcp(daemon->port(), qt::request_text("GET", "/api/health/live"));
  ASSERT_TRUE(live) << "health was not answered while 1,000 bodies were in flight";
  EXPECT_EQ(live->status, 200);
  // The last bytes: every request is complete and answered.
  int answered = 0;
  for (int fd : sockets) {
    ASSERT_TRUE(qt::send_all(fd, "b"));
    const auto response = qt::read_response(fd, 30000);
    if (response && (response->status == 202 || response->status == 200)) ++answered;
    ::close(fd);
  }
  sending = false;
  sampler.join();
  EXPECT_EQ(answered, kConnections);
  const std::uint64_t after_kib = resident_kib(daemon->pid());
  EXPECT_LT(std::max<std::uint64_t>(peak_kib, after_kib), 300u * 1024)
      << "1,000 bodies of 1 MiB: peak " << peak_kib << " kB, after " << after_kib << " kB";
  EXPECT_EQ(daemon->get("/api/health/live")->status, 200);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeRequestEdges, InTokenModeABodyWithoutTheTokenIsRefusedBeforeItIsRead) {
  write("a", "4x5", "8x8");
  auto daemon = Daemon::start(data.path(), {"--auth", "token"}, {{"QUANTEM_GPU_TOKEN", "env-token-0123456789"}});
  ASSERT_NE(daemon, nullptr);
  const std::string target = "/api/browse/load?" + source("a");
  // The headers announce 1 MiB that is never sent: only a check before the body can answer.
  const int fd = qt::connect_tcp(daemon->port());
  ASSERT_TRUE(qt::send_all(fd, qt::request_text("POST", target, "127.0.0.1", "Content-Length: 1048576\r\n")));
  const auto refused = qt::read_response(fd, 3000);
  ASSERT_TRUE(refused) << "the body was waited for before the token was checked";
  EXPECT_EQ(refused->status, 403);
  EXPECT_EQ(refused->header("connection"), "close");
  EXPECT_EQ(json::parse(refused->body)["detail"],
            "This daemon requires a token: send 'Authorization: Bearer <token>' or '?token=<token>'.");
  ::close(fd);
  // With the token, the body is read and the request answered.
  const auto accepted = qt::exchange_tcp(
      daemon->port(), qt::request_text("POST", target, "127.0.0.1",
                                       "Authorization: Bearer env-token-0123456789\r\nContent-Length: 4\r\n") + "body");
  ASSERT_TRUE(accepted);
  EXPECT_TRUE(accepted->status == 200 || accepted->status == 202) << accepted->status << " " << accepted->body;
  // The refusal is counted like any answer.
  const auto metrics = daemon->get("/metrics", {{"Authorization", "Bearer env-token-0123456789"}});
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("quantem_http_requests_total{route=\"/api/browse/load\",code=\"403\"} 1"),
            std::string::npos)
      << metrics->body;
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeRequestEdges, AnAbsoluteFormRequestLineNamingAnotherHostIsRefusedLikeAForeignHost) {
  write("a", "4x5", "8x8");
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  const std::string port = std::to_string(daemon->port());
  // The Host header is loopback; the request line names another host, which wins (RFC 9112 section 3.2.2).
  const std::vector<std::string> targets = {"http://evil.example/api/browse/capabilities",
                                            "http://evil.example:" + port + "/api/health/live",
                                            "HTTPS://10.0.0.1/api/browse/realspace?" + source("a")};
  for (const auto& target : targets) {
    const auto refused = qt::exchange_tcp(daemon->port(), qt::request_text("GET", target, "127.0.0.1:" + port));
    ASSERT_TRUE(refused) << target;
    EXPECT_EQ(refused->status, 403) << target;
    EXPECT_EQ(json::parse(refused->body)["detail"], kForeignHostMessage) << target;
  }
  // Naming the daemon's own loopback address is answered as before, whatever the Host header says.
  const auto own = qt::exchange_tcp(
      daemon->port(), qt::request_text("GET", "http://127.0.0.1:" + port + "/api/health/live", "evil.example"));
  ASSERT_TRUE(own);
  EXPECT_EQ(own->status, 200);
  EXPECT_EQ(own->body, R"({"live":true})");
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeRequestEdges, ARequestStillWaitingForALoadWhenTheGraceEndsIsAnswered503) {
  write_slow_acquisition();
  auto daemon = Daemon::start(data.path(), {"--cpu-threads", "1", "--shutdown-grace", "0.2"});
  ASSERT_NE(daemon, nullptr);
  const int fd = qt::connect_tcp(daemon->port());
  ASSERT_TRUE(qt::send_all(fd, qt::request_text("GET", "/api/browse/realspace?" + source("slow"))));
  ASSERT_TRUE(eventually([&] { return state_of(*daemon, "slow") == "loading"; })) << "the load did not start";
  const int stopped = daemon->stop(15);
  const auto response = qt::read_response(fd, 5000);
  ASSERT_TRUE(response) << "the waiting request was cut off without an answer";
  EXPECT_EQ(response->status, 503);
  EXPECT_EQ(response->header("retry-after"), "1");
  EXPECT_EQ(response->header("connection"), "close");
  EXPECT_EQ(json::parse(response->body)["detail"], "the daemon is shutting down; retry");
  EXPECT_EQ(stopped, 0);
  ::close(fd);
}

TEST_F(ServeRequestEdges, CbedAndCbedRegionWithEnsureResidentMakeTheAcquisitionActive) {
  for (const char* prefix : {"a", "b", "c"}) write(prefix, "6x5", "12x12");
  // Two devices of one entry each (docs/admission.md): admission preserves the
  // active acquisition on its device when it can.
  auto daemon = Daemon::start(data.path(), {"--cpu-devices", "2", "--device-budget", "64MiB", "--cache-entries", "1"});
  ASSERT_NE(daemon, nullptr);
  auto device_of = [&](const std::string& prefix) {
    auto response = daemon->get("/api/browse/residency?" + source(prefix));
    const json doc = json::parse(response->body);
    return doc["state"] == "resident" ? doc["device"].get<int>() : -1;
  };
  auto active_bytes = [&](int device) {
    const json capabilities = json::parse(daemon->get("/api/browse/capabilities")->body);
    return capabilities["devices"][device]["active_resident_bytes"].get<std::uint64_t>();
  };
  ASSERT_EQ(daemon->get("/api/browse/realspace?" + source("a"))->status, 200);  // a on device 0
  ASSERT_EQ(daemon->get("/api/browse/realspace?" + source("b"))->status, 200);  // b on device 1, active
  ASSERT_EQ(device_of("a"), 0);
  ASSERT_EQ(device_of("b"), 1);
  EXPECT_EQ(active_bytes(0), 0u);
  // cbed with ensure_resident=true makes a the active one.
  ASSERT_EQ(daemon->get("/api/browse/cbed?" + source("a") + "&sx=1&sy=1&ensure_resident=true")->status, 200);
  EXPECT_GT(active_bytes(0), 0u);
  EXPECT_EQ(active_bytes(1), 0u);
  // c goes where it evicts b, not the active a.
  ASSERT_EQ(daemon->get("/api/browse/realspace?" + source("c"))->status, 200);
  EXPECT_EQ(device_of("a"), 0);
  EXPECT_EQ(device_of("b"), -1);
  EXPECT_EQ(device_of("c"), 1);
  // cbed-region likewise: a region of b (loaded again) makes b active.
  ASSERT_EQ(daemon->get("/api/browse/cbed-region?" + source("b") + "&cx=2&cy=2&radius=1.5&ensure_resident=true")->status,
            200);
  const int b_device = device_of("b");
  ASSERT_GE(b_device, 0);
  EXPECT_GT(active_bytes(b_device), 0u);
  EXPECT_EQ(active_bytes(1 - b_device), 0u);
  // Without ensure_resident the active acquisition does not change.
  const int other = 1 - b_device;
  const std::string other_prefix = device_of("a") == other ? "a" : "c";
  ASSERT_EQ(daemon->get("/api/browse/cbed?" + source(other_prefix) + "&sx=1&sy=1")->status, 200);
  EXPECT_GT(active_bytes(b_device), 0u);
  EXPECT_EQ(active_bytes(other), 0u);
  EXPECT_EQ(daemon->stop(), 0);
}
