#pragma once
// Elapsed time in seconds, as logs and stage timings report it; the
// wall-clock time as the documents and files this daemon writes stamp it.
#include <chrono>
#include <ctime>
#include <string>

namespace quantem {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The current UTC time as ISO 8601 to the second, e.g. "2026-12-05T09:04:11Z".
inline std::string utc_timestamp_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

}  // namespace quantem
