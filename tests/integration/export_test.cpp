// `quantem-gpu export` and the export job routes through the real binary:
// the result read back by h5py + the official bitshuffle filter and compared
// with numpy (export_reference.py), the export catalogued by the daemon with
// the same bright-field image as the plan on its source, and the faults that
// must leave nothing that looks finished: SIGKILL and Ctrl-C mid-export, a
// cancelled job, a name collision, no export folder.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon.hpp"
#include "export_folders.hpp"


namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using quantem::test::Daemon;
using quantem::test::run_quantem;
using quantem::test::nothing_finished_looking;
using quantem::test::TempDir;
using quantem::test::wait_for_partial_data;

constexpr const char* kDelayVariable = "QUANTEM_EXPORT_BATCH_DELAY_MS_FOR_TESTING";

void write_source(const std::string& folder, const std::string& stem, const std::string& options) {
  const auto result = quantem::test::run_python_script(
      "products_load_fixture.py", "write " + folder + " " + stem + " " + options + " --no-expected");
  ASSERT_EQ(result.status, 0);
}

std::vector<std::string> entries(const std::string& folder) { return quantem::test::folder_entries(folder); }

// Starts the CLI without waiting; returns its pid.
pid_t spawn_quantem(const std::vector<std::string>& arguments, const std::string& env_entry) {
  const pid_t pid = quantem::test::spawn_quietly(quantem::test::quantem_binary(), arguments, {env_entry});
  EXPECT_GT(pid, 0);
  return pid;
}

class ExportCli : public ::testing::Test {
 protected:
  void SetUp() override {
    write_source(dir.path(), "scan", "--scan 9x8 --det 10x12 --dtype uint16 --mask '3,3'");
    master = dir.file("scan_master.h5");
    out = dir.file("out");
    fs::create_directory(out);
  }
  TempDir dir;
  std::string master;
  std::string out;
};

TEST_F(ExportCli, WritesThePlanAndRefusesToOverwriteIt) {
  const auto result = run_quantem({"export", master, out, "--backend", "cpu", "--scan-crop", "1:9,2:8", "--det-bin",
                                   "2", "--scan-bin", "3", "--frames-per-file", "2", "--threads", "2"});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  const json report = json::parse(result.stdout_text);
  EXPECT_EQ(report["name"], "scan_crop1-9x2-8_scanbin3_detbin2");
  EXPECT_EQ(report["dtype"], "uint32");
  EXPECT_EQ(report["shape"], json({3, 2, 5, 6}));
  EXPECT_EQ(report["data_files"], 3);
  EXPECT_EQ(report["backend"], "cpu");
  EXPECT_EQ(report["encoder"], "host");
  for (const char* stage : {"read", "encode", "write", "total"}) EXPECT_TRUE(report["seconds"].contains(stage));
  const auto check = quantem::test::run_python_script(
      "export_reference.py", master + " " + report["master"].get<std::string>() +
                                 " --crop 1,9,2,8 --scan-bin 3 --det-bin 2 --frames-per-file 2");
  ASSERT_EQ(check.status, 0);
  const json checked = json::parse(check.output);
  EXPECT_TRUE(checked["checks"]["all"].get<bool>()) << checked.dump();
  EXPECT_EQ(entries(out), std::vector<std::string>{"scan_crop1-9x2-8_scanbin3_detbin2"});

  const auto again = run_quantem({"export", master, out, "--backend", "cpu", "--scan-crop", "1:9,2:8", "--det-bin",
                                  "2", "--scan-bin", "3"});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.stderr_text.find("already exists"), std::string::npos) << again.stderr_text;
}

TEST_F(ExportCli, TheCudaBackendIsNeverReplacedByTheCpu) {
  // The default backend is cuda: on a machine or build without CUDA the export
  // refuses to start; it never runs on the CPU instead.
  const auto result = run_quantem({"export", master, out});
  if (result.exit_code == 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.stderr_text.find("CUDA unavailable"), std::string::npos) << result.stderr_text;
  EXPECT_TRUE(entries(out).empty());
}

