// libFuzzer target: the query-string reader and the parser of every route
// (protocol/query.cpp, protocol/requests.cpp) on arbitrary query bytes.
// Contract (query.hpp, requests.hpp): any query gives parameters or a typed
// quantem::Error (422 QueryValidationError, 400 bad_request); nothing else
// escapes, and every error body serialises as the error mapper does.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "quantem/core/error.hpp"
#include "quantem/protocol/query.hpp"
#include "quantem/protocol/requests.hpp"

namespace {

using quantem::protocol::QueryParams;

template <typename Parse>
void run_route(const QueryParams& params, Parse parse) {
  try {
    parse(params);
  } catch (const quantem::protocol::QueryValidationError& invalid) {
    if (!invalid.details().is_array() || invalid.details().empty()) std::abort();
    nlohmann::ordered_json body;
    body["detail"] = invalid.details();
    (void)body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  } catch (const quantem::Error& error) {
    if (error.kind() != quantem::ErrorKind::bad_request && error.kind() != quantem::ErrorKind::unprocessable) {
      std::abort();  // a query alone can only be invalid
    }
    nlohmann::ordered_json body;
    body["detail"] = error.what();
    (void)body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace quantem::protocol;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const QueryParams params = parse_query_string(text);
  run_route(params, parse_realspace_query);
  run_route(params, parse_shape_query);
  run_route(params, parse_cbed_query);
  run_route(params, parse_region_query);
  run_route(params, parse_source_query);
  run_route(params, parse_sessions_refresh);

  // The coercions and helpers on the raw bytes too.
  (void)percent_decode(text, true);
  (void)percent_decode(text, false);
  std::int64_t value = 0;
  (void)parse_python_int(text, value);
  (void)parse_python_float(text);
  (void)parse_python_bool(text);
  (void)python_str_repr(std::string(text));
  return 0;
}
