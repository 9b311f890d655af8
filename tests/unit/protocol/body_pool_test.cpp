#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "quantem/protocol/body_pool.hpp"

using quantem::protocol::BodyPool;
using quantem::protocol::BodyPoolLimits;

namespace {

constexpr std::size_t kKiB = 1024;

// A string of exactly `bytes` capacity, written through (as a body would be).
std::string filled(BodyPool& pool, std::size_t bytes, char value = 'v') {
  std::string body = pool.acquire(bytes);
  body.assign(bytes, value);
  return body;
}

}  // namespace

TEST(BodyPool, ReusesTheReturnedBufferForARequestThatFits) {
  BodyPool pool;
  std::string body = filled(pool, 256 * kKiB);
  const char* const memory = body.data();
  pool.release(std::move(body));
  EXPECT_EQ(pool.stats().free_buffers, 1u);

  std::string again = pool.acquire(200 * kKiB);
  EXPECT_EQ(again.data(), memory);
  EXPECT_TRUE(again.empty());
  EXPECT_GE(again.capacity(), 256 * kKiB);
  EXPECT_EQ(pool.stats().free_buffers, 0u);
  EXPECT_EQ(pool.stats().reused, 1u);
  EXPECT_EQ(pool.stats().allocated, 1u);
  again.assign(200 * kKiB, 'w');  // fits: no reallocation
  EXPECT_EQ(again.data(), memory);
}

TEST(BodyPool, PrefersTheMostRecentlyReturnedBufferThatFits) {
  BodyPool pool;
  std::string older = filled(pool, 300 * kKiB);
  std::string newer = filled(pool, 300 * kKiB);
  std::string small = filled(pool, 100 * kKiB);
  const char* const newer_memory = newer.data();
  const char* const older_memory = older.data();
  pool.release(std::move(older));
  pool.release(std::move(newer));
  pool.release(std::move(small));  // the most recent, but too small
  EXPECT_EQ(pool.acquire(250 * kKiB).data(), newer_memory);
  EXPECT_EQ(pool.acquire(250 * kKiB).data(), older_memory);
}

TEST(BodyPool, NeverHandsOutABufferSmallerThanAsked) {
  BodyPool pool;
  for (std::size_t bytes : {64 * kKiB, 128 * kKiB, 96 * kKiB}) pool.release(filled(pool, bytes));
  for (std::size_t asked : {1 * kKiB, 100 * kKiB, 129 * kKiB, 1024 * kKiB, std::size_t(0)}) {
    const std::string buffer = pool.acquire(asked);
    EXPECT_GE(buffer.capacity(), asked);
    EXPECT_TRUE(buffer.empty());
  }
}

TEST(BodyPool, KeepsASmallBodyFromHoldingAFarLargerBuffer) {
  BodyPool pool;  // max_capacity_ratio 2
  std::string large = filled(pool, 1024 * kKiB);
  const char* const memory = large.data();
  pool.release(std::move(large));
  EXPECT_NE(pool.acquire(100 * kKiB).data(), memory);
  EXPECT_EQ(pool.acquire(512 * kKiB).data(), memory);

  BodyPoolLimits any;
  any.max_capacity_ratio = 0;
  BodyPool lenient(any);
  std::string other = filled(lenient, 1024 * kKiB);
  const char* const other_memory = other.data();
  lenient.release(std::move(other));
  EXPECT_EQ(lenient.acquire(1 * kKiB).data(), other_memory);
}

TEST(BodyPool, KeepsAtMostMaxFreeBuffersDroppingTheOldest) {
  BodyPoolLimits limits;
  limits.max_free_buffers = 3;
  BodyPool pool(limits);
  std::vector<std::string> bodies;
  std::vector<const char*> memory;
  for (int i = 0; i < 5; ++i) {
    bodies.push_back(filled(pool, 64 * kKiB));
    memory.push_back(bodies.back().data());
  }
  for (auto& body : bodies) pool.release(std::move(body));
  EXPECT_EQ(pool.stats().free_buffers, 3u);
  // The three most recent, newest first; the two oldest were freed.
  EXPECT_EQ(pool.acquire(64 * kKiB).data(), memory[4]);
  EXPECT_EQ(pool.acquire(64 * kKiB).data(), memory[3]);
  EXPECT_EQ(pool.acquire(64 * kKiB).data(), memory[2]);
  EXPECT_EQ(pool.stats().free_buffers, 0u);
  EXPECT_EQ(pool.stats().free_bytes, 0u);
}

