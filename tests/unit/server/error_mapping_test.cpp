#include <gtest/gtest.h>

#include "quantem/core/error.hpp"
#include "quantem/protocol/query.hpp"
#include "quantem/server/error_mapping.hpp"

using namespace quantem;
using namespace quantem::server;

namespace {
template <typename E>
HttpResponse respond_to(E error) {
  try {
    throw error;
  } catch (...) {
    return error_response(std::current_exception());
  }
}
}  // namespace

TEST(ErrorMapping, EveryKindHasItsStatus) {
  EXPECT_EQ(http_status(ErrorKind::bad_request), 400);
  EXPECT_EQ(http_status(ErrorKind::forbidden), 403);
  EXPECT_EQ(http_status(ErrorKind::not_found), 404);
  EXPECT_EQ(http_status(ErrorKind::conflict), 409);
  EXPECT_EQ(http_status(ErrorKind::payload_too_large), 413);
  EXPECT_EQ(http_status(ErrorKind::unprocessable), 422);
  EXPECT_EQ(http_status(ErrorKind::corrupt_data), 422);
  EXPECT_EQ(http_status(ErrorKind::unavailable), 503);
  EXPECT_EQ(http_status(ErrorKind::io), 500);
  EXPECT_EQ(http_status(ErrorKind::internal), 500);
}

TEST(ErrorMapping, TypedErrorsBecomeDetailBodies) {
  const auto response = respond_to(not_found("unknown session: nope"));
  EXPECT_EQ(response.status, 404);
  EXPECT_EQ(response.content_type, "application/json");
  EXPECT_EQ(response.body, R"({"detail":"unknown session: nope"})");
  const auto corrupt = respond_to(CorruptChunk("frame 7 does not decode"));
  EXPECT_EQ(corrupt.status, 422);
  EXPECT_EQ(corrupt.body, R"({"detail":"frame 7 does not decode"})");
  const auto busy = respond_to(unavailable("busy"));
  EXPECT_EQ(busy.status, 503);
  EXPECT_EQ(busy.header("retry-after"), "1");
}

TEST(ErrorMapping, NonAsciiDetailStaysRawUtf8) {
  EXPECT_EQ(respond_to(not_found("unknown session: caf\xC3\xA9")).body, "{\"detail\":\"unknown session: caf\xC3\xA9\"}");
}

TEST(ErrorMapping, ValidationErrorsKeepTheirList) {
  protocol::QueryParams params = protocol::parse_query_string("sx=abc");
  protocol::QueryReader reader(params);
  (void)reader.int_or("sx", 0);
  try {
    reader.finish();
    FAIL();
  } catch (...) {
    const auto response = error_response(std::current_exception());
    EXPECT_EQ(response.status, 422);
    EXPECT_EQ(response.body,
              R"({"detail":[{"type":"int_parsing","loc":["query","sx"],"msg":"Input should be a valid integer, unable to parse string as an integer","input":"abc"}]})");
  }
}

TEST(ErrorMapping, UnknownExceptionsAreAPlainInternalServerError) {
  const auto response = respond_to(std::runtime_error("secret detail that must not leak"));
  EXPECT_EQ(response.status, 500);
  EXPECT_EQ(response.content_type, "text/plain; charset=utf-8");
  EXPECT_EQ(response.body, "Internal Server Error");
  EXPECT_EQ(respond_to(42).status, 500);
}
