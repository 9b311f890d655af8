// GET /api/browse/products on the real daemon (CPU backend): every image of
// the json and npz bundles equals, byte for byte, what GET
// /api/browse/realspace answers for its mode, on several plans (crops, scan
// and detector bins, a given centre) and source dtypes; the npz is read by
// numpy; entity tags, 304, the image cache and the errors.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "daemon.hpp"

using quantem::test::Daemon;
using json = nlohmann::json;

namespace {

// An independent RFC 4648 decoder (the daemon encodes).
std::string base64_decode(const std::string& text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  std::uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    if (c == '=') break;
    const int v = value(c);
    EXPECT_GE(v, 0) << "not base64: " << c;
    bits = (bits << 6) | static_cast<std::uint32_t>(v);
    if (++count == 4) {
      out.push_back(static_cast<char>(bits >> 16));
      out.push_back(static_cast<char>((bits >> 8) & 0xFF));
      out.push_back(static_cast<char>(bits & 0xFF));
      bits = 0;
      count = 0;
    }
  }
  if (count == 2) out.push_back(static_cast<char>(bits >> 4));
  if (count == 3) {
    out.push_back(static_cast<char>(bits >> 10));
    out.push_back(static_cast<char>((bits >> 2) & 0xFF));
  }
  return out;
}

// The six viewer modes with the viewer's radii: the products query and, per
// mode, the realspace query that must give the same image.
const char* const kModes = "BF,ABF,ADF,CoMx,CoMy,iCoM";
const char* const kRadii = "&inner_ABF=0.5&outer_ABF=1&inner_ADF=1&outer_ADF=3";
std::string single_radii(const std::string& mode) {
  if (mode == "ABF") return "&inner=0.5&outer=1";
  if (mode == "ADF") return "&inner=1&outer=3";
  return "";
}

class ServeProductsBundle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new quantem::test::TempDir();
    for (const auto& [name, dtype] : std::map<std::string, std::string>{{"u16", "uint16"}, {"u32", "uint32"}}) {
      const auto synth = quantem::test::run_quantem({"synth", root_->file("data/" + name), "--prefix", name, "--scan",
                                                     "9x13", "--detector", "16x14", "--dtype", dtype, "--threads",
                                                     "1", "--seed", "5"});
      ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
    }
    daemon_ = Daemon::start(root_->file("data"), {"--implementation-revision", "bundle-rev"}).release();
  }
  static void TearDownTestSuite() {
    if (daemon_) {
      EXPECT_EQ(daemon_->stop(), 0);
    }
    delete daemon_;
    delete root_;
  }
  static std::string source(const std::string& name) { return "session=" + name + "&file=" + name + "_master.h5"; }

  static quantem::test::TempDir* root_;
  static Daemon* daemon_;
};

quantem::test::TempDir* ServeProductsBundle::root_ = nullptr;
Daemon* ServeProductsBundle::daemon_ = nullptr;

const char* const kPlans[] = {
    "",
    "&row_start=1&row_stop=8&column_start=2&column_stop=13",
    "&row_start=0&row_stop=1&column_start=3&column_stop=9",
    "&scan_bin=2",
    "&det_bin=2",
    "&row_start=2&row_stop=9&column_start=0&column_stop=10&scan_bin=3&det_bin=3",
    "&cx=6.5&cy=8.25",
};

