// The backend's small building blocks: the per-resident derived-value cache
// and the CPU thread pool.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "quantem/backend/thread_pool.hpp"
#include "quantem/backend/derived_cache.hpp"

namespace quantem::backend {
namespace {

TEST(DerivedCache, ComputesEachKeyOnceAndKeepsTypesApart) {
  DerivedCache cache(8);
  int calls = 0;
  const auto a = cache.get_or_compute<int>("a", [&] { return ++calls; });
  const auto b = cache.get_or_compute<int>("a", [&] { return ++calls; });
  EXPECT_EQ(*a, 1);
  EXPECT_EQ(*b, 1);
  const auto text = cache.get_or_compute<std::string>("a", [] { return std::string("other type"); });
  EXPECT_EQ(*text, "other type");
  EXPECT_EQ(cache.computations(), 2u);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(DerivedCache, DropsTheLeastRecentlyUsedBeyondCapacity) {
  DerivedCache cache(2);
  int calls = 0;
  cache.get_or_compute<int>("a", [&] { return ++calls; });
  cache.get_or_compute<int>("b", [&] { return ++calls; });
  cache.get_or_compute<int>("a", [&] { return ++calls; });  // a is now the most recent
  cache.get_or_compute<int>("c", [&] { return ++calls; });  // evicts b
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(*cache.get_or_compute<int>("a", [&] { return ++calls; }), 1);
  EXPECT_EQ(*cache.get_or_compute<int>("b", [&] { return ++calls; }), 4);  // recomputed
  cache.clear();
  EXPECT_EQ(cache.size(), 0u);
}

TEST(DerivedCache, AFailedComputationStoresNothing) {
  DerivedCache cache;
  EXPECT_THROW(cache.get_or_compute<int>("k", []() -> int { throw std::runtime_error("no"); }), std::runtime_error);
  EXPECT_EQ(*cache.get_or_compute<int>("k", [] { return 7; }), 7);
  EXPECT_EQ(cache.computations(), 1u);
}

TEST(DerivedCache, ConcurrentCallersShareOneComputation) {
  DerivedCache cache;
  std::atomic<int> calls{0};
  std::vector<std::thread> threads;
  std::vector<int> seen(8);
  for (std::size_t t = 0; t < seen.size(); ++t) {
    threads.emplace_back([&, t] {
      seen[t] = *cache.get_or_compute<int>("shared", [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return 100 + calls.fetch_add(1);
      });
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(calls.load(), 1);
  for (const int value : seen) EXPECT_EQ(value, 100);
}

TEST(ThreadPool, CoversEveryItemOnceWithParticipantsBelowTheSize) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.size(), 3u);
  std::vector<std::atomic<int>> hits(1000);
  std::atomic<bool> participant_in_range{true};
  pool.parallel_for(hits.size(), 7, [&](std::size_t begin, std::size_t end, unsigned participant) {
    if (participant >= 3) participant_in_range = false;
    for (std::size_t i = begin; i < end; ++i) hits[i]++;
  });
  for (const auto& hit : hits) EXPECT_EQ(hit.load(), 1);
  EXPECT_TRUE(participant_in_range.load());
}

TEST(ThreadPool, RethrowsTheFirstExceptionAndStaysUsable) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [](std::size_t begin, std::size_t, unsigned) {
                                   if (begin == 42) throw std::runtime_error("item 42");
                                 }),
               std::runtime_error);
  std::atomic<int> count{0};
  pool.parallel_for(10, 1, [&](std::size_t, std::size_t, unsigned) { count++; });
  EXPECT_EQ(count.load(), 10);
}

TEST(ThreadPool, NestedAndConcurrentLoopsDoNotDeadlock) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      pool.parallel_for(8, 1, [&](std::size_t, std::size_t, unsigned) {
        pool.parallel_for(8, 1, [&](std::size_t, std::size_t, unsigned) { inner++; });
      });
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(inner.load(), 3 * 8 * 8);
}

}  // namespace
}  // namespace quantem::backend
