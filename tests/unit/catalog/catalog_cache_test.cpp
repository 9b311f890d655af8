// The catalog cache file (catalog/catalog_cache.hpp): a round trip keeps every
// field of real inspections (masks, missing shards, calibrations, optional
// counts); every kind of damage is refused as a whole; the default path
// follows $XDG_CACHE_HOME and differs per data folder; signatures tell a
// changed file. And the parallel build with kept inspections equals the
// sequential build.
#include <stdlib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "acquisition_equality.hpp"
#include "catalog_fixtures.hpp"
#include "quantem/catalog/catalog.hpp"
#include "quantem/catalog/catalog_cache.hpp"
#include "quantem/core/error.hpp"
#include "test_support.hpp"

namespace quantem::catalog {
namespace {

namespace fs = std::filesystem;

class CatalogCacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string root = dir_->path();
    test::make_acquisitions(*dir_, {
                                       root + "/s1 masked --shard-frames 6 --ntrigger 6 --det 8x8 --mask 8x8:uint32:1,2=1;7,7=4",
                                       root + "/s1 plain --shard-frames 3,3 --ntrigger 6",
                                       root + "/s2 missing --shard-frames 4,4 --ntrigger 8 --missing-shards 2",
                                       root + "/s2 calibrated --shard-frames 4 --root-attr scan_sampling_A=0.5",
                                       root + "/s3 inl --shard-frames inline:3,2 --ntrigger 5 --dtype uint32",
                                   });
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::vector<Acquisition> inspections() {
    std::vector<Acquisition> found;
    for (const auto& master : discover_masters(dir_->path())) found.push_back(inspect_master(master));
    return found;
  }
  static std::vector<const Acquisition*> pointers(const std::vector<Acquisition>& acquisitions) {
    std::vector<const Acquisition*> out;
    for (const auto& a : acquisitions) out.push_back(&a);
    return out;
  }
  static test::TempDir* dir_;
};
test::TempDir* CatalogCacheTest::dir_ = nullptr;

TEST_F(CatalogCacheTest, RoundTripKeepsEveryField) {
  const auto original = inspections();
  ASSERT_EQ(original.size(), 5u);
  bool masked = false, missing = false;
  for (const auto& a : original) {
    masked = masked || a.masked_pixel_count > 0;
    missing = missing || !a.status.loadable;
  }
  ASSERT_TRUE(masked) << "the fixtures must cover a pixel mask";
  ASSERT_TRUE(missing) << "the fixtures must cover a master that is not loadable";
  const std::string folder = absolute_folder(dir_->path());
  const auto decoded = decode_catalog_cache(encode_catalog_cache(folder, pointers(original)), folder);
  ASSERT_EQ(decoded.size(), original.size());
  for (const auto& a : original) {
    SCOPED_TRACE(a.master_path);
    ASSERT_EQ(decoded.count(a.master_path), 1u);
    test::expect_same_acquisition(decoded.at(a.master_path), a);
  }
}

TEST_F(CatalogCacheTest, EveryDamageIsRefusedAsAWhole) {
  const auto original = inspections();
  const std::string folder = absolute_folder(dir_->path());
  const std::string bytes = encode_catalog_cache(folder, pointers(original));
  auto refused = [&](const std::string& damaged, const std::string& what) {
    SCOPED_TRACE(what);
    try {
      (void)decode_catalog_cache(damaged, folder);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::corrupt_data) << e.what();
    }
  };
  refused("", "empty");
  refused(bytes.substr(0, bytes.size() / 2), "truncated");
  refused(bytes.substr(0, 20), "header only");
  refused(bytes + "x", "a byte more");
  for (std::size_t at : {std::size_t{0}, std::size_t{9}, std::size_t{30}, bytes.size() / 2, bytes.size() - 1}) {
    std::string flipped = bytes;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x40);
    refused(flipped, "a flipped byte at " + std::to_string(at));
  }
  std::string other_version = bytes;
  other_version[8] = static_cast<char>(kCatalogCacheVersion + 1);
  refused(other_version, "another version");
  try {
    (void)decode_catalog_cache(bytes, folder + "-elsewhere");
    ADD_FAILURE() << "the cache of another folder was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another data folder"), std::string::npos) << e.what();
  }
  // Every prefix is refused, never crashes.
  for (std::size_t size = 0; size < bytes.size(); size += 1 + size / 16) {
    EXPECT_THROW((void)decode_catalog_cache(bytes.substr(0, size), folder), Error) << size;
  }
}

