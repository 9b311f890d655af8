// The edges of loading through the real daemon: a shard whose read hangs
// holds one load, not its device; cancelling it frees its reservation; a
// catalog cache too large to read never holds readiness back.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using quantem::test::Daemon;
using quantem::test::TempDir;
using Clock = std::chrono::steady_clock;

void write_source(const std::string& folder, const std::string& stem) {
  const auto result = quantem::test::run_python_script(
      "products_load_fixture.py", "write " + folder + " " + stem + " --scan 8x8 --det 16x16 --dtype uint16 --no-expected");
  ASSERT_EQ(result.status, 0);
}

// quantem_resident_bytes of device 0 in /metrics.
std::uint64_t device_bytes(const Daemon& daemon) {
  const auto metrics = daemon.get("/metrics");
  if (!metrics) return 0;
  std::smatch match;
  const std::regex pattern("quantem_resident_bytes\\{device=\"0\"\\} (\\d+)");
  return std::regex_search(metrics->body, match, pattern) ? std::stoull(match[1]) : 0;
}

// The inspector workers of a daemon (its children running inspect-worker).
std::vector<pid_t> inspect_workers(pid_t daemon) {
  std::vector<pid_t> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    const std::string text((std::istreambuf_iterator<char>(stat)), {});
    const auto close = text.rfind(')');
    char state = 0;
    int parent = 0;
    if (close == std::string::npos || std::sscanf(text.c_str() + close + 1, " %c %d", &state, &parent) != 2 ||
        parent != daemon) {
      continue;
    }
    std::ifstream command_line(entry.path() / "cmdline");
    const std::string arguments((std::istreambuf_iterator<char>(command_line)), {});
    if (arguments.find("inspect-worker") != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

TEST(ServeLoadEdges, AShardWhoseReadHangsHoldsOneLoadNotItsDevice) {
  TempDir data;
  fs::create_directory(data.file("sess"));
  write_source(data.file("sess"), "good");
  write_source(data.file("sess"), "stuck");
  // The read of the stuck acquisition's data file never returns, as on a dead
  // NFS server or a FIFO nobody writes (the inspection refuses a FIFO that is
  // already there; one swapped in under a queued load hangs like this): the
  // inspector worker reading its storage never answers.
  auto daemon = Daemon::start(data.path(), {"--inspect-workers", "4"},
                              {{"QUANTEM_TEST_INSPECTOR_HANG_ON", "stuck_data_000001.h5"}});  // CPU: one device
  ASSERT_NE(daemon, nullptr);
  auto stuck = daemon->request("POST", "/api/browse/load?session=sess&file=stuck_master.h5");
  ASSERT_TRUE(stuck);
  ASSERT_EQ(stuck->status, 202) << stuck->body;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the stuck load is running

  // Another acquisition on the same device loads and answers at once.
  const auto start = Clock::now();
  auto good = daemon->get("/api/browse/realspace?session=sess&file=good_master.h5&mode=BF");
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200) << good->body;
  EXPECT_LT(seconds, 20.0);
  const json stuck_state =
      json::parse(daemon->get("/api/browse/residency?session=sess&file=stuck_master.h5")->body);
  EXPECT_EQ(stuck_state["state"], "loading") << stuck_state.dump();

  // Cancelled, the stuck load's reservation stops counting on the device:
  // what the device holds is the good resident (with its tile sums) alone.
  const auto good_bytes = [&] {
    const json doc = json::parse(daemon->get("/api/browse/residency?session=sess&file=good_master.h5")->body);
    return doc["resident_bytes"].get<std::uint64_t>() + doc["tile_sums"]["bytes"].get<std::uint64_t>();
  };
  ASSERT_GT(good_bytes(), 0u);
  EXPECT_GT(device_bytes(*daemon), good_bytes());  // the stuck load's reservation
  auto cancelled = daemon->request("DELETE", "/api/browse/resident?session=sess&file=stuck_master.h5");
  ASSERT_TRUE(cancelled);
  EXPECT_EQ(cancelled->status, 200) << cancelled->body;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (device_bytes(*daemon) != good_bytes() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(device_bytes(*daemon), good_bytes());
  EXPECT_EQ(daemon->get("/api/health/live")->status, 200);

  // End the stuck read (its worker killed: the load fails, a typed error), then stop.
  for (const pid_t worker : inspect_workers(daemon->pid())) ::kill(worker, SIGKILL);
  EXPECT_EQ(daemon->get("/api/browse/realspace?session=sess&file=good_master.h5&mode=BF")->status, 200);
  EXPECT_EQ(daemon->stop(), 0);
}

}  // namespace

namespace {

// A catalog cache file too large to read (sparse: no disk used) is ignored and
// replaced; readiness follows the catalog, never the cache.
TEST(ServeCatalogCacheEdges, AnOversizeOrUnallocatableCacheIsIgnoredAndReplaced) {
  TempDir data;
  fs::create_directory(data.file("sess"));
  write_source(data.file("sess"), "good");
  for (const std::uint64_t bytes : {1ull << 40, 300ull << 20}) {  // 1 TiB: bad_alloc; 300 MiB: over the cap
    SCOPED_TRACE(bytes);
    const std::string cache = data.file("cache.bin");
    const int fd = ::open(cache.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    ::close(fd);
    auto daemon = Daemon::start(data.path(), {"--catalog-cache", cache});  // waits for /api/health/ready
    ASSERT_NE(daemon, nullptr);
    auto image = daemon->get("/api/browse/realspace?session=sess&file=good_master.h5&mode=BF");
    ASSERT_TRUE(image);
    EXPECT_EQ(image->status, 200) << image->body;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (fs::file_size(cache) == bytes && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_LT(fs::file_size(cache), 1u << 20);  // replaced by the build's own
    EXPECT_EQ(daemon->stop(), 0);
    EXPECT_NE(daemon->stderr_text().find("more than the cap"), std::string::npos) << daemon->stderr_text();
  }
}

}  // namespace
