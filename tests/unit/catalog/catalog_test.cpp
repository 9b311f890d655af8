// Discovery, sessions, aliases, ordering, size formatting and the sessions
// document (docs/protocol.md, 'Masters, sessions and readiness'), and facts
// observed on the Python service's catalog of h5py fixtures.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "catalog_fixtures.hpp"
#include "quantem/catalog/catalog.hpp"

namespace quantem::catalog {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

TEST(FormatSize, MatchesPythonFormatting) {
  EXPECT_EQ(format_size(0), "0 B");
  EXPECT_EQ(format_size(1), "1 B");
  EXPECT_EQ(format_size(1023), "1023 B");
  EXPECT_EQ(format_size(1024), "1.0 KB");
  EXPECT_EQ(format_size(1536), "1.5 KB");
  EXPECT_EQ(format_size(9872), "9.6 KB");
  EXPECT_EQ(format_size(1280), "1.2 KB");  // 1.25 rounds half to even
  EXPECT_EQ(format_size(1331), "1.3 KB");  // 1.2998 -> 1.3
  EXPECT_EQ(format_size(1048575), "1024.0 KB");
  EXPECT_EQ(format_size(1048576), "1.0 MB");
  EXPECT_EQ(format_size(3758096384ull), "3.5 GB");
  EXPECT_EQ(format_size(1ull << 40), "1.0 TB");
  EXPECT_EQ(format_size(5000ull << 40), "5000.0 TB");
}

TEST(AbsoluteFolder, ExpandsAndNormalises) {
  EXPECT_EQ(absolute_folder("/data/./4dstem/"), "/data/4dstem");
  EXPECT_EQ(absolute_folder("/data/x/../4dstem"), "/data/4dstem");
  EXPECT_EQ(absolute_folder("/"), "/");
  const char* home = std::getenv("HOME");
  if (home && *home == '/') {
    EXPECT_EQ(absolute_folder("~/abc"), absolute_folder(std::string(home) + "/abc"));
  }
  EXPECT_EQ(absolute_folder("rel"), (fs::current_path() / "rel").lexically_normal().string());
}

// The tree of Appendix C under <tmp>/probe/root, plus exclusions and ordering cases.
class CatalogTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.path() + "/probe/root";
    const std::string tiny = " --shard-frames inline:4 --filter none";
    test::make_acquisitions(dir_, {
                                      root_ + " top" + tiny,
                                      root_ + "/onelevel one" + tiny,
                                      root_ + "/detector/20260101_session sample_01" + tiny,
                                      root_ + "/detector/20260101_session sample_00 --shard-frames 2,2 --ntrigger 4",
                                      root_ + "/detector/20260101_pending pending --ntrigger 4 --missing-shards 1",
                                      root_ + "/_hidden x" + tiny,
                                      root_ + "/.dot x" + tiny,
                                      root_ + "/sess _under" + tiny,
                                      root_ + "/sess visible" + tiny,
                                      root_ + "/a/p/s m" + tiny,
                                      root_ + "/b/p/s m" + tiny,
                                      root_ + "/a/b y" + tiny,
                                      root_ + "/a-c z" + tiny,
                                  });
    fs::copy_file(root_ + "/sess/visible_master.h5", root_ + "/sess/._visible_master.h5");
    fs::create_directory(root_ + "/sess/folder_master.h5");
    fs::create_directory_symlink(root_ + "/onelevel", root_ + "/linkdir");
    fs::create_symlink(root_ + "/onelevel/one_master.h5", root_ + "/onelevel/alias_master.h5");
    std::ofstream(root_ + "/sess/bad\xff_master.h5") << "x";
    std::ofstream(root_ + "/sess/Upper_MASTER.h5") << "x";
  }

  std::string relative(const std::string& path) const { return path.substr(root_.size() + 1); }

  TempDir dir_;
  std::string root_;
};

TEST_F(CatalogTree, DiscoveryExcludesAndOrdersComponentWise) {
  std::vector<std::string> found;
  for (const auto& path : discover_masters(root_)) found.push_back(relative(path));
  const std::vector<std::string> expected = {
      "a/b/y_master.h5",  // component-wise: "a" < "a-c" although "a-c" < "a/b" as strings
      "a/p/s/m_master.h5",
      "a-c/z_master.h5",
      "b/p/s/m_master.h5",
      "detector/20260101_pending/pending_master.h5",
      "detector/20260101_session/sample_00_master.h5",
      "detector/20260101_session/sample_01_master.h5",
      "onelevel/alias_master.h5",  // a symlinked file is listed
      "onelevel/one_master.h5",
      "sess/folder_master.h5",  // a directory matching the pattern is listed (not loadable)
      "sess/visible_master.h5",
      "top_master.h5",
  };
  EXPECT_EQ(found, expected);
}

