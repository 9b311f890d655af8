#include "quantem/protocol/query.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "quantem/core/text.hpp"

namespace quantem::protocol {

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Appends the UTF-8 of U+FFFD.
void append_replacement(std::string& out) { out += "\xEF\xBF\xBD"; }

// Decodes bytes as UTF-8, replacing each maximal invalid subpart with U+FFFD
// (what CPython's "replace" error handler does).
std::string sanitize_utf8(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t size = bytes.size();
  std::size_t i = 0;
  while (i < size) {
    const unsigned char lead = data[i];
    if (lead < 0x80) {
      out.push_back(static_cast<char>(lead));
      ++i;
      continue;
    }
    int needed = 0;
    unsigned char second_low = 0x80, second_high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      needed = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      needed = 2;
      if (lead == 0xE0) second_low = 0xA0;
      if (lead == 0xED) second_high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      needed = 3;
      if (lead == 0xF0) second_low = 0x90;
      if (lead == 0xF4) second_high = 0x8F;
    } else {
      append_replacement(out);
      ++i;
      continue;
    }
    std::size_t valid = 0;
    for (int k = 1; k <= needed && i + k < size; ++k) {
      const unsigned char c = data[i + k];
      const unsigned char low = k == 1 ? second_low : 0x80;
      const unsigned char high = k == 1 ? second_high : 0xBF;
      if (c < low || c > high) break;
      ++valid;
    }
    if (valid == static_cast<std::size_t>(needed)) {
      out.append(bytes, i, static_cast<std::size_t>(needed) + 1);
      i += static_cast<std::size_t>(needed) + 1;
    } else {
      append_replacement(out);
      i += valid + 1;
    }
  }
  return out;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Rust's `str::parse::<i64>()` grammar ([+-]?[0-9]+), saturating instead of
// failing on overflow (Python ints are unbounded; see the header).
bool parse_plain_int(std::string_view text, std::int64_t& value) {
  if (text.empty()) return false;
  bool negative = false;
  if (text.front() == '+' || text.front() == '-') {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) return false;
  // Accumulate the magnitude as unsigned, saturating.
  constexpr std::uint64_t limit = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + 1;
  std::uint64_t magnitude = 0;
  bool saturated = false;
  for (char c : text) {
    if (!is_digit(c)) return false;
    if (!saturated) {
      const auto digit = static_cast<std::uint64_t>(c - '0');
      if (magnitude > (limit - digit) / 10) {
        saturated = true;
      } else {
        magnitude = magnitude * 10 + digit;
      }
    }
  }
  if (negative) {
    value = saturated || magnitude == limit ? std::numeric_limits<std::int64_t>::min()
                                            : -static_cast<std::int64_t>(magnitude);
  } else {
    value = saturated || magnitude >= limit ? std::numeric_limits<std::int64_t>::max()
                                            : static_cast<std::int64_t>(magnitude);
  }
  return true;
}

// pydantic-core `strip_underscores`: no leading/trailing '_', no "__".
std::optional<std::string> strip_underscores(std::string_view text) {
  if (text.empty() || text.front() == '_' || text.back() == '_' || text.find('_') == std::string_view::npos ||
      text.find("__") != std::string_view::npos) {
    return std::nullopt;
  }
  std::string out;
  for (char c : text)
    if (c != '_') out.push_back(c);
  return out;
}

// Rust's f64 grammar: [+-]? (inf | infinity | nan | digits with optional '.'
// and exponent), the words in any case.
bool is_rust_float(std::string_view text) {
  if (text.empty()) return false;
  if (text.front() == '+' || text.front() == '-') text.remove_prefix(1);
  if (iequals(text, "inf") || iequals(text, "infinity") || iequals(text, "nan")) return true;
  std::size_t i = 0;
  std::size_t integer_digits = 0, fraction_digits = 0;
  while (i < text.size() && is_digit(text[i])) ++i, ++integer_digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && is_digit(text[i])) ++i, ++fraction_digits;
  }
  if (integer_digits + fraction_digits == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    std::size_t exponent_digits = 0;
    while (i < text.size() && is_digit(text[i])) ++i, ++exponent_digits;
    if (exponent_digits == 0) return false;
  }
  return i == text.size();
}

double to_double(std::string_view text) {
  std::string_view body = text;
  bool negative = false;
  if (!body.empty() && (body.front() == '+' || body.front() == '-')) {
    negative = body.front() == '-';
    body.remove_prefix(1);
  }
  if (iequals(body, "inf") || iequals(body, "infinity")) {
    return negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  if (iequals(body, "nan")) return std::numeric_limits<double>::quiet_NaN();
  // The grammar was checked: strtod sees only [+-]digits[.digits][e[+-]digits],
  // which it parses the same in every locale that uses '.' (the daemon never
  // calls setlocale, so it runs in the "C" locale).
  const std::string copy(text);
  return std::strtod(copy.c_str(), nullptr);
}

nlohmann::ordered_json error_object(const char* type, const std::string& name, const char* message,
                                    const nlohmann::ordered_json& input) {
  nlohmann::ordered_json error;
  error["type"] = type;
  error["loc"] = nlohmann::ordered_json::array({"query", name});
  error["msg"] = message;
  error["input"] = input;
  return error;
}

}  // namespace

