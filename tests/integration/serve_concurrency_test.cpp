// Residency under concurrency and file changes through the real binary:
// 16 clients hammering products on three acquisitions while two one-entry
// virtual devices evict and reload them (no 5xx, bodies byte-identical to the
// single-client bodies), exact placement on 2 devices x 1 entry, cancelling a
// load, a resident dropped by the watcher when its files are rewritten, and a
// shard being written never served.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon.hpp"

using quantem::test::Daemon;
using quantem::test::run_quantem;
using json = nlohmann::json;

namespace {

class ServeConcurrency : public ::testing::Test {
 protected:
  void write(const std::string& prefix, const std::string& seed = "1", const std::string& scan = "6x5") {
    const auto synth = run_quantem({"synth", data.file("sess"), "--prefix", prefix, "--scan", scan, "--detector",
                                    "12x12", "--threads", "1", "--seed", seed});
    ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  }
  static std::string source(const std::string& prefix) { return "session=sess&file=" + prefix + "_master.h5"; }
  static json get_json(const Daemon& daemon, const std::string& target) {
    auto response = daemon.get(target);
    EXPECT_TRUE(response && response->status == 200) << target;
    return response ? json::parse(response->body) : json();
  }
  static json residency(const Daemon& daemon, const std::string& prefix) {
    return get_json(daemon, "/api/browse/residency?" + source(prefix));
  }
  static std::uint64_t total_resident_bytes(const Daemon& daemon) {
    std::uint64_t total = 0;
    const json capabilities = get_json(daemon, "/api/browse/capabilities");
    for (const auto& device : capabilities["devices"]) {
      total += device["resident_bytes"].get<std::uint64_t>();
    }
    return total;
  }
  static bool eventually(const std::function<bool()>& condition) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (condition()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  quantem::test::TempDir data;
};

}  // namespace

TEST_F(ServeConcurrency, SixteenClientsGetExactBodiesWhileDevicesEvictAndReload) {
  for (const char* prefix : {"a", "b", "c"}) write(prefix, prefix == std::string("b") ? "2" : "3");
  // Three acquisitions on two devices of one entry each: every round trip of
  // the clients below forces evictions and reloads under pins.
  auto daemon = Daemon::start(data.path(), {"--cpu-devices", "2", "--device-budget", "64MiB", "--cache-entries", "1",
                                            "--cpu-threads", "2"});
  ASSERT_NE(daemon, nullptr);
  std::vector<std::string> targets;
  for (const char* prefix : {"a", "b", "c"}) {
    const std::string s = source(prefix);
    targets.push_back("/api/browse/realspace?" + s + "&mode=ADF&inner=0.5&outer=2");
    targets.push_back("/api/browse/realspace?" + s + "&mode=CoMx&scan_bin=2");
    targets.push_back("/api/browse/realspace-shape?" + s + "&shape=annulus&cx=6&cy=6&inner=1&outer=4&det_bin=2");
    targets.push_back("/api/browse/cbed?" + s + "&sx=3&sy=2&ensure_resident=true");
    targets.push_back("/api/browse/cbed-region?" + s + "&cx=2&cy=2&radius=1.5&reduce=sum&ensure_resident=true");
  }
  std::map<std::string, std::string> expected;
  for (const auto& target : targets) {
    auto response = daemon->get(target);
    ASSERT_TRUE(response) << target;
    ASSERT_EQ(response->status, 200) << target << ": " << response->body;
    expected[target] = response->body;
  }

  constexpr int kClients = 16, kRequestsPerClient = 24;
  std::atomic<int> mismatches{0}, server_errors{0}, other_statuses{0}, transport_errors{0};
  std::vector<std::string> failures(kClients);
  std::vector<std::thread> clients;
  for (int client = 0; client < kClients; ++client) {
    clients.emplace_back([&, client] {
      std::mt19937 random(static_cast<unsigned>(client));
      std::uniform_int_distribution<std::size_t> pick(0, targets.size() - 1);
      for (int i = 0; i < kRequestsPerClient; ++i) {
        const std::string& target = targets[pick(random)];
        auto response = daemon->get(target);
        if (!response) {
          ++transport_errors;
          continue;
        }
        if (response->status >= 500) {
          ++server_errors;
          failures[client] = target + " -> " + std::to_string(response->status) + " " + response->body;
        } else if (response->status != 200) {
          ++other_statuses;
          failures[client] = target + " -> " + std::to_string(response->status) + " " + response->body;
        } else if (response->body != expected[target]) {
          ++mismatches;
          failures[client] = target + ": body differs from the single-client body";
        }
      }
    });
  }
  for (auto& client : clients) client.join();
  std::string report;
  for (const auto& failure : failures)
    if (!failure.empty()) report += failure + "\n";
  EXPECT_EQ(transport_errors.load(), 0);
  EXPECT_EQ(server_errors.load(), 0) << report;
  EXPECT_EQ(other_statuses.load(), 0) << report;
  EXPECT_EQ(mismatches.load(), 0) << report;
  // The daemon's own count agrees: no 5xx on any product route (health/ready
  // answered 503 while starting, as it should).
  std::istringstream metrics(daemon->get("/metrics")->body);
  std::uint64_t evictions = 0;
  for (std::string line; std::getline(metrics, line);) {
    if (line.find("quantem_http_requests_total{route=\"/api/browse/") == 0) {
      EXPECT_EQ(line.find("code=\"5"), std::string::npos) << line;
    }
    if (line.find("quantem_evictions_total ") == 0) evictions = std::stoull(line.substr(line.find(' ') + 1));
  }
  EXPECT_GT(evictions, 0u);  // the clients really raced evictions and reloads
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeConcurrency, TwoDevicesWithOneEntryEachPlaceAndEvictExactlyByTheRules) {
  for (const char* prefix : {"a", "b", "c", "d"}) write(prefix);
  auto daemon = Daemon::start(data.path(), {"--cpu-devices", "2", "--device-budget", "64MiB", "--cache-entries", "1"});
  ASSERT_NE(daemon, nullptr);
  auto realspace = [&](const std::string& prefix) {
    auto response = daemon->get("/api/browse/realspace?" + source(prefix));
    EXPECT_TRUE(response && response->status == 200) << prefix;
    return json::parse(response->get_header_value("x-quantem-provenance"))["device_index"].get<int>();
  };
  EXPECT_EQ(realspace("a"), 0);  // both empty: the lowest index
  EXPECT_EQ(realspace("b"), 1);  // the least-populated device
  // One entry each, equal capacity: the lowest index, evicting only there (a);
  // the active acquisition b is preserved on device 1.
  EXPECT_EQ(realspace("c"), 0);
  EXPECT_EQ(residency(*daemon, "a")["state"], "absent");
  EXPECT_EQ(residency(*daemon, "b")["state"], "resident");
  // Now c is active: d replaces b on device 1.
  EXPECT_EQ(realspace("d"), 1);
  EXPECT_EQ(residency(*daemon, "b")["state"], "absent");
  EXPECT_EQ(residency(*daemon, "c")["device"], 0);
  const auto capabilities = get_json(*daemon, "/api/browse/capabilities");
  EXPECT_EQ(capabilities["devices"][0]["resident_entries"], 1);
  EXPECT_EQ(capabilities["devices"][1]["resident_entries"], 1);
  EXPECT_EQ(capabilities["devices"][1]["active_resident_bytes"], capabilities["devices"][1]["resident_bytes"]);
  EXPECT_EQ(capabilities["devices"][0]["active_resident_bytes"], 0);
  const std::string metrics = daemon->get("/metrics")->body;
  EXPECT_NE(metrics.find("quantem_evictions_total 2"), std::string::npos) << metrics;
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeConcurrency, DeletingALoadOrAResidentFreesEverything) {
  write("big", "1", "48x48");
  auto daemon = Daemon::start(data.path(), {"--cpu-devices", "2", "--device-budget", "256MiB"});
  ASSERT_NE(daemon, nullptr);
  auto load = daemon->request("POST", "/api/browse/load?" + source("big"));
  ASSERT_TRUE(load);
  ASSERT_TRUE(load->status == 202 || load->status == 200) << load->body;
  auto evict = daemon->request("DELETE", "/api/browse/resident?" + source("big"));  // while loading, or just after
  ASSERT_TRUE(evict);
  EXPECT_EQ(evict->status, 200);
  EXPECT_EQ(json::parse(evict->body)["evicted"], true);
  EXPECT_EQ(json::parse(evict->body)["state"], "absent");
  EXPECT_TRUE(eventually([&] { return total_resident_bytes(*daemon) == 0; }));
  EXPECT_EQ(residency(*daemon, "big")["state"], "absent");
  // A later load starts afresh and completes.
  ASSERT_TRUE(daemon->request("POST", "/api/browse/load?" + source("big")));
  EXPECT_TRUE(eventually([&] { return residency(*daemon, "big")["state"] == "resident"; }));
  EXPECT_GT(total_resident_bytes(*daemon), 0u);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeConcurrency, TheWatcherDropsAResidentWhoseFilesAreRewritten) {
  write("a", "1");
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  const std::string target = "/api/browse/realspace?" + source("a") + "&mode=BF";
  auto before = daemon->get(target);
  ASSERT_TRUE(before);
  ASSERT_EQ(before->status, 200);
  ASSERT_EQ(residency(*daemon, "a")["state"], "resident");
  write("a", "9");  // rewritten in place after the load
  // No request names it: the watcher alone drops the stale resident.
  EXPECT_TRUE(eventually([&] { return total_resident_bytes(*daemon) == 0; }));
  auto after = daemon->get(target);
  ASSERT_TRUE(after);
  ASSERT_EQ(after->status, 200);
  EXPECT_NE(after->body, before->body);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeConcurrency, AShardBeingWrittenIsNeverServed) {
  write("a");
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  const std::string target = "/api/browse/realspace?" + source("a") + "&mode=BF";
  auto first = daemon->get(target);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200);

  const std::string shard = data.file("sess/a_data_000001.h5");
  const int fd = ::open(shard.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "more", 4), 4);  // a writer is appending and keeps the file open
  int status = 0;
  std::string detail;
  EXPECT_TRUE(eventually([&] {
    auto refused = daemon->get(target);
    status = refused ? refused->status : 0;
    detail = refused ? refused->body : "";
    return status == 409;
  }));
  ASSERT_EQ(status, 409) << detail;
  EXPECT_EQ(json::parse(detail)["detail"], "source files are being written: a_data_000001.h5");
  EXPECT_EQ(json::parse(daemon->get("/api/browse/acquisitions")->body)["pending"][0]["kind"], "writing");
  ::close(fd);
  // Served again at once after the close; the frames did not change.
  auto served = daemon->get(target);
  ASSERT_TRUE(served);
  EXPECT_EQ(served->status, 200) << served->body;
  EXPECT_EQ(served->body, first->body);
  EXPECT_EQ(daemon->stop(), 0);
}