TEST_F(CatalogCacheTest, FilesAreWrittenAtomicallyAndDamagedOnesIgnored) {
  test::TempDir cache;
  const std::string path = cache.path() + "/made/quantem-gpu/catalog.bin";
  const std::string folder = absolute_folder(dir_->path());
  auto missing = read_catalog_cache(path, folder);
  EXPECT_TRUE(missing.entries.empty());
  EXPECT_TRUE(missing.problem.empty()) << missing.problem;  // absent is not a problem

  const auto original = inspections();
  write_catalog_cache(path, folder, pointers(original));
  EXPECT_EQ((fs::status(cache.path() + "/made").permissions() & fs::perms::all), fs::perms::owner_all);
  auto read = read_catalog_cache(path, folder);
  EXPECT_TRUE(read.problem.empty()) << read.problem;
  EXPECT_EQ(read.entries.size(), original.size());
  for (const auto& entry : fs::directory_iterator(cache.path() + "/made/quantem-gpu")) {
    EXPECT_EQ(entry.path().filename(), "catalog.bin");  // no temporary left behind
  }
  fs::resize_file(path, fs::file_size(path) - 1);
  auto truncated = read_catalog_cache(path, folder);
  EXPECT_TRUE(truncated.entries.empty());
  EXPECT_FALSE(truncated.problem.empty());
  fs::remove(path);
  fs::create_directory(path);
  auto directory = read_catalog_cache(path, folder);
  EXPECT_TRUE(directory.entries.empty());
  EXPECT_FALSE(directory.problem.empty());
  EXPECT_THROW(write_catalog_cache(path, folder, pointers(original)), Error);  // rename onto a folder fails
}

TEST_F(CatalogCacheTest, DefaultPathFollowsXdgAndDiffersPerFolder) {
  const char* saved = std::getenv("XDG_CACHE_HOME");
  const std::string saved_value = saved ? saved : "";
  ::setenv("XDG_CACHE_HOME", "/somewhere/cache", 1);
  const std::string one = default_catalog_cache_path("/data/one");
  EXPECT_EQ(one.rfind("/somewhere/cache/quantem-gpu/catalog-", 0), 0u) << one;
  EXPECT_EQ(one.size(), std::string("/somewhere/cache/quantem-gpu/catalog-0123456789abcdef.bin").size());
  EXPECT_NE(default_catalog_cache_path("/data/two"), one);
  EXPECT_EQ(default_catalog_cache_path("/data/one/"), one);  // the same folder spelled differently
  ::setenv("XDG_CACHE_HOME", "relative", 1);                  // not absolute: ignored, as the spec says
  const char* home = std::getenv("HOME");
  if (home && *home) {
    EXPECT_EQ(default_catalog_cache_path("/data/one").rfind(std::string(home) + "/.cache/quantem-gpu/", 0), 0u);
  }
  if (saved) {
    ::setenv("XDG_CACHE_HOME", saved_value.c_str(), 1);
  } else {
    ::unsetenv("XDG_CACHE_HOME");
  }
}

TEST_F(CatalogCacheTest, SignatureTellsAChangedFile) {
  test::TempDir scratch;
  test::make_acquisitions(scratch, {scratch.path() + " one --shard-frames 4 --ntrigger 4"});
  const auto acquisition = inspect_master(scratch.file("one_master.h5"));
  ASSERT_EQ(acquisition.signature.size(), 2u);
  EXPECT_TRUE(signature_unchanged(acquisition.signature));
  const std::string shard = acquisition.signature[1].path;
  fs::copy_file(shard, shard + ".copy");
  fs::rename(shard + ".copy", shard);  // same bytes, same size, another inode
  EXPECT_FALSE(signature_unchanged(acquisition.signature));
}

TEST_F(CatalogCacheTest, ParallelBuildWithKeptInspectionsEqualsTheSequentialBuild) {
  const auto sequential = build_catalog(dir_->path());
  const auto kept = inspections();
  std::atomic<int> inspected{0};
  std::set<std::string> reusable = {kept[0].master_path, kept[2].master_path};
  BuildOptions options;
  options.threads = 3;
  options.reuse = [&](const std::string& master) -> std::optional<Acquisition> {
    if (!reusable.count(master)) return std::nullopt;
    for (const auto& a : kept)
      if (a.master_path == master) return a;
    return std::nullopt;
  };
  int progress_calls = 0;
  std::size_t first_progress = 0;
  options.progress = [&](const Catalog& partial) {
    std::size_t files = 0;
    for (const auto& session : partial.sessions) files += session.files.size();
    if (progress_calls++ == 0) first_progress = files;
  };
  BuildCounts counts;
  const auto parallel = build_catalog(
      dir_->path(),
      [&](const std::string& master) {
        ++inspected;
        return inspect_master(master);
      },
      options, &counts);
  EXPECT_EQ(sessions_document(parallel).dump(), sessions_document(sequential).dump());
  EXPECT_EQ(parallel.session_directories, sequential.session_directories);
  EXPECT_EQ(counts.reused, 2u);
  EXPECT_EQ(counts.inspected, 3u);
  EXPECT_EQ(inspected.load(), 3);
  EXPECT_GE(progress_calls, 1);
  EXPECT_EQ(first_progress, 2u);  // the kept ones are known before any inspection
}

