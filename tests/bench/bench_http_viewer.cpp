// The viewer's access pattern through HTTP, as a user would measure it: one
// keep-alive connection (httplib::Client), every row of the request-path table with N
// requests each, cache misses forced by changing a float parameter by 1e-7
// (or a new crop / position per request for the fresh-plan and cbed rows: one
// cbed row walks along a scan row as a cursor does, one jumps across the scan),
// plus an image-cache-hit row and a 304 row. The products rows ask for
// BF+ABF+ADF+CoMx+CoMy+iCoM of one plan in one /api/browse/products request
// (json, npz and raw), and the same six images as six realspace requests in a row
// (one sample = the six round trips). Per row: client wall time
// p50/p90/min/mean, statuses, body bytes, and the daemon's server-timing
// stages (p50/mean per stage, cache descriptions). JSON on stdout.
// Before the rows, --fill-image-cache N (default 64, the daemon's image-cache
// entries) distinct BF images fill the daemon's image cache, so the rows
// measure its steady state; the fill is the first row,
// "image-cache fill (first N images)" (0: no fill, the rows fill the cache).
//
//   bench_http_viewer --url http://127.0.0.1:8780 --session S --file F_master.h5 [--requests 40]
//                     [--fill-image-cache 64]
//   bench_http_viewer --start-daemon build/src/cli/quantem-gpu --data DIR --session S --file F_master.h5
//                     [--daemon-arg=--backend --daemon-arg=cpu ...]
// The second form starts the daemon itself and first measures cold start ->
// first BF body and the first BF request including the load, then runs the
// rows against it and stops it (SIGTERM).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <httplib.h>
#include <optional>

#include "raw_http.hpp"
#include <nlohmann/json.hpp>

extern char** environ;

namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); }

double percentile(std::vector<double> values, double fraction) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t index = std::min(values.size() - 1, static_cast<std::size_t>(fraction * (values.size() - 1) + 0.5));
  return values[index];
}

json summary(const std::vector<double>& values) {
  json s;
  if (values.empty()) return s;
  double sum = 0;
  for (double v : values) sum += v;
  s["p50"] = percentile(values, 0.5);
  s["p90"] = percentile(values, 0.9);
  s["min"] = *std::min_element(values.begin(), values.end());
  s["mean"] = sum / values.size();
  return s;
}

// "resolve;dur=0.031, cache;desc=hit" -> {resolve: 0.031}, desc "hit".
void parse_server_timing(const std::string& header, std::map<std::string, double>& stages, std::string& cache) {
  std::stringstream entries(header);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    const auto start = entry.find_first_not_of(' ');
    if (start == std::string::npos) continue;
    entry = entry.substr(start);
    const auto semicolon = entry.find(';');
    const std::string name = entry.substr(0, semicolon);
    if (semicolon == std::string::npos) continue;
    const std::string parameter = entry.substr(semicolon + 1);
    if (parameter.rfind("dur=", 0) == 0) stages[name] = std::atof(parameter.c_str() + 4);
    if (parameter.rfind("desc=", 0) == 0 && name == "cache") cache = parameter.substr(5);
  }
}

struct Row {
  Row(std::string name_, std::function<std::string(int)> target_,
      std::function<httplib::Headers(int)> headers_ = nullptr)
      : name(std::move(name_)), target(std::move(target_)), headers(std::move(headers_)) {}
  std::string name;
  // Target of request i (0-based; negative: warm-up); headers added when set.
  std::function<std::string(int)> target;
  std::function<httplib::Headers(int)> headers;
  int warmup = 1;
};

// One keep-alive connection over a raw socket (tests/integration/raw_http.hpp):
// cpp-httplib 0.11.4's client waits for a body after a 304 that, as RFC 9110
// requires, carries no content-length, so the 304 row could not be measured
// through it.
struct Reply {
  int status = 0;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string get_header_value(const std::string& name) const {
    for (const auto& [key, value] : headers) {
      if (key.size() == name.size() &&
          std::equal(key.begin(), key.end(), name.begin(), [](char a, char b) { return std::tolower(a) == std::tolower(b); }))
        return value;
    }
    return "";
  }
};

