#pragma once
// The catalog documents (/api/browse/sessions, /api/browse/acquisitions) as
// HTTP responses, so that a poll of an unchanged catalog costs little:
//  - `etag` (a digest of the JSON body) and `cache-control: no-cache` (a
//    browser revalidates every time); a request whose `if-none-match` names
//    the tag gets 304 with no body;
//  - the gzip form (`content-encoding: gzip`, `vary: accept-encoding`) when
//    the request's `accept-encoding` accepts gzip and the body is larger than
//    a TCP segment; the body is the same JSON either way.
#include <string>

#include "quantem/server/catalog_service.hpp"
#include "quantem/server/http_types.hpp"

namespace quantem::server {

// Whether an Accept-Encoding header value accepts gzip (`gzip`, `x-gzip` or
// `*`, with a q-value other than 0).
bool accepts_gzip(const std::string& accept_encoding);

HttpResponse document_response(const HttpRequest& request, const DocumentBody& body);

}  // namespace quantem::server
