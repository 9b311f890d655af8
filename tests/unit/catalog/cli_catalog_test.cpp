// End to end: the built `quantem-gpu catalog DIR` prints the sessions document.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "catalog_fixtures.hpp"
#include "quantem/catalog/catalog.hpp"

namespace quantem::catalog {
namespace {

namespace fs = std::filesystem;

TEST(CliCatalog, PrintsTheSessionsDocument) {
  const std::string binary = test::quantem_binary();
  if (!test::file_exists(binary)) GTEST_SKIP() << "quantem-gpu is not built: " << binary;
  test::TempDir dir;
  const std::string root = dir.path() + "/root";
  test::make_acquisitions(dir, {root + "/detector/20260101_session sample_00 --shard-frames 2,2 --ntrigger 4",
                                root + "/detector/20260101_session short --shard-frames 4 --ntrigger 9",
                                root + " top --shard-frames inline:4 --filter none --root-attr scan_sampling_A=0.5 "
                                       "--root-attr k_pixel_size_mrad=0.25"});
  const auto result = test::run_command(test::shell_quote(binary) + " catalog " + test::shell_quote(root) + " 2>/dev/null");
  ASSERT_EQ(result.status, 0) << result.output;

  // Byte for byte what the library produces, plus a newline.
  EXPECT_EQ(result.output, sessions_document(build_catalog(root)).dump() + "\n");

  const auto document = nlohmann::ordered_json::parse(result.output);
  std::vector<std::string> keys;
  for (const auto& item : document.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"data_folder", "data_folders", "sessions", "complete"}));
  EXPECT_EQ(document["data_folder"], root);
  ASSERT_EQ(document["sessions"].size(), 2u);
  const auto& top = document["sessions"][0];
  EXPECT_EQ(top["path"], ".");
  EXPECT_EQ(top["source"], dir.path().substr(dir.path().find_last_of('/') + 1));
  EXPECT_EQ(top["date"], "root");
  EXPECT_EQ(top["files"][0]["cal"], "ok");
  EXPECT_EQ(top["files"][0]["scan_sampling_A"], 0.5);
  const auto& files = document["sessions"][1]["files"];
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0]["name"], "sample_00_master.h5");
  EXPECT_EQ(files[0]["shape"], nlohmann::ordered_json::parse("[2,2,4,4]"));
  EXPECT_EQ(files[0]["dtype"], "uint16");
  EXPECT_EQ(files[0]["loadable"], true);
  const std::string session_dir = root + "/detector/20260101_session/";
  const auto size = fs::file_size(session_dir + "sample_00_master.h5") +
                    fs::file_size(session_dir + "sample_00_data_000001.h5") +
                    fs::file_size(session_dir + "sample_00_data_000002.h5");
  EXPECT_EQ(files[0]["size_bytes"], size);
  EXPECT_EQ(files[0]["size"], format_size(size));
  EXPECT_EQ(files[1]["name"], "short_master.h5");
  EXPECT_EQ(files[1]["shape"], nlohmann::ordered_json::parse("[3,3,4,4]"));
  EXPECT_EQ(files[1]["loadable"], false);
  EXPECT_EQ(files[1]["load_status"]["reason"],
            "stored frame count is 4; expected 9 from master metadata ntrigger=9, nimages=1");
  EXPECT_EQ(files[1]["has_ssb"], false);
  EXPECT_EQ(document["complete"], true);
}

}  // namespace
}  // namespace quantem::catalog
