#include "kvpool/block_pool.h"

#include <catch2/catch.hpp>
#include <vector>

namespace mmserve {
namespace kvpool {
namespace {

constexpr int kBlockSize = 4;

std::vector<TokenId> Tokens(TokenId first) { return {first, first + 1, first + 2, first + 3}; }

BlockKey KeyFor(const std::vector<TokenId>& tokens, uint64_t parent = kRootBlockHash) {
  return MakeBlockKey(parent, tokens, {}, 0, kBlockSize);
}

TEST_CASE("a new pool has every block free and hands out each block once", "[block_pool]") {
  BlockPool pool(3, kBlockSize);
  CHECK(pool.num_free_blocks() == 3);
  std::vector<int> seen;
  for (int i = 0; i < 3; ++i) {
    std::optional<BlockId> b = pool.TakeFreeBlock();
    REQUIRE(b.has_value());
    CHECK(pool.ref_count(*b) == 1);
    seen.push_back(b->value);
  }
  CHECK(seen == std::vector<int>{0, 1, 2});
  CHECK(pool.num_free_blocks() == 0);
  CHECK_FALSE(pool.TakeFreeBlock().has_value());
  CHECK(pool.CheckInvariants().ok());
}

TEST_CASE("a released block keeps its hash and can still be found", "[block_pool]") {
  BlockPool pool(2, kBlockSize);
  BlockId b = *pool.TakeFreeBlock();
  auto tokens = Tokens(10);
  REQUIRE(pool.CacheBlock(b, KeyFor(tokens), kRootCacheUid, tokens));
  pool.Release(b);
  CHECK(pool.num_free_blocks() == 2);
  std::optional<BlockId> hit = pool.FindCached(KeyFor(tokens), kRootCacheUid, tokens);
  REQUIRE(hit.has_value());
  CHECK(*hit == b);
  // Acquiring the hit takes it off the free list.
  pool.Acquire(*hit);
  CHECK(pool.num_free_blocks() == 1);
  CHECK(pool.ref_count(b) == 1);
  CHECK(pool.CheckInvariants().ok());
}

TEST_CASE("uncached free blocks are reused before cached ones", "[block_pool]") {
  BlockPool pool(2, kBlockSize);
  BlockId cached = *pool.TakeFreeBlock();
  BlockId plain = *pool.TakeFreeBlock();
  auto tokens = Tokens(10);
  REQUIRE(pool.CacheBlock(cached, KeyFor(tokens), kRootCacheUid, tokens));
  pool.Release(cached);
  pool.Release(plain);
  CHECK(*pool.TakeFreeBlock() == plain);
  CHECK(pool.num_evictions() == 0);
  CHECK(pool.FindCached(KeyFor(tokens), kRootCacheUid, tokens).has_value());
}

TEST_CASE("cached free blocks are evicted least recently released first", "[block_pool]") {
  BlockPool pool(3, kBlockSize);
  std::vector<BlockId> blocks;
  std::vector<std::vector<TokenId>> tokens;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(*pool.TakeFreeBlock());
    tokens.push_back(Tokens(100 * (i + 1)));
    REQUIRE(pool.CacheBlock(blocks[i], KeyFor(tokens[i]), kRootCacheUid, tokens[i]));
  }
  // Release order 2, 0, 1: block 2 is the least recently used.
  pool.Release(blocks[2]);
  pool.Release(blocks[0]);
  pool.Release(blocks[1]);
  CHECK(*pool.TakeFreeBlock() == blocks[2]);
  CHECK(pool.num_evictions() == 1);
  CHECK_FALSE(pool.FindCached(KeyFor(tokens[2]), kRootCacheUid, tokens[2]).has_value());
  CHECK(pool.FindCached(KeyFor(tokens[0]), kRootCacheUid, tokens[0]).has_value());
  CHECK(*pool.TakeFreeBlock() == blocks[0]);
  CHECK(pool.num_evictions() == 2);
  CHECK(pool.num_cached_blocks() == 1);
  CHECK(pool.CheckInvariants().ok());
}

TEST_CASE("a hit with the right hash but different tokens, parent or extra keys misses",
          "[block_pool]") {
  BlockPool pool(1, kBlockSize);
  BlockId b = *pool.TakeFreeBlock();
  auto tokens = Tokens(10);
  BlockKey key = KeyFor(tokens);
  REQUIRE(pool.CacheBlock(b, key, kRootCacheUid, tokens));
  // A forged key with the same 64-bit hash stands in for a hash collision.
  auto other = Tokens(20);
  CHECK_FALSE(pool.FindCached(key, kRootCacheUid, other).has_value());
  BlockKey wrong_parent = key;
  wrong_parent.parent_hash ^= 1;
  CHECK_FALSE(pool.FindCached(wrong_parent, kRootCacheUid, tokens).has_value());
  BlockKey wrong_extra = key;
  wrong_extra.extra_keys = 5;
  CHECK_FALSE(pool.FindCached(wrong_extra, kRootCacheUid, tokens).has_value());
  CHECK(pool.FindCached(key, kRootCacheUid, tokens).has_value());
}

TEST_CASE("a hit must follow the cached parent it was computed after, not just its hash",
          "[block_pool]") {
  BlockPool pool(3, kBlockSize);
  BlockId parent = *pool.TakeFreeBlock();
  BlockId child = *pool.TakeFreeBlock();
  auto t0 = Tokens(10), t1 = Tokens(20);
  BlockKey k0 = KeyFor(t0);
  BlockKey k1 = MakeBlockKey(k0.hash, t1, {}, 0, kBlockSize);
  REQUIRE(pool.CacheBlock(parent, k0, kRootCacheUid, t0));
  REQUIRE(pool.CacheBlock(child, k1, pool.cache_uid(parent), t1));
  CHECK(pool.FindCached(k1, pool.cache_uid(parent), t1) == child);
  // The parent is evicted and its hash cached again by a new block: same
  // parent hash, but not the KV the child was computed after.
  const uint64_t old_uid = pool.cache_uid(parent);
  pool.Release(parent);
  BlockId reused = *pool.TakeFreeBlock();  // the uncached third block goes first
  pool.Release(reused);
  CHECK(pool.CacheBlock(*pool.TakeFreeBlock(), k0, kRootCacheUid, t0) == false);
  CHECK(pool.is_cached(parent));
  BlockId again = *pool.TakeFreeBlock();  // now the parent itself is evicted
  CHECK(again == parent);
  CHECK_FALSE(pool.is_cached(parent));
  REQUIRE(pool.CacheBlock(again, k0, kRootCacheUid, t0));
  CHECK(pool.cache_uid(again) != old_uid);
  CHECK_FALSE(pool.FindCached(k1, pool.cache_uid(again), t1).has_value());
  CHECK_FALSE(pool.FindCached(k1, kRootCacheUid, t1).has_value());
  CHECK(pool.CheckInvariants().ok());
}

TEST_CASE("a second block with an already cached hash is not cached", "[block_pool]") {
  BlockPool pool(2, kBlockSize);
  BlockId a = *pool.TakeFreeBlock();
  BlockId b = *pool.TakeFreeBlock();
  auto tokens = Tokens(10);
  CHECK(pool.CacheBlock(a, KeyFor(tokens), kRootCacheUid, tokens));
  CHECK_FALSE(pool.CacheBlock(b, KeyFor(tokens), kRootCacheUid, tokens));
  CHECK_FALSE(pool.CacheBlock(a, KeyFor(Tokens(30)), kRootCacheUid, Tokens(30)));
  CHECK(pool.is_cached(a));
  CHECK_FALSE(pool.is_cached(b));
  CHECK(*pool.FindCached(KeyFor(tokens), kRootCacheUid, tokens) == a);
  CHECK(pool.CheckInvariants().ok());
}

TEST_CASE("a shared block returns to the free list only when its last holder releases it",
          "[block_pool]") {
  BlockPool pool(1, kBlockSize);
  BlockId b = *pool.TakeFreeBlock();
  auto tokens = Tokens(10);
  REQUIRE(pool.CacheBlock(b, KeyFor(tokens), kRootCacheUid, tokens));
  pool.Acquire(b);
  CHECK(pool.ref_count(b) == 2);
  pool.Release(b);
  CHECK(pool.num_free_blocks() == 0);
  pool.Release(b);
  CHECK(pool.num_free_blocks() == 1);
  CHECK(pool.CheckInvariants().ok());
}

}  // namespace
}  // namespace kvpool
}  // namespace mmserve
