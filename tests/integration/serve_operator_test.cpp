// The edges an operator meets with the real `quantem-gpu serve`: a log stream
// that closes, its runtime folder, token files that are not files, exit
// statuses and their priority under systemd, SIGHUP, the log level, the end
// of stdin, a socket daemon's curl arguments, small budgets on many threads.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon.hpp"
#include "raw_http.hpp"

using quantem::test::Daemon;
using quantem::test::run_quantem;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr int kConfigurationStatus = 78;  // EX_CONFIG: docs/deploy.md "Exit statuses"

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

bool wait_for(const std::function<bool()>& condition, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return condition();
}

std::optional<int> wait_exit(pid_t pid, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (true) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    if (std::chrono::steady_clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A child process with the standard streams the test chooses; killed when the
// test ends without reaping it.
class Child {
 public:
  // `setup` runs in the child after fork (redirections, setsid), then execv(argv).
  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
        const std::function<void()>& setup) {
    std::vector<std::string> storage = argv;
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
      setup();
      std::vector<char*> pointers;
      for (auto& argument : storage) pointers.push_back(argument.data());
      pointers.push_back(nullptr);
      ::execv(pointers[0], pointers.data());
      _exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      wait_exit(pid_, std::chrono::seconds(10));
    }
  }
  pid_t pid() const { return pid_; }
  std::optional<int> wait(std::chrono::seconds limit) {
    const auto code = wait_exit(pid_, limit);
    reaped_ = code.has_value();
    return code;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

void redirect(int fd, const std::string& path) {
  const int opened = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ::dup2(opened, fd);
  ::close(opened);
}

class ServeOperator : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto synth = run_quantem({"synth", data_folder() + "/sess", "--prefix", "a", "--scan", "4x5", "--detector",
                                    "8x8", "--threads", "1"});
    ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  }
  std::string data_folder() const { return data.file("root"); }
  std::map<std::string, std::string> runtime_env() const { return {{"QUANTEM_GPU_RUNTIME_DIR", runtime.path()}}; }
  std::vector<std::string> serve_arguments(const std::string& port_file) const {
    return {quantem::test::quantem_binary(), "serve", data_folder(), "--backend", "cpu", "--port", "0",
            "--port-file", port_file};
  }
  int wait_port(const std::string& port_file) const {
    int port = 0;
    wait_for([&] { return (port = std::atoi(slurp(port_file).c_str())) > 0; }, std::chrono::seconds(30));
    return port;
  }

  quantem::test::TempDir data;
  quantem::test::TempDir runtime;
};

int http_status(int port, const std::string& target) {
  const auto response = quantem::test::exchange_tcp(port, quantem::test::request_text("GET", target, "127.0.0.1"));
  return response ? response->status : -1;
}

}  // namespace

// `serve ... 2>&1 | head -c1`: the reader of the log goes away after one
// byte; every later log line meets a closed pipe. The daemon keeps serving,
// and SIGTERM still stops it cleanly.
TEST_F(ServeOperator, ALogPipeThatClosesNeverStopsTheDaemon) {
  const std::string status_file = data.file("status"), port_file = data.file("port");
  std::string command = "{ ";
  for (const std::string& argument : serve_arguments(port_file)) command += "'" + argument + "' ";
  command += "--log-level debug 2>&1; echo $? >'" + status_file + "'; } | head -c1 >/dev/null";
  Child shell({"/bin/bash", "-c", command}, runtime_env(), [] {});
  const int port = wait_port(port_file);
  ASSERT_GT(port, 0);
  // Every request logs a line (debug), each one a write to the closed pipe.
  for (int i = 0; i < 20; ++i) ASSERT_EQ(http_status(port, "/api/health/live"), 200) << "request " << i;
  EXPECT_EQ(http_status(port, "/api/browse/sessions"), 200);
  pid_t daemon_pid = 0;
  for (const auto& entry : fs::directory_iterator(runtime.path())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("server-", 0) == 0) daemon_pid = std::atoi(name.c_str() + 7);
  }
  ASSERT_GT(daemon_pid, 0);
  ::kill(daemon_pid, SIGUSR1);  // one more log line into the closed pipe
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(http_status(port, "/api/health/live"), 200);
  ::kill(daemon_pid, SIGTERM);
  EXPECT_TRUE(wait_for([&] { return !slurp(status_file).empty(); }, std::chrono::seconds(30)));
  EXPECT_EQ(slurp(status_file), "0\n");  // not 141 (SIGPIPE)
  EXPECT_FALSE(fs::exists(runtime.file("server-" + std::to_string(daemon_pid) + ".json")));
  EXPECT_TRUE(shell.wait(std::chrono::seconds(10)).has_value());
}

