// Residency through the real binary: CPU virtual devices listed like GPUs,
// placement on the least-populated device, per-device LRU, 413 before any
// load, background loads, eviction, and rewritten files never served stale.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon.hpp"

using quantem::test::Daemon;
using quantem::test::run_quantem;
using json = nlohmann::json;

namespace {

class ServeResidency : public ::testing::Test {
 protected:
  void write(const std::string& prefix, const std::string& seed = "1") {
    const auto synth = run_quantem({"synth", data.file("sess"), "--prefix", prefix, "--scan", "6x5", "--detector",
                                    "12x12", "--threads", "1", "--seed", seed});
    ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  }
  static std::string source(const std::string& prefix) { return "session=sess&file=" + prefix + "_master.h5"; }
  static json residency(const Daemon& daemon, const std::string& prefix) {
    auto response = daemon.get("/api/browse/residency?" + source(prefix));
    EXPECT_TRUE(response && response->status == 200);
    return response ? json::parse(response->body) : json();
  }
  static int device_of(const httplib::Result& response) {
    return json::parse(response->get_header_value("x-quantem-provenance"))["device_index"];
  }
  quantem::test::TempDir data;
};

}  // namespace

TEST_F(ServeResidency, VirtualDevicesAreListedLikeGpus) {
  write("a");
  auto daemon = Daemon::start(data.path(), {"--cpu-devices", "3", "--device-budget", "64MiB"});
  ASSERT_NE(daemon, nullptr);
  const auto doc = json::parse(daemon->get("/api/browse/capabilities")->body);
  EXPECT_EQ(doc["backend"], "cpu");
  EXPECT_EQ(doc["browse_gpus"], json::array({0, 1, 2}));
  EXPECT_TRUE(doc["browse_gpu"].is_null());
  EXPECT_EQ(doc["features"]["multi_gpu_residency"], true);
  EXPECT_EQ(doc["cache_budget_bytes"], 64 << 20);
  EXPECT_EQ(doc["aggregate_cache_budget_bytes"], 3 * (64 << 20));
  ASSERT_EQ(doc["devices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const auto& device = doc["devices"][i];
    EXPECT_EQ(device["index"], i);
    EXPECT_EQ(device["cache_budget_bytes"], 64 << 20);
    EXPECT_EQ(device["resident_bytes"], 0);
    EXPECT_EQ(device["resident_entries"], 0);
    for (const char* key : {"name", "total_memory_bytes", "free_bytes", "active_resident_bytes", "evictable_bytes",
                            "available_peak_bytes", "available_resident_bytes"}) {
      EXPECT_TRUE(device.contains(key)) << key;
    }
  }
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeResidency, WholeAcquisitionsGoToTheLeastPopulatedDeviceAndLruEvictsOnlyThere) {
  for (const char* prefix : {"a", "b", "c"}) write(prefix);
  auto daemon = Daemon::start(data.path(), {"--cpu-devices", "2", "--device-budget", "64MiB", "--cache-entries", "1"});
  ASSERT_NE(daemon, nullptr);
  auto a = daemon->get("/api/browse/realspace?" + source("a"));
  auto b = daemon->get("/api/browse/realspace?" + source("b"));
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->status, 200);
  ASSERT_EQ(b->status, 200);
  EXPECT_NE(device_of(a), device_of(b));  // one acquisition per device
  auto capabilities = json::parse(daemon->get("/api/browse/capabilities")->body);
  EXPECT_EQ(capabilities["devices"][0]["resident_entries"], 1);
  EXPECT_EQ(capabilities["devices"][1]["resident_entries"], 1);

  // Any crop or bin of a resident acquisition is a view: no reload, no eviction.
  auto binned = daemon->get("/api/browse/realspace?" + source("a") +
                            "&scan_bin=2&det_bin=3&row_start=1&row_stop=6&column_start=0&column_stop=4");
  ASSERT_TRUE(binned);
  EXPECT_EQ(binned->status, 200);
  EXPECT_EQ(device_of(binned), device_of(a));

  auto c = daemon->get("/api/browse/realspace?" + source("c"));
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200);
  const int c_device = device_of(c);
  const std::string evicted = c_device == device_of(a) ? "a" : "b";
  const std::string kept = evicted == "a" ? "b" : "a";
  EXPECT_EQ(residency(*daemon, evicted)["state"], "absent");
  EXPECT_EQ(residency(*daemon, kept)["state"], "resident");
  EXPECT_EQ(residency(*daemon, "c")["device"], c_device);

  const std::string metrics = daemon->get("/metrics")->body;
  EXPECT_NE(metrics.find("quantem_loads_completed_total 3"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("quantem_evictions_total 1"), std::string::npos) << metrics;
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeResidency, AnEstimateAboveEveryBudgetIsRefusedBeforeLoading) {
  write("a");
  auto daemon = Daemon::start(data.path(), {"--cpu-devices", "2", "--device-budget", "1KiB"});
  ASSERT_NE(daemon, nullptr);
  for (const char* route : {"realspace", "realspace-shape", "cbed", "cbed-region"}) {
    const std::string extra = std::string(route) == "realspace-shape" ? "&outer=2" : "&ensure_resident=true";
    auto response = daemon->get(std::string("/api/browse/") + route + "?" + source("a") + extra);
    ASSERT_TRUE(response);
    EXPECT_EQ(response->status, 413) << route << ": " << response->body;
    const std::string detail = json::parse(response->body)["detail"];
    EXPECT_TRUE(std::regex_match(detail, std::regex("Requested exact load needs a [0-9.]+ [KMGT]?B transition peak but "
                                                    "the largest per-GPU data-cache budget is 1\\.0 KB\\. Crop the scan "
                                                    "region or increase scan/detector binning\\.")))
        << detail;
  }
  auto load = daemon->request("POST", "/api/browse/load?" + source("a"));
  ASSERT_TRUE(load);
  EXPECT_EQ(load->status, 413);
  EXPECT_EQ(residency(*daemon, "a")["state"], "absent");
  const std::string metrics = daemon->get("/metrics")->body;
  EXPECT_NE(metrics.find("quantem_loads_started_total 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("quantem_admission_rejections_total 5"), std::string::npos) << metrics;
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeResidency, BackgroundLoadThenEvict) {
  write("a");
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  EXPECT_EQ(residency(*daemon, "a")["state"], "absent");
  auto load = daemon->request("POST", "/api/browse/load?" + source("a"));
  ASSERT_TRUE(load);
  EXPECT_TRUE(load->status == 202 || load->status == 200) << load->body;
  EXPECT_EQ(load->get_header_value("location"), "/api/browse/residency?" + source("a"));
  json status;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    status = residency(*daemon, "a");
    if (status["state"] == "resident") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(status["state"], "resident") << status.dump();
  EXPECT_EQ(status["device"], 0);
  EXPECT_GT(status["resident_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(status["bytes_done"], status["bytes_total"]);
  EXPECT_TRUE(status["encoding"].is_string());

  auto cbed = daemon->get("/api/browse/cbed?" + source("a") + "&sx=2&sy=2");
  ASSERT_TRUE(cbed);
  EXPECT_EQ(cbed->status, 200);  // resident: served without ensure_resident
  auto evict = daemon->request("DELETE", "/api/browse/resident?" + source("a"));
  ASSERT_TRUE(evict);
  EXPECT_EQ(json::parse(evict->body)["evicted"], true);
  EXPECT_EQ(residency(*daemon, "a")["state"], "absent");
  EXPECT_EQ(daemon->get("/api/browse/cbed?" + source("a") + "&sx=2&sy=2")->status, 409);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeResidency, ARewrittenAcquisitionIsNeverServedFromStaleMemory) {
  write("a", "1");
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  const std::string target = "/api/browse/realspace?" + source("a") + "&mode=ADF&inner=0.5&outer=2";
  auto before = daemon->get(target);
  ASSERT_TRUE(before);
  ASSERT_EQ(before->status, 200);
  ASSERT_EQ(daemon->get(target)->body, before->body);  // cached or recomputed: identical

  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  write("a", "7");  // same names, different counts
  auto after = daemon->get(target);
  ASSERT_TRUE(after);
  ASSERT_EQ(after->status, 200);
  EXPECT_NE(after->body, before->body);
  EXPECT_NE(json::parse(after->get_header_value("x-quantem-provenance"))["signature"],
            json::parse(before->get_header_value("x-quantem-provenance"))["signature"]);

  // A fresh daemon on the rewritten files gives the same answer.
  auto fresh = Daemon::start(data.path());
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(fresh->get(target)->body, after->body);
  EXPECT_EQ(fresh->stop(), 0);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeResidency, FractionalDeviceBudgetAndIdleReleaseThroughTheBinary) {
  write("a");
  auto daemon =
      Daemon::start(data.path(), {"--cpu-devices", "2", "--device-budget", "25%", "--idle-release", "1s"});
  ASSERT_NE(daemon, nullptr);
  const auto doc = json::parse(daemon->get("/api/browse/capabilities")->body);
  EXPECT_EQ(doc["cache_fraction"], 0.25);
  for (const auto& device : doc["devices"]) {
    const auto total = device["total_memory_bytes"].get<std::uint64_t>();
    EXPECT_EQ(device["cache_budget_bytes"].get<std::uint64_t>(),
              static_cast<std::uint64_t>(static_cast<double>(total) * 0.25) / 2);
  }
  auto load = daemon->request("POST", "/api/browse/load?" + source("a"));
  ASSERT_TRUE(load);
  // Resident, then released after one idle second (checked every second): generous bound.
  bool was_resident = false, released = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && !released) {
    const std::string state = residency(*daemon, "a")["state"];
    was_resident = was_resident || state == "resident";
    released = was_resident && state == "absent";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(was_resident);
  ASSERT_TRUE(released);
  const std::string metrics = daemon->get("/metrics")->body;
  EXPECT_NE(metrics.find("quantem_idle_releases_total 1"), std::string::npos) << metrics;
  // The next request loads it again.
  EXPECT_EQ(daemon->get("/api/browse/cbed?" + source("a") + "&sx=2&sy=2&ensure_resident=true")->status, 200);
  EXPECT_EQ(daemon->stop(), 0);
}

// Tile sums through the daemon: once the residency document says they are
// ready, BF on fresh crops (the bright-field fit sums the crop's patterns) and
// cbed-region square sums equal, byte for byte, the same requests to a daemon
// started with --no-tile-sums, whose crops decode every frame.
TEST_F(ServeResidency, CropsWithTileSumsEqualCropsWithout) {
  const auto synth = run_quantem({"synth", data.file("sess"), "--prefix", "t", "--scan", "48x40", "--detector",
                                  "12x12", "--threads", "1", "--seed", "5"});
  ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  auto with = Daemon::start(data.path(), {"--cpu-threads", "2"});
  auto without = Daemon::start(data.path(), {"--cpu-threads", "2", "--no-tile-sums"});
  ASSERT_NE(with, nullptr);
  ASSERT_NE(without, nullptr);
  for (const Daemon* daemon : {with.get(), without.get()}) {
    ASSERT_EQ(daemon->request("POST", "/api/browse/load?" + source("t"))->status / 100, 2);
  }
  json tiles;
  for (int poll = 0; poll < 200; ++poll) {
    tiles = residency(*with, "t")["tile_sums"];
    if (tiles["state"] == "ready") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(tiles["state"], "ready") << tiles;
  EXPECT_EQ(tiles["bytes"], 3 * 3 * 144 * 8);  // tiles of 16 positions, one uint64 per detector pixel
  EXPECT_EQ(residency(*without, "t")["tile_sums"]["state"], "none");
  EXPECT_EQ(residency(*without, "t")["tile_sums"]["bytes"], 0);

  const std::vector<std::string> crops = {
      "&row_start=0&row_stop=48&column_start=0&column_stop=39",   // all but one column: whole tiles + edge
      "&row_start=3&row_stop=45&column_start=5&column_stop=40",   // across tiles, touching the right edge
      "&row_start=16&row_stop=32&column_start=16&column_stop=32", // exactly one tile
      "&row_start=17&row_stop=18&column_start=0&column_stop=40",  // one row
      "&row_start=2&row_stop=14&column_start=3&column_stop=9",    // inside one tile
      "&row_start=1&row_stop=48&column_start=0&column_stop=37&scan_bin=3&det_bin=2",  // partial scan bins
  };
  for (const std::string& crop : crops) {
    const std::string target = "/api/browse/realspace?" + source("t") + "&mode=BF" + crop;
    const auto a = with->get(target);
    const auto b = without->get(target);
    ASSERT_TRUE(a && b) << crop;
    ASSERT_EQ(a->status, 200) << crop << a->body;
    ASSERT_EQ(b->status, 200) << crop << b->body;
    EXPECT_EQ(a->body, b->body) << crop;
  }
  for (const std::string roi : {"&cx=20.5&cy=24.5&radius=15.5", "&cx=10&cy=30&radius=9", "&cx=39&cy=47&radius=20"}) {
    for (const std::string reduce : {"sum", "mean", "max"}) {
      const std::string target = "/api/browse/cbed-region?" + source("t") + "&shape=square&reduce=" + reduce + roi;
      const auto a = with->get(target);
      const auto b = without->get(target);
      ASSERT_TRUE(a && b) << roi;
      ASSERT_EQ(a->status, 200) << roi << a->body;
      EXPECT_EQ(a->body, b->body) << roi << " " << reduce;
      EXPECT_EQ(a->get_header_value("x-value-divisor"), b->get_header_value("x-value-divisor")) << roi;
    }
  }
  EXPECT_EQ(with->stop(), 0);
  EXPECT_EQ(without->stop(), 0);
}
