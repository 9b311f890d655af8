#pragma once
// The one place where errors become HTTP responses. Handlers never let an
// exception escape: BrowseService catches everything and calls
// error_response(), which
//  - maps quantem::Error kinds to statuses (bad_request 400, forbidden 403,
//    not_found 404, conflict 409, payload_too_large 413, unprocessable and
//    corrupt_data 422, unavailable 503, io and internal 500) with the body
//    {"detail": "<message>"};
//  - sends a QueryValidationError as 422 {"detail": [pydantic list]};
//  - answers any other exception as the reference does for an unhandled one:
//    500, text/plain, "Internal Server Error" (the message is logged, never sent).
#include <exception>

#include "quantem/core/error.hpp"
#include "quantem/server/http_types.hpp"

namespace quantem::server {

int http_status(ErrorKind kind) noexcept;

// Never throws.
HttpResponse error_response(std::exception_ptr error) noexcept;

}  // namespace quantem::server
