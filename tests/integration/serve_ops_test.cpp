// Operating the real `quantem-gpu serve` as its users do: runtime files of
// daemons that died, signals, token rules, a data folder that goes away, and
// `quantem-gpu info`.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon.hpp"

using quantem::test::Daemon;
using quantem::test::run_quantem;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

class ServeOps : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto synth = run_quantem({"synth", data_folder() + "/sess", "--prefix", "a", "--scan", "4x5", "--detector",
                                    "8x8", "--threads", "1"});
    ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  }
  std::string data_folder() const { return data.file("root"); }
  std::string runtime_file(pid_t pid) const { return runtime.file("server-" + std::to_string(pid) + ".json"); }
  std::map<std::string, std::string> runtime_env() const { return {{"QUANTEM_GPU_RUNTIME_DIR", runtime.path()}}; }

  quantem::test::TempDir data;
  quantem::test::TempDir runtime;
};

// A pid that no process has now: a child that has exited and been reaped.
pid_t reaped_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t count = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++count;
  return count;
}

bool wait_for(const std::function<bool()>& condition, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return condition();
}

void write_text(const std::string& path, const std::string& text, mode_t mode) {
  { std::ofstream(path) << text; }
  ::chmod(path.c_str(), mode);
}

}  // namespace

TEST_F(ServeOps, RuntimeFilesOfDeadDaemonsAreRemovedAtStartAndNeverListed) {
  auto live = Daemon::start(data_folder(), {}, runtime_env());
  ASSERT_NE(live, nullptr);
  auto killed = Daemon::start(data_folder(), {}, runtime_env());
  ASSERT_NE(killed, nullptr);
  const pid_t killed_pid = killed->pid();
  killed->stop(SIGKILL);  // no chance to clean up
  ASSERT_TRUE(fs::exists(runtime_file(killed_pid)));
  const pid_t dead_pid = reaped_pid();
  write_text(runtime_file(dead_pid), R"({"url":"http://127.0.0.1:1","pid":)" + std::to_string(dead_pid) + "}\n", 0600);
  // A pid that is alive but is not a quantem-gpu daemon (this test program).
  write_text(runtime_file(getpid()), R"({"url":"http://127.0.0.1:2"})" "\n", 0600);

  // The documented way to find a daemon lists only the live one.
  const auto info = run_quantem({"info", "--json"}, runtime_env());
  ASSERT_EQ(info.exit_code, 0) << info.stderr_text;
  const json listed = json::parse(info.stdout_text)["daemons"];
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  EXPECT_EQ(listed[0]["pid"], live->pid());
  EXPECT_EQ(listed[0]["url"], "http://127.0.0.1:" + std::to_string(live->port()));

  auto next = Daemon::start(data_folder(), {}, runtime_env());
  ASSERT_NE(next, nullptr);
  EXPECT_FALSE(fs::exists(runtime_file(killed_pid)));
  EXPECT_FALSE(fs::exists(runtime_file(dead_pid)));
  EXPECT_FALSE(fs::exists(runtime_file(getpid())));
  EXPECT_TRUE(fs::exists(runtime_file(live->pid())));
  EXPECT_TRUE(fs::exists(runtime_file(next->pid())));
  EXPECT_NE(next->stderr_text().find("removed the runtime file of daemon " + std::to_string(killed_pid)),
            std::string::npos)
      << next->stderr_text();
  EXPECT_EQ(next->stop(SIGTERM), 0);
  EXPECT_EQ(live->stop(SIGTERM), 0);
}

TEST_F(ServeOps, Sigusr1LogsTheStatusAndKeepsServing) {
  auto daemon = Daemon::start(data_folder(), {}, runtime_env());
  ASSERT_NE(daemon, nullptr);
  ::kill(daemon->pid(), SIGUSR1);
  EXPECT_TRUE(wait_for([&] { return daemon->stderr_text().find("status: ready; 0 residents") != std::string::npos; },
                       std::chrono::seconds(10)))
      << daemon->stderr_text();
  auto sessions = daemon->get("/api/browse/sessions");
  ASSERT_TRUE(sessions);
  EXPECT_EQ(sessions->status, 200);
  EXPECT_TRUE(fs::exists(runtime_file(daemon->pid())));
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
}

TEST_F(ServeOps, ShortTokenIsRefused) {
  auto env = runtime_env();
  env["QUANTEM_GPU_TOKEN"] = "x";
  const auto result = run_quantem({"serve", data_folder(), "--backend", "cpu", "--port", "0", "--port-file",
                                   data.file("port"), "--auth", "token"},
                                  env);
  EXPECT_EQ(result.exit_code, 78);
  EXPECT_NE(result.stderr_text.find("the token is too short (1 characters; at least 16 are required)"),
            std::string::npos)
      << result.stderr_text;
  EXPECT_TRUE(fs::is_empty(runtime.path()));
}

TEST_F(ServeOps, TokenFileAccessibleByOthersIsRefusedLikeAnSshKey) {
  const std::string token = "0123456789abcdef0123456789abcdef";
  const std::string token_file = data.file("token");
  write_text(token_file, token + "\n", 0644);
  auto env = runtime_env();
  env["QUANTEM_GPU_TOKEN"] = "";
  env["QUANTEM_GPU_TOKEN_FILE"] = token_file;
  const auto refused = run_quantem({"serve", data_folder(), "--backend", "cpu", "--port", "0", "--port-file",
                                    data.file("port"), "--auth", "token"},
                                   env);
  EXPECT_EQ(refused.exit_code, 78);
  EXPECT_NE(refused.stderr_text.find("permissions 0644 for the token file " + token_file + " are too open"),
            std::string::npos)
      << refused.stderr_text;

  ::chmod(token_file.c_str(), 0600);
  auto daemon = Daemon::start(data_folder(), {"--auth", "token"}, env);
  ASSERT_NE(daemon, nullptr);
  auto accepted = daemon->get("/api/browse/capabilities", {{"Authorization", "Bearer " + token}});
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->status, 200);
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
}

TEST_F(ServeOps, DataFolderRenamedAwayKeepsTheLastGoodCatalogMarkedStale) {
  auto daemon = Daemon::start(data_folder(), {}, runtime_env());
  ASSERT_NE(daemon, nullptr);
  const json before = json::parse(daemon->get("/api/browse/sessions")->body);
  ASSERT_EQ(before["sessions"].size(), 1u);
  EXPECT_FALSE(before.contains("stale"));  // the reference's document while the folder is fine

  const std::string away = data.file("renamed-away");
  fs::rename(data_folder(), away);
  auto sessions = daemon->get("/api/browse/sessions?refresh=1");
  ASSERT_TRUE(sessions);
  ASSERT_EQ(sessions->status, 200);
  const json stale = json::parse(sessions->body);
  EXPECT_EQ(stale["sessions"], before["sessions"]);  // the last good catalog, not an empty list
  EXPECT_EQ(stale["data_folder"], before["data_folder"]);
  EXPECT_EQ(stale["stale"], true);
  EXPECT_NE(stale["stale_reason"].get<std::string>().find("cannot be read: No such file or directory"),
            std::string::npos)
      << stale.dump();
  EXPECT_TRUE(stale["stale_since"].is_string());

  auto ready = daemon->get("/api/health/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503);
  EXPECT_EQ(ready->get_header_value("retry-after"), "1");
  EXPECT_NE(json::parse(ready->body)["reason"].get<std::string>().find("No such file or directory"), std::string::npos);
  // An acquisition of the last good catalog whose files are gone: a typed error, and the daemon keeps serving.
  auto image = daemon->get("/api/browse/realspace?session=sess&file=a_master.h5");
  ASSERT_TRUE(image);
  EXPECT_GE(image->status, 400) << image->body;
  EXPECT_TRUE(json::parse(image->body).contains("detail")) << image->body;
  EXPECT_EQ(daemon->get("/api/health/live")->status, 200);

  // Logged once, however often it is looked at (the signal loop checks every second).
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ(count_of(daemon->stderr_text(), "cannot be read"), 1u) << daemon->stderr_text();

  fs::rename(away, data_folder());
  EXPECT_TRUE(wait_for([&] { return daemon->get("/api/health/ready")->status == 200; }, std::chrono::seconds(10)));
  const json back = json::parse(daemon->get("/api/browse/sessions?refresh=1")->body);
  EXPECT_FALSE(back.contains("stale"));
  EXPECT_EQ(back["sessions"], before["sessions"]);
  EXPECT_NE(daemon->stderr_text().find("can be read again"), std::string::npos);
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
}

TEST_F(ServeOps, UnreadableDataFolderIsReportedWithItsReason) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root: chmod 000 does not deny root (EACCES cannot happen); "
                    "DataFolderRenamedAwayKeepsTheLastGoodCatalogMarkedStale covers the same path";
  }
  auto daemon = Daemon::start(data_folder(), {}, runtime_env());
  ASSERT_NE(daemon, nullptr);
  ::chmod(data_folder().c_str(), 0);
  const json stale = json::parse(daemon->get("/api/browse/sessions?refresh=1")->body);
  ::chmod(data_folder().c_str(), 0755);
  EXPECT_EQ(stale["sessions"].size(), 1u);
  EXPECT_NE(stale.value("stale_reason", std::string()).find("Permission denied"), std::string::npos) << stale.dump();
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
}