TEST_F(ServeProductsBundle, EveryJsonImageEqualsTheRealspaceRouteByteForByte) {
  ASSERT_NE(daemon_, nullptr);
  for (const std::string name : {"u16", "u32"}) {
    for (const std::string plan : kPlans) {
      const std::string what = name + plan;
      auto bundle = daemon_->get("/api/browse/products?" + source(name) + "&modes=" + kModes + kRadii + plan);
      ASSERT_TRUE(bundle) << what;
      ASSERT_EQ(bundle->status, 200) << what << ": " << bundle->body;
      EXPECT_EQ(bundle->get_header_value("content-type"), "application/json") << what;
      EXPECT_EQ(bundle->get_header_value("cache-control"), "max-age=300") << what;
      const json doc = json::parse(bundle->body);
      ASSERT_EQ(doc["images"].size(), 6u) << what;
      const json& provenance = doc["provenance"];
      // The body's provenance is the header's without device_index (equal
      // entity tags, equal bodies, whichever device a reload lands on).
      json header_provenance = json::parse(bundle->get_header_value("x-quantem-provenance"));
      EXPECT_EQ(header_provenance["device_index"], 0) << what;
      EXPECT_FALSE(provenance.contains("device_index")) << what;
      header_provenance.erase("device_index");
      EXPECT_EQ(header_provenance, provenance) << what;
      EXPECT_EQ(provenance["geometry"]["modes"], json::array({"BF", "ABF", "ADF", "CoMx", "CoMy", "iCoM"})) << what;
      EXPECT_EQ(provenance["output_dtype"], "mixed") << what;
      EXPECT_EQ(provenance["implementation_revision"], "bundle-rev") << what;
      for (std::size_t i = 0; i < 6; ++i) {
        const json& image = doc["images"][i];
        const std::string mode = image["mode"];
        auto single = daemon_->get("/api/browse/realspace?" + source(name) + "&mode=" + mode + single_radii(mode) + plan);
        ASSERT_TRUE(single) << what << " " << mode;
        ASSERT_EQ(single->status, 200) << what << " " << mode << ": " << single->body;
        EXPECT_EQ(base64_decode(image["data"]), single->body) << what << " " << mode;
        EXPECT_EQ(image["shape"], json::array({std::stoi(single->get_header_value("x-height")),
                                               std::stoi(single->get_header_value("x-width"))}))
            << what << " " << mode;
        EXPECT_EQ(image["dtype"], single->get_header_value("x-dtype")) << what << " " << mode;
        EXPECT_EQ(std::to_string(image["value_divisor"].get<int>()), single->get_header_value("x-value-divisor"));
        const json single_provenance = json::parse(single->get_header_value("x-quantem-provenance"));
        EXPECT_EQ(provenance["geometry"]["images"][i], single_provenance["geometry"]) << what << " " << mode;
        EXPECT_EQ(provenance["output_shape"], single_provenance["output_shape"]) << what;
        EXPECT_EQ(provenance["scan_region"], single_provenance["scan_region"]) << what;
      }
    }
  }
}

TEST_F(ServeProductsBundle, EveryRawImageEqualsTheRealspaceRouteByteForByte) {
  ASSERT_NE(daemon_, nullptr);
  for (const std::string plan : kPlans) {
    const std::string modes = "CoMy,BF,iCoM,ADF";  // the request's order
    auto bundle = daemon_->get("/api/browse/products?" + source("u32") + "&format=raw&modes=" + modes + kRadii + plan);
    ASSERT_TRUE(bundle) << plan;
    ASSERT_EQ(bundle->status, 200) << plan << ": " << bundle->body;
    EXPECT_EQ(bundle->get_header_value("content-type"), "application/octet-stream") << plan;
    const json index = json::parse(bundle->get_header_value("x-quantem-images"));
    ASSERT_EQ(index.size(), 4u) << plan;
    std::size_t offset = 0;
    for (std::size_t i = 0; i < index.size(); ++i) {
      const json& image = index[i];
      const std::string mode = image["mode"];
      EXPECT_EQ(image["offset"].get<std::size_t>(), offset) << plan << " " << mode;
      auto single = daemon_->get("/api/browse/realspace?" + source("u32") + "&mode=" + mode + single_radii(mode) + plan);
      ASSERT_TRUE(single) << plan << " " << mode;
      ASSERT_EQ(single->status, 200) << plan << " " << mode << ": " << single->body;
      const std::size_t bytes = image["bytes"];
      EXPECT_EQ(bundle->body.substr(offset, bytes), single->body) << plan << " " << mode;
      EXPECT_EQ(image["shape"], json::array({std::stoi(single->get_header_value("x-height")),
                                             std::stoi(single->get_header_value("x-width"))}))
          << plan << " " << mode;
      EXPECT_EQ(image["dtype"], single->get_header_value("x-dtype")) << plan << " " << mode;
      offset += bytes;
    }
    EXPECT_EQ(offset, bundle->body.size()) << plan;
    EXPECT_EQ(json::parse(bundle->get_header_value("x-quantem-provenance"))["geometry"]["modes"],
              json::array({"CoMy", "BF", "iCoM", "ADF"}))
        << plan;
  }
}

