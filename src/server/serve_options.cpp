#include "quantem/server/serve_options.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "quantem/catalog/catalog.hpp"
#include "quantem/core/text.hpp"
#include "quantem/catalog/catalog_cache.hpp"
#include "quantem/inspector/inspector.hpp"
#include "quantem/core/version.hpp"
#include "quantem/server/security.hpp"

namespace quantem::server {

namespace {

// Python int() of a decimal string: surrounding whitespace, one sign, digits
// with single underscores between them.
std::optional<long long> python_int(const std::string& raw) {
  const std::string text(trim(raw));
  std::size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  if (i >= text.size()) return std::nullopt;
  long long value = 0;
  bool previous_digit = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '_') {
      if (!previous_digit || i + 1 >= text.size() || !std::isdigit(static_cast<unsigned char>(text[i + 1]))) return std::nullopt;
      previous_digit = false;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    if (value > (std::numeric_limits<long long>::max() - (c - '0')) / 10) return std::nullopt;
    value = value * 10 + (c - '0');
    previous_digit = true;
  }
  return negative ? -value : value;
}

// --log-level, else $QUANTEM_GPU_LOG_LEVEL (the unit's environment file);
// nullopt when neither is given.
std::optional<logging::Level> validate_log_level(const std::string& option_value) {
  if (!option_value.empty()) {
    const auto level = logging::parse_level(option_value);
    if (!level) {
      throw ServeUsageError(std::string("--log-level must be one of ") + logging::level_names() + ", got '" +
                            option_value + "'");
    }
    return level;
  }
  const char* variable = std::getenv(logging::kLevelVariable);
  if (!variable || !*variable) return std::nullopt;
  const auto level = logging::parse_level(variable);
  if (!level) {
    throw ServeUsageError(std::string("$") + logging::kLevelVariable + " must be one of " + logging::level_names() +
                          ", got '" + variable + "'");
  }
  return level;
}

}  // namespace

std::vector<int> parse_gpu_list(const std::string& spec) {
  std::vector<int> indices;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = spec.find(',', start);
    const std::string piece = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto value = python_int(piece);
    if (!value || *value > std::numeric_limits<int>::max() || *value < std::numeric_limits<int>::min()) {
      throw ServeUsageError("--gpus must be 'auto' or comma-separated CUDA indices");
    }
    if (std::find(indices.begin(), indices.end(), static_cast<int>(*value)) == indices.end()) {
      indices.push_back(static_cast<int>(*value));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (int index : indices)
    if (index < 0) throw ServeUsageError("--gpus must contain CUDA indices zero or greater");
  return indices;
}

std::optional<DeviceBudget> parse_device_budget(const std::string& raw) {
  const std::string text(trim(raw));
  if (text.empty()) return std::nullopt;
  const bool percent = text.back() == '%';
  const std::string number = percent ? std::string(trim(text.substr(0, text.size() - 1))) : text;
  const bool plain_decimal = !number.empty() && number.find_first_not_of("0123456789.") == std::string::npos &&
                             std::count(number.begin(), number.end(), '.') == 1;
  if (percent || plain_decimal) {
    if (number.empty() || number.find_first_not_of("0123456789.") != std::string::npos ||
        std::count(number.begin(), number.end(), '.') > 1 || number.find_first_of("0123456789") == std::string::npos) {
      return std::nullopt;
    }
    const double value = std::strtod(number.c_str(), nullptr) / (percent ? 100.0 : 1.0);
    if (value > 0.0 && value <= 1.0) return DeviceBudget{0, value};
    if (percent) return std::nullopt;
    // A unitless decimal above 1 is a byte count ("2048.0").
  }
  const auto bytes = parse_byte_size(text);
  if (!bytes || *bytes == 0) return std::nullopt;
  return DeviceBudget{*bytes, 0.0};
}

// "12.5 GiB" -> number "12.5" (digits and at most one dot), unit "gib" (lower
// case, trimmed); nullopt without a digit.
struct NumberWithUnit {
  std::string number;
  bool has_dot = false;
  std::string unit;
};
std::optional<NumberWithUnit> split_number_and_unit(const std::string& text) {
  std::size_t number_end = 0;
  bool seen_digit = false, seen_dot = false;
  while (number_end < text.size()) {
    const char c = text[number_end];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
    ++number_end;
  }
  if (!seen_digit) return std::nullopt;
  const std::string unit = to_lower(trim(text.substr(number_end)));
  return NumberWithUnit{text.substr(0, number_end), seen_dot, unit};
}

std::optional<std::chrono::milliseconds> parse_duration(const std::string& raw) {
  const std::string text(trim(raw));
  const auto split = split_number_and_unit(text);
  if (!split) return std::nullopt;
  const std::string& unit = split->unit;
  double milliseconds_per_unit = 0;
  if (unit == "ms") milliseconds_per_unit = 1;
  else if (unit.empty() || unit == "s") milliseconds_per_unit = 1e3;
  else if (unit == "m" || unit == "min") milliseconds_per_unit = 60e3;
  else if (unit == "h") milliseconds_per_unit = 3600e3;
  else return std::nullopt;
  const double milliseconds = std::strtod(split->number.c_str(), nullptr) * milliseconds_per_unit;
  if (!std::isfinite(milliseconds) || milliseconds < 0 || milliseconds > 1e15) return std::nullopt;
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(milliseconds)));
}

