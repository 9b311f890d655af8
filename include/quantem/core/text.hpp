#pragma once
// Small text helpers every component uses: one definition each.
#include <string>
#include <string_view>

namespace quantem {

// The characters C's isspace() accepts in the "C" locale.
inline constexpr std::string_view kAsciiWhitespace = " \t\n\v\f\r";
// HTTP's optional whitespace (RFC 9110 section 5.6.3): space and tab.
inline constexpr std::string_view kHttpWhitespace = " \t";

// `text` without leading and trailing characters from `characters`.
std::string_view trim(std::string_view text, std::string_view characters = kAsciiWhitespace);

// ASCII letters in lower case; other bytes unchanged.
std::string to_lower(std::string_view text);

// Equal ignoring ASCII case.
bool iequals(std::string_view a, std::string_view b) noexcept;

// The part of a path after its last '/' (the whole path when it has none).
std::string base_name(const std::string& path);

}  // namespace quantem