TEST_F(ServeProductsBundle, NumpyLoadsTheNpzAndEachArrayEqualsTheRealspaceNpy) {
  ASSERT_NE(daemon_, nullptr);
  int index = 0;
  for (const std::string& plan : {std::string(kPlans[0]), std::string(kPlans[1]), std::string(kPlans[5])}) {
    const std::string modes = "iCoM,ADF,BF,CoMy";  // the request's order
    auto npz = daemon_->get("/api/browse/products?" + source("u16") + "&format=npz&modes=" + modes + kRadii + plan);
    ASSERT_TRUE(npz) << plan;
    ASSERT_EQ(npz->status, 200) << plan << ": " << npz->body;
    EXPECT_EQ(npz->get_header_value("content-type"), "application/zip");
    const std::string folder = root_->file("npz" + std::to_string(index++));
    std::filesystem::create_directories(folder);
    std::ofstream(folder + "/bundle.npz", std::ios::binary) << npz->body;
    quantem::test::run_python_script("bundle_reference.py", folder + "/bundle.npz " + folder);
    const auto names = quantem::test::read_file(folder + "/names.txt");
    EXPECT_EQ(std::string(names.begin(), names.end()), "iCoM\nADF\nBF\nCoMy\n") << plan;
    for (const std::string mode : {"iCoM", "ADF", "BF", "CoMy"}) {
      auto single = daemon_->get("/api/browse/realspace?" + source("u16") + "&format=npy&mode=" + mode +
                                 single_radii(mode) + plan);
      ASSERT_TRUE(single && single->status == 200) << plan << " " << mode;
      const auto saved = quantem::test::read_file(folder + "/" + mode + ".npy");
      EXPECT_EQ(std::string(saved.begin(), saved.end()), single->body) << plan << " " << mode;
    }
  }
}

TEST_F(ServeProductsBundle, EntityTagsNotModifiedAndTheImageCache) {
  ASSERT_NE(daemon_, nullptr);
  const std::string target = "/api/browse/products?" + source("u16") + "&modes=BF,CoMx&outer_BF=1.0000003";
  auto first = daemon_->get(target);
  ASSERT_TRUE(first && first->status == 200);
  EXPECT_NE(first->get_header_value("server-timing").find("cache;desc=miss"), std::string::npos)
      << first->get_header_value("server-timing");
  EXPECT_NE(first->get_header_value("server-timing").find("compute;dur="), std::string::npos);
  auto again = daemon_->get(target);
  ASSERT_TRUE(again && again->status == 200);
  EXPECT_NE(again->get_header_value("server-timing").find("cache;desc=hit"), std::string::npos);
  EXPECT_EQ(again->body, first->body);
  const std::string etag = first->get_header_value("etag");
  ASSERT_EQ(etag.size(), 26u);
  EXPECT_EQ(again->get_header_value("etag"), etag);
  auto unchanged = daemon_->get(target, {{"If-None-Match", etag}});
  ASSERT_TRUE(unchanged);
  EXPECT_EQ(unchanged->status, 304);
  EXPECT_TRUE(unchanged->body.empty());
  EXPECT_NE(unchanged->get_header_value("server-timing").find("cache;desc=not-modified"), std::string::npos);
  // Another order, format or radius is another representation.
  for (const std::string& other : {"/api/browse/products?" + source("u16") + "&modes=CoMx,BF&outer_BF=1.0000003",
                                  target + "&format=npz", target + "&outer_BF=1.0000004"}) {
    auto response = daemon_->get(other, {{"If-None-Match", etag}});
    ASSERT_TRUE(response);
    EXPECT_EQ(response->status, 200) << other;
    EXPECT_NE(response->get_header_value("etag"), etag) << other;
  }
}

TEST_F(ServeProductsBundle, BadRequestsAreRefusedWithTheirDetail) {
  ASSERT_NE(daemon_, nullptr);
  const std::map<std::string, std::string> refused = {
      {"&modes=BF,ADF,BF", "modes names the mode 'BF' more than once"},
      {"&modes=BF,bf", "unknown virtual-image mode: 'bf'"},
      {"&modes=", "modes must name at least one virtual-image mode"},
      {"&format=npy", "format must be json, npz or raw"},
      {"&row_start=0&row_stop=20&column_start=0&column_stop=4", "scan crop exceeds the source scan shape"},
  };
  for (const auto& [query, detail] : refused) {
    auto response = daemon_->get("/api/browse/products?" + source("u16") + query);
    ASSERT_TRUE(response) << query;
    EXPECT_EQ(response->status, 400) << query;
    EXPECT_EQ(response->body, json({{"detail", detail}}).dump()) << query;
  }
  auto unknown = daemon_->get("/api/browse/products?session=nope&file=x_master.h5");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
}

}  // namespace
