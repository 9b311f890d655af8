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
#include "export_folders.hpp"

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

std::vector<std::string> entries(const std::string& folder) { return quantem::test::folder_entries(folder); }

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

// --- I/O errors while writing: a typed failure, nothing left, the process lives ---

namespace io_errors {

// An ext4 file system in a file, loop-mounted with errors=remount-ro, whose
// errors are triggered through /sys/fs/ext4/<loop>/trigger_fs_error. Empty
// skip_reason when mounted.
class LoopMount {
 public:
  explicit LoopMount(const std::string& folder) : image_(folder + "/fs.img"), mount_point_(folder + "/mnt") {
    fs::create_directory(mount_point_);
    if (::geteuid() != 0) {
      skip_reason_ = "mounting a loop file system needs root";
      return;
    }
    const auto made = quantem::test::run_command("truncate -s 64M " + image_ + " && mkfs.ext4 -q -F " + image_ +
                                                 " 2>&1 && mount -o loop,errors=remount-ro " + image_ + " " +
                                                 mount_point_ + " 2>&1");
    if (made.status != 0) {
      skip_reason_ = "cannot loop-mount an ext4 file system here: " + made.output;
      return;
    }
    mounted_ = true;
    const auto loop = quantem::test::run_command("losetup -j " + image_ + " | cut -d: -f1 | head -1 | xargs basename");
    trigger_ = "/sys/fs/ext4/" + loop.output.substr(0, loop.output.find('\n')) + "/trigger_fs_error";
    if (!fs::exists(trigger_)) skip_reason_ = "this kernel has no " + trigger_;
  }
  ~LoopMount() {
    if (mounted_) quantem::test::run_command("umount -l " + mount_point_ + " 2>&1");
  }
  const std::string& skip_reason() const { return skip_reason_; }
  const std::string& path() const { return mount_point_; }
  // The next write fails and the file system turns read-only (EROFS).
  void fail_writes() const { write_text(trigger_, "1"); }

 private:
  std::string image_, mount_point_, trigger_, skip_reason_;
  bool mounted_ = false;
};

bool holds_partial_data(const std::string& folder) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    if (entry.path().filename().string()[0] != '.' || !entry.is_directory()) continue;
    for (const auto& inner : fs::directory_iterator(entry.path(), error)) {
      if (inner.path().filename().string().find("_data_") != std::string::npos) return true;
    }
  }
  return false;
}

}  // namespace io_errors

TEST_F(ExportEdges, TheDiskFillingUpMidExportFailsTheCliClearlyAndLeavesNothing) {
  // A file size limit makes a write fail (EFBIG) as a full disk or quota does
  // while statvfs still reports room: in a data file (the limit below the
  // first data file's size), then in the master (data files of one frame
  // fit, the master does not).
  for (const auto& [limit_blocks, frames_per_file] : {std::pair{8, "0"}, std::pair{12, "1"}}) {
    const auto result = quantem::test::run_command(
        "ulimit -f " + std::to_string(limit_blocks) + "; " + quantem::test::quantem_binary() + " export " + master +
        " " + out + " --backend cpu --threads 1 --no-progress --frames-per-file " + frames_per_file + " 2>&1");
    EXPECT_EQ(result.status, 1) << result.output;
    EXPECT_NE(result.output.find("is full: File too large"), std::string::npos) << result.output;
    EXPECT_TRUE(entries(out).empty());
  }
  // With room again the same export runs.
  const auto result = run_quantem({"export", master, out, "--backend", "cpu"});
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(entries(out), std::vector<std::string>{"scan_full"});
}