class Bench {
 public:
  Bench(const std::string& url, std::string token) : token_(std::move(token)) {
    port_ = std::atoi(url.substr(url.rfind(':') + 1).c_str());
  }
  ~Bench() {
    if (fd_ >= 0) ::close(fd_);
  }

  std::optional<Reply> get(const std::string& target, httplib::Headers headers = {}) {
    return send("GET", target, std::move(headers));
  }

  std::optional<Reply> send(const std::string& method, const std::string& target, httplib::Headers headers = {}) {
    if (!token_.empty()) headers.emplace("Authorization", "Bearer " + token_);
    std::string extra;
    for (const auto& [name, value] : headers) extra += name + ": " + value + "\r\n";
    const std::string request =
        quantem::test::request_text(method, target, "127.0.0.1:" + std::to_string(port_), extra);
    for (int attempt = 0; attempt < 2; ++attempt) {  // the server may have closed an idle connection
      if (fd_ < 0) fd_ = quantem::test::connect_tcp(port_);
      if (fd_ < 0) return std::nullopt;
      if (quantem::test::send_all(fd_, request)) {
        if (auto response = quantem::test::read_response(fd_, 600000)) {
          Reply reply;
          reply.status = response->status;
          reply.body = std::move(response->body);
          reply.headers = std::move(response->headers);
          if (reply.get_header_value("connection") == "close") {
            ::close(fd_);
            fd_ = -1;
          }
          return reply;
        }
      }
      ::close(fd_);
      fd_ = -1;
    }
    return std::nullopt;
  }

  json run(const Row& row, int requests) {
    for (int i = 0; i < row.warmup; ++i) get(row.target(-1 - i), row.headers ? row.headers(-1 - i) : httplib::Headers{});
    std::vector<double> client_ms;
    std::map<std::string, std::vector<double>> stage_ms;
    std::map<std::string, int> statuses, caches;
    std::uint64_t body_bytes = 0;
    std::string first_error;
    for (int i = 0; i < requests; ++i) {
      const std::string target = row.target(i);
      const httplib::Headers headers = row.headers ? row.headers(i) : httplib::Headers{};
      const auto start = Clock::now();
      auto response = get(target, headers);
      const double elapsed = ms_since(start);
      if (!response) {
        ++statuses["transport-error"];
        continue;
      }
      ++statuses[std::to_string(response->status)];
      if (response->status >= 400 && first_error.empty()) first_error = response->body.substr(0, 300);
      client_ms.push_back(elapsed);
      body_bytes = response->body.size();
      std::map<std::string, double> stages;
      std::string cache;
      parse_server_timing(response->get_header_value("server-timing"), stages, cache);
      for (const auto& [stage, value] : stages) stage_ms[stage].push_back(value);
      if (!cache.empty()) ++caches[cache];
    }
    json out;
    out["name"] = row.name;
    out["example_target"] = row.target(0);
    out["requests"] = requests;
    out["status"] = statuses;
    out["client_ms"] = summary(client_ms);
    out["body_bytes"] = body_bytes;
    json stages = json::object();
    for (const auto& [stage, values] : stage_ms) {
      json s = summary(values);
      stages[stage] = {{"p50", s["p50"]}, {"mean", s["mean"]}};
    }
    out["server_ms"] = stages;
    out["cache"] = caches;
    if (!first_error.empty()) out["first_error"] = first_error;
    return out;
  }

