#pragma once
// Runs the real quantem-gpu binary for integration tests: start `serve` on an
// ephemeral loopback port (--port 0 --port-file), wait for
// /api/health/ready, talk to it over HTTP, stop it with a signal.
#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <httplib.h>

#include "test_support.hpp"

namespace quantem::test {

struct ProcessResult {
  int exit_code = -1;  // -1: killed by a signal or not finished in time
  std::string stdout_text;
  std::string stderr_text;
};

// Runs quantem-gpu with arguments (no shell) and waits up to timeout_seconds.
ProcessResult run_quantem(const std::vector<std::string>& arguments, const std::map<std::string, std::string>& env = {},
                          int timeout_seconds = 60);

class Daemon {
 public:
  // Starts `quantem-gpu serve DATA --backend cpu --port 0 --port-file ...`
  // plus extra arguments; waits until it listens and, when wait_ready, until
  // /api/health/ready answers 200. Fails the test (ADD_FAILURE) and returns
  // nullptr when it does not come up.
  static std::unique_ptr<Daemon> start(const std::string& data_folder, const std::vector<std::string>& extra_arguments = {},
                                       const std::map<std::string, std::string>& env = {}, bool wait_ready = true);
  // The same over `serve --unix-socket socket_path` (no TCP port): waits until
  // the socket answers, and when wait_ready, until /api/health/ready is 200.
  static std::unique_ptr<Daemon> start_unix(const std::string& data_folder, const std::string& socket_path,
                                            const std::vector<std::string>& extra_arguments = {},
                                            const std::map<std::string, std::string>& env = {}, bool wait_ready = true);
  ~Daemon();

  int port() const { return port_; }  // 0 for a Unix-socket daemon
  const std::string& socket_path() const { return socket_path_; }
  pid_t pid() const { return pid_; }
  std::unique_ptr<httplib::Client> client() const;

  // GET/POST/DELETE target ("/api/...?...") with Host 127.0.0.1:port.
  httplib::Result request(const std::string& method, const std::string& target,
                          const httplib::Headers& headers = {}) const;
  httplib::Result get(const std::string& target, const httplib::Headers& headers = {}) const {
    return request("GET", target, headers);
  }

  // Sends the signal and waits (bounded) for the exit; returns the exit code.
  int stop(int signal_number = 15);
  std::string stdout_text() const;
  std::string stderr_text() const;
  const std::string& runtime_dir() const { return runtime_dir_.path(); }

 private:
  Daemon() = default;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string socket_path_;
  bool exited_ = false;
  int exit_code_ = -1;
  TempDir files_;
  TempDir runtime_dir_;
  TempDir cache_dir_;  // $XDG_CACHE_HOME unless the test sets it
};

}  // namespace quantem::test
