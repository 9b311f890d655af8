#include <gtest/gtest.h>

#include "quantem/protocol/requests.hpp"

using namespace quantem::protocol;
using quantem::ErrorKind;

namespace {

template <typename Fn>
std::string bad_request_text(Fn&& fn) {
  try {
    fn();
  } catch (const QueryValidationError& error) {
    return "422:" + error.details().dump();
  } catch (const quantem::Error& error) {
    if (error.kind() != ErrorKind::bad_request) return std::string("kind:") + quantem::error_kind_name(error.kind());
    return error.what();
  }
  return "no error";
}

QueryParams q(const std::string& text) { return parse_query_string(text); }

}  // namespace

TEST(RealspaceQuery, DefaultsMatchTheReference) {
  const auto query = parse_realspace_query(q("session=s&file=f_master.h5"));
  EXPECT_EQ(query.source.session, "s");
  EXPECT_EQ(query.source.file, "f_master.h5");
  EXPECT_EQ(query.request.mode, quantem::products::RealspaceMode::BF);
  EXPECT_EQ(query.request.inner, 0.0);
  EXPECT_EQ(query.request.outer, 1.0);
  EXPECT_FALSE(query.request.center_col.has_value());
  EXPECT_FALSE(query.request.center_row.has_value());
  EXPECT_FALSE(query.plan.crop.has_value());
  EXPECT_EQ(query.plan.scan_bin, 1u);
  EXPECT_EQ(query.plan.detector_bin, 1u);
  EXPECT_FALSE(query.ensure_resident);
  EXPECT_EQ(query.format, PayloadFormat::raw);
}

TEST(RealspaceQuery, ReadsEveryParameter) {
  const auto query = parse_realspace_query(
      q("session=s&file=f&mode=CoMx&inner=0.5&outer=2&cx=3.25&cy=-1&det_bin=2&dtype=float32&scan_bin=3&row_start=1&"
        "row_stop=4&column_start=0&column_stop=2&ensure_resident=yes&format=npy"));
  EXPECT_EQ(query.request.mode, quantem::products::RealspaceMode::CoMx);
  EXPECT_EQ(query.request.inner, 0.5);
  EXPECT_EQ(query.request.outer, 2.0);
  EXPECT_EQ(query.request.center_col, 3.25);
  EXPECT_EQ(query.request.center_row, -1.0);
  EXPECT_EQ(query.plan.detector_bin, 2u);
  EXPECT_EQ(query.plan.scan_bin, 3u);
  ASSERT_TRUE(query.plan.crop.has_value());
  EXPECT_EQ(query.plan.crop->row_start, 1u);
  EXPECT_EQ(query.plan.crop->row_stop, 4u);
  EXPECT_EQ(query.plan.crop->col_start, 0u);
  EXPECT_EQ(query.plan.crop->col_stop, 2u);
  EXPECT_TRUE(query.ensure_resident);
  EXPECT_EQ(query.format, PayloadFormat::npy);
}

TEST(RealspaceQuery, RejectsUnknownModeWithPythonRepr) {
  EXPECT_EQ(bad_request_text([] { parse_realspace_query(q("session=s&file=f&mode=bf")); }),
            "unknown virtual-image mode: 'bf'");
  EXPECT_EQ(bad_request_text([] { parse_realspace_query(q("session=s&file=f&mode=it%27s")); }),
            "unknown virtual-image mode: \"it's\"");
  EXPECT_EQ(bad_request_text([] { parse_realspace_query(q("session=s&file=f&mode=")); }),
            "unknown virtual-image mode: ''");
}

TEST(RealspaceQuery, RejectsNonFiniteGeometry) {
  for (const char* param : {"inner=nan", "outer=inf", "cx=-inf", "cy=NaN"}) {
    EXPECT_EQ(bad_request_text([&] { parse_realspace_query(q(std::string("session=s&file=f&") + param)); }),
              "detector center and radii must be finite")
        << param;
  }
}

TEST(RealspaceQuery, CoercionErrorsComeBeforeValidation) {
  const std::string text = bad_request_text([] { parse_realspace_query(q("mode=bad&det_bin=1.5")); });
  EXPECT_EQ(text,
            "422:"
            R"([{"type":"missing","loc":["query","session"],"msg":"Field required","input":null},)"
            R"({"type":"missing","loc":["query","file"],"msg":"Field required","input":null},)"
            R"({"type":"int_parsing","loc":["query","det_bin"],"msg":"Input should be a valid integer, unable to parse string as an integer","input":"1.5"}])");
}