TEST(BodyPool, KeepsAtMostMaxFreeBytes) {
  BodyPoolLimits limits;
  limits.max_free_bytes = 200 * kKiB;
  BodyPool pool(limits);
  std::string first = filled(pool, 80 * kKiB);
  std::string second = filled(pool, 80 * kKiB);
  std::string third = filled(pool, 80 * kKiB);
  const char* const second_memory = second.data();
  const char* const third_memory = third.data();
  pool.release(std::move(first));
  pool.release(std::move(second));
  EXPECT_EQ(pool.stats().free_buffers, 2u);
  pool.release(std::move(third));  // 240 KiB > 200 KiB: the oldest goes
  const auto stats = pool.stats();
  EXPECT_EQ(stats.free_buffers, 2u);
  EXPECT_LE(stats.free_bytes, limits.max_free_bytes);
  EXPECT_GE(stats.free_bytes, 160 * kKiB);
  EXPECT_EQ(pool.acquire(80 * kKiB).data(), third_memory);
  EXPECT_EQ(pool.acquire(80 * kKiB).data(), second_memory);

  // A buffer larger than the whole bound is freed at once, and keeps the rest.
  pool.release(filled(pool, 100 * kKiB));
  pool.release(filled(pool, 300 * kKiB));
  EXPECT_EQ(pool.stats().free_buffers, 1u);
  EXPECT_LE(pool.stats().free_bytes, limits.max_free_bytes);

  BodyPoolLimits none;
  none.max_free_buffers = 0;
  BodyPool keeps_nothing(none);
  keeps_nothing.release(filled(keeps_nothing, 4 * kKiB));
  EXPECT_EQ(keeps_nothing.stats().free_buffers, 0u);
}

TEST(BodyPool, SharedBodyReturnsToThePoolWhenTheLastOwnerLetsGo) {
  BodyPool pool;
  std::string body = filled(pool, 128 * kKiB, 'b');
  const char* const memory = body.data();
  std::shared_ptr<const std::string> shared = pool.share(std::move(body));
  ASSERT_EQ(shared->size(), 128 * kKiB);
  EXPECT_EQ(shared->data(), memory);
  EXPECT_EQ((*shared)[0], 'b');
  auto cache_copy = shared;  // the image cache and a response hold it
  shared.reset();
  EXPECT_EQ(pool.stats().free_buffers, 0u);
  cache_copy.reset();
  EXPECT_EQ(pool.stats().free_buffers, 1u);
  EXPECT_EQ(pool.acquire(128 * kKiB).data(), memory);
}

TEST(BodyPool, ABodyOutlivingThePoolIsFreedSafely) {
  std::shared_ptr<const std::string> survivor;
  {
    BodyPool pool;
    pool.release(filled(pool, 64 * kKiB));
    survivor = pool.share(filled(pool, 128 * kKiB, 's'));
  }
  EXPECT_EQ(survivor->size(), 128 * kKiB);
  EXPECT_EQ(survivor->back(), 's');
  survivor.reset();  // the pool is gone: freed (ASan reports a leak or a use after free)
}

TEST(BodyPool, ConcurrentAcquireShareAndReleaseKeepBuffersIntactAndBounded) {
  BodyPoolLimits limits;
  limits.max_free_buffers = 4;
  limits.max_free_bytes = 1024 * kKiB;
  auto pool = std::make_unique<BodyPool>(limits);
  constexpr int kThreads = 6;
  constexpr int kRounds = 400;
  std::atomic<int> corrupted{0};
  std::vector<std::shared_ptr<const std::string>> kept(kThreads);  // outlive the pool
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const std::size_t bytes = (16 + (round * 7 + t * 13) % 200) * kKiB;
        const char value = static_cast<char>('a' + t);
        std::string body = pool->acquire(bytes);
        if (body.capacity() < bytes || !body.empty()) ++corrupted;
        body.assign(bytes, value);
        if (round % 3 == 0) {
          pool->release(std::move(body));
          continue;
        }
        auto shared = pool->share(std::move(body));
        std::this_thread::yield();  // another thread could reuse it now if it were returned early
        if (shared->size() != bytes ||
            std::find_if(shared->begin(), shared->end(), [value](char c) { return c != value; }) != shared->end())
          ++corrupted;
        kept[t] = std::move(shared);  // the previous one returns now; the last after the pool is destroyed
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(corrupted.load(), 0);
  const auto stats = pool->stats();
  EXPECT_LE(stats.free_buffers, limits.max_free_buffers);
  EXPECT_LE(stats.free_bytes, limits.max_free_bytes);
  EXPECT_EQ(stats.reused + stats.allocated, std::uint64_t(kThreads) * kRounds);
  EXPECT_GT(stats.reused, 0u);
  pool.reset();
  for (const auto& body : kept) ASSERT_TRUE(body && !body->empty());
  kept.clear();
}
