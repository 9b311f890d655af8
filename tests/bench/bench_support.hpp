#pragma once
// Small helpers shared by the GPU benchmarks (bench_gpu_codec, bench_dense_peers).
#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace quantem::bench {

// The median (mean of the middle two for an even count; 0 when empty).
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  if (n == 0) return 0.0;
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// body(i) for i < count, strided over one thread per hardware thread.
template <class F>
void parallel_for(std::size_t count, F&& body) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (std::size_t i = t; i < count; i += threads) body(i);
    });
  for (auto& thread : pool) thread.join();
}

}  // namespace quantem::bench
