// Start-up, security and shutdown behaviour of the real `quantem-gpu serve`.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "daemon.hpp"

using quantem::test::Daemon;
using quantem::test::run_quantem;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

class ServeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto synth = run_quantem({"synth", data.file("sess"), "--prefix", "a", "--scan", "4x5", "--detector", "8x8",
                                    "--threads", "1"});
    ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
  }
  quantem::test::TempDir data;
};

// A raw HTTP/1.1 exchange (no client library), for requests without Content-Length.
std::string raw_exchange(int port, const std::string& request) {
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(sock, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(sock);
    return "connect failed";
  }
  timeval timeout{10, 0};
  ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  (void)::send(sock, request.data(), request.size(), 0);
  std::string reply;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = ::recv(sock, buffer, sizeof buffer, 0)) > 0) reply.append(buffer, static_cast<std::size_t>(n));
  ::close(sock);
  return reply;
}

}  // namespace

TEST_F(ServeCli, CudaIsRequiredUnlessTheCpuBackendIsNamed) {
  const auto result = run_quantem({"serve", data.path(), "--port", "0", "--port-file", data.file("port")});
  EXPECT_EQ(result.exit_code, 78);  // a configuration error: no restart fixes it (docs/deploy.md)
  EXPECT_EQ(result.stderr_text.rfind("CUDA unavailable: ", 0), 0u) << result.stderr_text;
  EXPECT_EQ(result.stdout_text, "");
  EXPECT_FALSE(fs::exists(data.file("port")));  // never listened, never fell back to the CPU
}

TEST_F(ServeCli, ReferenceValidationMessages) {
  struct Case {
    std::vector<std::string> arguments;
    std::string message;
  };
  for (const Case& c : {Case{{"--gpu", "-1"}, "--gpu must be zero or greater"},
                        Case{{"--gpus", "0,nope"}, "--gpus must be 'auto' or comma-separated CUDA indices"},
                        Case{{"--gpus", "1,-1"}, "--gpus must contain CUDA indices zero or greater"},
                        Case{{"--port", "70000"}, "--port must be between 1 and 65535"},
                        Case{{"--port", "0"}, "--port must be between 1 and 65535"},
                        Case{{"--backend", "cpu", "--device-budget", "plenty"}, "--device-budget"},
                        Case{{"--backend", "cpu", "--auth", "password"}, "--auth must be none or token"}}) {
    std::vector<std::string> arguments = {"serve", data.path()};
    arguments.insert(arguments.end(), c.arguments.begin(), c.arguments.end());
    const auto result = run_quantem(arguments);
    EXPECT_EQ(result.exit_code, 78) << c.message;  // the replaced service exits 1; docs/protocol.md
    EXPECT_NE(result.stderr_text.find(c.message), std::string::npos) << result.stderr_text;
    EXPECT_EQ(result.stdout_text, "");
  }
  EXPECT_NE(run_quantem({"serve", data.path(), "--gpu", "0", "--gpus", "1"}).exit_code, 0);
  EXPECT_NE(run_quantem({"serve"}).exit_code, 0);
}

TEST_F(ServeCli, UniquePrefixesOfLongOptionsAreAcceptedLikeArgparse) {
  // Each of these reaches serve's own validation (exit 78 with its message),
  // which it cannot without the abbreviation being understood (CLI11 alone
  // rejects an unknown option with exit 2).
  struct Case {
    std::vector<std::string> arguments;
    std::string message;
  };
  for (const Case& c : {Case{{"--implementation", "abc", "--gpu", "-1"}, "--gpu must be zero or greater"},
                        Case{{"--implementation=abc", "--gpus", "x"}, "--gpus must be 'auto'"},
                        Case{{"--back=cpu", "--port-f", data.file("port"), "--port", "70000"},
                             "--port must be between 1 and 65535"},
                        Case{{"--backend", "cpu", "--device-b", "plenty"}, "--device-budget"}}) {
    std::vector<std::string> arguments = {"serve", data.path()};
    arguments.insert(arguments.end(), c.arguments.begin(), c.arguments.end());
    const auto result = run_quantem(arguments);
    EXPECT_EQ(result.exit_code, 78) << c.message << ": " << result.stderr_text;
    EXPECT_NE(result.stderr_text.find(c.message), std::string::npos) << result.stderr_text;
  }
  // A prefix of several names is argparse's usage error (exit 2).
  const auto ambiguous = run_quantem({"serve", data.path(), "--p", "5"});
  EXPECT_EQ(ambiguous.exit_code, 2);
  EXPECT_NE(ambiguous.stderr_text.find("quantem-gpu serve: error: ambiguous option: --p could match --port, --port-file"),
            std::string::npos)
      << ambiguous.stderr_text;
  const auto gpu_or_gpus = run_quantem({"serve", data.path(), "--gp", "0"});
  EXPECT_EQ(gpu_or_gpus.exit_code, 2);
  EXPECT_NE(gpu_or_gpus.stderr_text.find("could match --gpu, --gpus"), std::string::npos) << gpu_or_gpus.stderr_text;
  // Not a prefix of anything: still the parser's unknown-option error.
  EXPECT_EQ(run_quantem({"serve", data.path(), "--nonsense", "1"}).exit_code, 2);
}

