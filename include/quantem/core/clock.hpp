#pragma once
// Elapsed time in seconds, as logs and stage timings report it.
#include <chrono>

namespace quantem {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace quantem
