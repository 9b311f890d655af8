#include "quantem/hdf5/error.hpp"

#include <cctype>
#include <vector>

#include "quantem/core/error.hpp"

namespace quantem::hdf5 {

ErrorSilencer::ErrorSilencer() {
  H5Eget_auto2(H5E_DEFAULT, &previous_function_, &previous_data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

ErrorSilencer::~ErrorSilencer() { H5Eset_auto2(H5E_DEFAULT, previous_function_, previous_data_); }

void silence_error_printing() {
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

namespace {

herr_t collect_description(unsigned /*n*/, const H5E_error2_t* error, void* client_data) {
  auto* descriptions = static_cast<std::vector<std::string>*>(client_data);
  if (error && error->desc && *error->desc) descriptions->emplace_back(error->desc);
  return 0;
}

herr_t append_to_trace(unsigned depth, const H5E_error2_t* error, void* client_data) {
  auto& out = *static_cast<std::string*>(client_data);
  out += depth == 0 ? " [" : "; ";
  out += error->func_name ? error->func_name : "?";
  out += ": ";
  out += error->desc ? error->desc : "";
  return 0;
}

}  // namespace

std::string take_error_message() {
  std::vector<std::string> descriptions;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_description, &descriptions);
  H5Eclear2(H5E_DEFAULT);
  if (descriptions.empty()) return {};
  // Like h5py: the API-level description, capitalised, then the innermost cause.
  std::string message = descriptions.front();
  message[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(message[0])));
  if (descriptions.size() > 1 && descriptions.back() != descriptions.front()) {
    message += " (" + descriptions.back() + ")";
  }
  return message;
}

std::string take_error_trace() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, append_to_trace, &text);
  H5Eclear2(H5E_DEFAULT);
  if (!text.empty()) text += "]";
  return text;
}

void throw_error(const std::string& what) {
  std::string message = take_error_message();
  if (message.empty()) message = "HDF5 call failed";
  throw HdfError(what + ": " + message);
}

void throw_error_with_trace(const std::string& what) { throw HdfError("HDF5: " + what + take_error_trace()); }

}  // namespace quantem::hdf5
