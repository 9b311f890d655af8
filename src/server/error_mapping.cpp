#include "quantem/server/error_mapping.hpp"

#include <spdlog/spdlog.h>

#include "quantem/protocol/query.hpp"

namespace quantem::server {

int http_status(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::bad_request: return 400;
    case ErrorKind::forbidden: return 403;
    case ErrorKind::not_found: return 404;
    case ErrorKind::conflict: return 409;
    case ErrorKind::payload_too_large: return 413;
    case ErrorKind::unprocessable: return 422;
    case ErrorKind::corrupt_data: return 422;
    case ErrorKind::unavailable: return 503;
    case ErrorKind::io: return 500;
    case ErrorKind::internal: return 500;
  }
  return 500;
}

namespace {

HttpResponse internal_server_error() {
  HttpResponse response;
  response.status = 500;
  response.content_type = "text/plain; charset=utf-8";
  response.body = "Internal Server Error";
  return response;
}

}  // namespace

HttpResponse error_response(std::exception_ptr error) noexcept {
  try {
    try {
      std::rethrow_exception(error);
    } catch (const protocol::QueryValidationError& invalid) {
      nlohmann::ordered_json body;
      body["detail"] = invalid.details();
      return HttpResponse::json(422, body);
    } catch (const Error& typed) {
      const int status = http_status(typed.kind());
      if (status == 503) {
        // Documented, passing states (not ready yet, a load pending, shutting
        // down; docs/protocol.md): the client retries; not an error of the daemon.
        spdlog::warn("503 ({}): {}", error_kind_name(typed.kind()), typed.what());
      } else if (status >= 500) {
        spdlog::error("{} error: {}", error_kind_name(typed.kind()), typed.what());
      } else {
        spdlog::debug("{} ({}): {}", status, error_kind_name(typed.kind()), typed.what());
      }
      HttpResponse response = HttpResponse::detail(status, typed.what());
      if (status == 503) response.set_header("retry-after", "1");
      return response;
    } catch (const std::exception& unexpected) {
      spdlog::error("unhandled exception: {}", unexpected.what());
      return internal_server_error();
    } catch (...) {
      spdlog::error("unhandled non-standard exception");
      return internal_server_error();
    }
  } catch (...) {
    // Building the response itself failed (allocation): the plainest answer.
    HttpResponse response;
    response.status = 500;
    return response;
  }
}

}  // namespace quantem::server
