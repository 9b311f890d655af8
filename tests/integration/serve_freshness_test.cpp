// Freshness through the real binary: a data folder swapped for a copy and then
// rewritten, a file rewritten in place while resident, a session folder that
// cannot be read, refreshes in a loop, and more directories than inotify
// watches. The expected bytes come from a second daemon serving a folder
// written once with the new content (an independent reference).
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon.hpp"

using quantem::test::Daemon;
using quantem::test::run_quantem;
using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

const std::string kSource = "session=sess&file=a_master.h5";

void synth(const std::string& session_folder, const std::string& prefix, const std::string& seed) {
  const auto made = run_quantem({"synth", session_folder, "--prefix", prefix, "--scan", "6x5", "--detector", "12x12",
                                 "--threads", "1", "--seed", seed});
  ASSERT_EQ(made.exit_code, 0) << made.stderr_text;
}

struct Answer {
  int status = 0;
  std::string body;
  std::string signature;  // the provenance's, empty when absent
};

Answer answer(const Daemon& daemon, const std::string& target) {
  Answer out;
  auto response = daemon.get(target);
  if (!response) return out;
  out.status = response->status;
  out.body = response->body;
  const std::string provenance = response->get_header_value("x-quantem-provenance");
  if (!provenance.empty()) out.signature = json::parse(provenance).value("signature", "");
  return out;
}

