// Crafted masters must not take the daemon down (decision 0012): the real
// `quantem-gpu serve` on a folder holding the masters that crash libhdf5
// (tests/fuzz/known-crashes/inspect_master/) beside valid synthesized
// acquisitions keeps serving; those masters show the inspector's reason, the
// others list, load and serve. The same for a worker that abort()s or hangs
// (test hooks of inspector/worker.hpp).
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon.hpp"

using quantem::test::Daemon;
using quantem::test::run_quantem;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

class ServeInspector : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* prefix : {"a", "b"}) {
      const auto synth = run_quantem({"synth", session_dir(), "--prefix", prefix, "--scan", "4x5", "--detector", "8x8",
                                      "--threads", "1"});
      ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
    }
  }
  std::string data_folder() const { return data.file("root"); }
  std::string session_dir() const { return data_folder() + "/sess"; }
  std::string stopped(const std::string& name) const {
    return "master file is not readable HDF5: " + session_dir() + "/" + name + " (the inspector stopped on this file)";
  }
  // name -> load_status of the sessions document.
  static std::map<std::string, json> statuses(const Daemon& daemon) {
    std::map<std::string, json> found;
    auto response = daemon.get("/api/browse/sessions");
    EXPECT_TRUE(response);
    if (!response) return found;
    EXPECT_EQ(response->status, 200) << response->body;
    const json document = json::parse(response->body);
    for (const auto& session : document["sessions"])
      for (const auto& file : session["files"]) found[file["name"].get<std::string>()] = file["load_status"];
    return found;
  }
  static void expect_serves(const Daemon& daemon, const std::string& stem) {
    SCOPED_TRACE(stem);
    auto cbed = daemon.get("/api/browse/cbed?session=sess&file=" + stem + "_master.h5&sx=1&sy=2&ensure_resident=true");
    ASSERT_TRUE(cbed);
    EXPECT_EQ(cbed->status, 200) << cbed->body;
  }
  quantem::test::TempDir data;
};

TEST_F(ServeInspector, KnownLibhdf5CrashesDoNotTakeTheDaemonDown) {
  std::vector<std::string> crashes;
  for (const auto& entry :
       fs::directory_iterator(quantem::test::source_dir() + "/tests/fuzz/known-crashes/inspect_master")) {
    crashes.push_back(entry.path().filename().string());
    fs::copy_file(entry.path(), session_dir() + "/" + crashes.back());
  }
  ASSERT_FALSE(crashes.empty());
  // Before the inspector, this daemon died with SIGSEGV right after it started.
  auto daemon = Daemon::start(data_folder());
  ASSERT_NE(daemon, nullptr);
  auto found = statuses(*daemon);
  EXPECT_EQ(found.size(), 2 + crashes.size());
  for (const auto& name : crashes) {
    SCOPED_TRACE(name);
    EXPECT_EQ(found[name]["loadable"], false);
    EXPECT_EQ(found[name]["reason"], stopped(name));
    // Resolving it is the ordinary not-ready answer, not a crash.
    auto refused = daemon->get("/api/browse/cbed?session=sess&file=" + name + "&sx=0&sy=0&ensure_resident=true");
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 409) << refused->body;
  }
  EXPECT_EQ(found["a_master.h5"]["loadable"], true);
  EXPECT_EQ(found["b_master.h5"]["loadable"], true);
  expect_serves(*daemon, "a");
  expect_serves(*daemon, "b");
  auto poll = daemon->get("/api/browse/acquisitions");
  ASSERT_TRUE(poll);
  EXPECT_EQ(poll->status, 200) << poll->body;
  // A refresh asks the inspector again (a condemned master is retried), and
  // the daemon survives that too.
  EXPECT_EQ(daemon->get("/api/browse/sessions?refresh=true")->status, 200);
  EXPECT_EQ(::kill(daemon->pid(), 0), 0);
  EXPECT_EQ(daemon->stop(), 0);
  std::size_t stops = 0;
  const std::string log = daemon->stderr_text();
  for (auto at = log.find("inspector: worker"); at != std::string::npos; at = log.find("inspector: worker", at + 1)) ++stops;
  // Each crash condemns on its second strike, three times: the first build,
  // the product request (a resolve retries a condemned master once per
  // interval) and the refresh. Polls and lists in between ask nothing.
  EXPECT_EQ(stops, 6 * crashes.size()) << log;
}

TEST_F(ServeInspector, AbortingWorkerIsRestartedAndTheOthersServe) {
  auto daemon = Daemon::start(data_folder(), {}, {{"QUANTEM_TEST_INSPECTOR_ABORT_ON", "a_master.h5"}});
  ASSERT_NE(daemon, nullptr);
  auto found = statuses(*daemon);
  EXPECT_EQ(found["a_master.h5"]["reason"], stopped("a_master.h5"));
  EXPECT_EQ(found["b_master.h5"]["loadable"], true);
  expect_serves(*daemon, "b");
  EXPECT_EQ(daemon->stop(), 0);
  EXPECT_NE(daemon->stderr_text().find("killed by signal 6"), std::string::npos) << daemon->stderr_text();
}