TEST(ExportIoErrors, AFileSystemTurningReadOnlyMidExportFailsTheJobAndTheDaemonKeepsServing) {
  TempDir data;
  fs::create_directory(data.file("sess"));
  write_source(data.file("sess"), "scan", "--scan 9x8 --det 10x12 --dtype uint16");
  io_errors::LoopMount mount(data.path());
  if (!mount.skip_reason().empty()) GTEST_SKIP() << mount.skip_reason();
  const std::string exports = mount.path() + "/exports";
  fs::create_directory(exports);
  auto daemon = Daemon::start(data.path(), {"--export-dir", exports, "--cpu-threads", "1"},
                              {{"QUANTEM_EXPORT_BATCH_DELAY_MS_FOR_TESTING", "300"}});
  ASSERT_NE(daemon, nullptr);
  // Resident before the export, so its loss would show.
  ASSERT_EQ(daemon->get("/api/browse/realspace?session=sess&file=scan_master.h5&mode=BF")->status, 200);
  auto started = daemon->request("POST", "/api/browse/export?session=sess&file=scan_master.h5&frames_per_file=8");
  ASSERT_TRUE(started);
  ASSERT_EQ(started->status, 202) << started->body;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!io_errors::holds_partial_data(exports) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(io_errors::holds_partial_data(exports));
  mount.fail_writes();

  const json job = wait_for_job(*daemon, json::parse(started->body)["id"]);
  EXPECT_EQ(job["state"], "failed") << job.dump();
  EXPECT_EQ(job["error"]["status"], 500) << job.dump();
  EXPECT_NE(job["error"]["detail"].get<std::string>().find("Read-only file system"), std::string::npos)
      << job.dump();
  // Nothing that looks finished (the read-only folder keeps the hidden
  // incomplete one, removed by the next export once writable).
  for (const auto& name : entries(exports)) EXPECT_EQ(name[0], '.') << name;
  // The daemon lives, its resident with it, and it stops cleanly.
  auto health = daemon->get("/api/health/live");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto resident = daemon->get("/api/browse/residency?session=sess&file=scan_master.h5");
  ASSERT_TRUE(resident);
  EXPECT_EQ(json::parse(resident->body)["state"], "resident") << resident->body;
  EXPECT_EQ(daemon->get("/api/browse/realspace?session=sess&file=scan_master.h5&mode=BF")->status, 200);
  // The folder is read-only now: the next POST says so at once.
  auto refused = daemon->request("POST", "/api/browse/export?session=sess&file=scan_master.h5&scan_bin=2");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 409) << refused->body;
  EXPECT_NE(refused->body.find("is not writable: Read-only file system"), std::string::npos) << refused->body;
  EXPECT_EQ(daemon->stop(), 0);
}

// --- names, folders, numbers: refused at the request, before any work -----------

TEST(ExportNames, ANameLongerThanTheFolderTakesIsRefusedBeforeAnyWork) {
  TempDir data;
  fs::create_directory(data.file("sess"));
  fs::create_directory(data.file("exports"));
  // A stem of 230 characters: its own files fit; with a crop and a bin the
  // export's hidden folder name would not (255 on ext4, tmpfs, xfs).
  const std::string stem(230, 's');
  write_source(data.file("sess"), stem, "--scan 9x8 --det 10x12 --dtype uint16");
  auto daemon = Daemon::start(data.path(), {"--export-dir", data.file("exports")});
  ASSERT_NE(daemon, nullptr);
  auto refused = daemon->request("POST", "/api/browse/export?session=sess&file=" + stem +
                                             "_master.h5&row_start=0&row_stop=4&column_start=0&column_stop=4&scan_bin=2");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  EXPECT_NE(refused->body.find("limit of 255 characters"), std::string::npos) << refused->body;
  // The whole acquisition's name fits (235 characters, 254 with the hidden folder's).
  auto fits = daemon->request("POST", "/api/browse/export?session=sess&file=" + stem + "_master.h5");
  ASSERT_TRUE(fits);
  ASSERT_EQ(fits->status, 202) << fits->body;
  EXPECT_EQ(wait_for_job(*daemon, json::parse(fits->body)["id"])["state"], "done");
  EXPECT_EQ(daemon->stop(), 0);
  const auto cli = run_quantem({"export", data.file("sess/" + stem + "_master.h5"), data.file("exports"), "--backend",
                                "cpu", "--scan-bin", "2"});
  EXPECT_EQ(cli.exit_code, 1);
  EXPECT_NE(cli.stderr_text.find("limit of 255 characters"), std::string::npos) << cli.stderr_text;
}

class ExportRequestEdges : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directory(data.file("sess"));
    write_source(data.file("sess"), "scan", "--scan 9x8 --det 10x12 --dtype uint16");
    fs::create_directory(exports);
  }
  TempDir data;
  const std::string exports = data.file("exports");
  const std::string post = "/api/browse/export?session=sess&file=scan_master.h5";
};

