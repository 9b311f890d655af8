// The catalog across restarts and under load, against the real binary: the
// cache file reused for exactly the unchanged masters (a touched master, a
// truncated shard and a shard replaced by another of the same size are
// inspected again), a corrupt or truncated cache ignored and replaced, one
// cache per data folder, the partial sessions document while the first build
// runs, ETag/304 and gzip on the catalog documents, a worker killed once does
// not condemn a valid master, and a hung shard read neither holds up another
// acquisition nor the shutdown, and never outlives a SIGKILLed daemon.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <regex>
#include <sstream>
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

struct BuildCounts {
  int reused = -1;
  int inspected = -1;
};

// The counts of the n-th (0-based) catalog build in a daemon's log.
BuildCounts build_counts(const std::string& log, std::size_t n = 0) {
  static const std::regex line(R"(masters \((\d+) reused, (\d+) inspected\))");
  std::size_t seen = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator(); ++it, ++seen) {
    if (seen == n) return {std::stoi((*it)[1]), std::stoi((*it)[2])};
  }
  return {};
}

std::string gunzip(const std::string& bytes) {
  z_stream stream{};
  if (inflateInit2(&stream, 15 + 16) != Z_OK) return {};
  std::string out;
  char buffer[65536];
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  stream.avail_in = static_cast<uInt>(bytes.size());
  int result = Z_OK;
  while (result == Z_OK) {
    stream.next_out = reinterpret_cast<Bytef*>(buffer);
    stream.avail_out = sizeof buffer;
    result = inflate(&stream, Z_NO_FLUSH);
    out.append(buffer, sizeof buffer - stream.avail_out);
  }
  inflateEnd(&stream);
  return result == Z_STREAM_END ? out : std::string();
}

