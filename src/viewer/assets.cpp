#include "quantem/viewer/assets.hpp"

#include "quantem/core/text.hpp"

namespace quantem::viewer {

namespace {

// Only this origin: scripts and styles from the daemon, API calls to it,
// images (PNG export) from blob: URLs. No inline script or style.
const char* const kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' blob: data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace

const Asset* find_asset(std::string_view path) {
  for (const auto& asset : assets()) {
    if (asset.path == path) return &asset;
  }
  return nullptr;
}

bool etag_matches(std::string_view if_none_match, std::string_view etag) {
  while (!if_none_match.empty()) {
    const auto comma = if_none_match.find(',');
    std::string_view candidate = trim(if_none_match.substr(0, comma), kHttpWhitespace);
    if_none_match = comma == std::string_view::npos ? std::string_view() : if_none_match.substr(comma + 1);
    if (candidate == "*") return true;
    if (candidate.substr(0, 2) == "W/") candidate.remove_prefix(2);
    if (candidate == etag) return true;
  }
  return false;
}

std::vector<std::pair<std::string, std::string>> asset_headers(const Asset& asset, bool not_modified) {
  std::vector<std::pair<std::string, std::string>> headers = {{"etag", std::string(asset.etag)},
                                                               {"cache-control", "no-cache"}};
  if (!not_modified) {
    headers.emplace_back("x-content-type-options", "nosniff");
    headers.emplace_back("referrer-policy", "no-referrer");
    headers.emplace_back("content-security-policy", kContentSecurityPolicy);
  }
  return headers;
}

}  // namespace quantem::viewer