TEST_F(ExportCli, NoExportFolderIsAClearError) {
  const auto result = run_quantem({"export", master, dir.file("nowhere"), "--backend", "cpu"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.stderr_text.find("does not exist"), std::string::npos) << result.stderr_text;
}

TEST_F(ExportCli, KilledMidWriteLeavesNothingFinishedAndTheNextExportCleansUp) {
  const pid_t pid = spawn_quantem({"export", master, out, "--backend", "cpu", "--frames-per-file", "10", "--threads",
                                   "1", "--no-progress"},
                                  std::string(kDelayVariable) + "=300");
  ASSERT_TRUE(wait_for_partial_data(out, std::chrono::seconds(30)));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(nothing_finished_looking(out));
  ASSERT_EQ(entries(out).size(), 1u);  // the incomplete folder, clearly named
  EXPECT_NE(entries(out)[0].find(".incomplete-export"), std::string::npos);
  // The catalog does not list it.
  const auto catalog = run_quantem({"catalog", out});
  ASSERT_EQ(catalog.exit_code, 0);
  EXPECT_EQ(json::parse(catalog.stdout_text)["sessions"].size(), 0u);

  const auto result = run_quantem({"export", master, out, "--backend", "cpu"});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(entries(out), std::vector<std::string>{"scan_full"});
}

TEST_F(ExportCli, InterruptCancelsAndLeavesNothing) {
  const pid_t pid = spawn_quantem({"export", master, out, "--backend", "cpu", "--threads", "1", "--no-progress"},
                                  std::string(kDelayVariable) + "=300");
  ASSERT_TRUE(wait_for_partial_data(out, std::chrono::seconds(30)));
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_TRUE(entries(out).empty());
}

// --- the job routes ------------------------------------------------------------

class ExportRoutes : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directory(data.file("sess"));
    write_source(data.file("sess"), "scan", "--scan 9x8 --det 10x12 --dtype uint16 --mask '3,3;0,0;0,1;1,0;1,1'");
    fs::create_directory(data.file("exports"));
  }

  static json wait_for_job(const Daemon& daemon, const std::string& id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    json job;
    while (std::chrono::steady_clock::now() < deadline) {
      auto response = daemon.get("/api/browse/export/" + id);
      if (!response || response->status != 200) return json();
      job = json::parse(response->body);
      if (job["state"] != "queued" && job["state"] != "running") return job;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return job;
  }

  TempDir data;
  const std::string plan = "&row_start=1&row_stop=9&column_start=0&column_stop=7&scan_bin=2&det_bin=2";
};