TEST_F(CatalogTree, AWalkOnSeveralThreadsFindsWhatOneThreadFinds) {
  fs::create_directory(root_ + "/locked");
  fs::permissions(root_ + "/locked", fs::perms::none);
  std::vector<UnreadableDirectory> one_unreadable, four_unreadable;
  const auto one = discover_masters(root_, &one_unreadable, 1);
  const auto four = discover_masters(root_, &four_unreadable, 4);
  fs::permissions(root_ + "/locked", fs::perms::owner_all);
  EXPECT_EQ(four, one);
  EXPECT_EQ(one.size(), 12u);
  ASSERT_EQ(four_unreadable.size(), one_unreadable.size());
  for (std::size_t i = 0; i < one_unreadable.size(); ++i) {
    EXPECT_EQ(four_unreadable[i].path, one_unreadable[i].path);
    EXPECT_EQ(four_unreadable[i].reason, one_unreadable[i].reason);
  }
  if (::geteuid() != 0) {  // root lists any directory
    ASSERT_EQ(one_unreadable.size(), 1u);
    EXPECT_EQ(one_unreadable[0].path, root_ + "/locked");
    EXPECT_EQ(one_unreadable[0].reason, "Permission denied");
  }
}

TEST_F(CatalogTree, SessionsSourcesDatesAndAliases) {
  const Catalog catalog = build_catalog(root_);
  EXPECT_EQ(catalog.data_folder, root_);
  std::vector<std::string> paths;
  for (const auto& session : catalog.sessions) paths.push_back(session.path);
  const std::vector<std::string> expected_paths = {".",
                                                   "a-c",
                                                   "a/b",
                                                   "a/p/s",
                                                   "b/p/s",
                                                   "detector/20260101_pending",
                                                   "detector/20260101_session",
                                                   "onelevel",
                                                   "sess"};
  EXPECT_EQ(paths, expected_paths);

  const Session& top = catalog.sessions[0];
  EXPECT_EQ(top.source, "probe");
  EXPECT_EQ(top.date, "root");
  EXPECT_EQ(top.directory, root_);
  const Session* one = catalog.find_session("onelevel");
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(one->source, "root");
  EXPECT_EQ(one->date, "onelevel");
  ASSERT_EQ(one->files.size(), 2u);
  EXPECT_EQ(one->files[0].name, "alias_master.h5");

  EXPECT_EQ(catalog.find_session("."), &catalog.sessions[0]);
  EXPECT_EQ(catalog.find_session("probe/root"), &catalog.sessions[0]);
  EXPECT_EQ(catalog.find_session("root/onelevel"), one);
  const Session* session = catalog.find_session("detector/20260101_session");
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->source, "detector");
  EXPECT_EQ(session->date, "20260101_session");
  ASSERT_EQ(session->files.size(), 2u);
  EXPECT_EQ(session->files[0].name, "sample_00_master.h5");
  EXPECT_EQ(session->files[1].name, "sample_01_master.h5");
  // a/p/s and b/p/s share the alias p/s: it is dropped.
  EXPECT_EQ(catalog.find_session("p/s"), nullptr);
  EXPECT_NE(catalog.find_session("a/p/s"), nullptr);
  EXPECT_EQ(catalog.find_session("nope"), nullptr);
  EXPECT_EQ(catalog.session_directories.count("p/s"), 0u);
  EXPECT_EQ(catalog.session_directories.at("root/a-c"), root_ + "/a-c");

  const Session* sess = catalog.find_session("sess");
  ASSERT_NE(sess, nullptr);
  ASSERT_EQ(sess->files.size(), 2u);
  EXPECT_EQ(sess->files[0].name, "folder_master.h5");
  EXPECT_FALSE(sess->files[0].status.loadable);
}

