#include "quantem/server/http_types.hpp"

namespace quantem::server {

std::optional<std::string> HttpRequest::header(std::string_view lower_case_name) const {
  for (const auto& [name, value] : headers)
    if (name == lower_case_name) return value;
  return std::nullopt;
}

HttpResponse HttpResponse::json(int status, const nlohmann::ordered_json& document) {
  HttpResponse response;
  response.status = status;
  response.content_type = "application/json";
  // Non-ASCII stays raw UTF-8 (as Starlette sends it); invalid UTF-8 is replaced.
  response.body = document.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return response;
}

HttpResponse HttpResponse::detail(int status, const std::string& text) {
  nlohmann::ordered_json body;
  body["detail"] = text;
  return json(status, body);
}

void HttpResponse::set_header(const std::string& lower_case_name, const std::string& value) {
  for (auto& [name, existing] : headers) {
    if (name == lower_case_name) {
      existing = value;
      return;
    }
  }
  headers.emplace_back(lower_case_name, value);
}

std::optional<std::string> HttpResponse::header(std::string_view lower_case_name) const {
  for (const auto& [name, value] : headers)
    if (name == lower_case_name) return value;
  return std::nullopt;
}

}  // namespace quantem::server