// A shared sticky folder (mode 1777, like /tmp) as QUANTEM_GPU_RUNTIME_DIR:
// used through a private subfolder, its own mode left alone.
TEST_F(ServeOperator, ASharedStickyRuntimeFolderGetsAPrivateSubfolderAndKeepsItsMode) {
  const std::string shared = runtime.file("shared");
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  auto daemon = Daemon::start(data_folder(), {}, {{"QUANTEM_GPU_RUNTIME_DIR", shared}});
  ASSERT_NE(daemon, nullptr);
  struct stat status {};
  ASSERT_EQ(::stat(shared.c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 07777, 01777u);
  const std::string private_folder = shared + "/quantem-gpu-" + std::to_string(::geteuid());
  ASSERT_EQ(::stat(private_folder.c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 07777, 0700u);
  EXPECT_TRUE(fs::exists(private_folder + "/server-" + std::to_string(daemon->pid()) + ".json"));
  const auto info = run_quantem({"info", "--json"}, {{"QUANTEM_GPU_RUNTIME_DIR", shared}});
  EXPECT_EQ(json::parse(info.stdout_text)["runtime_directory"], private_folder);
  EXPECT_EQ(json::parse(info.stdout_text)["daemons"].size(), 1u) << info.stdout_text;
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
  ASSERT_EQ(::stat(shared.c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 07777, 01777u);
}

// An existing folder is never chmod-ed: a safe one is used as it is, an
// unsafe one refused (exit 78) and left as it was; a missing one is created 0700.
TEST_F(ServeOperator, UnsafeRuntimeFoldersAreRefusedAndNoneIsChmodded) {
  const std::string open_folder = runtime.file("world-writable");
  ASSERT_EQ(::mkdir(open_folder.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open_folder.c_str(), 0777), 0);
  const auto refused = run_quantem({"serve", data_folder(), "--backend", "cpu", "--port", "0", "--port-file",
                                    data.file("port")},
                                   {{"QUANTEM_GPU_RUNTIME_DIR", open_folder}});
  EXPECT_EQ(refused.exit_code, kConfigurationStatus);
  EXPECT_NE(refused.stderr_text.find("refusing the runtime folder: " + open_folder + " (mode 0777) may be written by "
                                     "other users"),
            std::string::npos)
      << refused.stderr_text;
  struct stat status {};
  ASSERT_EQ(::stat(open_folder.c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 07777, 0777u);
  EXPECT_FALSE(fs::exists(data.file("port")));

  if (::geteuid() == 0) {  // only root can give a folder to another user
    const std::string foreign = runtime.file("foreign");
    ASSERT_EQ(::mkdir(foreign.c_str(), 0700), 0);
    ASSERT_EQ(::chown(foreign.c_str(), 65534, 65534), 0);
    const auto not_ours = run_quantem({"serve", data_folder(), "--backend", "cpu", "--port", "0", "--port-file",
                                       data.file("port")},
                                      {{"QUANTEM_GPU_RUNTIME_DIR", foreign}});
    EXPECT_EQ(not_ours.exit_code, kConfigurationStatus);
    EXPECT_NE(not_ours.stderr_text.find(foreign + " belongs to user 65534"), std::string::npos) << not_ours.stderr_text;
  }

  const std::string readable = runtime.file("readable");
  ASSERT_EQ(::mkdir(readable.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(readable.c_str(), 0755), 0);
  auto daemon = Daemon::start(data_folder(), {}, {{"QUANTEM_GPU_RUNTIME_DIR", readable}});
  ASSERT_NE(daemon, nullptr);
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
  ASSERT_EQ(::stat(readable.c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 07777, 0755u);

  const std::string missing = runtime.file("new/runtime");
  auto created = Daemon::start(data_folder(), {}, {{"QUANTEM_GPU_RUNTIME_DIR", missing}});
  ASSERT_NE(created, nullptr);
  ASSERT_EQ(::stat(missing.c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 07777, 0700u);
  EXPECT_EQ(created->stop(SIGTERM), 0);
}

// A token file that is a FIFO, a folder or a device: a clear refusal at once
// (a FIFO without a writer used to hold start-up forever).
TEST_F(ServeOperator, TokenFilesThatAreNotRegularFilesAreRefusedAtOnce) {
  const std::string fifo = data.file("token-fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string folder = data.file("token-folder");
  ASSERT_EQ(::mkdir(folder.c_str(), 0700), 0);
  struct Case {
    std::string path;
    std::string what;
  };
  for (const Case& c : {Case{fifo, "a FIFO (named pipe)"}, Case{folder, "a folder"},
                        Case{"/dev/null", "a character device"}}) {
    auto env = runtime_env();
    env["QUANTEM_GPU_TOKEN_FILE"] = c.path;
    const auto start = std::chrono::steady_clock::now();
    const auto result = run_quantem({"serve", data_folder(), "--backend", "cpu", "--auth", "token", "--port", "0",
                                     "--port-file", data.file("port")},
                                    env, 20);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << c.path;
    EXPECT_EQ(result.exit_code, kConfigurationStatus) << c.path;
    EXPECT_NE(result.stderr_text.find("(" + c.path + "): it is " + c.what + ", not a regular file"), std::string::npos)
        << result.stderr_text;
    EXPECT_EQ(result.stderr_text.find("empty"), std::string::npos) << result.stderr_text;
  }
  EXPECT_FALSE(fs::exists(data.file("port")));
}

// Exit statuses: 78 for a refused configuration (restarting cannot fix it),
// 2 for a command line that cannot be parsed, 1 for a failure a restart may
// fix (the port is taken).
TEST_F(ServeOperator, ConfigurationErrorsExit78UsageErrors2AndFailures1) {
  const auto no_gpu = run_quantem({"serve", data_folder(), "--gpus", "auto", "--port", "0", "--port-file",
                                   data.file("port")},
                                  runtime_env());
  EXPECT_EQ(no_gpu.exit_code, kConfigurationStatus) << no_gpu.stderr_text;
  EXPECT_EQ(no_gpu.stderr_text.rfind("CUDA unavailable: ", 0), 0u) << no_gpu.stderr_text;
  EXPECT_NE(no_gpu.stderr_text.find("--backend cpu"), std::string::npos) << no_gpu.stderr_text;
  const auto bad_value = run_quantem({"serve", data_folder(), "--backend", "cpu", "--cache-entries", "0"}, runtime_env());
  EXPECT_EQ(bad_value.exit_code, kConfigurationStatus);
  EXPECT_EQ(run_quantem({"serve", data_folder(), "--no-such-option"}, runtime_env()).exit_code, 2);

  auto first = Daemon::start(data_folder(), {}, runtime_env());
  ASSERT_NE(first, nullptr);
  const auto taken = run_quantem({"serve", data_folder(), "--backend", "cpu", "--port", std::to_string(first->port())},
                                 runtime_env(), 30);
  EXPECT_EQ(taken.exit_code, 1) << taken.stderr_text;
  EXPECT_EQ(first->stop(SIGTERM), 0);

  // `info` says what to change when serve would find no GPU.
  const auto info = run_quantem({"info", "--json"}, runtime_env());
  const json report = json::parse(info.stdout_text);
  if (report["cuda"]["gpus"].empty()) {
    EXPECT_NE(report["advice"].get<std::string>().find("--backend cpu"), std::string::npos) << info.stdout_text;
    EXPECT_NE(run_quantem({"info"}, runtime_env()).stdout_text.find("advice: no usable GPU"), std::string::npos);
  } else {
    EXPECT_TRUE(report["advice"].is_null());
  }
}

// Under systemd ($JOURNAL_STREAM) every fatal message carries the error
// priority "<3>" (journalctl -p err shows it); elsewhere the bare text.
TEST_F(ServeOperator, FatalStartupMessagesCarryTheErrorPriorityUnderSystemd) {
  auto env = runtime_env();
  env["JOURNAL_STREAM"] = "8:12345";
  const auto configuration = run_quantem({"serve", data_folder(), "--port", "0", "--port-file", data.file("port")}, env);
  EXPECT_EQ(configuration.exit_code, kConfigurationStatus);
  EXPECT_EQ(configuration.stderr_text.rfind("<3>CUDA unavailable: ", 0), 0u) << configuration.stderr_text;
  auto first = Daemon::start(data_folder(), {}, runtime_env());
  ASSERT_NE(first, nullptr);
  const auto failure = run_quantem({"serve", data_folder(), "--backend", "cpu", "--port", std::to_string(first->port())},
                                   env, 30);
  EXPECT_EQ(failure.exit_code, 1);
  EXPECT_NE(failure.stderr_text.find("\n<3>cannot listen on 127.0.0.1:" + std::to_string(first->port())),
            std::string::npos)
      << failure.stderr_text;
  std::istringstream lines(failure.stderr_text);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_EQ(line.rfind('<', 0), 0u) << "a line without its priority: " << line;
  }
  EXPECT_EQ(first->stop(SIGTERM), 0);
}

// SIGHUP (systemctl reload) reads the catalog again and keeps serving.
TEST_F(ServeOperator, SighupReadsTheCatalogAgainAndKeepsServing) {
  auto daemon = Daemon::start(data_folder(), {}, runtime_env());
  ASSERT_NE(daemon, nullptr);
  const auto synth = run_quantem({"synth", data_folder() + "/second", "--prefix", "b", "--scan", "4x4", "--detector",
                                  "8x8", "--threads", "1"});
  ASSERT_EQ(synth.exit_code, 0);
  ::kill(daemon->pid(), SIGHUP);
  EXPECT_TRUE(wait_for([&] { return daemon->stderr_text().find("was read again (2 sessions)") != std::string::npos; },
                       std::chrono::seconds(20)))
      << daemon->stderr_text();
  EXPECT_NE(daemon->stderr_text().find("(SIGHUP) received: reading the catalog again"), std::string::npos);
  EXPECT_EQ(::waitpid(daemon->pid(), nullptr, WNOHANG), 0);  // still running
  EXPECT_EQ(json::parse(daemon->get("/api/browse/sessions")->body)["sessions"].size(), 2u);
  EXPECT_TRUE(fs::exists(runtime.file("server-" + std::to_string(daemon->pid()) + ".json")));
  ::kill(daemon->pid(), SIGHUP);  // twice: still serving
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(daemon->get("/api/health/ready")->status, 200);
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
  EXPECT_EQ(daemon->stderr_text().find("(SIGHUP) received: stopping"), std::string::npos);
}

// Started on a terminal, the hang-up of that terminal (SIGHUP from the
// kernel when its other end closes, as when an `ssh -t` session ends) stops
// the daemon cleanly.
TEST_F(ServeOperator, TheHangupOfItsTerminalStopsTheDaemonCleanly) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  ASSERT_GE(master, 0);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  const std::string terminal = ::ptsname(master);
  const std::string port_file = data.file("port"), log = data.file("log");
  Child daemon(serve_arguments(port_file), runtime_env(), [&] {
    ::close(master);  // else the daemon itself would keep the terminal's other end open
    ::setsid();
    const int slave = ::open(terminal.c_str(), O_RDWR);  // becomes the controlling terminal
    ::dup2(slave, 0);
    ::dup2(slave, 1);
    redirect(2, log);
  });
  std::atomic<bool> reading{true};
  std::thread drain([&] {  // the terminal's reader (its output must not fill up)
    char buffer[4096];
    while (reading) {
      pollfd readable{master, POLLIN, 0};
      if (::poll(&readable, 1, 50) > 0 && ::read(master, buffer, sizeof buffer) <= 0) break;
    }
  });
  const int port = wait_port(port_file);
  ASSERT_GT(port, 0);
  ASSERT_TRUE(wait_for([&] { return http_status(port, "/api/health/ready") == 200; }, std::chrono::seconds(30)));
  const std::string runtime_file = runtime.file("server-" + std::to_string(daemon.pid()) + ".json");
  EXPECT_TRUE(fs::exists(runtime_file));
  reading = false;
  drain.join();
  ::close(master);  // the terminal's other end goes away: the kernel hangs it up
  const auto code = daemon.wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << slurp(log);
  EXPECT_NE(slurp(log).find("(SIGHUP) received: stopping"), std::string::npos) << slurp(log);
  EXPECT_FALSE(fs::exists(runtime_file));
}

// --exit-on-stdin-close: a launcher without a terminal (ssh host 'quantem-gpu
// serve ...') stops the daemon by closing its stdin.
TEST_F(ServeOperator, TheEndOfStdinStopsTheDaemonWhenAskedFor) {
  int input[2];
  ASSERT_EQ(::pipe(input), 0);
  const std::string port_file = data.file("port"), log = data.file("log");
  auto arguments = serve_arguments(port_file);
  arguments.push_back("--exit-on-stdin-close");
  Child daemon(arguments, runtime_env(), [&] {
    ::dup2(input[0], 0);
    ::close(input[0]);
    ::close(input[1]);
    redirect(1, data.file("out"));
    redirect(2, log);
  });
  ::close(input[0]);
  const int port = wait_port(port_file);
  ASSERT_GT(port, 0);
  ASSERT_EQ(::write(input[1], "ignored\n", 8), 8);  // input is read and dropped
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(http_status(port, "/api/health/live"), 200);
  const std::string runtime_file = runtime.file("server-" + std::to_string(daemon.pid()) + ".json");
  EXPECT_TRUE(fs::exists(runtime_file));
  ::close(input[1]);
  const auto code = daemon.wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << slurp(log);
  EXPECT_NE(slurp(log).find("standard input reached its end (--exit-on-stdin-close): stopping"), std::string::npos);
  EXPECT_FALSE(fs::exists(runtime_file));
}

// --log-level and $QUANTEM_GPU_LOG_LEVEL reach the debug access log; a level
// that does not exist is a configuration error.
TEST_F(ServeOperator, TheLogLevelReachesTheAccessLog) {
  const std::string access_line = "GET /api/browse/capabilities -> 200";
  auto quiet = Daemon::start(data_folder(), {}, runtime_env());
  ASSERT_NE(quiet, nullptr);
  quiet->get("/api/browse/capabilities");
  EXPECT_EQ(quiet->stop(SIGTERM), 0);
  EXPECT_EQ(quiet->stderr_text().find(access_line), std::string::npos) << quiet->stderr_text();

  auto option = Daemon::start(data_folder(), {"--log-level", "debug"}, runtime_env());
  ASSERT_NE(option, nullptr);
  option->get("/api/browse/capabilities");
  EXPECT_TRUE(wait_for([&] { return option->stderr_text().find(access_line) != std::string::npos; },
                       std::chrono::seconds(10)))
      << option->stderr_text();
  EXPECT_EQ(option->stop(SIGTERM), 0);

  auto env = runtime_env();
  env["QUANTEM_GPU_LOG_LEVEL"] = "debug";
  auto variable = Daemon::start(data_folder(), {}, env);
  ASSERT_NE(variable, nullptr);
  variable->get("/api/browse/capabilities");
  EXPECT_TRUE(wait_for([&] { return variable->stderr_text().find(access_line) != std::string::npos; },
                       std::chrono::seconds(10)))
      << variable->stderr_text();
  EXPECT_EQ(variable->stop(SIGTERM), 0);

  env["QUANTEM_GPU_LOG_LEVEL"] = "error";  // the option wins over the variable
  auto warn = Daemon::start(data_folder(), {"--log-level", "warn"}, env);
  ASSERT_NE(warn, nullptr);
  EXPECT_EQ(warn->stop(SIGTERM), 0);
  EXPECT_EQ(warn->stderr_text().find("ready"), std::string::npos) << warn->stderr_text();

  const auto refused = run_quantem({"serve", data_folder(), "--backend", "cpu", "--log-level", "chatty"}, runtime_env());
  EXPECT_EQ(refused.exit_code, kConfigurationStatus);
  EXPECT_NE(refused.stderr_text.find("--log-level must be one of trace|debug|info|warn|error, got 'chatty'"),
            std::string::npos)
      << refused.stderr_text;
  env["QUANTEM_GPU_LOG_LEVEL"] = "loud";
  const auto refused_variable = run_quantem({"serve", data_folder(), "--backend", "cpu"}, env);
  EXPECT_EQ(refused_variable.exit_code, kConfigurationStatus);
  EXPECT_NE(refused_variable.stderr_text.find("$QUANTEM_GPU_LOG_LEVEL must be one of"), std::string::npos);
}

// The runtime file and `info --json` of a socket daemon give its address in
// forms clients take: `url` as http+unix:// with the socket path
// percent-encoded (`url_form` says so), and what curl needs; curl reaches the
// daemon with it.
TEST_F(ServeOperator, ASocketDaemonsCurlArgumentsWork) {
  quantem::test::TempDir sockets;
  const std::string socket_path = sockets.file("quantem.sock");
  auto daemon = Daemon::start_unix(data_folder(), socket_path, {}, runtime_env());
  ASSERT_NE(daemon, nullptr);
  const auto info = run_quantem({"info", "--json"}, runtime_env());
  const json listed = json::parse(info.stdout_text)["daemons"];
  ASSERT_EQ(listed.size(), 1u) << info.stdout_text;
  std::string encoded;
  for (const unsigned char c : socket_path) {
    char escape[4];
    std::snprintf(escape, sizeof escape, "%%%02X", c);
    encoded += std::isalnum(c) || c == '.' || c == '_' || c == '~' || c == '-' ? std::string(1, c) : escape;
  }
  EXPECT_EQ(listed[0]["url"], "http+unix://" + encoded);
  EXPECT_EQ(listed[0]["url_form"], "http+unix");
  EXPECT_EQ(encoded.find('/'), std::string::npos);
  EXPECT_EQ(listed[0]["curl_args"], json::array({"--unix-socket", socket_path, "http://localhost"}));
  std::string command = "curl -fsS";
  for (const auto& argument : listed[0]["curl_args"]) command += " '" + argument.get<std::string>() + "'";
  const auto curl = quantem::test::run_command(command + "/api/health/ready");
  EXPECT_EQ(curl.status, 0);
  ASSERT_TRUE(json::accept(curl.output)) << curl.output;
  const json ready = json::parse(curl.output);
  EXPECT_EQ(ready["live"], true) << curl.output;
  EXPECT_EQ(ready["ready"], true) << curl.output;
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
}

// The CPU backend's read staging is sized by what the load reads, not
// --cpu-threads x 4 MiB: a small budget on many threads admits a tiny file.
TEST_F(ServeOperator, ASmallBudgetOnManyCpuThreadsAdmitsATinyFile) {
  auto daemon = Daemon::start(data_folder(), {"--device-budget", "64MiB", "--cpu-threads", "16"}, runtime_env());
  ASSERT_NE(daemon, nullptr);
  const auto image = daemon->get("/api/browse/realspace?session=sess&file=a_master.h5&ensure_resident=true");
  ASSERT_TRUE(image);
  EXPECT_EQ(image->status, 200) << image->body;
  EXPECT_EQ(daemon->stop(SIGTERM), 0);
}