TEST_F(CatalogTree, SessionsDocumentKeysAndValues) {
  const Catalog catalog = build_catalog(root_);
  const auto document = sessions_document(catalog);
  const std::string text = document.dump();
  const std::string head = "{\"data_folder\":\"" + root_ + "\",\"data_folders\":[\"" + root_ + "\"],\"sessions\":[";
  EXPECT_EQ(text.substr(0, head.size()), head);
  EXPECT_EQ(text.substr(text.size() - 18), "],\"complete\":true}");

  const Session* session = catalog.find_session("detector/20260101_session");
  ASSERT_NE(session, nullptr);
  const auto& sample = session->files[0];
  const std::string expected_file =
      "{\"name\":\"sample_00_master.h5\",\"shape\":[2,2,4,4],\"dtype\":\"uint16\",\"cal\":\"un\",\"size\":\"" +
      format_size(sample.size_bytes) + "\",\"size_bytes\":" + std::to_string(sample.size_bytes) +
      ",\"loadable\":true,\"load_status\":{\"loadable\":true,\"reason\":\"master and detector sources are complete, "
      "readable, and internally consistent\",\"action\":\"Ready to open with Show4DSTEM.\"},\"scan_sampling_A\":null,"
      "\"k_pixel_size_mrad\":null,\"has_ssb\":false}";
  EXPECT_NE(text.find("{\"path\":\"detector/20260101_session\",\"source\":\"detector\",\"date\":\"20260101_session\","
                      "\"files\":[" + expected_file),
            std::string::npos)
      << text;

  // The pending master of Appendix C.
  const std::string pending_master = root_ + "/detector/20260101_pending/pending_master.h5";
  const std::string pending_shard = root_ + "/detector/20260101_pending/pending_data_000001.h5";
  const std::string expected_pending =
      "{\"name\":\"pending_master.h5\",\"shape\":[2,2,0,0],\"dtype\":null,\"cal\":\"un\",\"size\":\"" +
      format_size(fs::file_size(pending_master)) + "\",\"size_bytes\":" + std::to_string(fs::file_size(pending_master)) +
      ",\"loadable\":false,\"load_status\":{\"loadable\":false,\"reason\":\"linked detector file is missing: " +
      pending_shard +
      "\",\"action\":\"Finish copying or writing the linked detector file next to the master, then poll again.\"},"
      "\"scan_sampling_A\":null,\"k_pixel_size_mrad\":null,\"has_ssb\":false}";
  EXPECT_NE(text.find(expected_pending), std::string::npos) << text;
}

TEST(SessionsDocument, CalibrationAndNonFiniteValues) {
  Catalog catalog;
  catalog.data_folder = "/d";
  Session session;
  session.path = ".";
  session.source = "x";
  session.date = "d";
  Acquisition calibrated;
  calibrated.name = "a_master.h5";
  calibrated.scan_sampling_A = 0.5;
  calibrated.k_pixel_size_mrad = 0.25;
  calibrated.dtype = DType::uint8;
  Acquisition broken;
  broken.name = "b\xff_master.h5";
  broken.scan_sampling_A = std::nan("");
  broken.k_pixel_size_mrad = 1.0 / 0.0;
  session.files = {calibrated, broken};
  catalog.sessions.push_back(session);
  const auto document = sessions_document(catalog);
  const auto& files = document["sessions"][0]["files"];
  EXPECT_EQ(files[0]["cal"], "ok");
  EXPECT_EQ(files[0]["scan_sampling_A"], 0.5);
  EXPECT_EQ(files[0]["k_pixel_size_mrad"], 0.25);
  EXPECT_EQ(files[0]["dtype"], "uint8");
  EXPECT_EQ(files[1]["cal"], "un");
  EXPECT_TRUE(files[1]["scan_sampling_A"].is_null());
  EXPECT_TRUE(files[1]["k_pixel_size_mrad"].is_null());
  EXPECT_EQ(files[1]["name"], "b\xEF\xBF\xBD_master.h5");
  EXPECT_NO_THROW((void)document.dump());
  EXPECT_NE(document.dump().find("\"scan_sampling_A\":0.5,\"k_pixel_size_mrad\":0.25"), std::string::npos);
}

TEST(BuildCatalog, MissingFolderIsEmpty) {
  TempDir dir;
  const Catalog catalog = build_catalog(dir.file("does-not-exist"));
  EXPECT_TRUE(catalog.sessions.empty());
  EXPECT_TRUE(catalog.session_directories.empty());
  const std::string text = sessions_document(catalog).dump();
  EXPECT_EQ(text, "{\"data_folder\":\"" + dir.file("does-not-exist") + "\",\"data_folders\":[\"" +
                      dir.file("does-not-exist") + "\"],\"sessions\":[],\"complete\":true}");
}

}  // namespace
}  // namespace quantem::catalog