TEST_F(ServeCli, NonLoopbackBindIsRefusedWithoutTheFlag) {
  const auto refused = run_quantem({"serve", data.path(), "--backend", "cpu", "--host", "0.0.0.0", "--port", "0",
                                    "--port-file", data.file("port")});
  EXPECT_EQ(refused.exit_code, 78);
  EXPECT_NE(refused.stderr_text.find("not a loopback address"), std::string::npos) << refused.stderr_text;
  EXPECT_FALSE(fs::exists(data.file("port")));

  auto daemon = Daemon::start(data.path(), {"--host", "0.0.0.0", "--allow-non-loopback"});
  ASSERT_NE(daemon, nullptr);
  EXPECT_NE(daemon->stderr_text().find("non-loopback"), std::string::npos) << daemon->stderr_text();
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeCli, ASecondDaemonOnTheSamePortFailsToStart) {
  auto first = Daemon::start(data.path());
  ASSERT_NE(first, nullptr);
  const auto second = run_quantem({"serve", data.path(), "--backend", "cpu", "--port", std::to_string(first->port())},
                                  {}, 30);
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_NE(second.stderr_text.find("cannot listen on 127.0.0.1:" + std::to_string(first->port()) +
                                    ": Address already in use"),
            std::string::npos)
      << second.stderr_text;
  // The first daemon still answers every request (no port sharing).
  for (int i = 0; i < 10; ++i) {
    auto response = first->get("/api/browse/capabilities");
    ASSERT_TRUE(response);
    EXPECT_EQ(response->status, 200);
  }
  EXPECT_EQ(first->stop(), 0);
}

TEST_F(ServeCli, StdoutStaysQuietAndSignalsStopCleanly) {
  for (int signal_number : {15, 2}) {
    auto daemon = Daemon::start(data.path(), {"--implementation-revision", "cli-rev"});
    ASSERT_NE(daemon, nullptr);
    auto capabilities = daemon->get("/api/browse/capabilities");
    ASSERT_TRUE(capabilities);
    EXPECT_EQ(json::parse(capabilities->body)["implementation_revision"], "cli-rev");
    auto image = daemon->get("/api/browse/realspace?session=sess&file=a_master.h5");
    ASSERT_TRUE(image);
    EXPECT_EQ(image->status, 200);
    const std::string runtime_file = daemon->runtime_dir() + "/server-" + std::to_string(daemon->pid()) + ".json";
    EXPECT_TRUE(fs::exists(runtime_file));
    EXPECT_EQ(daemon->stop(signal_number), 0) << daemon->stderr_text();
    EXPECT_EQ(daemon->stdout_text(), "");
    EXPECT_FALSE(fs::exists(runtime_file)) << "the runtime file outlived the daemon";
  }
}