  // Several requests one after the other, timed as one sample: client wall
  // time of the whole sequence, and the sum of the daemon's `total` stages.
  json run_sequence(const std::string& name, const std::vector<std::function<std::string(int)>>& targets,
                    int requests) {
    for (const auto& target : targets) get(target(-1));  // warm-up
    std::vector<double> client_ms, server_total_ms;
    std::map<std::string, int> statuses, caches;
    std::uint64_t body_bytes = 0;
    for (int i = 0; i < requests; ++i) {
      const auto start = Clock::now();
      double server_total = 0;
      std::uint64_t bytes = 0;
      for (const auto& target : targets) {
        auto response = get(target(i));
        if (!response) {
          ++statuses["transport-error"];
          continue;
        }
        ++statuses[std::to_string(response->status)];
        bytes += response->body.size();
        std::map<std::string, double> stages;
        std::string cache;
        parse_server_timing(response->get_header_value("server-timing"), stages, cache);
        server_total += stages["total"];
        if (!cache.empty()) ++caches[cache];
      }
      client_ms.push_back(ms_since(start));
      server_total_ms.push_back(server_total);
      body_bytes = bytes;
    }
    json out;
    out["name"] = name;
    json examples = json::array();
    for (const auto& target : targets) examples.push_back(target(0));
    out["example_targets"] = examples;
    out["requests"] = requests;
    out["requests_per_sample"] = targets.size();
    out["status"] = statuses;
    out["client_ms"] = summary(client_ms);
    out["body_bytes"] = body_bytes;
    json total = summary(server_total_ms);
    out["server_ms"] = {{"total", {{"p50", total["p50"]}, {"mean", total["mean"]}}}};  // summed over the sequence
    out["cache"] = caches;
    return out;
  }

 private:
  int port_ = 0;
  int fd_ = -1;
  std::string token_;
};

std::string number(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.10g", value);
  return buffer;
}

// Starts `binary serve data --port 0 --port-file ... extra`; returns pid and port.
struct StartedDaemon {
  pid_t pid = -1;
  int port = 0;
};

StartedDaemon spawn_daemon(const std::string& binary, const std::string& data, const std::vector<std::string>& extra,
                           const std::string& port_file, const std::string& log_file) {
  std::vector<std::string> arguments = {binary, "serve", data, "--port", "0", "--port-file", port_file};
  arguments.insert(arguments.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : arguments) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  StartedDaemon started;
  if (posix_spawn(&started.pid, binary.c_str(), &actions, nullptr, argv.data(), environ) != 0) {
    throw std::runtime_error("cannot start " + binary);
  }
  posix_spawn_file_actions_destroy(&actions);
  return started;
}

}  // namespace

// A crop on a cold acquisition (region-first loads): the acquisition
// evicted, then BF of a centred crop of a quarter of each scan axis (a new
// radius: no cached image), timed to its body; then at once the full-scan BF
// (also new), timed from the crop's request: with the load going on behind the
// crop, that is the whole load plus one product. The residency route is polled
// after the full BF to confirm the resident is whole.
bool measure_cold_crops(Bench& bench, const std::string& realspace, const std::string& source, int scan_rows,
                        int scan_cols, json& report) {
  const int crop_rows = std::max(1, scan_rows / 4), crop_cols = std::max(1, scan_cols / 4);
  const int row = (scan_rows - crop_rows) / 2, col = (scan_cols - crop_cols) / 2;
  const std::string crop = "&row_start=" + std::to_string(row) + "&row_stop=" + std::to_string(row + crop_rows) +
                           "&column_start=" + std::to_string(col) + "&column_stop=" + std::to_string(col + crop_cols);
  json samples = json::array();
  for (int k = 0; k < 3; ++k) {
    auto evicted = bench.send("DELETE", "/api/browse/resident?" + source);
    if (!evicted || evicted->status != 200) {
      std::cerr << "DELETE /api/browse/resident failed\n";
      return false;
    }
    const auto start = Clock::now();
    auto cropped = bench.get(realspace + "&mode=BF&inner=0&ensure_resident=true&outer=" +
                             number(1 + (9100 + k) * 1e-7) + crop);
    const double crop_ms = ms_since(start);
    auto full = bench.get(realspace + "&mode=BF&inner=0&ensure_resident=true&outer=" + number(1 + (9200 + k) * 1e-7));
    const double full_ms = ms_since(start);
    if (!cropped || cropped->status != 200 || !full || full->status != 200) {
      std::cerr << "BF of a cold crop, or the full BF after it, failed\n";
      return false;
    }
    auto residency = bench.get("/api/browse/residency?" + source);
    const json state = residency && residency->status == 200 ? json::parse(residency->body) : json();
    samples.push_back({{"crop_bf_request_s", crop_ms / 1000},
                       {"crop_to_full_bf_body_s", full_ms / 1000},
                       {"crop_server_timing", cropped->get_header_value("server-timing")},
                       {"full_server_timing", full->get_header_value("server-timing")},
                       {"state_after_full", state.value("state", "")},
                       {"scan_rows_resident_after_full", state.value("scan_rows_resident", 0)}});
  }
  report["cold_crop"] = {{"crop", {row, row + crop_rows, col, col + crop_cols}}, {"samples", samples}};
  return true;
}

