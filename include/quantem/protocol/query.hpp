#pragma once
// Query strings as the reference service (Starlette + FastAPI + pydantic v2)
// reads them (docs/protocol.md#2-conventions):
//  - `a=1&b=&c` splits on '&', '+' is a space, %XX is decoded (invalid escapes
//    stay as written, invalid UTF-8 becomes U+FFFD), blank values are kept;
//  - names are case-sensitive, unknown names are ignored, the LAST value of a
//    repeated name wins;
//  - int/float/bool coercion follows pydantic v2 lax mode exactly, and every
//    failure is collected into one 422 list body in declaration order.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/core/error.hpp"

namespace quantem::protocol {

struct QueryParams {
  std::vector<std::pair<std::string, std::string>> items;  // in request order

  // The last value given for `name`, nullopt when absent.
  std::optional<std::string> last(std::string_view name) const;
};

// Parses the text after '?' (without the '?').
QueryParams parse_query_string(std::string_view query);

// Percent-decoding as Python's urllib.parse.unquote (errors="replace").
std::string percent_decode(std::string_view text, bool plus_is_space);

// pydantic v2 coercions of a query string. nullopt: the value is rejected.
// int: surrounding whitespace trimmed, optional sign, '_' only between digits,
//      a fraction of zeros ("1.0", "1.") accepted; "1.5", "1e3", "0x10" rejected.
//      Values beyond int64 saturate (Python has no limit; every use clamps or
//      range-checks, so saturation gives the same answer).
// float: decimal/exponent forms, inf/infinity/nan in any case, '_' between digits.
// bool: exactly 0/1 or (any case) f/t, n/y, no/yes, off/on, false/true; no trimming.
enum class IntParse { ok, invalid, too_long };
IntParse parse_python_int(std::string_view text, std::int64_t& value);
std::optional<double> parse_python_float(std::string_view text);
std::optional<bool> parse_python_bool(std::string_view text);

// A 422 carrying FastAPI's validation list: {"detail": [ {type, loc, msg, input}, ... ]}.
class QueryValidationError : public Error {
 public:
  explicit QueryValidationError(nlohmann::ordered_json details)
      : Error(ErrorKind::unprocessable, "query parameters failed validation"), details_(std::move(details)) {}
  const nlohmann::ordered_json& details() const noexcept { return details_; }

 private:
  nlohmann::ordered_json details_;
};

// Reads declared parameters in declaration order, collecting coercion errors.
// Call finish() after the last declaration: it throws QueryValidationError
// when any parameter failed. Values of failed parameters are the defaults.
class QueryReader {
 public:
  explicit QueryReader(const QueryParams& params) : params_(params) {}

  std::string required_string(const std::string& name);
  std::string string_or(const std::string& name, const std::string& fallback);
  std::int64_t int_or(const std::string& name, std::int64_t fallback);
  std::optional<std::int64_t> optional_int(const std::string& name);
  double float_or(const std::string& name, double fallback);
  std::optional<double> optional_float(const std::string& name);
  bool bool_or(const std::string& name, bool fallback);

  bool has_errors() const { return !errors_.empty(); }
  void finish() const;

 private:
  std::optional<std::int64_t> read_int(const std::string& name, const std::string& text);
  std::optional<double> read_float(const std::string& name, const std::string& text);

  const QueryParams& params_;
  nlohmann::ordered_json errors_ = nlohmann::ordered_json::array();
};

}  // namespace quantem::protocol
