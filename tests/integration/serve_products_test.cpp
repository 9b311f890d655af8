// Every array route of the real daemon against an independent numpy
// reference (tests/support/python/server_reference.py): files written by h5py
// with the official bitshuffle filter and by `quantem-gpu synth`, products
// computed by numpy from the stored counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "daemon.hpp"

using quantem::test::Daemon;
using json = nlohmann::json;

namespace {

class ServeProducts : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new quantem::test::TempDir();
    const auto synth = quantem::test::run_quantem({"synth", root_->file("data/synthsess"), "--prefix", "syn", "--scan",
                                                   "6x8", "--detector", "16x16", "--threads", "1"});
    ASSERT_EQ(synth.exit_code, 0) << synth.stderr_text;
    quantem::test::run_python_script("server_reference.py", "prepare " + root_->path() + " --synth synthsess syn 6x8");
    std::ifstream in(root_->file("manifest.json"));
    manifest_ = new json(json::parse(in));
    daemon_ = Daemon::start(root_->file("data"), {"--implementation-revision", "integration-rev"}).release();
  }
  static void TearDownTestSuite() {
    if (daemon_) {
      EXPECT_EQ(daemon_->stop(), 0);
    }
    delete daemon_;
    delete manifest_;
    delete root_;
  }

  static std::string expected_npy(const std::string& name) {
    const auto bytes = quantem::test::read_file(root_->file("expected/" + name + ".npy"));
    return std::string(bytes.begin(), bytes.end());
  }
  static std::string npy_data(const std::string& npy) {
    const std::size_t header = 10 + static_cast<unsigned char>(npy[8]) + 256 * static_cast<unsigned char>(npy[9]);
    return npy.substr(header);
  }
  static std::vector<float> floats(const std::string& data) {
    std::vector<float> values(data.size() / 4);
    std::memcpy(values.data(), data.data(), values.size() * 4);
    return values;
  }
  static bool has_exact_header(const httplib::Response& response, const std::string& lower_name) {
    for (const auto& [name, value] : response.headers)
      if (name == lower_name) return true;
    return false;
  }

  static quantem::test::TempDir* root_;
  static json* manifest_;
  static Daemon* daemon_;
};

quantem::test::TempDir* ServeProducts::root_ = nullptr;
json* ServeProducts::manifest_ = nullptr;
Daemon* ServeProducts::daemon_ = nullptr;

void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, const std::string& kind,
                  const std::string& name) {
  ASSERT_EQ(actual.size(), expected.size()) << name;
  float scale = 0;
  for (float v : expected) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double tolerance = kind == "icom" ? 1e-4 * std::max(1.0f, scale) : 1e-5 * std::max(1.0f, std::abs(expected[i]));
    EXPECT_NEAR(actual[i], expected[i], tolerance) << name << " value " << i;
  }
}

}  // namespace

TEST_F(ServeProducts, EveryArrayRouteMatchesTheNumpyReference) {
  ASSERT_NE(daemon_, nullptr);
  ASSERT_GE((*manifest_)["cases"].size(), 40u);
  for (const auto& c : (*manifest_)["cases"]) {
    const std::string name = c["name"];
    const std::string target = "/api/browse/" + c["route"].get<std::string>() + "?" + c["query"].get<std::string>();
    const std::string expected = expected_npy(name);

    auto npy = daemon_->get(target + "&format=npy");
    ASSERT_TRUE(npy) << name;
    ASSERT_EQ(npy->status, 200) << name << ": " << npy->body;
    EXPECT_EQ(npy->get_header_value("content-type"), "application/x-npy") << name;
    auto raw = daemon_->get(target);
    ASSERT_TRUE(raw) << name;
    ASSERT_EQ(raw->status, 200) << name << ": " << raw->body;

    for (const auto* response : {&npy.value(), &raw.value()}) {
      EXPECT_EQ(response->get_header_value("x-width"), std::to_string(c["width"].get<int>())) << name;
      EXPECT_EQ(response->get_header_value("x-height"), std::to_string(c["height"].get<int>())) << name;
      EXPECT_EQ(response->get_header_value("x-dtype"), c["dtype"].get<std::string>()) << name;
      EXPECT_EQ(response->get_header_value("x-value-divisor"), std::to_string(c["divisor"].get<int>())) << name;
      EXPECT_EQ(response->get_header_value("cache-control"), c["cache_control"].get<std::string>()) << name;
      for (const char* header : {"x-width", "x-height", "x-dtype", "x-value-divisor", "cache-control",
                                 "x-quantem-provenance", "content-type"}) {
        EXPECT_TRUE(has_exact_header(*response, header)) << name << " lacks the lower-case header " << header;
      }
      EXPECT_FALSE(response->has_header("access-control-allow-origin")) << name;
      const auto provenance = json::parse(response->get_header_value("x-quantem-provenance"));
      EXPECT_EQ(provenance["output_shape"], json::array({c["height"], c["width"]})) << name;
      EXPECT_EQ(provenance["output_dtype"], c["dtype"]) << name;
      EXPECT_EQ(provenance["scan_bin"], c["scan_bin"]) << name;
      EXPECT_EQ(provenance["detector_bin"], c["det_bin"]) << name;
      EXPECT_EQ(provenance["masked_pixel_count"], c["masked_pixels"]) << name;
      EXPECT_EQ(provenance["source_dtype"], c["source_dtype"]) << name;
      EXPECT_EQ(provenance["backend"], "cpu") << name;
      EXPECT_EQ(provenance["device_index"], 0) << name;
      EXPECT_EQ(provenance["implementation_revision"], "integration-rev") << name;
      EXPECT_EQ(provenance["signature"].get<std::string>().size(), 24u) << name;
    }
    EXPECT_EQ(raw->get_header_value("content-type"), "application/octet-stream") << name;
    EXPECT_EQ(npy_data(npy->body), raw->body) << name << ": raw and npy bodies differ";
    if (c["kind"] == "exact") {
      EXPECT_EQ(npy->body, expected) << name << ": exact counts differ from the numpy reference";
    } else {
      EXPECT_EQ(npy->body.substr(0, npy->body.size() - npy_data(npy->body).size()),
                expected.substr(0, expected.size() - npy_data(expected).size()))
          << name << ": npy headers differ";
      expect_close(floats(npy_data(npy->body)), floats(npy_data(expected)), c["kind"], name);
    }
  }
}