TEST_F(ServeInspector, HangingInspectionMissesItsDeadline) {
  auto daemon =
      Daemon::start(data_folder(), {"--inspect-timeout", "0.5"}, {{"QUANTEM_TEST_INSPECTOR_HANG_ON", "b_master.h5"}});
  ASSERT_NE(daemon, nullptr);
  auto found = statuses(*daemon);
  EXPECT_EQ(found["b_master.h5"]["reason"], stopped("b_master.h5"));
  EXPECT_EQ(found["a_master.h5"]["loadable"], true);
  expect_serves(*daemon, "a");
  EXPECT_EQ(daemon->stop(), 0);
  EXPECT_NE(daemon->stderr_text().find("no answer within 500 ms"), std::string::npos) << daemon->stderr_text();
}

TEST_F(ServeInspector, InspectTimeoutIsValidated) {
  const auto refused = run_quantem({"serve", data_folder(), "--backend", "cpu", "--inspect-timeout", "0"});
  EXPECT_EQ(refused.exit_code, 78);
  EXPECT_NE(refused.stderr_text.find("--inspect-timeout must be between 0.05 and 3600 seconds"), std::string::npos)
      << refused.stderr_text;
}

TEST_F(ServeInspector, CatalogCommandSurvivesAKnownCrash) {
  for (const auto& entry :
       fs::directory_iterator(quantem::test::source_dir() + "/tests/fuzz/known-crashes/inspect_master")) {
    fs::copy_file(entry.path(), session_dir() + "/" + entry.path().filename().string());
  }
  const auto catalog = run_quantem({"catalog", data_folder()});
  ASSERT_EQ(catalog.exit_code, 0) << catalog.stderr_text;  // was 139 (SIGSEGV)
  EXPECT_NE(catalog.stdout_text.find("(the inspector stopped on this file)"), std::string::npos) << catalog.stdout_text;
}

}  // namespace

namespace {

// Loads read each shard's libhdf5 facts through the worker too: a worker that
// dies there fails that load with a typed error, and the daemon goes on.
TEST_F(ServeInspector, LoadsReadShardStorageThroughTheWorker) {
  auto daemon = Daemon::start(data_folder(), {}, {{"QUANTEM_TEST_INSPECTOR_ABORT_ON", "a_data_000001.h5"}});
  ASSERT_NE(daemon, nullptr);
  auto found = statuses(*daemon);
  EXPECT_EQ(found["a_master.h5"]["loadable"], true);  // inspection never asks about the shard by name
  auto failed = daemon->get("/api/browse/cbed?session=sess&file=a_master.h5&sx=1&sy=2&ensure_resident=true");
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->status, 422) << failed->body;
  EXPECT_NE(failed->body.find("the inspector stopped while reading the storage of " + session_dir() +
                              "/a_data_000001.h5:"),
            std::string::npos)
      << failed->body;
  expect_serves(*daemon, "b");
  EXPECT_EQ(daemon->stop(), 0);
}

}  // namespace

namespace {

// The inspector workers of a daemon: its children running `inspect-worker`.
std::vector<pid_t> inspect_workers(pid_t daemon) {
  std::vector<pid_t> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    const auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int parent = 0;
    if (std::sscanf(text.c_str() + close + 1, " %c %d", &state, &parent) != 2 || parent != daemon) continue;
    std::ifstream command_line(entry.path() / "cmdline");
    const std::string arguments((std::istreambuf_iterator<char>(command_line)), {});
    if (arguments.find("inspect-worker") != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

// Workers killed while idle are replaced; the next master inspected is not
// condemned for their deaths.
TEST_F(ServeInspector, WorkersKilledWhileIdleAreReplacedWithoutAStrike) {
  auto daemon = Daemon::start(data_folder(), {"--inspect-workers", "2"});
  ASSERT_NE(daemon, nullptr);
  const std::vector<pid_t> workers = inspect_workers(daemon->pid());
  ASSERT_FALSE(workers.empty());
  for (const pid_t worker : workers) ::kill(worker, SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto synth = run_quantem({"synth", session_dir(), "--prefix", "c", "--scan", "4x5", "--detector", "8x8",
                                  "--threads", "1"});
  ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  auto refreshed = daemon->get("/api/browse/sessions?refresh=true");
  ASSERT_TRUE(refreshed);
  auto found = statuses(*daemon);
  ASSERT_TRUE(found.count("c_master.h5"));
  EXPECT_EQ(found["c_master.h5"]["loadable"], true) << found["c_master.h5"].dump();
  expect_serves(*daemon, "c");
  EXPECT_EQ(daemon->stop(), 0);
}

}  // namespace
