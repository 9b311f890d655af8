#include <gtest/gtest.h>

#include <memory>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

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

// The documented 503s (not ready, a load pending, shutting down) are passing
// states a client retries: logged as warnings, never at error level, which
// `journalctl -p err` keeps for the daemon's own failures.
TEST(ErrorMapping, Documented503sAreWarningsAnd500sErrors) {
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  auto previous = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>("capture", sink);
  logger->set_pattern("%l|%v");
  logger->set_level(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  const auto unavailable_response = respond_to(unavailable("the catalog is being built"));
  const std::string after_503 = captured.str();
  const auto internal_response = respond_to(Error(ErrorKind::internal, "a broken invariant"));
  const std::string after_500 = captured.str().substr(after_503.size());
  spdlog::set_default_logger(previous);

  EXPECT_EQ(unavailable_response.status, 503);
  EXPECT_EQ(after_503.rfind("warning|", 0), 0u) << after_503;
  EXPECT_NE(after_503.find("the catalog is being built"), std::string::npos) << after_503;
  EXPECT_EQ(internal_response.status, 500);
  EXPECT_EQ(after_500.rfind("error|", 0), 0u) << after_500;
}
