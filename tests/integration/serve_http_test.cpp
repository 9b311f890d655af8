// The HTTP layer under hostile and careless clients,
// through the real binary and raw sockets: slow, idle and keep-alive
// connections cost no worker; the whole-request header deadline; bounded
// graceful stop; header limits with memory back near its baseline; the Range
// rule; duplicate Host; half-closed clients; framing of every response.
// Deadlines are short options (--header-timeout, --shutdown-grace) so the
// suite stays fast; the only timing assertions are the daemon's stated bounds.
// docs/decisions/0008-http-server-on-boost-beast.md tells how the previous
// HTTP server failed each of these.
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon.hpp"
#include "raw_http.hpp"

using quantem::test::Daemon;
using quantem::test::RawResponse;
using quantem::test::run_quantem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace qt = quantem::test;

namespace {

constexpr const char* kImage = "/api/browse/realspace?session=sess&file=a_master.h5";

class ServeHttp : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto synth = run_quantem({"synth", data.file("sess"), "--prefix", "a", "--scan", "4x5", "--detector", "8x8",
                                    "--threads", "1"});
    ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  }
  quantem::test::TempDir data;
};

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Seconds for one request on a fresh connection, answered 200; a failed
// exchange counts as an hour.
double live_request_seconds(int port) {
  const auto start = Clock::now();
  const auto response = qt::exchange_tcp(port, qt::request_text("GET", "/api/health/live", "127.0.0.1", "Connection: close\r\n"));
  if (!response || response->status != 200) return 3600;
  return seconds_since(start);
}

// The bound: another client answered within 100 ms. The fastest of
// five must meet it (one slow sample on a loaded 2-core CI machine is
// scheduling, not starvation) and none may take a second (a server that
// gives each connection a worker takes seconds here).
void expect_other_clients_answered_at_once(int port, const std::string& situation) {
  std::vector<double> seconds;
  for (int i = 0; i < 5; ++i) seconds.push_back(live_request_seconds(port));
  const double fastest = *std::min_element(seconds.begin(), seconds.end());
  const double slowest = *std::max_element(seconds.begin(), seconds.end());
  EXPECT_LT(fastest, 0.1) << situation;
  EXPECT_LT(slowest, 1.0) << situation;
}

std::uint64_t resident_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// Connections that drip a request line one byte at a time, never finishing
// it, from one thread.
class Drippers {
 public:
  Drippers(int port, int count, std::chrono::milliseconds interval) : interval_(interval) {
    for (int i = 0; i < count; ++i) sockets_.push_back(qt::connect_tcp(port));
    thread_ = std::thread([this] {
      const std::string line = "GET /api/health/live?padding=" + std::string(4096, 'x');
      std::size_t position = 0;
      while (!stop_) {
        for (int fd : sockets_) (void)::send(fd, line.data() + position % line.size(), 1, MSG_NOSIGNAL);
        ++position;
        std::this_thread::sleep_for(interval_);
      }
    });
  }
  ~Drippers() {
    stop_ = true;
    thread_.join();
    for (int fd : sockets_) ::close(fd);
  }
  const std::vector<int>& sockets() const { return sockets_; }
  bool all_connected() const {
    return std::all_of(sockets_.begin(), sockets_.end(), [](int fd) { return fd >= 0; });
  }