TEST_F(ExportRoutes, AJobWritesThePlanAndTheCatalogedExportHasThePlansBrightField) {
  auto daemon = Daemon::start(data.path(), {"--export-dir", data.file("exports")});
  ASSERT_NE(daemon, nullptr);
  auto started = daemon->request("POST", "/api/browse/export?session=sess&file=scan_master.h5" + plan);
  ASSERT_TRUE(started);
  ASSERT_EQ(started->status, 202) << started->body;
  const json queued = json::parse(started->body);
  EXPECT_EQ(queued["name"], "scan_crop1-9x0-7_scanbin2_detbin2");
  EXPECT_EQ(started->get_header_value("location"), "/api/browse/export/" + queued["id"].get<std::string>());

  const json job = wait_for_job(*daemon, queued["id"]);
  ASSERT_EQ(job["state"], "done") << job.dump();
  EXPECT_EQ(job["frames_done"], job["frames_total"]);
  EXPECT_EQ(job["master"], "scan_crop1-9x0-7_scanbin2_detbin2/scan_crop1-9x0-7_scanbin2_detbin2_master.h5");
  const std::string export_master = data.file("exports/") + job["master"].get<std::string>();
  const auto check = quantem::test::run_python_script(
      "export_reference.py", data.file("sess/scan_master.h5") + " " + export_master +
                                 " --crop 1,9,0,7 --scan-bin 2 --det-bin 2");
  ASSERT_EQ(check.status, 0);
  EXPECT_TRUE(json::parse(check.output)["checks"]["all"].get<bool>()) << check.output;

  // The export folder lies inside the data folder: a refresh catalogues it.
  const json sessions = json::parse(daemon->get("/api/browse/sessions?refresh=true")->body);
  std::string session;
  for (const auto& s : sessions["sessions"]) {
    for (const auto& f : s["files"]) {
      if (f["name"] == "scan_crop1-9x0-7_scanbin2_detbin2_master.h5") {
        session = s["path"];
        EXPECT_TRUE(f["loadable"].get<bool>()) << f.dump();
      }
    }
  }
  ASSERT_EQ(session, "exports/scan_crop1-9x0-7_scanbin2_detbin2");
  auto source_bf = daemon->get("/api/browse/realspace?session=sess&file=scan_master.h5&mode=BF" + plan);
  auto export_bf = daemon->get("/api/browse/realspace?session=" + session +
                               "&file=scan_crop1-9x0-7_scanbin2_detbin2_master.h5&mode=BF");
  ASSERT_TRUE(source_bf && export_bf);
  ASSERT_EQ(source_bf->status, 200) << source_bf->body;
  ASSERT_EQ(export_bf->status, 200) << export_bf->body;
  EXPECT_EQ(export_bf->get_header_value("x-width"), source_bf->get_header_value("x-width"));
  EXPECT_EQ(export_bf->get_header_value("x-height"), source_bf->get_header_value("x-height"));
  EXPECT_EQ(export_bf->body, source_bf->body);

  // The same plan again: never overwritten.
  auto collision = daemon->request("POST", "/api/browse/export?session=sess&file=scan_master.h5" + plan);
  ASSERT_TRUE(collision);
  EXPECT_EQ(collision->status, 409);
  EXPECT_NE(collision->body.find("already exists"), std::string::npos) << collision->body;
  EXPECT_EQ(daemon->get("/api/browse/export/999")->status, 404);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ExportRoutes, ACancelledJobLeavesNothingAndTheDaemonKeepsServing) {
  auto daemon = Daemon::start(data.path(), {"--export-dir", data.file("exports"), "--cpu-threads", "1"},
                              {{kDelayVariable, "1000"}});
  ASSERT_NE(daemon, nullptr);
  auto started = daemon->request("POST", "/api/browse/export?session=sess&file=scan_master.h5");
  ASSERT_TRUE(started);
  ASSERT_EQ(started->status, 202) << started->body;
  const std::string id = json::parse(started->body)["id"];
  // Products of the same resident are answered while the export runs.
  auto bf = daemon->get("/api/browse/realspace?session=sess&file=scan_master.h5&mode=BF");
  ASSERT_TRUE(bf);
  EXPECT_EQ(bf->status, 200);
  auto cancelled = daemon->request("DELETE", "/api/browse/export/" + id);
  ASSERT_TRUE(cancelled);
  EXPECT_EQ(cancelled->status, 200);
  const json job = wait_for_job(*daemon, id);
  EXPECT_EQ(job["state"], "cancelled") << job.dump();
  EXPECT_TRUE(entries(data.file("exports")).empty());
  EXPECT_EQ(daemon->get("/api/browse/realspace?session=sess&file=scan_master.h5&mode=BF")->status, 200);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ExportRoutes, ADaemonKilledMidExportLeavesNothingFinishedAndTheNextStartCleansUp) {
  const std::string exports = data.file("exports");
  {
    auto daemon = Daemon::start(data.path(), {"--export-dir", exports, "--cpu-threads", "1"},
                                {{kDelayVariable, "1000"}});
    ASSERT_NE(daemon, nullptr);
    auto started = daemon->request("POST", "/api/browse/export?session=sess&file=scan_master.h5");
    ASSERT_TRUE(started);
    ASSERT_EQ(started->status, 202) << started->body;
    ASSERT_TRUE(wait_for_partial_data(exports, std::chrono::seconds(30)));
    EXPECT_EQ(daemon->stop(SIGKILL), -1);
  }
  EXPECT_TRUE(nothing_finished_looking(exports));
  ASSERT_EQ(entries(exports).size(), 1u);
  EXPECT_NE(entries(exports)[0].find(".incomplete-export"), std::string::npos);

  auto daemon = Daemon::start(data.path(), {"--export-dir", exports});
  ASSERT_NE(daemon, nullptr);
  EXPECT_TRUE(entries(exports).empty());  // removed at start: its writer is gone
  // Nothing of it was catalogued either.
  const json sessions = json::parse(daemon->get("/api/browse/sessions?refresh=true")->body);
  for (const auto& s : sessions["sessions"]) EXPECT_EQ(s["path"].get<std::string>().find("exports"), std::string::npos);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ExportRoutes, StoppingTheDaemonMidExportCancelsItAndLeavesNothing) {
  const std::string exports = data.file("exports");
  auto daemon = Daemon::start(data.path(), {"--export-dir", exports, "--cpu-threads", "1"},
                              {{kDelayVariable, "1000"}});
  ASSERT_NE(daemon, nullptr);
  auto started = daemon->request("POST", "/api/browse/export?session=sess&file=scan_master.h5");
  ASSERT_TRUE(started);
  ASSERT_EQ(started->status, 202) << started->body;
  ASSERT_TRUE(wait_for_partial_data(exports, std::chrono::seconds(30)));
  EXPECT_EQ(daemon->stop(), 0);
  EXPECT_TRUE(entries(exports).empty());
}

TEST_F(ExportRoutes, WithoutAnExportFolderTheRouteSaysHowToEnableIt) {
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  auto response = daemon->request("POST", "/api/browse/export?session=sess&file=scan_master.h5");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 409);
  EXPECT_NE(response->body.find("--export-dir"), std::string::npos) << response->body;
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ExportRoutes, NotEnoughSpaceFailsTheJobWithATypedError) {
  auto daemon = Daemon::start(data.path(), {"--export-dir", data.file("exports")},
                              {{"QUANTEM_EXPORT_FREE_BYTES_FOR_TESTING", "1000"}});
  ASSERT_NE(daemon, nullptr);
  auto started = daemon->request("POST", "/api/browse/export?session=sess&file=scan_master.h5");
  ASSERT_TRUE(started);
  ASSERT_EQ(started->status, 202);
  const json job = wait_for_job(*daemon, json::parse(started->body)["id"]);
  EXPECT_EQ(job["state"], "failed");
  EXPECT_EQ(job["error"]["status"], 413) << job.dump();
  EXPECT_TRUE(entries(data.file("exports")).empty());
  EXPECT_EQ(daemon->stop(), 0);
}

}  // namespace
