// The edges of saving, through the real binary: the clean-up of abandoned
// exports never removes what an export did not write; an I/O error while
// writing (a loop-mounted ext4 remounted read-only, a file size limit) fails
// the export with a typed error, leaves nothing, and the daemon keeps serving;
// names longer than the filesystem takes are refused before any work; the
// export folder is checked at start and at POST; the queue is bounded.
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using quantem::test::Daemon;
using quantem::test::run_quantem;
using quantem::test::TempDir;

void write_source(const std::string& folder, const std::string& stem, const std::string& options) {
  const auto result = quantem::test::run_python_script(
      "products_load_fixture.py", "write " + folder + " " + stem + " " + options + " --no-expected");
  ASSERT_EQ(result.status, 0);
}

std::vector<std::string> entries(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Sets the modification time of `path` (not following a symlink) `seconds` into the past.
void age(const std::string& path, int seconds) {
  struct timeval times[2];
  ::gettimeofday(&times[0], nullptr);
  times[0].tv_sec -= seconds;
  times[1] = times[0];
  ASSERT_EQ(::lutimes(path.c_str(), times), 0) << path;
}

json wait_for_job(const Daemon& daemon, const std::string& id, int seconds = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
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

class ExportEdges : public ::testing::Test {
 protected:
  void SetUp() override {
    write_source(dir.path(), "scan", "--scan 9x8 --det 10x12 --dtype uint16");
    master = dir.file("scan_master.h5");
    out = dir.file("out");
    fs::create_directory(out);
  }
  TempDir dir;
  std::string master;
  std::string out;
};

// --- the clean-up removes only what an export made ------------------------------

TEST_F(ExportEdges, TheCleanUpNeverRemovesWhatAnExportDidNotWrite) {
  // A user's regular file with the hidden name of the next export, a folder of
  // notes with that suffix, and a symlink with it to a folder of someone
  // else's files: all older than any grace period.
  const std::string own_name = out + "/.scan_full.incomplete-export";
  write_text(own_name, "a user's file");
  fs::create_directory(out + "/.notes.incomplete-export");
  write_text(out + "/.notes.incomplete-export/notes.txt", "keep me");
  fs::create_directory(dir.file("elsewhere"));
  write_text(dir.file("elsewhere/data.txt"), "keep me too");
  fs::create_symlink(dir.file("elsewhere"), out + "/.linked.incomplete-export");
  for (const std::string& path : {own_name, out + "/.notes.incomplete-export", out + "/.linked.incomplete-export"}) {
    age(path, 3600);
  }

  // The export whose hidden name is taken: refused, naming why; nothing removed.
  const auto taken = run_quantem({"export", master, out, "--backend", "cpu"});
  EXPECT_EQ(taken.exit_code, 1);
  EXPECT_NE(taken.stderr_text.find("was not made by an export"), std::string::npos) << taken.stderr_text;
  // Another export runs the clean-up and writes beside them.
  const auto other = run_quantem({"export", master, out, "--backend", "cpu", "--scan-crop", "0:4,0:4"});
  ASSERT_EQ(other.exit_code, 0) << other.stderr_text;

  EXPECT_EQ(read_text(own_name), "a user's file");
  EXPECT_EQ(read_text(out + "/.notes.incomplete-export/notes.txt"), "keep me");
  EXPECT_TRUE(fs::is_symlink(out + "/.linked.incomplete-export"));
  EXPECT_EQ(read_text(dir.file("elsewhere/data.txt")), "keep me too");
  EXPECT_EQ(entries(out), (std::vector<std::string>{".linked.incomplete-export", ".notes.incomplete-export",
                                                    ".scan_full.incomplete-export", "scan_crop0-4x0-4"}));
}

TEST_F(ExportEdges, AFolderAnExportMarkedAndLeftIsRemovedByTheNextExport) {
  // What a writer that died leaves: the folder with its marker, lock free.
  const std::string left = out + "/.scan_crop0-2x0-2.incomplete-export";
  fs::create_directory(left);
  write_text(left + "/.export-lock", "quantem-gpu incomplete export\npid 1\nhost elsewhere\n");
  write_text(left + "/scan_crop0-2x0-2_data_000001.h5", "partial");
  const auto result = run_quantem({"export", master, out, "--backend", "cpu"});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(entries(out), std::vector<std::string>{"scan_full"});
}

}  // namespace
