#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "quantem/protocol/query.hpp"

using namespace quantem::protocol;

namespace {
std::optional<std::int64_t> to_int(const char* text) {
  std::int64_t value = 0;
  if (parse_python_int(text, value) != IntParse::ok) return std::nullopt;
  return value;
}
}  // namespace

TEST(QueryString, LastRepeatedValueWinsAndBlanksAreKept) {
  const auto params = parse_query_string("a=1&b=&c&a=2&&=x");
  EXPECT_EQ(params.last("a"), "2");
  EXPECT_EQ(params.last("b"), "");
  EXPECT_EQ(params.last("c"), "");
  EXPECT_EQ(params.last(""), "x");
  EXPECT_FALSE(params.last("A").has_value());
  EXPECT_EQ(params.items.size(), 5u);
}

TEST(QueryString, DecodesLikePythonUnquote) {
  const auto params = parse_query_string("s=a+b%20c&t=%zz%4&u=%C3%A9&v=%FF&w=%E2%82A&x%3Dy=1");
  EXPECT_EQ(params.last("s"), "a b c");
  EXPECT_EQ(params.last("t"), "%zz%4");
  EXPECT_EQ(params.last("u"), "\xC3\xA9");
  EXPECT_EQ(params.last("v"), "\xEF\xBF\xBD");
  EXPECT_EQ(params.last("w"), "\xEF\xBF\xBD" "A");  // truncated sequence: one replacement
  EXPECT_EQ(params.last("x=y"), "1");
}

TEST(PythonInt, AcceptsPydanticLaxForms) {
  EXPECT_EQ(to_int("+1"), 1);
  EXPECT_EQ(to_int("-3"), -3);
  EXPECT_EQ(to_int(" 7 "), 7);
  EXPECT_EQ(to_int("1_000"), 1000);
  EXPECT_EQ(to_int("1.0"), 1);
  EXPECT_EQ(to_int("1.000"), 1);
  EXPECT_EQ(to_int("2."), 2);
  EXPECT_EQ(to_int("007"), 7);
}

TEST(PythonInt, RejectsFractionsExponentsHexAndBadUnderscores) {
  for (const char* text : {"1.5", "1e3", "0x10", "", " ", "_1", "1_", "1__0", "abc", "1.0.0", ".0", "+", "1 2", "inf"}) {
    EXPECT_FALSE(to_int(text).has_value()) << text;
  }
}

TEST(PythonInt, SaturatesBeyondInt64) {
  EXPECT_EQ(to_int("99999999999999999999999"), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(to_int("-99999999999999999999999"), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(to_int("9223372036854775807"), std::numeric_limits<std::int64_t>::max());
  std::int64_t value = 0;
  EXPECT_EQ(parse_python_int(std::string(4301, '1'), value), IntParse::too_long);
}

TEST(PythonFloat, AcceptsNanInfinityAndDecimalForms) {
  EXPECT_TRUE(std::isnan(*parse_python_float("nan")));
  EXPECT_TRUE(std::isnan(*parse_python_float("NaN")));
  EXPECT_EQ(*parse_python_float("inf"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(*parse_python_float("-inf"), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(*parse_python_float("Infinity"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(*parse_python_float("1e3"), 1000.0);
  EXPECT_EQ(*parse_python_float("1."), 1.0);
  EXPECT_EQ(*parse_python_float(" .5 "), 0.5);
  EXPECT_EQ(*parse_python_float("+2.5E-1"), 0.25);
  EXPECT_EQ(*parse_python_float("1_0.5"), 10.5);
  EXPECT_EQ(*parse_python_float("0.1"), 0.1);
}

TEST(PythonFloat, RejectsGarbage) {
  for (const char* text : {"", "abc", "0x10", "1e", "e3", "--1", ".", "1,5", "nanx", "_1.0"}) {
    EXPECT_FALSE(parse_python_float(text).has_value()) << text;
  }
}

TEST(PythonBool, AcceptsTheDocumentedWordsInAnyCase) {
  for (const char* text : {"true", "TRUE", "1", "yes", "Yes", "on", "t", "T", "y"}) EXPECT_EQ(parse_python_bool(text), true) << text;
  for (const char* text : {"false", "False", "0", "no", "off", "OFF", "f", "n", "N"}) EXPECT_EQ(parse_python_bool(text), false) << text;
  for (const char* text : {"2", "false ", " true", "", "yess", "nope"}) EXPECT_FALSE(parse_python_bool(text).has_value()) << text;
}

TEST(QueryReader, CollectsPydanticErrorsInDeclarationOrder) {
  const auto params = parse_query_string("sx=abc&flag=maybe&x=1.5&f=zz");
  QueryReader reader(params);
  (void)reader.required_string("session");
  (void)reader.int_or("sx", 0);
  (void)reader.float_or("f", 0.0);
  (void)reader.bool_or("flag", false);
  (void)reader.optional_int("x");
  (void)reader.optional_int("absent");
  ASSERT_TRUE(reader.has_errors());
  try {
    reader.finish();
    FAIL() << "finish() should throw";
  } catch (const QueryValidationError& error) {
    EXPECT_EQ(error.kind(), quantem::ErrorKind::unprocessable);
    EXPECT_EQ(error.details().dump(),
              R"([{"type":"missing","loc":["query","session"],"msg":"Field required","input":null},)"
              R"({"type":"int_parsing","loc":["query","sx"],"msg":"Input should be a valid integer, unable to parse string as an integer","input":"abc"},)"
              R"({"type":"float_parsing","loc":["query","f"],"msg":"Input should be a valid number, unable to parse string as a number","input":"zz"},)"
              R"({"type":"bool_parsing","loc":["query","flag"],"msg":"Input should be a valid boolean, unable to interpret input","input":"maybe"},)"
              R"({"type":"int_parsing","loc":["query","x"],"msg":"Input should be a valid integer, unable to parse string as an integer","input":"1.5"}])");
  }
}

TEST(QueryReader, ValidQueriesDoNotThrowAndDefaultsApply) {
  const auto params = parse_query_string("session=s&file=f&det_bin=2&det_bin=3&ok=on");
  QueryReader reader(params);
  EXPECT_EQ(reader.required_string("session"), "s");
  EXPECT_EQ(reader.int_or("det_bin", 1), 3);
  EXPECT_EQ(reader.int_or("scan_bin", 1), 1);
  EXPECT_TRUE(reader.bool_or("ok", false));
  EXPECT_FALSE(reader.optional_float("cx").has_value());
  EXPECT_EQ(reader.string_or("mode", "BF"), "BF");
  EXPECT_NO_THROW(reader.finish());
}