TEST_F(ExportRequestEdges, TheExportFolderIsCheckedAtStartAndAtEachPost) {
  // At start: an empty --export-dir is a usage error (exit 2), never exports
  // turned off in silence; a missing, non-folder or read-only one a refused
  // configuration (exit 78).
  const auto empty = run_quantem({"serve", data.path(), "--backend", "cpu", "--port", "65000", "--export-dir", ""});
  EXPECT_EQ(empty.exit_code, 2) << empty.stderr_text;
  EXPECT_NE(empty.stderr_text.find("empty --export-dir"), std::string::npos) << empty.stderr_text;
  write_text(data.file("plain"), "x");
  for (const std::string& folder : {data.file("missing"), data.file("plain")}) {
    const auto refused = run_quantem({"serve", data.path(), "--backend", "cpu", "--port", "65000", "--export-dir", folder});
    EXPECT_EQ(refused.exit_code, 78) << folder << ": " << refused.stderr_text;
    EXPECT_NE(refused.stderr_text.find("is not an existing folder"), std::string::npos) << refused.stderr_text;
  }
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directory(data.file("locked"));
    fs::permissions(data.file("locked"), fs::perms::owner_read | fs::perms::owner_exec);
    const auto locked = run_quantem({"serve", data.path(), "--backend", "cpu", "--port", "65000", "--export-dir",
                                     data.file("locked")});
    EXPECT_EQ(locked.exit_code, 78) << locked.stderr_text;
    EXPECT_NE(locked.stderr_text.find("not writable"), std::string::npos) << locked.stderr_text;
  }

  // At POST: the folder gone, or replaced by a file, answers 409 at once.
  auto daemon = Daemon::start(data.path(), {"--export-dir", exports});
  ASSERT_NE(daemon, nullptr);
  fs::remove(exports);
  auto gone = daemon->request("POST", post);
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->status, 409) << gone->body;
  EXPECT_NE(gone->body.find("cannot be used"), std::string::npos) << gone->body;
  write_text(exports, "not a folder");
  auto file = daemon->request("POST", post);
  ASSERT_TRUE(file);
  EXPECT_EQ(file->status, 409) << file->body;
  EXPECT_NE(file->body.find("is not a folder"), std::string::npos) << file->body;
  fs::remove(exports);
  fs::create_directory(exports);

  // A dangling symlink with the export's name: refused at the POST, not after the work.
  fs::create_symlink(data.file("nowhere"), exports + "/scan_full");
  auto taken = daemon->request("POST", post);
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->status, 409) << taken->body;
  EXPECT_NE(taken->body.find("already exists"), std::string::npos) << taken->body;
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ExportRequestEdges, TheQueueIsBounded) {
  // One export runs slowly; the queue behind it holds 64; the next POST is 503.
  auto daemon = Daemon::start(data.path(), {"--export-dir", exports, "--cpu-threads", "1"},
                              {{"QUANTEM_EXPORT_BATCH_DELAY_MS_FOR_TESTING", "2000"}});
  ASSERT_NE(daemon, nullptr);
  int accepted = 0;
  int refused_status = 0;
  std::string refused_body, retry_after;
  for (int row = 1; row <= 70 && refused_status == 0; ++row) {
    auto response = daemon->request("POST", post + "&row_start=0&row_stop=" + std::to_string(1 + row % 9) +
                                                "&column_start=0&column_stop=" + std::to_string(1 + row / 9));
    ASSERT_TRUE(response);
    if (response->status == 202) {
      ++accepted;
    } else {
      refused_status = response->status;
      refused_body = response->body;
      retry_after = response->get_header_value("retry-after");
    }
  }
  EXPECT_EQ(accepted, 65);  // the running one and 64 waiting
  EXPECT_EQ(refused_status, 503) << refused_body;
  EXPECT_EQ(retry_after, "1");
  EXPECT_NE(refused_body.find("the export queue is full"), std::string::npos) << refused_body;
  EXPECT_EQ(daemon->stop(), 0);
}

TEST_F(ExportRequestEdges, CliNumbersAndSourcesAreCheckedBeforeUse) {
  const std::string master = data.file("sess/scan_master.h5");
  const auto negative = run_quantem({"export", master, exports, "--backend", "cpu", "--frames-per-file", "-1"});
  EXPECT_EQ(negative.exit_code, 2) << negative.stderr_text;
  EXPECT_NE(negative.stderr_text.find("--frames-per-file"), std::string::npos) << negative.stderr_text;
  const auto threads = run_quantem({"export", master, exports, "--backend", "cpu", "--threads", "100000"});
  EXPECT_EQ(threads.exit_code, 2) << threads.stderr_text;
  EXPECT_NE(threads.stderr_text.find("--threads"), std::string::npos) << threads.stderr_text;
  const auto shard = run_quantem({"export", data.file("sess/scan_data_000001.h5"), exports, "--backend", "cpu"});
  EXPECT_EQ(shard.exit_code, 1) << shard.stdout_text;
  EXPECT_NE(shard.stderr_text.find("is not the master of an acquisition"), std::string::npos) << shard.stderr_text;
  // A frames-per-file larger than the frames: one data file, and said so.
  const auto one = run_quantem({"export", master, exports, "--backend", "cpu", "--frames-per-file",
                                "18446744073709551615"});
  ASSERT_EQ(one.exit_code, 0) << one.stderr_text;
  EXPECT_EQ(json::parse(one.stdout_text)["data_files"], 1);
  EXPECT_TRUE(fs::exists(exports + "/scan_full/scan_full_data_000001.h5"));
}

}  // namespace