int main(int argc, char** argv) {
  CLI::App app{"Viewer access pattern through HTTP (keep-alive), JSON on stdout"};
  std::string url, session, file, token, daemon_binary, data_folder;
  std::vector<std::string> daemon_arguments;
  int requests = 40;
  int cold_starts = 1;
  int fill_image_cache = 64;
  std::string keep_daemon_logs;
  app.add_option("--url", url, "Daemon URL, e.g. http://127.0.0.1:8780");
  app.add_option("--session", session, "Session id")->required();
  app.add_option("--file", file, "Master file name")->required();
  app.add_option("--token", token, "Bearer token (--auth token daemons)");
  app.add_option("--requests", requests, "Requests per row")->capture_default_str();
  app.add_option("--start-daemon", daemon_binary, "Start this quantem-gpu binary (measures cold start)");
  app.add_option("--data", data_folder, "Data folder for --start-daemon");
  app.add_option("--daemon-arg", daemon_arguments, "Extra serve argument for --start-daemon (repeat)");
  app.add_option("--cold-starts", cold_starts, "Cold starts to measure with --start-daemon")->capture_default_str();
  app.add_option("--keep-daemon-logs", keep_daemon_logs,
                 "Copy each started daemon's log (daemon-N.log, one per cold start) into this folder at the end");
  app.add_option("--fill-image-cache", fill_image_cache,
                 "Distinct BF images requested before the rows, timed as their own first row (0: none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (url.empty() == daemon_binary.empty()) {
    std::cerr << "give exactly one of --url and --start-daemon\n";
    return 2;
  }
  if (!daemon_binary.empty() && data_folder.empty()) {
    std::cerr << "--start-daemon needs --data\n";
    return 2;
  }

  const std::string source = "session=" + session + "&file=" + file;
  const std::string realspace = "/api/browse/realspace?" + source;
  json report;
  report["session"] = session;
  report["file"] = file;
  report["requests_per_row"] = requests;

  std::optional<StartedDaemon> daemon;
  const std::string work = std::filesystem::temp_directory_path() / ("bench_http_viewer." + std::to_string(::getpid()));
  if (!daemon_binary.empty()) {
    std::filesystem::create_directories(work);
    json colds = json::array();
    for (int attempt = 0; attempt < cold_starts; ++attempt) {
      const std::string port_file = work + "/port";
      std::filesystem::remove(port_file);
      const auto start = Clock::now();
      const std::string log_file = work + "/daemon-" + std::to_string(attempt) + ".log";
      StartedDaemon started = spawn_daemon(daemon_binary, data_folder, daemon_arguments, port_file, log_file);
      while (started.port == 0) {
        std::ifstream in(port_file);
        int port = 0;
        if (in >> port && port > 0) started.port = port;
        int status = 0;
        if (started.port == 0 && ::waitpid(started.pid, &status, WNOHANG) == started.pid) {
          std::cerr << "the daemon exited before listening; see " << log_file << "\n";
          return 1;
        }
        if (started.port == 0) std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
      const double listening_ms = ms_since(start);
      httplib::Client client("http://127.0.0.1:" + std::to_string(started.port));
      client.set_keep_alive(true);
      client.set_read_timeout(600, 0);
      httplib::Headers headers;
      if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
      int not_ready = 0;
      double first_request_ms = 0;
      std::string server_timing;
      while (true) {
        const auto request_start = Clock::now();
        auto response = client.Get(realspace + "&mode=BF", headers);
        first_request_ms = ms_since(request_start);
        if (response && response->status == 200) {
          server_timing = response->get_header_value("server-timing");
          break;
        }
        if (response && response->status != 503) {
          std::cerr << "first BF request answered " << response->status << ": " << response->body << "\n";
          return 1;
        }
        ++not_ready;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      json cold;
      cold["start_to_listening_s"] = listening_ms / 1000;
      cold["start_to_first_bf_body_s"] = ms_since(start) / 1000;
      cold["first_bf_request_including_load_s"] = first_request_ms / 1000;
      cold["first_bf_server_timing"] = server_timing;
      cold["not_ready_answers"] = not_ready;
      colds.push_back(cold);
      if (attempt + 1 < cold_starts) {
        client.stop();
        ::kill(started.pid, SIGTERM);
        int status = 0;
        ::waitpid(started.pid, &status, 0);
      } else {
        daemon = started;
      }
    }
    report["cold_start"] = colds;
    url = "http://127.0.0.1:" + std::to_string(daemon->port);
  }
  report["url"] = url;

  Bench bench(url, token);
  // Shapes from the daemon: the full BF image is the scan, a pattern the detector.
  auto bf = bench.get(realspace + "&mode=BF&ensure_resident=true");
  if (!bf || bf->status != 200) {
    std::cerr << "BF request failed: " << (bf ? std::to_string(bf->status) + " " + bf->body : "no connection") << "\n";
    return 1;
  }
  const int scan_rows = std::atoi(bf->get_header_value("x-height").c_str());
  const int scan_cols = std::atoi(bf->get_header_value("x-width").c_str());
  auto pattern = bench.get("/api/browse/cbed?" + source + "&sx=0&sy=0&ensure_resident=true");
  if (!pattern || pattern->status != 200) {
    std::cerr << "cbed request failed\n";
    return 1;
  }
  const int det_rows = std::atoi(pattern->get_header_value("x-height").c_str());
  const int det_cols = std::atoi(pattern->get_header_value("x-width").c_str());
  report["scan_shape"] = {scan_rows, scan_cols};
  // The crop rows measure the steady state: the resident's tile sums built
  // (or skipped, or off) before they start.
  {
    const auto start = Clock::now();
    json tile_sums;
    while (ms_since(start) < 300000) {
      auto residency = bench.get("/api/browse/residency?" + source);
      if (!residency || residency->status != 200) break;
      tile_sums = json::parse(residency->body).value("tile_sums", json());
      const std::string state = tile_sums.is_object() ? tile_sums.value("state", "") : "";
      if (state != "queued" && state != "building") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    report["tile_sums"] = tile_sums;
    report["tile_sums_wait_s"] = ms_since(start) / 1000;
  }
  report["detector_shape"] = {det_rows, det_cols};

  // i < 0 is a warm-up; every index gives a distinct value.
  auto tiny = [](int i) { return number((i + 1000) * 1e-7); };
  auto offset = [](double base, int i) { return number(base + (i + 1000) * 1e-7); };
  // A new crop per request: half the scan, shifted over a grid of offsets.
  const int crop_rows = std::max(1, scan_rows / 2), crop_cols = std::max(1, scan_cols / 2);
  auto crop = [&](int i) {
    const int span_rows = scan_rows - crop_rows + 1, span_cols = scan_cols - crop_cols + 1;
    const int k = (i + 1000) % (span_rows * span_cols);
    const int r = k / span_cols, c = k % span_cols;
    return "&row_start=" + std::to_string(r) + "&row_stop=" + std::to_string(r + crop_rows) +
           "&column_start=" + std::to_string(c) + "&column_stop=" + std::to_string(c + crop_cols);
  };
  const double cx = det_cols / 2.0, cy = det_rows / 2.0, r_in = std::max(1.0, det_rows / 8.0),
               r_out = std::max(2.0, det_rows / 3.0);

  std::vector<Row> rows;
  rows.emplace_back("BF", [&](int i) { return realspace + "&mode=BF&inner=0&outer=" + offset(1, i); });
  rows.emplace_back("ABF", [&](int i) { return realspace + "&mode=ABF&inner=" + offset(0.5, i) + "&outer=1"; });
  rows.emplace_back("ADF", [&](int i) { return realspace + "&mode=ADF&inner=" + offset(1, i) + "&outer=3"; });
  rows.emplace_back("annulus shape", [&](int i) {
                    return "/api/browse/realspace-shape?" + source + "&shape=annulus&cx=" + number(cx) +
                           "&cy=" + number(cy) + "&inner=" + offset(r_in, i) + "&outer=" + number(r_out);
                  });
  rows.emplace_back("BF scan_bin 2", [&](int i) { return realspace + "&mode=BF&scan_bin=2&inner=0&outer=" + offset(1, i); });
  rows.emplace_back("CoMx (computed plan)", [&](int i) { return realspace + "&mode=CoMx&inner=" + tiny(i); });
  rows.emplace_back("CoMy (computed plan)", [&](int i) { return realspace + "&mode=CoMy&inner=" + tiny(i); });
  rows.emplace_back("iCoM", [&](int i) { return realspace + "&mode=iCoM&inner=" + tiny(i); });
  rows.emplace_back("BF fresh plan (new crop)", [&](int i) { return realspace + "&mode=BF" + crop(i); });
  rows.emplace_back("CoMx fresh plan (new crop)", [&](int i) { return realspace + "&mode=CoMx" + crop(i + 5000); });
  // A square scan ROI of 64 x 64 positions (fewer on a smaller scan), summed,
  // at a new place per request: a rectangle's summed pattern (tile sums).
  const int side_rows = std::min(64, scan_rows), side_cols = std::min(64, scan_cols);
  const int side = std::min(side_rows, side_cols);
  rows.emplace_back("cbed-region rectangle " + std::to_string(side) + "x" + std::to_string(side), [&, side](int i) {
                    const int span_rows = scan_rows - side + 1, span_cols = scan_cols - side + 1;
                    const int k = (i + 1000) * 7 % (span_rows * span_cols);
                    const double half = (side - 1) / 2.0;
                    return "/api/browse/cbed-region?" + source + "&shape=square&reduce=sum&radius=" + number(half) +
                           "&cx=" + number(k % span_cols + half) + "&cy=" + number(k / span_cols + half) +
                           "&ensure_resident=true";
                  });
  rows.emplace_back("cbed new position", [&](int i) {
                    const int k = (i + 1000) % (scan_rows * scan_cols);
                    return "/api/browse/cbed?" + source + "&sx=" + std::to_string(k / scan_cols) +
                           "&sy=" + std::to_string(k % scan_cols) + "&ensure_resident=true";
                  });
  // The same at scattered positions (a stride of 7,919 frames): every request
  // in another seek segment, so none is served from the recent frames.
  rows.emplace_back("cbed scattered position", [&](int i) {
                    const std::uint64_t frames = std::uint64_t(scan_rows) * std::uint64_t(scan_cols);
                    const std::uint64_t k = (std::uint64_t(i + 1000) * 7919) % frames;
                    return "/api/browse/cbed?" + source + "&sx=" + std::to_string(k / std::uint64_t(scan_cols)) +
                           "&sy=" + std::to_string(k % std::uint64_t(scan_cols)) + "&ensure_resident=true";
                  });
  rows.emplace_back("cbed-region mean r=5", [&](int i) {
                    return "/api/browse/cbed-region?" + source + "&shape=circle&reduce=mean&radius=5&cx=" +
                           offset(scan_cols / 2.0, i) + "&cy=" + number(scan_rows / 2.0) + "&ensure_resident=true";
                  });
  const std::string same_bf = realspace + "&mode=BF&inner=0&outer=1";
  rows.emplace_back("BF again (image-cache hit)", [&](int) { return same_bf; });
  std::string etag;
  rows.emplace_back("BF If-None-Match (304)", [&](int) { return same_bf; },
                  [&](int) {
                    if (etag.empty()) {
                      auto r = bench.get(same_bf);
                      if (r) etag = r->get_header_value("etag");
                    }
                    return httplib::Headers{{"If-None-Match", etag}};
                  });

  // Every product of one plan: one products request (cache misses forced by
  // ABF's inner radius), and the same six images as six realspace requests.
  const std::string products = "/api/browse/products?" + source + "&modes=BF,ABF,ADF,CoMx,CoMy,iCoM";
  auto products_target = [&](const std::string& format) {
    return [&, format](int i) {
      return products + "&inner_ABF=" + offset(0.5, i) + "&outer_ABF=1&inner_ADF=1&outer_ADF=3" + format;
    };
  };
  rows.emplace_back("products BF+ABF+ADF+CoMx+CoMy+iCoM, one request", products_target(""));
  rows.emplace_back("products BF+ABF+ADF+CoMx+CoMy+iCoM, one request (npz)", products_target("&format=npz"));
  rows.emplace_back("products BF+ABF+ADF+CoMx+CoMy+iCoM, one request (raw)", products_target("&format=raw"));
  // Offsets of their own (i + 3000): never an image another row cached.
  const std::vector<std::function<std::string(int)>> six_singles = {
      [&](int i) { return realspace + "&mode=BF&inner=0&outer=" + offset(1, i + 3000); },
      [&](int i) { return realspace + "&mode=ABF&inner=" + offset(0.5, i + 3000) + "&outer=1"; },
      [&](int i) { return realspace + "&mode=ADF&inner=" + offset(1, i + 3000) + "&outer=3"; },
      [&](int i) { return realspace + "&mode=CoMx&inner=" + tiny(i + 3000); },
      [&](int i) { return realspace + "&mode=CoMy&inner=" + tiny(i + 3000); },
      [&](int i) { return realspace + "&mode=iCoM&inner=" + tiny(i + 3000); },
  };

  json results = json::array();
  if (fill_image_cache > 0) {
    // New images the rows never ask for (outer 1 + (20000 + i) * 1e-7): each
    // is a miss that stores a fresh body, until the cache holds N of them.
    Row fill("image-cache fill (first " + std::to_string(fill_image_cache) + " images)",
             [&](int i) { return realspace + "&mode=BF&inner=0&outer=" + number(1 + (20000 + i) * 1e-7); });
    fill.warmup = 0;
    results.push_back(bench.run(fill, fill_image_cache));
  }
  for (const auto& row : rows) results.push_back(bench.run(row, requests));
  results.push_back(bench.run_sequence("six single requests in sequence (BF, ABF, ADF, CoMx, CoMy, iCoM)",
                                       six_singles, requests));
  report["rows"] = results;

  // The first BF request of a viewer on a daemon that is up: the acquisition
  // evicted, then a BF (a new radius: no cached image) loads it again.
  json first_loads = json::array();
  for (int k = 0; k < 3; ++k) {
    auto evicted = bench.send("DELETE", "/api/browse/resident?" + source);
    if (!evicted || evicted->status != 200) {
      std::cerr << "DELETE /api/browse/resident failed\n";
      return 1;
    }
    const auto start = Clock::now();
    auto first = bench.get(realspace + "&mode=BF&inner=0&ensure_resident=true&outer=" + number(1 + (9000 + k) * 1e-7));
    const double ms = ms_since(start);
    if (!first || first->status != 200) {
      std::cerr << "BF after eviction failed\n";
      return 1;
    }
    first_loads.push_back({{"first_bf_request_including_load_s", ms / 1000},
                           {"server_timing", first->get_header_value("server-timing")}});
  }
  report["first_bf_on_a_ready_daemon"] = first_loads;
  if (!measure_cold_crops(bench, realspace, source, scan_rows, scan_cols, report)) return 1;
  std::cout << report.dump(2) << std::endl;

  if (daemon) {
    ::kill(daemon->pid, SIGTERM);
    int status = 0;
    ::waitpid(daemon->pid, &status, 0);
    if (!keep_daemon_logs.empty()) {
      std::filesystem::create_directories(keep_daemon_logs);
      for (const auto& entry : std::filesystem::directory_iterator(work)) {
        if (entry.path().extension() == ".log") {
          std::filesystem::copy_file(entry.path(), std::filesystem::path(keep_daemon_logs) / entry.path().filename(),
                                     std::filesystem::copy_options::overwrite_existing);
        }
      }
    }
    std::filesystem::remove_all(work);
  }
  return 0;
}