// The products a client asks for: a cached BF, a BF never asked before (no
// image cache), a diffraction pattern.
std::vector<std::string> product_targets(int round) {
  return {"/api/browse/realspace?" + kSource + "&mode=BF",
          "/api/browse/realspace?" + kSource + "&mode=BF&outer=" + std::to_string(0.5 + 0.001 * round),
          "/api/browse/cbed?" + kSource + "&sx=2&sy=3"};
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool wait_for(const std::function<bool()>& condition, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return condition();
}

class ServeFreshness : public ::testing::Test {
 protected:
  std::string folder() const { return data.file("D"); }

  // Polls every product until each equals the reference daemon's answer for
  // the new content; an old body or old signature after the first new answer
  // of a route fails. Returns false when the new content is not served
  // within `limit`.
  bool serves_the_new_content(const Daemon& daemon, const Daemon& reference, std::chrono::milliseconds limit) {
    std::vector<std::string> old_bodies, old_signatures;
    for (const auto& target : product_targets(0)) {
      old_bodies.push_back(before_.at(target).body);
      old_signatures.push_back(before_.at(target).signature);
    }
    const auto end = std::chrono::steady_clock::now() + limit;
    std::vector<bool> renewed(old_bodies.size(), false);
    int converged_rounds = 0;  // in a row
    for (int round = 1; std::chrono::steady_clock::now() < end + 2s; ++round) {
      const auto targets = product_targets(round);
      bool all_new = true;
      for (std::size_t i = 0; i < targets.size(); ++i) {
        const Answer now = answer(daemon, targets[i]);
        const bool is_old = now.status == 200 && (now.signature == old_signatures[i] || now.body == old_bodies[i]);
        if (renewed[i]) {
          EXPECT_FALSE(is_old) << "an old answer after a new one, round " << round << ": " << targets[i];
        }
        const bool is_new = now.status == 200 && !is_old && now.body == answer(reference, targets[i]).body;
        renewed[i] = renewed[i] || is_new;
        all_new = all_new && is_new;
      }
      converged_rounds = all_new ? converged_rounds + 1 : 0;
      if (converged_rounds == 1 && std::chrono::steady_clock::now() > end) return false;  // too late
      if (converged_rounds >= 10) return true;  // and it stays new
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  // mv SWAPPED AWAY && cp -a AWAY SWAPPED while the daemon serves D, products
  // asked for meanwhile, then the acquisition rewritten (synth, another seed).
  void swap_for_a_copy_then_rewrite(const std::string& swapped, const std::string& away) {
    synth(folder() + "/sess", "a", "1");
    synth(reference_data.file("sess"), "a", "2");
    auto daemon = Daemon::start(folder());
    auto reference = Daemon::start(reference_data.path());
    ASSERT_NE(daemon, nullptr);
    ASSERT_NE(reference, nullptr);
    remember_products(*daemon, *reference);
    const json acquisitions = json::parse(daemon->get("/api/browse/acquisitions")->body);

    const std::string command = "mv '" + swapped + "' '" + away + "' && cp -a '" + away + "' '" + swapped + "'";
    ASSERT_EQ(std::system(command.c_str()), 0);
    // Served from the copy (same bytes, other inodes) for a second, as clients keep asking.
    for (int round = 0; round < 20; ++round) {
      for (const auto& target : product_targets(0)) EXPECT_EQ(answer(*daemon, target).status, 200) << target;
      std::this_thread::sleep_for(50ms);
    }
    synth(folder() + "/sess", "a", "2");
    EXPECT_TRUE(serves_the_new_content(*daemon, *reference, 5s));
    EXPECT_TRUE(wait_for(
        [&] {
          const json now = json::parse(daemon->get("/api/browse/acquisitions")->body);
          return now["ready_token"] != acquisitions["ready_token"] && now["history"].size() == 1;
        },
        5s));
    const json ready_body = json::parse(daemon->get("/api/health/ready")->body);
    EXPECT_EQ(ready_body["watcher"]["kind"], "inotify");
    EXPECT_EQ(ready_body["watcher"]["polled_directories"], 0);
    if (swapped == folder()) {
      const std::string text = daemon->get("/metrics")->body;
      const auto at = text.find("\nquantem_watch_folder_refollows_total ");
      ASSERT_NE(at, std::string::npos);
      EXPECT_GE(std::stoi(text.substr(at + 38)), 1) << text.substr(at);
    }
    EXPECT_EQ(daemon->stop(), 0);
  }

  void remember_products(const Daemon& daemon, const Daemon& reference) {
    for (const auto& target : product_targets(0)) {
      before_[target] = answer(daemon, target);
      ASSERT_EQ(before_[target].status, 200) << target << " " << before_[target].body;
      ASSERT_FALSE(before_[target].signature.empty());
      // Meaningful only when the two contents differ.
      ASSERT_NE(before_[target].body, answer(reference, target).body) << target;
    }
  }

  quantem::test::TempDir data;
  quantem::test::TempDir reference_data;
  std::map<std::string, Answer> before_;
};

}  // namespace

TEST_F(ServeFreshness, AFolderSwappedForACopyThenRewrittenIsServedFreshNeverOld) {
  swap_for_a_copy_then_rewrite(folder(), folder() + ".old");
}

TEST_F(ServeFreshness, ASessionFolderSwappedForACopyThenRewrittenIsServedFreshNeverOld) {
  swap_for_a_copy_then_rewrite(folder() + "/sess", data.file("sess.old"));
}

TEST_F(ServeFreshness, AFileRewrittenInPlaceWhileResidentIsServedFreshNeverOld) {
  synth(folder() + "/sess", "a", "1");
  synth(reference_data.file("sess"), "a", "2");
  auto daemon = Daemon::start(folder());
  auto reference = Daemon::start(reference_data.path());
  ASSERT_NE(daemon, nullptr);
  ASSERT_NE(reference, nullptr);
  remember_products(*daemon, *reference);
  ASSERT_EQ(json::parse(daemon->get("/api/browse/residency?" + kSource)->body)["state"], "resident");

  // Same paths, same inodes, new bytes.
  for (const auto& entry : fs::directory_iterator(reference_data.file("sess"))) {
    const std::string target = folder() + "/sess/" + entry.path().filename().string();
    struct stat before {};
    ASSERT_EQ(::stat(target.c_str(), &before), 0) << target;
    std::ofstream(target, std::ios::binary | std::ios::trunc) << read_file(entry.path().string());
    struct stat after {};
    ASSERT_EQ(::stat(target.c_str(), &after), 0);
    ASSERT_EQ(after.st_ino, before.st_ino);  // rewritten in place
  }
  EXPECT_TRUE(serves_the_new_content(*daemon, *reference, 5s));
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeFreshness, AnUnreadableSessionFolderIsReportedNotSilentlyDropped) {
  if (::geteuid() == 0) {
    // Root reads a mode 000 folder through CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH.
    // Without them in the bounding set, the daemon this test starts is
    // checked like any other user (the test process keeps its own).
    if (::prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0 ||
        ::prctl(PR_CAPBSET_DROP, CAP_DAC_READ_SEARCH, 0, 0, 0) != 0) {
      GTEST_SKIP() << "running as root and cannot drop CAP_DAC_OVERRIDE from the bounding set: a mode 000 folder "
                      "stays readable, so the case cannot happen here";
    }
  }
  synth(folder() + "/sess", "a", "1");
  synth(folder() + "/locked", "b", "1");
  auto daemon = Daemon::start(folder());
  ASSERT_NE(daemon, nullptr);
  ASSERT_EQ(json::parse(daemon->get("/api/browse/sessions")->body)["sessions"].size(), 2u);
  ASSERT_EQ(::chmod((folder() + "/locked").c_str(), 0), 0);
  const json sessions = json::parse(daemon->get("/api/browse/sessions?refresh=true")->body);
  const json ready_body = json::parse(daemon->get("/api/health/ready")->body);
  const std::string metrics_text = daemon->get("/metrics")->body;
  ::chmod((folder() + "/locked").c_str(), 0755);

  EXPECT_EQ(sessions["sessions"].size(), 1u);
  ASSERT_EQ(sessions["unreadable_folders"].size(), 1u) << sessions.dump();
  EXPECT_EQ(sessions["unreadable_folders"][0]["path"], "locked");
  EXPECT_EQ(sessions["unreadable_folders"][0]["reason"], "Permission denied");
  EXPECT_EQ(ready_body["ready"], true);  // the rest is served
  ASSERT_EQ(ready_body["unreadable_folders"].size(), 1u) << ready_body.dump();
  ASSERT_EQ(ready_body["warnings"].size(), 1u);
  EXPECT_NE(ready_body["warnings"][0].get<std::string>().find("locked"), std::string::npos);
  EXPECT_NE(metrics_text.find("quantem_catalog_unreadable_folders 1\n"), std::string::npos) << metrics_text;
  const std::string said = "cannot list " + folder() + "/locked: Permission denied; its acquisitions are not listed";
  const std::string log = daemon->stderr_text();
  EXPECT_NE(log.find(said), std::string::npos) << log;
  EXPECT_EQ(log.find(said), log.rfind(said)) << "said more than once: " << log;

  // Readable again: listed again, nothing reported.
  EXPECT_TRUE(wait_for(
      [&] {
        const json now = json::parse(daemon->get("/api/browse/sessions?refresh=true")->body);
        return now["sessions"].size() == 2u && !now.contains("unreadable_folders");
      },
      5s));
  EXPECT_FALSE(json::parse(daemon->get("/api/health/ready")->body).contains("unreadable_folders"));
  EXPECT_NE(daemon->stderr_text().find("/locked can be listed again"), std::string::npos);
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeFreshness, RefreshesInALoopShareBuildsAndStillSeeEveryChange) {
  synth(folder() + "/sess", "a", "1");
  auto daemon = Daemon::start(folder());
  ASSERT_NE(daemon, nullptr);
  auto builds = [&] {
    const std::string text = daemon->get("/metrics")->body;
    const auto at = text.find("\nquantem_catalog_builds_total ");
    return at == std::string::npos ? -1 : std::stoi(text.substr(at + 30));
  };
  daemon->get("/api/browse/sessions");
  const int first = builds();
  ASSERT_GE(first, 1);
  // Twenty refreshes in a loop and eight at once, nothing changed: the
  // watcher vouches for the last build, or the rate limit spaces builds.
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) ASSERT_EQ(daemon->get("/api/browse/sessions?refresh=true")->status, 200);
  std::vector<std::thread> callers;
  for (int i = 0; i < 8; ++i) callers.emplace_back([&] { daemon->get("/api/browse/sessions?refresh=true"); });
  for (auto& caller : callers) caller.join();
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_LE(builds() - first, 1 + static_cast<int>(seconds));  // at most one per refresh interval (1 s)

  // A new acquisition is in the very next refresh's answer.
  synth(folder() + "/sess", "b", "1");
  const json sessions = json::parse(daemon->get("/api/browse/sessions?refresh=true")->body);
  EXPECT_EQ(sessions["sessions"][0]["files"].size(), 2u) << sessions.dump();
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ServeFreshness, BeyondTheInotifyWatchLimitTheRestIsPolledAndNewAcquisitionsAreFound) {
  synth(folder() + "/s1", "a", "1");
  synth(folder() + "/s2", "a", "1");
  // The folder alone is watched; s1, s2 and what comes later are polled (every second).
  auto daemon = Daemon::start(folder(), {}, {{"QUANTEM_WATCH_LIMIT", "1"}});
  ASSERT_NE(daemon, nullptr);
  // Ready once the catalog is built; the watcher is set up right after ("starting" until then).
  json ready_body;
  EXPECT_TRUE(wait_for(
      [&] {
        ready_body = json::parse(daemon->get("/api/health/ready")->body);
        return ready_body["watcher"]["kind"] != "starting";
      },
      5s));
  EXPECT_EQ(ready_body["ready"], true);
  EXPECT_EQ(ready_body["watcher"]["kind"], "inotify");
  EXPECT_EQ(ready_body["watcher"]["watched_directories"], 1);
  EXPECT_EQ(ready_body["watcher"]["polled_directories"], 2);
  EXPECT_EQ(ready_body["watcher"]["poll_interval_ms"], 1000);
  ASSERT_EQ(ready_body["warnings"].size(), 1u) << ready_body.dump();
  EXPECT_NE(daemon->get("/metrics")->body.find("quantem_watch_polled_directories 2\n"), std::string::npos);
  daemon->get("/api/browse/acquisitions");  // the first walk

  // A new acquisition in a polled folder and one in a new folder (polled too).
  // The background re-walk waits 10 s: only the watcher's polling finds them this soon.
  synth(folder() + "/s2", "late", "3");
  synth(folder() + "/s3", "new", "4");
  const auto written = std::chrono::steady_clock::now();
  EXPECT_TRUE(wait_for(
      [&] {
        const std::string body = daemon->get("/api/browse/acquisitions")->body;
        return body.find("s2/late_master.h5") != std::string::npos && body.find("s3/new_master.h5") != std::string::npos;
      },
      4s));
  EXPECT_LT(std::chrono::steady_clock::now() - written, 4s);  // the poll interval (1 s) and a turn, with margin
  EXPECT_EQ(json::parse(daemon->get("/api/health/ready")->body)["watcher"]["polled_directories"], 3);
  const std::string log = daemon->stderr_text();
  std::size_t said = 0;
  for (auto at = log.find("inotify cannot watch every directory"); at != std::string::npos;
       at = log.find("inotify cannot watch every directory", at + 1)) {
    ++said;
  }
  EXPECT_EQ(said, 1u) << log;  // said once
  EXPECT_EQ(daemon->stop(), 0);
}