std::optional<std::uint64_t> parse_byte_size(const std::string& raw) {
  const std::string text(trim(raw));
  const auto split = split_number_and_unit(text);
  if (!split) return std::nullopt;
  const std::string& unit = split->unit;
  const bool seen_dot = split->has_dot;
  double multiplier = 0;
  if (unit.empty() || unit == "b") multiplier = 1;
  else if (unit == "kb") multiplier = 1e3;
  else if (unit == "mb") multiplier = 1e6;
  else if (unit == "gb") multiplier = 1e9;
  else if (unit == "tb") multiplier = 1e12;
  else if (unit == "k" || unit == "kib") multiplier = 1024.0;
  else if (unit == "m" || unit == "mib") multiplier = 1024.0 * 1024.0;
  else if (unit == "g" || unit == "gib") multiplier = 1024.0 * 1024.0 * 1024.0;
  else if (unit == "t" || unit == "tib") multiplier = 1024.0 * 1024.0 * 1024.0 * 1024.0;
  else return std::nullopt;
  const std::string& number = split->number;
  if (!seen_dot && multiplier == 1) {
    // Plain bytes: exact, no floating point.
    const auto value = python_int(number);
    if (!value || *value < 0) return std::nullopt;
    return static_cast<std::uint64_t>(*value);
  }
  const double bytes = std::strtod(number.c_str(), nullptr) * multiplier;
  if (!std::isfinite(bytes) || bytes < 0 || bytes >= 1.8e19) return std::nullopt;
  return static_cast<std::uint64_t>(std::floor(bytes));
}

std::string resolve_implementation_revision(const std::string& option_value) {
  if (!option_value.empty()) return option_value;
  if (const char* env = std::getenv("QUANTEM_GPU_IMPLEMENTATION_REVISION"); env && *env) return env;
  return build_git_revision();
}

