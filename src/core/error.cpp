#include "quantem/core/error.hpp"

namespace quantem {

const char* error_kind_name(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::bad_request: return "bad_request";
    case ErrorKind::forbidden: return "forbidden";
    case ErrorKind::not_found: return "not_found";
    case ErrorKind::conflict: return "conflict";
    case ErrorKind::payload_too_large: return "payload_too_large";
    case ErrorKind::unprocessable: return "unprocessable";
    case ErrorKind::unavailable: return "unavailable";
    case ErrorKind::corrupt_data: return "corrupt_data";
    case ErrorKind::io: return "io";
    case ErrorKind::internal: return "internal";
  }
  return "internal";
}

}  // namespace quantem