TEST_F(ServeProducts, EveryErrorHasItsStatusAndExactDetail) {
  ASSERT_NE(daemon_, nullptr);
  ASSERT_GE((*manifest_)["errors"].size(), 20u);
  for (const auto& e : (*manifest_)["errors"]) {
    const std::string name = e["name"];
    const std::string target = "/api/browse/" + e["route"].get<std::string>() + "?" + e["query"].get<std::string>();
    auto response = daemon_->request(e["method"], target);
    ASSERT_TRUE(response) << name;
    EXPECT_EQ(response->status, e["status"].get<int>()) << name << ": " << response->body;
    EXPECT_EQ(response->get_header_value("content-type"), "application/json") << name;
    EXPECT_EQ(response->body, json({{"detail", e["detail"]}}).dump()) << name;
  }
}

TEST_F(ServeProducts, QueryCoercionFollowsPydantic) {
  ASSERT_NE(daemon_, nullptr);
  auto response = daemon_->get("/api/browse/cbed?sx=abc&sy=1.5&ensure_resident=maybe");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 422);
  EXPECT_EQ(response->body,
            R"({"detail":[{"type":"missing","loc":["query","session"],"msg":"Field required","input":null},)"
            R"({"type":"missing","loc":["query","file"],"msg":"Field required","input":null},)"
            R"({"type":"int_parsing","loc":["query","sx"],"msg":"Input should be a valid integer, unable to parse string as an integer","input":"abc"},)"
            R"({"type":"int_parsing","loc":["query","sy"],"msg":"Input should be a valid integer, unable to parse string as an integer","input":"1.5"},)"
            R"({"type":"bool_parsing","loc":["query","ensure_resident"],"msg":"Input should be a valid boolean, unable to interpret input","input":"maybe"}]})");
  // "+1", "1_0" and "1.0" are integers, the last repeated value wins, booleans take any case.
  const std::string source = "session=odd16&file=odd16_master.h5";
  auto lax = daemon_->get("/api/browse/cbed?" + source + "&sx=9&sx=%2B1&sy=1.0&det_bin=1_0&det_bin=1&ensure_resident=YES");
  auto strict = daemon_->get("/api/browse/cbed?" + source + "&sx=1&sy=1&ensure_resident=true");
  ASSERT_TRUE(lax && strict);
  EXPECT_EQ(lax->status, 200) << lax->body;
  EXPECT_EQ(lax->body, strict->body);
  auto nan = daemon_->get("/api/browse/realspace?" + source + "&cx=NaN");
  ASSERT_TRUE(nan);
  EXPECT_EQ(nan->status, 400);
}

TEST_F(ServeProducts, SelectedDiffractionNeedsAResidentUnlessAsked) {
  ASSERT_NE(daemon_, nullptr);
  const std::string source = "session=small8&file=small8_master.h5";
  auto evicted = daemon_->request("DELETE", "/api/browse/resident?" + source);
  ASSERT_TRUE(evicted);
  EXPECT_EQ(evicted->status, 200);
  auto cold = daemon_->get("/api/browse/cbed?" + source + "&sx=1&sy=1");
  ASSERT_TRUE(cold);
  EXPECT_EQ(cold->status, 409);
  EXPECT_EQ(cold->body, R"({"detail":"The requested crop/bin is no longer resident; load a virtual image first."})");
  auto warm = daemon_->get("/api/browse/cbed?" + source + "&sx=1&sy=1&ensure_resident=true");
  ASSERT_TRUE(warm);
  EXPECT_EQ(warm->status, 200);
  // Now resident: any crop or bin is a view of the same resident, no reload.
  auto binned = daemon_->get("/api/browse/cbed?" + source + "&sx=0&sy=0&scan_bin=2&det_bin=3");
  ASSERT_TRUE(binned);
  EXPECT_EQ(binned->status, 200);
}
