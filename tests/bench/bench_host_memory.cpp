// What writing a fresh image body costs on this host (the request path's encode
// stage of the first realspace misses). Each variant writes `--count` bodies
// of `--bytes` (one memcpy of a warm source per body) and reports the median
// microseconds per body; JSON on stdout. Variants:
//   kept_fresh      malloc'd bodies kept (the image cache filling up)
//   kept_string     std::string::assign into strings kept (the encoder today)
//   recycled        one buffer written again and again (a full cache reusing
//                   an evicted body)
//   populated       mmap(MAP_POPULATE) bodies kept (pages faulted in one call)
//   after_release   kept_fresh again after 512 MB were touched and unmapped
//                   (are pages the process gave back cheap to get again?)
//   hugepage        2 MiB-aligned bodies with madvise(MADV_HUGEPAGE), kept
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

// Times `write(i)` for i in [0, count): microseconds per call.
std::vector<double> time_each(std::size_t count, const std::function<void(std::size_t)>& write) {
  std::vector<double> micros;
  for (std::size_t i = 0; i < count; ++i) {
    const auto start = Clock::now();
    write(i);
    micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return micros;
}

nlohmann::json summary(const std::vector<double>& micros) {
  std::vector<double> sorted = micros;
  std::sort(sorted.begin(), sorted.end());
  return {{"median_us", median(micros)}, {"min_us", sorted.front()}, {"p90_us", sorted[sorted.size() * 9 / 10]}};
}

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_host_memory: the cost of writing fresh image bodies"};
  std::size_t bytes = std::size_t{1} << 20;
  std::size_t count = 64;
  app.add_option("--bytes", bytes, "bytes per body");
  app.add_option("--count", count, "bodies per variant");
  CLI11_PARSE(app, argc, argv);

  std::vector<char> source(bytes);
  for (std::size_t i = 0; i < bytes; ++i) source[i] = static_cast<char>(i * 131u);
  volatile char sink = 0;
  nlohmann::json report;
  report["bytes"] = bytes;
  report["count"] = count;
  report["transparent_hugepage"] = first_line("/sys/kernel/mm/transparent_hugepage/enabled");

  {
    std::vector<char*> kept;
    report["kept_fresh"] = summary(time_each(count, [&](std::size_t) {
      char* body = static_cast<char*>(std::malloc(bytes));
      std::memcpy(body, source.data(), bytes);
      kept.push_back(body);
    }));
    for (char* body : kept) sink = sink + body[bytes / 2], std::free(body);
  }
  {
    std::vector<std::string> kept;
    kept.reserve(count);
    report["kept_string"] = summary(time_each(count, [&](std::size_t) { kept.emplace_back().assign(source.data(), bytes); }));
  }
  {
    std::vector<char> body(bytes);
    std::memcpy(body.data(), source.data(), bytes);
    report["recycled"] = summary(time_each(count, [&](std::size_t) { std::memcpy(body.data(), source.data(), bytes); }));
    sink = sink + body[bytes / 2];
  }
  {
    std::vector<void*> kept;
    report["populated"] = summary(time_each(count, [&](std::size_t) {
      void* body = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      if (body == MAP_FAILED) std::abort();
      std::memcpy(body, source.data(), bytes);
      kept.push_back(body);
    }));
    for (void* body : kept) munmap(body, bytes);
  }
  {
    const std::size_t released = std::size_t{512} << 20;
    void* block = mmap(nullptr, released, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) std::abort();
    std::memset(block, 1, released);
    munmap(block, released);
    std::vector<char*> kept;
    report["after_release"] = summary(time_each(count, [&](std::size_t) {
      char* body = static_cast<char*>(std::malloc(bytes));
      std::memcpy(body, source.data(), bytes);
      kept.push_back(body);
    }));
    for (char* body : kept) std::free(body);
  }
  {
    const std::size_t huge = std::size_t{2} << 20;
    const std::size_t rounded = (bytes + huge - 1) / huge * huge;
    std::vector<void*> kept;
    report["hugepage"] = summary(time_each(count, [&](std::size_t) {
      void* body = std::aligned_alloc(huge, rounded);
      if (body == nullptr) std::abort();
      madvise(body, rounded, MADV_HUGEPAGE);
      std::memcpy(body, source.data(), bytes);
      kept.push_back(body);
    }));
    for (void* body : kept) std::free(body);
  }
  std::cout << report.dump() << "\n";
  return sink == 42 ? 0 : 0;
}