TEST(ProductQueries, CropAndBinRules) {
  EXPECT_EQ(bad_request_text([] { parse_cbed_query(q("session=s&file=f&row_start=0")); }),
            "scan crop requires row_start, row_stop, column_start, and column_stop");
  EXPECT_EQ(bad_request_text([] { parse_cbed_query(q("session=s&file=f&row_start=0&row_stop=0&column_start=0&column_stop=1")); }),
            "scan crop must be a nonempty half-open (row, column) region");
  EXPECT_EQ(bad_request_text([] { parse_cbed_query(q("session=s&file=f&row_start=-1&row_stop=2&column_start=0&column_stop=1")); }),
            "scan crop must be a nonempty half-open (row, column) region");
  EXPECT_NE(bad_request_text([] { parse_cbed_query(q("session=s&file=f&det_bin=0")); }).find("det_bin must be a positive integer"),
            std::string::npos);
  EXPECT_NE(bad_request_text([] { parse_cbed_query(q("session=s&file=f&scan_bin=-2")); }).find("scan_bin must be a positive integer"),
            std::string::npos);
  EXPECT_EQ(bad_request_text([] { parse_cbed_query(q("session=s&file=f&format=png")); }), "format must be raw or npy");
  // Any positive bin passes here; the source shape bounds it later.
  EXPECT_EQ(parse_cbed_query(q("session=s&file=f&scan_bin=3&det_bin=5")).plan.scan_bin, 3u);
}

TEST(CbedQuery, SxIsTheScanRowAndSyTheColumn) {
  const auto query = parse_cbed_query(q("session=s&file=f&sx=7&sy=-2&ensure_resident=1"));
  EXPECT_EQ(query.scan_row, 7);
  EXPECT_EQ(query.scan_col, -2);
  EXPECT_TRUE(query.ensure_resident);
}

TEST(ShapeQuery, ValidatesInTheReferenceOrder) {
  EXPECT_EQ(bad_request_text([] { parse_shape_query(q("session=s&file=f&shape=ring&cx=nan")); }),
            "detector shape must be circle, square, or annulus");
  EXPECT_EQ(bad_request_text([] { parse_shape_query(q("session=s&file=f&shape=circle&cx=nan&outer=-1")); }),
            "detector center and radii must be finite");
  EXPECT_EQ(bad_request_text([] { parse_shape_query(q("session=s&file=f&shape=circle&outer=0")); }),
            "detector radii must satisfy 0 <= inner < outer");
  EXPECT_EQ(bad_request_text([] { parse_shape_query(q("session=s&file=f&inner=-1&outer=2")); }),
            "detector radii must satisfy 0 <= inner < outer");
  EXPECT_EQ(bad_request_text([] { parse_shape_query(q("session=s&file=f&inner=2&outer=2")); }),
            "detector radii must satisfy 0 <= inner < outer");
  // A circle ignores inner, even a negative one.
  const auto circle = parse_shape_query(q("session=s&file=f&shape=circle&inner=-5&outer=1.6&cx=1.5&cy=1.5"));
  EXPECT_EQ(circle.request.shape, quantem::products::DetectorShape::circle);
  EXPECT_EQ(circle.request.outer, 1.6);
  EXPECT_EQ(circle.request.center_col, 1.5);
}

TEST(RegionQuery, ValidatesEverythingBeforeResidency) {
  EXPECT_EQ(bad_request_text([] { parse_region_query(q("session=s&file=f&reduce=median&shape=blob")); }),
            "scan ROI reduction must be mean, sum, or max");
  EXPECT_EQ(bad_request_text([] { parse_region_query(q("session=s&file=f&shape=blob")); }),
            "scan ROI shape must be circle or square");
  EXPECT_EQ(bad_request_text([] { parse_region_query(q("session=s&file=f&radius=0")); }),
            "scan ROI radius must be greater than zero");
  EXPECT_EQ(bad_request_text([] { parse_region_query(q("session=s&file=f&radius=nan")); }),
            "scan ROI radius must be greater than zero");
  EXPECT_EQ(bad_request_text([] { parse_region_query(q("session=s&file=f&cx=inf")); }), "scan ROI center must be finite");
  const auto query = parse_region_query(q("session=s&file=f&shape=square&cx=3&cy=2&radius=1&reduce=max"));
  EXPECT_EQ(query.request.shape, quantem::products::ScanRoiShape::square);
  EXPECT_EQ(query.request.reduce, quantem::products::RegionRequest::Reduce::max);
  EXPECT_EQ(query.request.center_col, 3.0);
  EXPECT_EQ(query.request.center_row, 2.0);
}

TEST(SessionsQuery, RefreshIsABool) {
  EXPECT_FALSE(parse_sessions_refresh(q("")));
  EXPECT_TRUE(parse_sessions_refresh(q("refresh=true")));
  EXPECT_EQ(bad_request_text([] { parse_sessions_refresh(q("refresh=2")); }),
            "422:" R"([{"type":"bool_parsing","loc":["query","refresh"],"msg":"Input should be a valid boolean, unable to interpret input","input":"2"}])");
}

TEST(PythonRepr, EscapesLikeCPython) {
  EXPECT_EQ(python_str_repr("bf"), "'bf'");
  EXPECT_EQ(python_str_repr("a'b\"c"), "'a\\'b\"c'");
  EXPECT_EQ(python_str_repr("tab\there\n\\"), "'tab\\there\\n\\\\'");
  EXPECT_EQ(python_str_repr(std::string("\x01", 1)), "'\\x01'");
  EXPECT_EQ(python_str_repr("\xC3\xA9"), "'\xC3\xA9'");
}
