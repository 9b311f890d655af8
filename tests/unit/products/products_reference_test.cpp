// Every product against an independent numpy reference
// (tests/support/python/products_reference.py) on the same random arrays:
// non-square scans, odd detectors, crops, scan and detector bins with partial
// edges, uint8/uint16/uint32 (counts above 65535) and masked pixels.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dense_fixture.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/products/products.hpp"
#include "test_support.hpp"

namespace quantem::test {
namespace {

using nlohmann::json;

// Writes a NumPy .npy (format 1.0) file.
void write_npy(const std::string& path, const std::string& descr, const std::vector<std::uint64_t>& shape,
               const std::uint8_t* data, std::size_t bytes) {
  std::string dims;
  for (const std::uint64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.erase(dims.size() - 2);  // "(a, b)" but "(a,)" for one axis
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const std::uint16_t length = static_cast<std::uint16_t>(header.size());
  const char length_bytes[2] = {static_cast<char>(length & 0xFF), static_cast<char>(length >> 8)};
  out.write(length_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<plan::BrowsePlan> plans_for(const DenseCase& c) {
  std::vector<plan::BrowsePlan> plans;
  plans.push_back({});
  plan::BrowsePlan cropped;
  cropped.crop = plan::ScanRegion{1, c.scan_rows, 1, c.scan_cols};
  plans.push_back(cropped);
  plan::BrowsePlan binned;
  binned.scan_bin = 2;
  binned.detector_bin = 2;
  plans.push_back(binned);
  plan::BrowsePlan both;
  both.crop = plan::ScanRegion{0, c.scan_rows - 1, 1, c.scan_cols};
  both.scan_bin = 3;
  both.detector_bin = 3;
  plans.push_back(both);
  return plans;
}

json requests_for(const plan::PlanGeometry& g) {
  const double height = static_cast<double>(g.detector_rows);
  const double width = static_cast<double>(g.detector_cols);
  const double rows = static_cast<double>(g.scan_rows);
  const double cols = static_cast<double>(g.scan_cols);
  json requests = json::array();
  const auto realspace = [&](const char* mode, double inner, double outer, json cy, json cx) {
    requests.push_back({{"kind", "realspace"}, {"mode", mode}, {"inner", inner}, {"outer", outer}, {"cy", cy}, {"cx", cx}});
  };
  realspace("BF", 0.0, 1.0, nullptr, nullptr);
  realspace("BF", 0.0, 0.5, nullptr, nullptr);
  realspace("ABF", 0.5, 1.0, nullptr, nullptr);
  realspace("ADF", 1.0, 2.5, 0.45 * height, nullptr);
  realspace("HAADF", 1.5, 4.0, nullptr, 0.55 * width);
  realspace("DF", 0.7, 1.3, 0.4 * height + 0.01, 0.6 * width - 0.02);
  for (const char* mode : {"CoMx", "CoMy", "CoMmag", "DPC", "iCoM"}) realspace(mode, 0.0, 1.0, nullptr, nullptr);
  const auto shape = [&](const char* name, double cy, double cx, double inner, double outer) {
    requests.push_back({{"kind", "shape"}, {"shape", name}, {"cy", cy}, {"cx", cx}, {"inner", inner}, {"outer", outer}});
  };
  shape("circle", height / 2.0 - 0.2, width / 2.0 + 0.3, 0.0, std::max(1.0, height / 4.0));
  shape("annulus", height / 2.0, width / 2.0, 1.0, std::max(2.0, height / 3.0));
  shape("square", height / 2.0 + 0.5, width / 2.0 - 0.5, 0.0, 1.5);
  for (const auto& [row, col] : std::vector<std::pair<int, int>>{{0, 0}, {1, 1}, {99, -5}, {-3, 2}}) {
    requests.push_back({{"kind", "cbed"}, {"row", row}, {"col", col}});
  }
  const auto region = [&](const char* name, double cy, double cx, double radius, const char* reduce) {
    requests.push_back(
        {{"kind", "region"}, {"shape", name}, {"cy", cy}, {"cx", cx}, {"radius", radius}, {"reduce", reduce}});
  };
  region("circle", rows / 2.0, cols / 2.0, 1.1, "mean");
  region("circle", rows / 2.0 - 0.5, cols / 2.0 + 0.3, 1.6, "sum");
  region("square", 0.0, 0.0, 1.0, "max");
  region("square", rows - 1.0, cols - 1.0, 50.0, "mean");
  return requests;
}

void compare_case(backend::Resident& resident, const plan::PlanGeometry& g, const json& requests,
                  const json& expected, const std::string& where) {
  ASSERT_EQ(expected["scan_shape"], json({g.scan_rows, g.scan_cols})) << where;
  ASSERT_EQ(expected["detector_shape"], json({g.detector_rows, g.detector_cols})) << where;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const json& request = requests[i];
    const json& want = expected["results"][i];
    const std::string what = where + " request " + request.dump();
    const std::string kind = request["kind"];
    products::Image image;
    products::UsedGeometry used;
    if (kind == "realspace") {
      products::RealspaceRequest r;
      r.mode = *products::realspace_mode_from_name(request["mode"]);
      r.inner = request["inner"];
      r.outer = request["outer"];
      if (!request["cy"].is_null()) r.center_row = request["cy"].get<double>();
      if (!request["cx"].is_null()) r.center_col = request["cx"].get<double>();
      image = products::realspace(resident, g, r, used);
      if (!image.is_float) {
        const json& fit = expected["bright_field"];
        ASSERT_TRUE(used.bright_field.has_value()) << what;
        EXPECT_NEAR(used.bright_field->center_row, fit[0].get<double>(), 1e-9) << what;
        EXPECT_NEAR(used.bright_field->center_col, fit[1].get<double>(), 1e-9) << what;
        EXPECT_NEAR(used.bright_field->radius, fit[2].get<double>(), 1e-9) << what;
        EXPECT_DOUBLE_EQ(*used.outer_radius_px, want["outer_px"].get<double>()) << what;
      }
    } else if (kind == "shape") {
      products::ShapeRequest s;
      const std::string name = request["shape"];
      s.shape = name == "circle" ? products::DetectorShape::circle
                : name == "square" ? products::DetectorShape::square
                                   : products::DetectorShape::annulus;
      s.center_row = request["cy"];
      s.center_col = request["cx"];
      s.inner = request["inner"];
      s.outer = request["outer"];
      image = products::realspace_shape(resident, g, s, used);
    } else if (kind == "cbed") {
      image = products::selected_diffraction(resident, g, request["row"].get<std::int64_t>(),
                                             request["col"].get<std::int64_t>());
    } else {
      products::RegionRequest r;
      r.shape = request["shape"] == "circle" ? products::ScanRoiShape::circle : products::ScanRoiShape::square;
      r.center_row = request["cy"];
      r.center_col = request["cx"];
      r.radius = request["radius"];
      const std::string reduce = request["reduce"];
      r.reduce = reduce == "mean"  ? products::RegionRequest::Reduce::mean
                 : reduce == "sum" ? products::RegionRequest::Reduce::sum
                                   : products::RegionRequest::Reduce::max;
      image = products::region_diffraction(resident, g, r);
      EXPECT_EQ(image.value_divisor, want["divisor"].get<std::uint64_t>()) << what;
    }
    if (want.contains("counts")) {
      ASSERT_FALSE(image.is_float) << what;
      EXPECT_EQ(image.integer_values(), want["counts"].get<std::vector<std::uint64_t>>()) << what;
      continue;
    }
    ASSERT_TRUE(image.is_float) << what;
    const std::vector<double> values = want["values"].get<std::vector<double>>();
    ASSERT_EQ(image.values.size(), values.size()) << what;
    double scale = 0.0;
    for (const double v : values) scale = std::max(scale, std::fabs(v));
    const bool integrated = request["mode"] == "iCoM";
    for (std::size_t p = 0; p < values.size(); ++p) {
      if (integrated) {
        EXPECT_NEAR(image.values[p], values[p], 1e-5 * std::max(scale, 1e-3)) << what << " at " << p;
      } else {
        EXPECT_NEAR(image.values[p], values[p], 1e-6 * std::max(std::fabs(values[p]), 1e-6)) << what << " at " << p;
      }
    }
  }
}

class ProductsAgainstNumpy : public ::testing::TestWithParam<DenseCase> {};

TEST_P(ProductsAgainstNumpy, EveryProductMatchesTheReference) {
  const DenseCase& c = GetParam();
  TempDir dir;
  const std::vector<std::uint8_t> bytes = c.source_bytes();
  write_npy(dir.file("data.npy"), dtype_numpy_str(c.dtype), {c.scan_rows, c.scan_cols, c.detector_rows, c.detector_cols},
            bytes.data(), bytes.size());
  const std::vector<std::uint8_t> mask = c.pixel_mask.empty() ? std::vector<std::uint8_t>(c.frame_pixels(), 0) : c.pixel_mask;
  write_npy(dir.file("mask.npy"), "|u1", {c.detector_rows, c.detector_cols}, mask.data(), mask.size());

  json cases = json::array();
  std::vector<plan::PlanGeometry> geometries;
  for (const plan::BrowsePlan& browse_plan : plans_for(c)) {
    geometries.push_back(plan::resolve_plan(browse_plan, c.scan_rows, c.scan_cols, c.detector_rows, c.detector_cols));
    const plan::PlanGeometry& g = geometries.back();
    json crop = nullptr;
    if (g.cropped) crop = {g.region.row_start, g.region.row_stop, g.region.col_start, g.region.col_stop};
    cases.push_back({{"crop", crop}, {"scan_bin", g.scan_bin}, {"det_bin", g.detector_bin}, {"requests", requests_for(g)}});
  }
  {
    std::ofstream out(dir.file("cases.json"));
    out << json({{"cases", cases}}).dump();
  }
  run_python_script("products_reference.py", dir.path());
  const std::vector<std::uint8_t> expected_bytes = read_file(dir.file("expected.json"));
  const json expected = json::parse(expected_bytes.begin(), expected_bytes.end())["cases"];
  ASSERT_EQ(expected.size(), cases.size());

  for (const unsigned threads : {1u, 2u}) {
    backend::CpuResidentOptions options;
    options.threads = threads;
    const auto resident = backend::make_cpu_resident(c.acquisition(), bytes.data(), bytes.size(), options);
    for (std::size_t i = 0; i < geometries.size(); ++i) {
      compare_case(*resident, geometries[i], cases[i]["requests"], expected[i],
                   c.name + " threads=" + std::to_string(threads) + " " + plan::to_string(geometries[i]));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sources, ProductsAgainstNumpy,
    ::testing::Values(random_case("u16_odd", DType::uint16, 7, 6, 13, 11, 101, 900, 3, 60000),
                      random_case("u8", DType::uint8, 6, 9, 9, 8, 102, 250, 2, 255),
                      random_case("u32_wide", DType::uint32, 5, 7, 10, 9, 103, 300000, 2, 4000000000ull, true),
                      random_case("u32_narrow", DType::uint32, 8, 5, 11, 12, 104, 2000, 2, 90000)),
    [](const ::testing::TestParamInfo<DenseCase>& param_info) {
      std::string name;  // "u16_odd" -> "U16Odd"
      bool upper = true;
      for (const char ch : param_info.param.name) {
        if (ch == '_') {
          upper = true;
          continue;
        }
        name += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch))) : ch;
        upper = false;
      }
      return name;
    });

}  // namespace
}  // namespace quantem::test