TEST_F(ServeCli, ForeignHostHeadersAreForbiddenAndNoCorsHeadersAreSent) {
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  auto foreign = daemon->get("/api/browse/capabilities", {{"Host", "attacker.example:8780"}});
  ASSERT_TRUE(foreign);
  EXPECT_EQ(foreign->status, 403);
  EXPECT_NE(foreign->body.find("loopback"), std::string::npos);
  auto rebinding = daemon->get("/api/browse/sessions", {{"Host", "10.1.2.3"}});
  ASSERT_TRUE(rebinding);
  EXPECT_EQ(rebinding->status, 403);
  for (const char* host : {"localhost:1234", "127.0.0.1", "[::1]:8780"}) {
    auto allowed = daemon->get("/api/browse/capabilities", {{"Host", host}, {"Origin", "http://attacker.example"}});
    ASSERT_TRUE(allowed);
    EXPECT_EQ(allowed->status, 200) << host;
    for (const auto& [name, value] : allowed->headers) {
      EXPECT_EQ(name.rfind("access-control", 0), std::string::npos) << name;
      EXPECT_EQ(name.rfind("Access-Control", 0), std::string::npos) << name;
    }
  }
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeCli, MethodsPathsAndBodylessPosts) {
  auto daemon = Daemon::start(data.path());
  ASSERT_NE(daemon, nullptr);
  auto head = daemon->request("HEAD", "/api/browse/capabilities");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 405);
  auto put = daemon->request("PUT", "/api/browse/capabilities");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 405);
  EXPECT_EQ(put->body, R"({"detail":"Method Not Allowed"})");
  EXPECT_EQ(put->get_header_value("allow"), "GET");
  auto missing = daemon->get("/api/browse/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->body, R"({"detail":"Not Found"})");

  // curl -X POST without a body sends no Content-Length: answered, not 400.
  const std::string reply = raw_exchange(daemon->port(),
                                         "POST /api/browse/load?session=sess&file=a_master.h5 HTTP/1.1\r\n"
                                         "Host: localhost\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(reply.rfind("HTTP/1.1 202", 0) == 0 || reply.rfind("HTTP/1.1 200", 0) == 0) << reply;
  // A chunked request body is refused before it is read.
  const std::string chunked = raw_exchange(daemon->port(),
                                           "POST /api/browse/load?session=sess&file=a_master.h5 HTTP/1.1\r\n"
                                           "Host: localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                                           "0\r\n\r\n");
  EXPECT_EQ(chunked.rfind("HTTP/1.1 411", 0), 0u) << chunked;
  // The daemon keeps serving.
  auto live = daemon->get("/api/health/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->body, R"({"live":true})");
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeCli, TokenModeWritesAPrivateRuntimeFileAndChecksEveryRequest) {
  auto daemon = Daemon::start(data.path(), {"--auth", "token"}, {{"QUANTEM_GPU_TOKEN", ""}, {"QUANTEM_GPU_TOKEN_FILE", ""}});
  ASSERT_NE(daemon, nullptr);
  const std::string runtime_file = daemon->runtime_dir() + "/server-" + std::to_string(daemon->pid()) + ".json";
  struct stat info {};
  ASSERT_EQ(::stat(runtime_file.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  std::ifstream in(runtime_file);
  const json runtime = json::parse(in);
  const std::string token = runtime["token"];
  EXPECT_TRUE(std::regex_match(token, std::regex("[0-9a-f]{64}"))) << token;
  EXPECT_EQ(runtime["port"], daemon->port());

  auto anonymous = daemon->get("/api/browse/capabilities");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 403);
  auto wrong = daemon->get("/api/browse/capabilities", {{"Authorization", "Bearer " + token.substr(1)}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 403);
  for (const auto& authorization : {"Bearer " + token, "token " + token}) {
    auto accepted = daemon->get("/api/browse/capabilities", {{"Authorization", authorization}});
    ASSERT_TRUE(accepted);
    EXPECT_EQ(accepted->status, 200);
  }
  auto query = daemon->get("/api/browse/sessions?token=" + token);
  ASSERT_TRUE(query);
  EXPECT_EQ(query->status, 200);
  auto health = daemon->get("/api/health/ready");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(daemon->stop(), 0);
  EXPECT_EQ(daemon->stderr_text().find(token), std::string::npos) << "the token was logged";
  EXPECT_EQ(daemon->stdout_text(), "");
}

TEST_F(ServeCli, TokenComesFromTheEnvironmentWhenGiven) {
  auto daemon = Daemon::start(data.path(), {"--auth", "token"}, {{"QUANTEM_GPU_TOKEN", "env-token-0123456789"}});
  ASSERT_NE(daemon, nullptr);
  auto accepted = daemon->get("/api/browse/capabilities", {{"Authorization", "Bearer env-token-0123456789"}});
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->status, 200);
  EXPECT_EQ(daemon->get("/api/browse/capabilities")->status, 403);
  EXPECT_EQ(daemon->stop(), 0);
}
