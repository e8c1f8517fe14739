#include "encoder_service/embedding_cache.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

namespace mmserve::encoder {
namespace {

std::shared_ptr<const EncodedMedia> Image(size_t floats, float fill) {
  auto e = std::make_shared<EncodedMedia>();
  e->grid = model::MediaGrid::FromThw(1, 2, 2);
  e->embedding.assign(floats, fill);
  return e;
}

ContentHash Key(uint64_t k) { return ContentHash{k, ~k}; }

TEST_CASE("a miss returns null and an insert makes the next lookup a hit") {
  EmbeddingCache cache(1 << 20);
  CHECK(cache.Lookup(Key(1)) == nullptr);
  cache.Insert(Key(1), Image(16, 1.0f));
  auto hit = cache.Lookup(Key(1));
  REQUIRE(hit != nullptr);
  CHECK(hit->embedding[0] == 1.0f);
  const auto s = cache.stats();
  CHECK(s.hits == 1);
  CHECK(s.misses == 1);
  CHECK(s.entries == 1);
}

TEST_CASE("the least recently used entry is evicted first, and a lookup refreshes") {
  const size_t one = Image(1000, 0)->bytes();
  EmbeddingCache cache(3 * one);
  cache.Insert(Key(1), Image(1000, 1));
  cache.Insert(Key(2), Image(1000, 2));
  cache.Insert(Key(3), Image(1000, 3));
  REQUIRE(cache.Lookup(Key(1)) != nullptr);  // 1 is now the most recent
  cache.Insert(Key(4), Image(1000, 4));      // evicts 2
  CHECK(cache.Lookup(Key(2)) == nullptr);
  CHECK(cache.Lookup(Key(1)) != nullptr);
  CHECK(cache.Lookup(Key(3)) != nullptr);
  CHECK(cache.Lookup(Key(4)) != nullptr);
  CHECK(cache.stats().evictions == 1);
  CHECK(cache.stats().bytes <= 3 * one);
}

TEST_CASE("an entry larger than the cache is not kept, and a zero cache never hits") {
  EmbeddingCache small(100);
  small.Insert(Key(1), Image(1000, 1));
  CHECK(small.Lookup(Key(1)) == nullptr);
  CHECK(small.stats().entries == 0);
  EmbeddingCache off(0);
  off.Insert(Key(1), Image(1, 1));
  CHECK(off.Lookup(Key(1)) == nullptr);
}

TEST_CASE("re-inserting a key replaces its entry and keeps the byte count exact") {
  EmbeddingCache cache(1 << 20);
  cache.Insert(Key(1), Image(100, 1));
  cache.Insert(Key(1), Image(200, 2));
  CHECK(cache.stats().entries == 1);
  CHECK(cache.stats().bytes == Image(200, 0)->bytes());
  CHECK(cache.Lookup(Key(1))->embedding.size() == 200);
}

TEST_CASE("an evicted entry stays valid for whoever still holds it") {
  const size_t one = Image(10, 0)->bytes();
  EmbeddingCache cache(one);
  cache.Insert(Key(1), Image(10, 7));
  auto held = cache.Lookup(Key(1));
  cache.Insert(Key(2), Image(10, 8));
  CHECK(cache.Lookup(Key(1)) == nullptr);
  CHECK(held->embedding[9] == 7);
}

TEST_CASE("threads looking up, inserting and evicting at once keep the counts exact") {
  // Room for 8 of the 32 keys: most inserts evict, and entries are read
  // after their eviction by the threads still holding them.
  const size_t one = Image(64, 0)->bytes();
  EmbeddingCache cache(8 * one);
  constexpr int kThreads = 4;
  constexpr int kOps = 20000;
  std::atomic<uint64_t> lookups{0}, found{0}, wrong{0};  // Catch2 asserts only here
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint64_t x = 88172645463325252ull + t;
      for (int i = 0; i < kOps; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift
        const uint64_t k = x % 32;
        if (auto e = cache.Lookup(Key(k))) {
          ++found;
          // Every entry of key k holds k: never another key's value, never
          // freed under the reader.
          if (e->embedding.size() != 64 || e->embedding[63] != static_cast<float>(k)) ++wrong;
        } else {
          cache.Insert(Key(k), Image(64, static_cast<float>(k)));
        }
        ++lookups;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong.load() == 0);
  const auto s = cache.stats();
  CHECK(s.hits == found.load());
  CHECK(s.hits + s.misses == lookups.load());
  CHECK(s.entries <= 8);
  CHECK(s.bytes == s.entries * one);
  CHECK(s.evictions > 0);
}

}  // namespace
}  // namespace mmserve::encoder