 private:
  std::chrono::milliseconds interval_;
  std::vector<int> sockets_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

TEST_F(ServeHttp, SixtyFourSlowOrIdleConnectionsLeaveOtherClientsAnsweredWithinATenthOfASecond) {
  // 32 connections dripping a request
  // line and 32 idle ones, with fewer workers than connections.
  auto daemon = Daemon::start(data.path(), {"--http-threads", "2", "--header-timeout", "30"});
  ASSERT_NE(daemon, nullptr);
  Drippers drippers(daemon->port(), 32, std::chrono::milliseconds(100));
  ASSERT_TRUE(drippers.all_connected());
  std::vector<int> idle;
  for (int i = 0; i < 32; ++i) idle.push_back(qt::connect_tcp(daemon->port()));
  ASSERT_TRUE(std::all_of(idle.begin(), idle.end(), [](int fd) { return fd >= 0; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // every connection accepted, drips under way
  expect_other_clients_answered_at_once(daemon->port(), "64 slow connections open");
  // An image route too, not only the health route.
  const auto image = qt::exchange_tcp(daemon->port(), qt::request_text("GET", kImage));
  ASSERT_TRUE(image);
  EXPECT_EQ(image->status, 200);
  // The slow connections are still open (the deadline is 30 s here): nothing
  // was answered by closing them.
  for (int fd : idle) EXPECT_FALSE(qt::closed_within(fd, 10));
  for (int fd : idle) ::close(fd);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeHttp, ARequestWhoseHeadersDoNotArriveWithinTheDeadlineIsClosedHoweverSteadilyItDrips) {
  // The header deadline covers the whole request line and headers, not each read.
  auto daemon = Daemon::start(data.path(), {"--header-timeout", "1"});
  ASSERT_NE(daemon, nullptr);
  const auto start = Clock::now();
  Drippers drippers(daemon->port(), 4, std::chrono::milliseconds(100));  // a byte every 0.1 s: each read is quick
  ASSERT_TRUE(drippers.all_connected());
  const int idle = qt::connect_tcp(daemon->port());
  for (int fd : drippers.sockets()) EXPECT_TRUE(qt::closed_within(fd, 5000)) << "a dripping connection stayed open";
  EXPECT_TRUE(qt::closed_within(idle, 5000)) << "an idle connection stayed open";
  const double elapsed = seconds_since(start);
  EXPECT_GE(elapsed, 0.9);  // not before the deadline
  EXPECT_LT(elapsed, 3.0);  // and soon after it
  ::close(idle);
  // A prompt client on a fresh connection is unaffected.
  EXPECT_LT(live_request_seconds(daemon->port()), 1.0);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeHttp, FortyKeepAliveConnectionsCostNoWorker) {
  // An idle keep-alive connection holds no worker: every connection gets an
  // answer at once, however few the workers (with cpp-httplib the 17th and
  // 33rd connection waited 5 s).
  auto daemon = Daemon::start(data.path(), {"--http-threads", "2"});
  ASSERT_NE(daemon, nullptr);
  std::vector<int> connections;
  for (int i = 0; i < 40; ++i) {
    const auto start = Clock::now();
    const int fd = qt::connect_tcp(daemon->port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(qt::send_all(fd, qt::request_text("GET", "/api/health/live")));
    const auto response = qt::read_response(fd);
    ASSERT_TRUE(response) << "connection " << i + 1;
    EXPECT_EQ(response->status, 200);
    EXPECT_NE(response->header("connection"), "close");
    EXPECT_LT(seconds_since(start), 1.0) << "connection " << i + 1;
    connections.push_back(fd);
  }
  expect_other_clients_answered_at_once(daemon->port(), "40 keep-alive connections open");
  // Every kept-alive connection still serves a second request.
  for (int fd : connections) {
    ASSERT_TRUE(qt::send_all(fd, qt::request_text("GET", kImage)));
    const auto response = qt::read_response(fd);
    ASSERT_TRUE(response);
    EXPECT_EQ(response->status, 200);
    EXPECT_EQ(response->body.size(), 4u * 5u * 4u);
    ::close(fd);
  }
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeHttp, SigtermWithSlowClientsExitsCleanlyWithinTheGrace) {
  // SIGTERM stops the daemon within --shutdown-grace, whatever slow clients
  // still send (cpp-httplib exited only when they stopped, after 21-39 s).
  auto daemon = Daemon::start(data.path(), {"--shutdown-grace", "1", "--header-timeout", "60"});
  ASSERT_NE(daemon, nullptr);
  Drippers drippers(daemon->port(), 4, std::chrono::milliseconds(200));
  ASSERT_TRUE(drippers.all_connected());
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(qt::connect_tcp(daemon->port()));
  // A keep-alive client between requests.
  const int kept = qt::connect_tcp(daemon->port());
  ASSERT_TRUE(qt::send_all(kept, qt::request_text("GET", "/api/health/live")));
  ASSERT_TRUE(qt::read_response(kept));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = Clock::now();
  EXPECT_EQ(daemon->stop(15), 0) << daemon->stderr_text();
  EXPECT_LT(seconds_since(start), 1.0 + 1.0);  // grace + 1 s
  for (int fd : idle) EXPECT_TRUE(qt::closed_within(fd, 1000));
  EXPECT_TRUE(qt::closed_within(kept, 1000));
  for (int fd : idle) ::close(fd);
  ::close(kept);
}

TEST_F(ServeHttp, HugeHeaderBlocksAreRefusedWith431AndMemoryStaysNearItsBaseline) {
  // Header blocks over the limit are refused with 431 and memory stays near
  // its baseline (1,000,000 header fields, 13.9 MB, from 4 clients at once
  // were once accepted and took RSS from 21.7 MB to 2.0 GB).
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  ASSERT_EQ(daemon->get(kImage)->status, 200);  // a resident and an image: the steady state
  const std::uint64_t baseline_kib = resident_kib(daemon->pid());
  ASSERT_GT(baseline_kib, 0u);

  std::string huge = "GET /api/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (int i = 0; i < 1000000; ++i) huge += "X-Fill-" + std::to_string(i) + ": v\r\n";
  huge += "\r\n";
  ASSERT_GT(huge.size(), 13'000'000u);
  std::vector<std::optional<RawResponse>> responses(4);
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] { responses[c] = qt::exchange_tcp(daemon->port(), huge); });
  }
  for (auto& client : clients) client.join();
  for (const auto& response : responses) {
    ASSERT_TRUE(response) << "no answer to a huge header block";
    EXPECT_EQ(response->status, 431);
    EXPECT_EQ(response->header("connection"), "close");
    EXPECT_NE(json::parse(response->body).at("detail").get<std::string>().find("too large"), std::string::npos)
        << response->body;
  }
  // Many small fields: the field count is limited too.
  std::string many = "GET /api/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (int i = 0; i < 200; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
  const auto fields = qt::exchange_tcp(daemon->port(), many + "\r\n");
  ASSERT_TRUE(fields);
  EXPECT_EQ(fields->status, 431);
  EXPECT_NE(json::parse(fields->body).at("detail").get<std::string>().find("too many"), std::string::npos) << fields->body;

  const std::uint64_t after_kib = resident_kib(daemon->pid());
  EXPECT_LT(after_kib, baseline_kib + 32 * 1024) << "RSS " << baseline_kib << " kB -> " << after_kib << " kB";
  EXPECT_EQ(daemon->get("/api/health/live")->status, 200);  // still serving
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeHttp, RangeIsIgnoredOnEveryRouteAndTheWholeRepresentationIsSent) {
  // Range is ignored with one rule for every route: 200 and the whole
  // representation, never 206 or 416 (docs/protocol.md).
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  for (const std::string& target : {std::string(kImage), std::string(kImage) + "&format=npy",
                                   std::string("/api/browse/sessions"), std::string("/metrics")}) {
    const auto plain = qt::exchange_tcp(daemon->port(), qt::request_text("GET", target));
    ASSERT_TRUE(plain);
    ASSERT_EQ(plain->status, 200) << target;
    for (const char* range : {"bytes=0-9", "bytes=0-1,4-5", "bytes=-3", "bytes=999999-"}) {
      const auto ranged = qt::exchange_tcp(daemon->port(), qt::request_text("GET", target, "127.0.0.1", std::string("Range: ") + range + "\r\n"));
      ASSERT_TRUE(ranged) << target << " " << range;
      EXPECT_EQ(ranged->status, 200) << target << " " << range;
      EXPECT_EQ(ranged->header("content-range"), "") << target << " " << range;
      EXPECT_EQ(ranged->header("content-length"), std::to_string(ranged->body.size()));
      if (target.find("metrics") == std::string::npos) {  // metrics count requests, so they change
        EXPECT_EQ(ranged->body, plain->body) << target << " " << range;
      }
      EXPECT_EQ(ranged->header("x-width"), plain->header("x-width"));
    }
  }
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeHttp, TwoHostHeadersAre400AsRfc9112Requires) {
  // A request with two Host headers is refused with 400 (RFC 9112).
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  const auto twice = qt::exchange_tcp(daemon->port(), "GET /api/browse/capabilities HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                      "Host: evil.com\r\n\r\n");
  ASSERT_TRUE(twice);
  EXPECT_EQ(twice->status, 400);
  EXPECT_NE(json::parse(twice->body).at("detail").get<std::string>().find("Host"), std::string::npos) << twice->body;
  const auto none = qt::exchange_tcp(daemon->port(), "GET /api/browse/capabilities HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 400);
  const auto once = qt::exchange_tcp(daemon->port(), qt::request_text("GET", "/api/browse/capabilities"));
  ASSERT_TRUE(once);
  EXPECT_EQ(once->status, 200);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeHttp, AClientThatHalfClosesAfterSendingStillGetsItsResponse) {
  // A client that half-closes after sending its request still gets the
  // response (cpp-httplib ran the POST /load and sent nothing).
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  const auto load = qt::exchange_tcp(daemon->port(), qt::request_text("POST", "/api/browse/load?session=sess&file=a_master.h5"),
                                     /*half_close_after_sending=*/true);
  ASSERT_TRUE(load) << "no response after the client half-closed";
  EXPECT_TRUE(load->status == 202 || load->status == 200) << load->status << " " << load->body;
  const auto image = qt::exchange_tcp(daemon->port(), qt::request_text("GET", kImage), true);
  ASSERT_TRUE(image);
  EXPECT_EQ(image->status, 200);
  EXPECT_EQ(image->body.size(), 4u * 5u * 4u);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeHttp, EveryResponseIsFramedAndConnectionCloseIsHonoured) {
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  for (const auto& [method, target] : std::vector<std::pair<std::string, std::string>>{
           {"GET", kImage}, {"GET", "/api/browse/nothing"}, {"PUT", "/api/browse/capabilities"},
           {"GET", "/api/browse/realspace?session=nope&file=x"}, {"GET", "/metrics"}}) {
    const int fd = qt::connect_tcp(daemon->port());
    ASSERT_TRUE(qt::send_all(fd, qt::request_text(method, target, "127.0.0.1", "Connection: close\r\n")));
    const auto response = qt::read_response(fd);
    ASSERT_TRUE(response) << target;
    EXPECT_EQ(response->header_count("content-length"), 1) << target;
    EXPECT_EQ(response->header("content-length"), std::to_string(response->body.size())) << target;
    EXPECT_EQ(response->header("connection"), "close") << target;
    EXPECT_TRUE(qt::closed_within(fd, 2000)) << target << ": connection: close was not honoured";
    ::close(fd);
  }
  // Bodies above the limit are refused before they are read.
  const auto too_large = qt::exchange_tcp(daemon->port(), qt::request_text("POST", "/api/browse/load?session=sess&file=a_master.h5",
                                                                           "127.0.0.1", "Content-Length: 5000000\r\n"));
  ASSERT_TRUE(too_large);
  EXPECT_EQ(too_large->status, 413);
  EXPECT_TRUE(json::parse(too_large->body).contains("detail"));
  // Malformed requests get a JSON 400 and the daemon keeps serving.
  const auto garbage = qt::exchange_tcp(daemon->port(), "NOT HTTP AT ALL\r\n\r\n");
  ASSERT_TRUE(garbage);
  EXPECT_EQ(garbage->status, 400);
  EXPECT_TRUE(json::parse(garbage->body).contains("detail"));
  // HTTP/1.0 closes by default.
  const int fd = qt::connect_tcp(daemon->port());
  ASSERT_TRUE(qt::send_all(fd, "GET /api/health/live HTTP/1.0\r\nHost: localhost\r\n\r\n"));
  const auto old = qt::read_response(fd);
  ASSERT_TRUE(old);
  EXPECT_EQ(old->status, 200);
  EXPECT_TRUE(qt::closed_within(fd, 2000));
  ::close(fd);
  // Pipelined requests are answered in order on one connection.
  const int pipelined = qt::connect_tcp(daemon->port());
  ASSERT_TRUE(qt::send_all(pipelined, qt::request_text("GET", "/api/health/live") + qt::request_text("GET", kImage) +
                                          qt::request_text("GET", "/api/browse/nothing")));
  const auto first = qt::read_response(pipelined), second = qt::read_response(pipelined), third = qt::read_response(pipelined);
  ASSERT_TRUE(first && second && third);
  EXPECT_EQ(first->body, R"({"live":true})");
  EXPECT_EQ(second->body.size(), 4u * 5u * 4u);
  EXPECT_EQ(third->status, 404);
  ::close(pipelined);
  // Expect: 100-continue gets the interim answer before the body is sent.
  const int expecting = qt::connect_tcp(daemon->port());
  ASSERT_TRUE(qt::send_all(expecting, qt::request_text("POST", "/api/browse/load?session=sess&file=a_master.h5", "127.0.0.1",
                                                       "Content-Length: 4\r\nExpect: 100-continue\r\n")));
  const auto interim = qt::read_response(expecting);
  ASSERT_TRUE(interim);
  EXPECT_EQ(interim->status, 100);
  ASSERT_TRUE(qt::send_all(expecting, "body"));
  const auto accepted = qt::read_response(expecting);
  ASSERT_TRUE(accepted);
  EXPECT_TRUE(accepted->status == 200 || accepted->status == 202) << accepted->status;
  ::close(expecting);
  // HEAD: the length of the body it would have, no body (the next response starts right after the head).
  const int head = qt::connect_tcp(daemon->port());
  ASSERT_TRUE(qt::send_all(head, qt::request_text("HEAD", "/api/browse/capabilities") + qt::request_text("GET", "/api/health/live")));
  const auto head_response = qt::read_response(head, 10000, /*head_request=*/true);
  ASSERT_TRUE(head_response);
  EXPECT_EQ(head_response->status, 405);
  EXPECT_EQ(head_response->header("content-length"), "31");  // {"detail":"Method Not Allowed"}
  const auto after_head = qt::read_response(head);
  ASSERT_TRUE(after_head);
  EXPECT_EQ(after_head->body, R"({"live":true})");
  ::close(head);
  EXPECT_EQ(daemon->get("/api/health/live")->status, 200);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeHttp, GraceAndDeadlineOptionsAreValidated) {
  const auto grace = run_quantem({"serve", data.path(), "--backend", "cpu", "--shutdown-grace", "-1"});
  EXPECT_EQ(grace.exit_code, 78);
  EXPECT_NE(grace.stderr_text.find("--shutdown-grace must be between 0 and 600 seconds"), std::string::npos) << grace.stderr_text;
  const auto deadline = run_quantem({"serve", data.path(), "--backend", "cpu", "--header-timeout", "0"});
  EXPECT_EQ(deadline.exit_code, 78);
  EXPECT_NE(deadline.stderr_text.find("--header-timeout must be between 0.05 and 3600 seconds"), std::string::npos)
      << deadline.stderr_text;
  const auto help = run_quantem({"serve", "--help"});
  for (const char* option : {"--unix-socket", "--shutdown-grace", "--header-timeout", "--http-threads"}) {
    EXPECT_NE(help.stdout_text.find(option), std::string::npos) << option;
  }
}