TEST_F(CatalogCacheTest, KeptInspectionsOfALargeFolderAreCheckedOnSeveralThreads) {
  test::TempDir large;
  for (int i = 0; i < 1500; ++i) std::ofstream(large.file("m" + std::to_string(i) + "_master.h5"));
  auto fake = [](const std::string& master) {
    Acquisition a = named_acquisition(master);
    a.status = {false, "fake", "none"};
    return a;
  };
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::atomic<int> asked{0};
  BuildOptions options;
  options.threads = 2;
  options.reuse = [&](const std::string& master) -> std::optional<Acquisition> {
    ++asked;
    {
      std::lock_guard<std::mutex> lock(mutex);
      threads.insert(std::this_thread::get_id());
    }
    if (master.find("m1") != std::string::npos) return std::nullopt;  // inspected
    Acquisition kept = fake(master);
    kept.status.reason = "kept";
    return kept;
  };
  BuildCounts counts;
  const auto built = build_catalog(large.path(), fake, options, &counts);
  EXPECT_EQ(asked.load(), 1500);
  EXPECT_EQ(threads.size(), 2u);
  EXPECT_EQ(counts.reused + counts.inspected, 1500u);
  ASSERT_EQ(built.sessions.size(), 1u);
  ASSERT_EQ(built.sessions[0].files.size(), 1500u);
  std::size_t kept = 0;
  for (const auto& file : built.sessions[0].files) {
    const bool should_keep = file.name.rfind("m1", 0) != 0;
    EXPECT_EQ(file.status.reason, should_keep ? "kept" : "fake") << file.name;
    kept += should_keep;
  }
  EXPECT_EQ(kept, counts.reused);
}

TEST_F(CatalogCacheTest, ParallelBuildStopsOnUnavailable) {
  BuildOptions options;
  options.threads = 2;
  EXPECT_THROW(build_catalog(
                   dir_->path(),
                   [](const std::string&) -> Acquisition { throw Error(ErrorKind::unavailable, "no worker"); }, options),
               Error);
  // Any other failure skips that master only.
  const auto built = build_catalog(
      dir_->path(),
      [](const std::string& master) -> Acquisition {
        if (master.find("plain") != std::string::npos) throw Error(ErrorKind::io, "unreadable");
        return inspect_master(master);
      },
      options);
  std::size_t files = 0;
  for (const auto& session : built.sessions) files += session.files.size();
  EXPECT_EQ(files, 4u);
}

TEST_F(CatalogCacheTest, SessionsTextIsTheDocumentByteForByte) {
  const auto built = build_catalog(dir_->path());
  EXPECT_EQ(sessions_document_text(built),
            sessions_document(built).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  // Text that needs escaping or repair, numbers of every kind, an empty session list.
  Catalog odd;
  odd.data_folder = "/data/\"quoted\"\\ \xc3\xa9t\xc3\xa9 \xff";
  Session session;
  session.path = "a/b\tc";
  session.source = "\x01control";
  session.date = "2026";
  for (const auto& sampling : {std::optional<double>(0.1), std::optional<double>(1e-300), std::optional<double>(),
                               std::optional<double>(std::nan("")), std::optional<double>(12345678.0)}) {
    Acquisition a = named_acquisition("/data/x" + std::to_string(session.files.size()) + "_master.h5");
    a.scan_sampling_A = sampling;
    a.k_pixel_size_mrad = sampling ? std::optional<double>(*sampling * 3) : std::nullopt;
    a.status = {session.files.size() % 2 == 0, "reason \"" + std::string("\xe2\x9c\x93") + "\"", "act\nion \xc3"};
    a.dtype = session.files.size() % 2 ? std::optional<DType>(DType::uint32) : std::nullopt;
    a.size_bytes = std::uint64_t{1} << (session.files.size() * 10);
    a.scan_rows = 3;
    session.files.push_back(a);
  }
  odd.sessions.push_back(session);
  EXPECT_EQ(sessions_document_text(odd),
            sessions_document(odd).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  Catalog empty;
  empty.data_folder = "/nothing";
  EXPECT_EQ(sessions_document_text(empty), sessions_document(empty).dump());
}

}  // namespace
}  // namespace quantem::catalog
