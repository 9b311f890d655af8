#pragma once
// The browser viewer (web/ in the source tree), compiled into the binary at
// build time by cmake/EmbedViewerAssets.cmake: no files to install, no network
// access, no build tool a user runs. The page is served at "/", its scripts
// and style sheet at "/viewer/<name>" (docs/viewer.md). No HTTP types here:
// the server's route (BrowseService) turns an asset into a response.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace quantem::viewer {

struct Asset {
  std::string_view path;          // URL path: "/" for index.html, else "/viewer/<file name>"
  std::string_view content_type;  // e.g. "text/javascript; charset=utf-8"
  std::string_view etag;          // strong validator, quoted: a prefix of the bytes' SHA-256
  std::string_view body;          // the file's bytes (static storage)
};

// Every embedded asset, in web/'s listed order (generated source).
const std::vector<Asset>& assets();

// The asset served at this URL path, or nullptr.
const Asset* find_asset(std::string_view path);

// True when an `if-none-match` header value (a list of entity tags, or "*")
// names `etag` (weak comparison, RFC 9110, section 13.1.2): the answer is 304.
bool etag_matches(std::string_view if_none_match, std::string_view etag);

// Headers (lower-case names) sent with every asset, besides content-type:
// `etag`, `cache-control: no-cache` (the browser revalidates, so an upgraded
// daemon serves its new page), and on 200 also `x-content-type-options`,
// `referrer-policy` and a content-security-policy that allows only this origin.
std::vector<std::pair<std::string, std::string>> asset_headers(const Asset& asset, bool not_modified);

}  // namespace quantem::viewer
