#include "daemon.hpp"

#include "raw_http.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace quantem::test {

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

// fork + exec with stdout/stderr redirected to files; the environment is the
// test's own plus `env`.
pid_t spawn(const std::vector<std::string>& arguments, const std::map<std::string, std::string>& env,
            const std::string& stdout_path, const std::string& stderr_path) {
  std::vector<std::string> argv_storage;
  argv_storage.push_back(quantem_binary());
  argv_storage.insert(argv_storage.end(), arguments.begin(), arguments.end());
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // A daemon never outlives a test process that died without stopping it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    for (const auto& [name, value] : env) {
      if (value.empty()) {
        ::unsetenv(name.c_str());
      } else {
        ::setenv(name.c_str(), value.c_str(), 1);
      }
    }
    const int out = ::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char*> argv;
    for (auto& argument : argv_storage) argv.push_back(argument.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Waits up to timeout for pid; returns the exit code, -1 for a signal, nullopt on timeout.
std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

ProcessResult run_quantem(const std::vector<std::string>& arguments, const std::map<std::string, std::string>& env,
                          int timeout_seconds) {
  TempDir files;
  ProcessResult result;
  const pid_t pid = spawn(arguments, env, files.file("stdout"), files.file("stderr"));
  const auto code = wait_exit(pid, std::chrono::seconds(timeout_seconds));
  if (!code) {
    ::kill(pid, SIGKILL);
    wait_exit(pid, std::chrono::seconds(10));
    ADD_FAILURE() << "quantem-gpu did not finish within " << timeout_seconds << " s";
  }
  result.exit_code = code.value_or(-1);
  result.stdout_text = slurp(files.file("stdout"));
  result.stderr_text = slurp(files.file("stderr"));
  return result;
}

std::unique_ptr<Daemon> Daemon::start(const std::string& data_folder, const std::vector<std::string>& extra_arguments,
                                      const std::map<std::string, std::string>& env, bool wait_ready) {
  std::unique_ptr<Daemon> daemon(new Daemon());
  std::vector<std::string> arguments = {"serve", data_folder, "--backend", "cpu", "--port", "0", "--port-file",
                                        daemon->files_.file("port")};
  arguments.insert(arguments.end(), extra_arguments.begin(), extra_arguments.end());
  auto environment = env;
  if (!environment.count("QUANTEM_GPU_RUNTIME_DIR")) environment["QUANTEM_GPU_RUNTIME_DIR"] = daemon->runtime_dir_.path();
  // The catalog cache goes to a folder of this daemon's unless the test names one.
  if (!environment.count("XDG_CACHE_HOME")) environment["XDG_CACHE_HOME"] = daemon->cache_dir_.path();
  daemon->pid_ = spawn(arguments, environment, daemon->files_.file("stdout"), daemon->files_.file("stderr"));

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (daemon->port_ == 0) {
    const std::string text = slurp(daemon->files_.file("port"));
    if (!text.empty()) daemon->port_ = std::atoi(text.c_str());
    if (daemon->port_ != 0) break;
    if (const auto code = wait_exit(daemon->pid_, std::chrono::milliseconds(0))) {
      daemon->exited_ = true;
      daemon->exit_code_ = *code;
      ADD_FAILURE() << "quantem-gpu serve exited (" << *code << ") before listening:\n" << daemon->stderr_text();
      return nullptr;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ADD_FAILURE() << "quantem-gpu serve did not write its port file:\n" << daemon->stderr_text();
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (wait_ready) {
    while (true) {
      auto response = daemon->get("/api/health/ready");
      if (response && response->status == 200) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        ADD_FAILURE() << "quantem-gpu serve never became ready:\n" << daemon->stderr_text();
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return daemon;
}

std::unique_ptr<Daemon> Daemon::start_unix(const std::string& data_folder, const std::string& socket_path,
                                           const std::vector<std::string>& extra_arguments,
                                           const std::map<std::string, std::string>& env, bool wait_ready) {
  std::unique_ptr<Daemon> daemon(new Daemon());
  daemon->socket_path_ = socket_path;
  std::vector<std::string> arguments = {"serve", data_folder, "--backend", "cpu", "--unix-socket", socket_path};
  arguments.insert(arguments.end(), extra_arguments.begin(), extra_arguments.end());
  auto environment = env;
  if (!environment.count("QUANTEM_GPU_RUNTIME_DIR")) environment["QUANTEM_GPU_RUNTIME_DIR"] = daemon->runtime_dir_.path();
  // The catalog cache goes to a folder of this daemon's unless the test names one.
  if (!environment.count("XDG_CACHE_HOME")) environment["XDG_CACHE_HOME"] = daemon->cache_dir_.path();
  daemon->pid_ = spawn(arguments, environment, daemon->files_.file("stdout"), daemon->files_.file("stderr"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    const auto response = exchange_unix(socket_path, request_text("GET", "/api/health/ready", "localhost"));
    if (response && (!wait_ready || response->status == 200)) break;
    if (const auto code = wait_exit(daemon->pid_, std::chrono::milliseconds(0))) {
      daemon->exited_ = true;
      daemon->exit_code_ = *code;
      ADD_FAILURE() << "quantem-gpu serve --unix-socket exited (" << *code << ") before answering:\n" << daemon->stderr_text();
      return nullptr;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ADD_FAILURE() << "quantem-gpu serve --unix-socket never answered on " << socket_path << ":\n" << daemon->stderr_text();
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return daemon;
}

Daemon::~Daemon() {
  if (pid_ > 0 && !exited_) {
    ::kill(pid_, SIGKILL);
    wait_exit(pid_, std::chrono::seconds(10));
  }
}

std::unique_ptr<httplib::Client> Daemon::client() const {
  auto client = std::make_unique<httplib::Client>("127.0.0.1", port_);
  client->set_connection_timeout(5);
  client->set_read_timeout(120);
  client->set_write_timeout(5);
  return client;
}

httplib::Result Daemon::request(const std::string& method, const std::string& target,
                                const httplib::Headers& headers) const {
  auto c = client();
  if (method == "GET") return c->Get(target, headers);
  if (method == "POST") return c->Post(target, headers, "", "text/plain");
  if (method == "DELETE") return c->Delete(target, headers);
  if (method == "PUT") return c->Put(target, headers, "", "text/plain");
  if (method == "HEAD") return c->Head(target, headers);
  ADD_FAILURE() << "unsupported method " << method;
  return c->Get(target, headers);
}

int Daemon::stop(int signal_number) {
  if (exited_) return exit_code_;
  ::kill(pid_, signal_number);
  const auto code = wait_exit(pid_, std::chrono::seconds(30));
  exited_ = code.has_value();
  exit_code_ = code.value_or(-1);
  if (!code) ADD_FAILURE() << "quantem-gpu serve did not stop within 30 s";
  return exit_code_;
}

std::string Daemon::stdout_text() const { return slurp(files_.file("stdout")); }
std::string Daemon::stderr_text() const { return slurp(files_.file("stderr")); }

}  // namespace quantem::test