TEST_F(ServeOps, InfoSaysWhatCudaThisHostHas) {
  const auto text = run_quantem({"info"}, runtime_env());
  ASSERT_EQ(text.exit_code, 0) << text.stderr_text;
  const auto as_json = run_quantem({"info", "--json"}, runtime_env());
  ASSERT_EQ(as_json.exit_code, 0);
  const json info = json::parse(as_json.stdout_text);
  EXPECT_NE(text.stdout_text.find("quantem-gpu " + info["version"].get<std::string>()), std::string::npos);
  if (!info["cuda"]["built_with_cuda"].get<bool>()) {
    EXPECT_NE(text.stdout_text.find("CUDA: not available in this build"), std::string::npos) << text.stdout_text;
  } else if (info["cuda"]["gpus"].empty()) {
    EXPECT_NE(text.stdout_text.find("no CUDA device"), std::string::npos) << text.stdout_text;
  } else {
    for (const auto& gpu : info["cuda"]["gpus"]) {
      EXPECT_GT(gpu["total_bytes"].get<std::uint64_t>(), 0u);
      EXPECT_LE(gpu["budget_bytes"].get<std::uint64_t>(), gpu["total_bytes"].get<std::uint64_t>());
    }
  }
  EXPECT_NE(text.stdout_text.find("daemon: none of this user is running"), std::string::npos) << text.stdout_text;
  EXPECT_EQ(info["runtime_directory"], runtime.path());
  // Tokens never appear in the report.
  EXPECT_EQ(as_json.stdout_text.find("\"token\""), std::string::npos);
}

TEST_F(ServeOps, LogsCarryJournalPrioritiesUnderSystemdAndNoColourCodesElsewhere) {
  auto env = runtime_env();
  env["JOURNAL_STREAM"] = "8:12345";  // systemd sets it when stderr is the journal
  auto journal = Daemon::start(data_folder(), {}, env);
  ASSERT_NE(journal, nullptr);
  EXPECT_EQ(journal->stop(SIGTERM), 0);
  const std::string journal_log = journal->stderr_text();
  EXPECT_EQ(journal_log.rfind("<6>", 0), 0u) << journal_log;
  EXPECT_NE(journal_log.find("\n<6>ready\n"), std::string::npos) << journal_log;
  EXPECT_EQ(journal_log.find('\x1b'), std::string::npos);

  env["JOURNAL_STREAM"] = "";
  auto plain = Daemon::start(data_folder(), {}, env);  // stderr is a file, not a terminal
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->stop(SIGTERM), 0);
  EXPECT_NE(plain->stderr_text().find("[info] ready"), std::string::npos) << plain->stderr_text();
  EXPECT_EQ(plain->stderr_text().find('\x1b'), std::string::npos);
}