std::optional<std::string> QueryParams::last(std::string_view name) const {
  for (auto it = items.rbegin(); it != items.rend(); ++it)
    if (it->first == name) return it->second;
  return std::nullopt;
}

std::string percent_decode(std::string_view text, bool plus_is_space) {
  std::string bytes;
  bytes.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '%' && i + 2 < text.size()) {
      const int high = hex_value(text[i + 1]);
      const int low = hex_value(text[i + 2]);
      if (high >= 0 && low >= 0) {
        bytes.push_back(static_cast<char>(high * 16 + low));
        i += 2;
        continue;
      }
    }
    bytes.push_back(plus_is_space && c == '+' ? ' ' : c);
  }
  return sanitize_utf8(bytes);
}

QueryParams parse_query_string(std::string_view query) {
  QueryParams params;
  std::size_t start = 0;
  while (start <= query.size()) {
    std::size_t end = query.find('&', start);
    if (end == std::string_view::npos) end = query.size();
    const std::string_view pair = query.substr(start, end - start);
    if (!pair.empty()) {
      const std::size_t equals = pair.find('=');
      const std::string_view name = equals == std::string_view::npos ? pair : pair.substr(0, equals);
      const std::string_view value = equals == std::string_view::npos ? std::string_view{} : pair.substr(equals + 1);
      params.items.emplace_back(percent_decode(name, true), percent_decode(value, true));
    }
    if (end == query.size()) break;
    start = end + 1;
  }
  return params;
}

IntParse parse_python_int(std::string_view text, std::int64_t& value) {
  const std::string_view trimmed = trim(text);
  if (trimmed.size() > 4300) return IntParse::too_long;
  if (parse_plain_int(trimmed, value)) return IntParse::ok;
  const std::size_t dot = trimmed.find('.');
  if (dot != std::string_view::npos) {
    const std::string_view fraction = trimmed.substr(dot + 1);
    bool zeros = true;
    for (char c : fraction) zeros = zeros && c == '0';
    if (zeros) return parse_plain_int(trimmed.substr(0, dot), value) ? IntParse::ok : IntParse::invalid;
    return IntParse::invalid;
  }
  if (const auto stripped = strip_underscores(trimmed)) {
    return parse_plain_int(*stripped, value) ? IntParse::ok : IntParse::invalid;
  }
  return IntParse::invalid;
}

std::optional<double> parse_python_float(std::string_view text) {
  const std::string_view trimmed = trim(text);
  if (is_rust_float(trimmed)) return to_double(trimmed);
  if (const auto stripped = strip_underscores(trimmed)) {
    if (is_rust_float(*stripped)) return to_double(*stripped);
  }
  return std::nullopt;
}

std::optional<bool> parse_python_bool(std::string_view text) {
  if (text == "0" || iequals(text, "f") || iequals(text, "n") || iequals(text, "no") || iequals(text, "off") ||
      iequals(text, "false")) {
    return false;
  }
  if (text == "1" || iequals(text, "t") || iequals(text, "y") || iequals(text, "on") || iequals(text, "yes") ||
      iequals(text, "true")) {
    return true;
  }
  return std::nullopt;
}

std::string QueryReader::required_string(const std::string& name) {
  if (auto value = params_.last(name)) return *value;
  errors_.push_back(error_object("missing", name, "Field required", nullptr));
  return {};
}

std::string QueryReader::string_or(const std::string& name, const std::string& fallback) {
  if (auto value = params_.last(name)) return *value;
  return fallback;
}

std::optional<std::int64_t> QueryReader::read_int(const std::string& name, const std::string& text) {
  std::int64_t value = 0;
  switch (parse_python_int(text, value)) {
    case IntParse::ok: return value;
    case IntParse::too_long:
      errors_.push_back(error_object("int_parsing_size", name,
                                     "Unable to parse input string as an integer, exceeded maximum size", text));
      return std::nullopt;
    case IntParse::invalid: break;
  }
  errors_.push_back(error_object("int_parsing", name,
                                 "Input should be a valid integer, unable to parse string as an integer", text));
  return std::nullopt;
}

std::optional<double> QueryReader::read_float(const std::string& name, const std::string& text) {
  if (auto value = parse_python_float(text)) return value;
  errors_.push_back(
      error_object("float_parsing", name, "Input should be a valid number, unable to parse string as a number", text));
  return std::nullopt;
}

std::int64_t QueryReader::int_or(const std::string& name, std::int64_t fallback) {
  return optional_int(name).value_or(fallback);
}

std::optional<std::int64_t> QueryReader::optional_int(const std::string& name) {
  const auto text = params_.last(name);
  if (!text) return std::nullopt;
  return read_int(name, *text);
}

double QueryReader::float_or(const std::string& name, double fallback) {
  return optional_float(name).value_or(fallback);
}

std::optional<double> QueryReader::optional_float(const std::string& name) {
  const auto text = params_.last(name);
  if (!text) return std::nullopt;
  return read_float(name, *text);
}

bool QueryReader::bool_or(const std::string& name, bool fallback) {
  const auto text = params_.last(name);
  if (!text) return fallback;
  if (auto value = parse_python_bool(*text)) return *value;
  errors_.push_back(
      error_object("bool_parsing", name, "Input should be a valid boolean, unable to interpret input", *text));
  return fallback;
}

void QueryReader::finish() const {
  if (!errors_.empty()) throw QueryValidationError(errors_);
}

}  // namespace quantem::protocol