namespace {

// The listening port and the devices asked for, in the reference's order:
// --port, --gpu, --gpus.
void validate_port_and_gpus(const ServeOptions& options, ServeSettings& settings) {
  if (options.port == 0 && !options.port_file.empty()) {
    settings.port = 0;
  } else if (options.port < 1 || options.port > 65535) {
    throw ServeUsageError("--port must be between 1 and 65535");
  } else {
    settings.port = static_cast<int>(options.port);
  }
  settings.port_file = options.port_file;
  if (options.gpu) {
    if (*options.gpu < 0) throw ServeUsageError("--gpu must be zero or greater");
    if (*options.gpu > std::numeric_limits<int>::max()) throw ServeUsageError("--gpu must be a CUDA index");
    settings.gpu_indices = std::vector<int>{static_cast<int>(*options.gpu)};
  } else if (options.gpus != "auto") {
    settings.gpu_indices = parse_gpu_list(options.gpus);
  }

}

// The backend, its devices and their budgets.
void validate_backend(const ServeOptions& options, ServeSettings& settings) {
  if (options.backend == "cpu") {
    settings.cpu_backend = true;
  } else if (options.backend != "cuda") {
    throw ServeUsageError("--backend must be cuda or cpu, got '" + options.backend + "'");
  }
  if (options.cpu_devices < 1 || options.cpu_devices > 64) throw ServeUsageError("--cpu-devices must be between 1 and 64");
  settings.cpu_devices = static_cast<int>(options.cpu_devices);
  if (!options.device_budget.empty()) {
    const auto budget = parse_device_budget(options.device_budget);
    if (!budget) {
      throw ServeUsageError(
          "--device-budget must be a positive byte count such as 1073741824, 64MiB, 2GB or 1.5GiB, or a fraction of "
          "device memory such as 0.8 or 80%; got '" + options.device_budget + "'");
    }
    settings.device_budget_bytes = budget->bytes;
    settings.device_budget_fraction = budget->fraction;
  }
  if (!options.idle_release.empty()) {
    const auto idle = parse_duration(options.idle_release);
    if (!idle || idle->count() <= 0) {
      throw ServeUsageError("--idle-release must be a positive duration such as 90s, 30m or 2h; got '" +
                            options.idle_release + "'");
    }
    settings.idle_release = *idle;
  }
  if (options.cpu_threads < 0 || options.cpu_threads > 4096) throw ServeUsageError("--cpu-threads must be between 0 and 4096");
  settings.cpu_threads = static_cast<unsigned>(options.cpu_threads);
  if (options.cache_entries < 1 || options.cache_entries > 4096) throw ServeUsageError("--cache-entries must be between 1 and 4096");
  settings.cache_entries = static_cast<std::size_t>(options.cache_entries);
  settings.tile_sums = !options.no_tile_sums;
}

// HTTP workers, the address, authentication and the connection deadlines.
void validate_http(const ServeOptions& options, ServeSettings& settings) {
  if (options.http_threads < 1 || options.http_threads > 1024) throw ServeUsageError("--http-threads must be between 1 and 1024");
  settings.http_threads = static_cast<int>(options.http_threads);
  if (options.http_spin_us < 0 || options.http_spin_us > 100000) throw ServeUsageError("--http-spin-us must be between 0 and 100000");
  settings.http_spin = std::chrono::microseconds(options.http_spin_us);

  settings.host = options.host;
  if (!is_loopback_address(options.host)) {
    if (!options.allow_non_loopback) {
      throw ServeUsageError("--host " + options.host +
                            " is not a loopback address: quantem-gpu serves loopback clients only (use an SSH "
                            "port-forward); pass --allow-non-loopback to bind it anyway");
    }
    settings.non_loopback = true;
  }
  if (options.auth == "token") {
    settings.token_auth = true;
  } else if (options.auth != "none") {
    throw ServeUsageError("--auth must be none or token, got '" + options.auth + "'");
  }
  if (!(options.shutdown_grace_seconds >= 0 && options.shutdown_grace_seconds <= 600)) {
    throw ServeUsageError("--shutdown-grace must be between 0 and 600 seconds");
  }
  settings.shutdown_grace = std::chrono::milliseconds(std::llround(options.shutdown_grace_seconds * 1000));
  if (!(options.header_timeout_seconds >= 0.05 && options.header_timeout_seconds <= 3600)) {
    throw ServeUsageError("--header-timeout must be between 0.05 and 3600 seconds");
  }
  settings.header_timeout = std::chrono::milliseconds(std::llround(options.header_timeout_seconds * 1000));
}

// The inspector, the socket, and the folders the daemon reads and writes.
void validate_inspector_and_paths(const ServeOptions& options, ServeSettings& settings) {
  if (!(options.inspect_timeout_seconds >= 0.05 && options.inspect_timeout_seconds <= 3600)) {
    throw ServeUsageError("--inspect-timeout must be between 0.05 and 3600 seconds");
  }
  settings.inspect_timeout = std::chrono::milliseconds(std::llround(options.inspect_timeout_seconds * 1000));
  if (options.inspect_workers < 0 || options.inspect_workers > 256) throw ServeUsageError("--inspect-workers must be between 0 and 256");
  settings.inspect_workers = options.inspect_workers == 0 ? inspector::default_inspect_workers()
                                                          : static_cast<std::size_t>(options.inspect_workers);
  // Absolute, so the runtime file and the logs name it wherever they are read.
  if (!options.unix_socket.empty()) settings.unix_socket = std::filesystem::absolute(options.unix_socket).lexically_normal().string();
  settings.data_folder = catalog::absolute_folder(options.data_folder);
  if (!options.export_dir.empty()) {
    if (!std::filesystem::is_directory(options.export_dir)) {
      throw ServeUsageError("--export-dir " + options.export_dir + " is not an existing folder");
    }
    if (::access(options.export_dir.c_str(), W_OK | X_OK) != 0) {
      throw ServeUsageError("--export-dir " + options.export_dir + " is not writable by this user: " +
                            std::strerror(errno));
    }
    settings.export_dir = std::filesystem::absolute(options.export_dir).lexically_normal().string();
  }
  settings.catalog_cache = options.catalog_cache == "off"  ? std::string()
                           : options.catalog_cache.empty() ? catalog::default_catalog_cache_path(settings.data_folder)
                                                           : catalog::absolute_folder(options.catalog_cache);
}

}  // namespace

ServeSettings validate_serve_options(const ServeOptions& options) {
  ServeSettings settings;
  validate_port_and_gpus(options, settings);
  validate_backend(options, settings);
  validate_http(options, settings);
  validate_inspector_and_paths(options, settings);
  settings.implementation_revision = resolve_implementation_revision(options.implementation_revision);
  settings.log_level = validate_log_level(options.log_level);
  settings.exit_on_stdin_close = options.exit_on_stdin_close;
  return settings;
}

}  // namespace quantem::server