// Sets a file's mtime to `seconds` after its current one (a new ctime too).
void shift_mtime(const std::string& path, int seconds) {
  struct stat status {};
  ASSERT_EQ(::stat(path.c_str(), &status), 0);
  timespec times[2] = {status.st_atim, status.st_mtim};
  times[1].tv_sec += seconds;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

class ServeCatalog : public ::testing::Test {
 protected:
  void make_acquisitions(const std::string& folder, const std::vector<std::string>& stems) {
    for (const auto& stem : stems) {
      const auto synth = run_quantem({"synth", folder + "/" + stem, "--prefix", stem, "--scan", "4x5", "--detector",
                                      "8x8", "--threads", "1"});
      ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
    }
  }
  std::string data_folder() const { return data.file("root"); }
  std::map<std::string, std::string> env() const { return {{"XDG_CACHE_HOME", cache.path()}}; }
  std::vector<std::string> cache_files() const {
    std::vector<std::string> files;
    if (!fs::exists(cache.path() + "/quantem-gpu")) return files;
    for (const auto& entry : fs::directory_iterator(cache.path() + "/quantem-gpu")) files.push_back(entry.path().string());
    return files;
  }
  // Starts, waits for the cache write that follows the first build, stops; returns the log.
  std::string run_once(const std::vector<std::string>& arguments = {}) {
    auto daemon = Daemon::start(data_folder(), arguments, env());
    if (!daemon) return {};
    EXPECT_EQ(daemon->get("/api/browse/sessions")->status, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the cache is written after the build
    EXPECT_EQ(daemon->stop(), 0);
    return daemon->stderr_text();
  }
  static std::map<std::string, json> statuses(const Daemon& daemon) {
    std::map<std::string, json> found;
    auto response = daemon.get("/api/browse/sessions");
    EXPECT_TRUE(response && response->status == 200);
    if (!response) return found;
    const json document = json::parse(response->body);
    for (const auto& session : document["sessions"])
      for (const auto& file : session["files"]) found[file["name"].get<std::string>()] = file["load_status"];
    return found;
  }
  quantem::test::TempDir data;
  quantem::test::TempDir cache;
};

TEST_F(ServeCatalog, RestartReinspectsExactlyTheChangedMasters) {
  make_acquisitions(data_folder(), {"a", "b", "c", "d", "e"});
  const std::string first = run_once();
  EXPECT_EQ(build_counts(first).reused, 0) << first;
  EXPECT_EQ(build_counts(first).inspected, 5) << first;
  ASSERT_EQ(cache_files().size(), 1u);

  const auto written = fs::last_write_time(cache_files().front());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string unchanged = run_once();
  EXPECT_EQ(build_counts(unchanged).reused, 5) << unchanged;
  EXPECT_EQ(build_counts(unchanged).inspected, 0) << unchanged;
  EXPECT_EQ(fs::last_write_time(cache_files().front()), written);  // nothing new: not rewritten

  // a: the master touched; b: a shard truncated; c: a shard replaced by
  // another file of the same size (a copy: new inode, later mtime).
  shift_mtime(data_folder() + "/a/a_master.h5", 5);
  const std::string b_shard = data_folder() + "/b/b_data_000001.h5";
  fs::resize_file(b_shard, fs::file_size(b_shard) / 2);
  const std::string c_shard = data_folder() + "/c/c_data_000001.h5";
  fs::copy_file(c_shard, c_shard + ".new");
  fs::rename(c_shard + ".new", c_shard);
  shift_mtime(c_shard, 7);

  auto daemon = Daemon::start(data_folder(), {}, env());
  ASSERT_NE(daemon, nullptr);
  auto found = statuses(*daemon);
  EXPECT_EQ(build_counts(daemon->stderr_text()).reused, 2) << daemon->stderr_text();
  EXPECT_EQ(build_counts(daemon->stderr_text()).inspected, 3) << daemon->stderr_text();
  EXPECT_EQ(found["a_master.h5"]["loadable"], true);
  EXPECT_EQ(found["b_master.h5"]["loadable"], false) << found["b_master.h5"];  // the truncated shard is seen
  EXPECT_EQ(found["c_master.h5"]["loadable"], true);
  auto cbed = daemon->get("/api/browse/cbed?session=c&file=c_master.h5&sx=1&sy=2&ensure_resident=true");
  ASSERT_TRUE(cbed);
  EXPECT_EQ(cbed->status, 200) << cbed->body;

  // A refresh with nothing changed inspects nothing. Past the refresh
  // interval it builds again (within it, it may reuse the last build).
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  ASSERT_EQ(daemon->get("/api/browse/sessions?refresh=true")->status, 200);
  EXPECT_EQ(build_counts(daemon->stderr_text(), 1).reused, 5) << daemon->stderr_text();
  EXPECT_EQ(build_counts(daemon->stderr_text(), 1).inspected, 0);
  EXPECT_EQ(daemon->stop(), 0);
  EXPECT_NE(fs::last_write_time(cache_files().front()), written);  // the changed run rewrote it
  const std::string again = run_once();
  EXPECT_EQ(build_counts(again).reused, 5) << again;
}

TEST_F(ServeCatalog, CorruptOrTruncatedCacheIsIgnoredAndReplaced) {
  make_acquisitions(data_folder(), {"a", "b"});
  run_once();
  ASSERT_EQ(cache_files().size(), 1u);
  const std::string file = cache_files().front();
  const auto size = fs::file_size(file);

  for (const std::string damage : {"flip", "truncate", "garbage", "empty"}) {
    SCOPED_TRACE(damage);
    if (damage == "flip") {
      std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
      stream.seekp(static_cast<std::streamoff>(size - 10));
      stream.put('\x5a');
    } else if (damage == "truncate") {
      fs::resize_file(file, size / 2);
    } else {
      std::ofstream(file, std::ios::trunc) << (damage == "garbage" ? "not a catalog cache" : "");
    }
    const std::string damaged = run_once();
    EXPECT_NE(damaged.find("ignored"), std::string::npos) << damaged;
    EXPECT_EQ(build_counts(damaged).inspected, 2) << damaged;
    // Replaced: the next start reuses everything.
    const std::string after = run_once();
    EXPECT_EQ(build_counts(after).reused, 2) << after;
  }
}

TEST_F(ServeCatalog, TwoDataFoldersKeepSeparateCaches) {
  make_acquisitions(data_folder(), {"a"});
  const std::string other = data.file("other");
  make_acquisitions(other, {"x", "y"});
  auto first = Daemon::start(data_folder(), {}, env());
  auto second = Daemon::start(other, {}, env());
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(first->stop(), 0);
  EXPECT_EQ(second->stop(), 0);
  EXPECT_EQ(cache_files().size(), 2u);
  auto again = Daemon::start(other, {}, env());
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(build_counts(again->stderr_text()).reused, 2) << again->stderr_text();
  EXPECT_EQ(build_counts(again->stderr_text()).inspected, 0);
  EXPECT_EQ(again->stop(), 0);
}

TEST_F(ServeCatalog, CacheCanBeNamedOrTurnedOff) {
  make_acquisitions(data_folder(), {"a"});
  run_once({"--catalog-cache", "off"});
  EXPECT_TRUE(cache_files().empty());
  const std::string named = data.file("named.bin");
  run_once({"--catalog-cache", named});
  EXPECT_TRUE(fs::exists(named));
  EXPECT_EQ(build_counts(run_once({"--catalog-cache", named})).reused, 1);
}

TEST_F(ServeCatalog, PartialSessionsWhileTheFirstBuildRuns) {
  make_acquisitions(data_folder(), {"a", "b", "z"});
  // z hangs its inspection for the deadline: the build takes about 3 s.
  auto daemon = Daemon::start(data_folder(), {"--inspect-workers", "1", "--inspect-timeout", "3"},
                              {{"XDG_CACHE_HOME", cache.path()}, {"QUANTEM_TEST_INSPECTOR_HANG_ON", "z_master.h5"}},
                              /*wait_ready=*/false);
  ASSERT_NE(daemon, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  // The first partial request asks the build to report; a poll a moment later sees a and b.
  ASSERT_EQ(daemon->get("/api/browse/sessions?partial=true")->status, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  auto partial = daemon->get("/api/browse/sessions?partial=true");
  ASSERT_TRUE(partial);
  ASSERT_EQ(partial->status, 200) << partial->body;
  const json known = json::parse(partial->body);
  EXPECT_EQ(known["complete"], false);
  std::size_t listed = 0;
  for (const auto& session : known["sessions"]) listed += session["files"].size();
  EXPECT_EQ(listed, 2u) << partial->body;  // a and b, not yet z
  EXPECT_EQ(daemon->get("/api/health/ready")->status, 503);

  // A client that does not ask waits for the whole catalog, as before.
  auto whole = daemon->get("/api/browse/sessions");
  ASSERT_TRUE(whole);
  EXPECT_EQ(json::parse(whole->body)["complete"], true);
  EXPECT_EQ(json::parse(whole->body)["sessions"].size(), 3u);
  EXPECT_EQ(json::parse(daemon->get("/api/browse/sessions?partial=true")->body)["complete"], true);
  EXPECT_EQ(daemon->get("/api/browse/sessions?partial=maybe")->status, 422);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeCatalog, CatalogDocumentsAnswerNotModifiedAndGzip) {
  make_acquisitions(data_folder(), {"a", "b", "c", "d", "e", "f", "g", "h"});
  auto daemon = Daemon::start(data_folder(), {}, env());
  ASSERT_NE(daemon, nullptr);
  auto raw = daemon->client();
  raw->set_decompress(false);  // the bytes as sent
  for (const std::string route : {"/api/browse/sessions", "/api/browse/acquisitions"}) {
    SCOPED_TRACE(route);
    auto plain = daemon->get(route);
    ASSERT_TRUE(plain);
    ASSERT_EQ(plain->status, 200);
    const std::string etag = plain->get_header_value("etag");
    ASSERT_FALSE(etag.empty());
    EXPECT_EQ(plain->get_header_value("cache-control"), "no-cache");
    EXPECT_FALSE(plain->has_header("content-encoding"));
    auto unchanged = daemon->get(route, {{"If-None-Match", etag}});
    ASSERT_TRUE(unchanged);
    EXPECT_EQ(unchanged->status, 304);
    EXPECT_TRUE(unchanged->body.empty());
    EXPECT_EQ(unchanged->get_header_value("etag"), etag);
    EXPECT_EQ(daemon->get(route, {{"If-None-Match", "\"other\""}})->status, 200);
    auto zipped = raw->Get(route, {{"Accept-Encoding", "gzip"}});
    ASSERT_TRUE(zipped);
    EXPECT_EQ(zipped->get_header_value("content-encoding"), "gzip");
    EXPECT_EQ(zipped->get_header_value("vary"), "accept-encoding");
    EXPECT_LT(zipped->body.size(), plain->body.size());
    EXPECT_EQ(gunzip(zipped->body), plain->body);
    EXPECT_FALSE(raw->Get(route, {{"Accept-Encoding", "gzip;q=0, identity"}})->has_header("content-encoding"));
  }
  // A new acquisition changes the tag.
  const std::string before = daemon->get("/api/browse/sessions")->get_header_value("etag");
  make_acquisitions(data_folder(), {"i"});
  EXPECT_NE(daemon->get("/api/browse/sessions?refresh=true")->get_header_value("etag"), before);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeCatalog, AWorkerKilledOnceDoesNotCondemnAValidMaster) {
  make_acquisitions(data_folder(), {"a", "b"});
  const std::string marker = data.file("crashed-once");
  auto daemon = Daemon::start(data_folder(), {}, {{"XDG_CACHE_HOME", cache.path()},
                                                  {"QUANTEM_TEST_INSPECTOR_ABORT_ONCE", "a_master.h5:" + marker}});
  ASSERT_NE(daemon, nullptr);
  auto found = statuses(*daemon);
  EXPECT_TRUE(fs::exists(marker));  // the worker did crash on it
  EXPECT_EQ(found["a_master.h5"]["loadable"], true) << found["a_master.h5"];
  EXPECT_NE(daemon->stderr_text().find("strike 1 of 2"), std::string::npos) << daemon->stderr_text();
  EXPECT_EQ(daemon->stop(), 0);
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t count = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

TEST_F(ServeCatalog, ACondemnedMasterIsRetriedByALoadAndByARefresh) {
  make_acquisitions(data_folder(), {"a", "b"});
  auto daemon = Daemon::start(data_folder(), {},
                              {{"XDG_CACHE_HOME", cache.path()}, {"QUANTEM_TEST_INSPECTOR_ABORT_ON", "a_master.h5"}});
  ASSERT_NE(daemon, nullptr);
  auto found = statuses(*daemon);
  ASSERT_EQ(found["a_master.h5"]["loadable"], false);
  const std::string crash = "killed by signal 6";
  EXPECT_EQ(count_of(daemon->stderr_text(), crash), 2u) << daemon->stderr_text();  // condemned on the second crash
  EXPECT_EQ(count_of(daemon->stderr_text(), "strike 1 of 2"), 1u);

  // Listing again does not retry it; a load asked for does (and it crashes twice more).
  statuses(*daemon);
  EXPECT_EQ(count_of(daemon->stderr_text(), crash), 2u);
  auto load = daemon->request("POST", "/api/browse/load?session=a&file=a_master.h5");
  ASSERT_TRUE(load);
  EXPECT_EQ(load->status, 409) << load->body;
  EXPECT_EQ(count_of(daemon->stderr_text(), crash), 4u) << daemon->stderr_text();
  // Not in a loop: a second load at once is answered from memory.
  EXPECT_EQ(daemon->request("POST", "/api/browse/load?session=a&file=a_master.h5")->status, 409);
  EXPECT_EQ(count_of(daemon->stderr_text(), crash), 4u);
  // A refresh retries it too.
  ASSERT_EQ(daemon->get("/api/browse/sessions?refresh=true")->status, 200);
  EXPECT_EQ(count_of(daemon->stderr_text(), crash), 6u) << daemon->stderr_text();
  EXPECT_EQ(daemon->stop(), 0);
  // Never kept in the cache: the next start inspects it again.
}

// Process ids of the daemon's children (its inspector workers).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text;
    std::getline(stat, text);
    const auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != 'Z') children.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return children;
}

bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const auto close = text.rfind(')');
  return close != std::string::npos && text.size() > close + 2 && text[close + 2] != 'Z';
}

TEST_F(ServeCatalog, AHungShardReadHoldsUpNeitherAnotherAcquisitionNorTheShutdown) {
  make_acquisitions(data_folder(), {"a", "b"});
  auto daemon = Daemon::start(data_folder(), {"--inspect-workers", "2", "--shutdown-grace", "1"},
                              {{"XDG_CACHE_HOME", cache.path()}, {"QUANTEM_TEST_INSPECTOR_HANG_ON", "a_data_000001.h5"}});
  ASSERT_NE(daemon, nullptr);
  auto hung = std::async(std::launch::async, [&] {
    return daemon->get("/api/browse/cbed?session=a&file=a_master.h5&sx=1&sy=2&ensure_resident=true");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto started = std::chrono::steady_clock::now();
  auto other = daemon->get("/api/browse/cbed?session=b&file=b_master.h5&sx=1&sy=2&ensure_resident=true");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 200) << other->body;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));  // generous: the hang is 2 minutes
  EXPECT_EQ(hung.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);  // still hung

  const auto stopping = std::chrono::steady_clock::now();
  EXPECT_EQ(daemon->stop(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - stopping, std::chrono::seconds(10));  // was about 2 minutes
  hung.wait();
}

TEST_F(ServeCatalog, WorkersDieWithAKilledDaemon) {
  make_acquisitions(data_folder(), {"a"});
  auto daemon = Daemon::start(data_folder(), {"--inspect-workers", "1"},
                              {{"XDG_CACHE_HOME", cache.path()}, {"QUANTEM_TEST_INSPECTOR_HANG_ON", "a_data_000001.h5"}});
  ASSERT_NE(daemon, nullptr);
  auto hung = std::async(std::launch::async, [&] {
    return daemon->get("/api/browse/cbed?session=a&file=a_master.h5&sx=1&sy=2&ensure_resident=true");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto workers = children_of(daemon->pid());
  ASSERT_FALSE(workers.empty());
  daemon->stop(SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (const pid_t worker : workers) {
    while (alive(worker) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(alive(worker)) << "worker " << worker << " outlived its daemon";
  }
  hung.wait();
}

}  // namespace
