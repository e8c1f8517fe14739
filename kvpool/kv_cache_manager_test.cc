#include "kvpool/kv_cache_manager.h"

#include <catch2/catch.hpp>
#include <set>
#include <vector>

namespace mmserve {
namespace kvpool {
namespace {

constexpr int kBlockSize = 4;

std::vector<TokenId> Tokens(int n, TokenId first = 1) {
  std::vector<TokenId> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

KvCacheManager MakeManager(int num_blocks, bool prefix_caching = true) {
  return KvCacheManager(KvCacheOptions{num_blocks, kBlockSize, prefix_caching});
}

// Allocates all of `tokens`, marks them computed (so full blocks are cached).
BlockTableId AllocateComputed(KvCacheManager& kv, const SequenceView& seq) {
  PrefixHit hit = kv.FindCachedPrefix(seq);
  absl::StatusOr<BlockTableId> t = kv.Allocate(seq, hit, static_cast<int>(seq.token_ids.size()));
  REQUIRE(t.ok());
  kv.CacheFullBlocks(*t, seq, static_cast<int>(seq.token_ids.size()));
  return *t;
}

TEST_CASE("allocate gives a table of ceil(tokens / block_size) blocks and slots follow it",
          "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(8);
  auto tokens = Tokens(10);
  SequenceView seq{tokens, {}};
  absl::StatusOr<BlockTableId> t = kv.Allocate(seq, PrefixHit{}, 10);
  REQUIRE(t.ok());
  absl::Span<const BlockId> table = kv.block_table(*t);
  REQUIRE(table.size() == 3);
  for (int p = 0; p < 10; ++p) {
    CHECK(kv.Slot(*t, p) == int64_t{table[p / kBlockSize].value} * kBlockSize + p % kBlockSize);
  }
  CHECK(kv.stats().num_used_blocks == 3);
  CHECK(kv.stats().usage() == Approx(3.0 / 8));
  CHECK(kv.CheckInvariants().ok());
}

TEST_CASE("append_slots takes a block only when a block boundary is crossed",
          "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(8);
  auto tokens = Tokens(4);
  absl::StatusOr<BlockTableId> t = kv.Allocate({tokens, {}}, PrefixHit{}, 4);
  REQUIRE(t.ok());
  CHECK(kv.AppendSlots(*t, 4));
  CHECK(kv.block_table(*t).size() == 1);
  CHECK(kv.AppendSlots(*t, 5));
  CHECK(kv.block_table(*t).size() == 2);
  CHECK(kv.AppendSlots(*t, 8));
  CHECK(kv.block_table(*t).size() == 2);
  CHECK(kv.AppendSlots(*t, 17));
  CHECK(kv.block_table(*t).size() == 5);
  CHECK(kv.CheckInvariants().ok());
}

TEST_CASE("append_slots fails without side effects when the pool is exhausted",
          "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(2);
  auto tokens = Tokens(4);
  BlockTableId t = *kv.Allocate({tokens, {}}, PrefixHit{}, 4);
  CHECK_FALSE(kv.AppendSlots(t, 13));  // needs 4 blocks, pool has 2
  CHECK(kv.block_table(t).size() == 1);
  CHECK(kv.num_free_blocks() == 1);
  CHECK(kv.AppendSlots(t, 8));
  CHECK_FALSE(kv.AppendSlots(t, 9));
  CHECK(kv.CheckInvariants().ok());
}

TEST_CASE("allocate rejects bad token counts and a full pool without changing anything",
          "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(2);
  auto tokens = Tokens(12);
  SequenceView seq{tokens, {}};
  CHECK_FALSE(kv.CanAllocate(PrefixHit{}, 12));
  CHECK(kv.Allocate(seq, PrefixHit{}, 12).status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(kv.Allocate(seq, PrefixHit{}, 13).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(kv.num_free_blocks() == 2);
  CHECK(kv.CheckInvariants().ok());
}

TEST_CASE("a later request hits the full blocks of a finished one but never the partial block",
          "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(16);
  auto a = Tokens(10);  // blocks [0,4) [4,8) full, [8,10) partial
  BlockTableId ta = AllocateComputed(kv, {a, {}});
  std::vector<BlockId> a_blocks(kv.block_table(ta).begin(), kv.block_table(ta).end());
  kv.Free(ta);

  auto b = Tokens(10);
  b[9] = 777;  // differs only inside the partial block
  PrefixHit hit = kv.FindCachedPrefix({b, {}});
  CHECK(hit.num_tokens == 8);
  REQUIRE(hit.blocks.size() == 2);
  CHECK(hit.blocks[0] == a_blocks[0]);
  CHECK(hit.blocks[1] == a_blocks[1]);
  BlockTableId tb = *kv.Allocate({b, {}}, hit, 10);
  CHECK(kv.stats().num_cached_blocks == 2);  // A's partial block was never cached
  CHECK(kv.block_table(tb).size() == 3);
  CHECK(kv.stats().prefix_hit_tokens == 8);
  CHECK(kv.stats().prefix_query_tokens == 20);
  CHECK(kv.stats().hit_rate() == Approx(8.0 / 20));
  CHECK(kv.CheckInvariants().ok());
}

TEST_CASE("a fully cached prompt still leaves its last token to compute", "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(16);
  auto a = Tokens(8);
  kv.Free(AllocateComputed(kv, {a, {}}));
  PrefixHit hit = kv.FindCachedPrefix({a, {}});
  CHECK(hit.num_tokens == 4);
}

TEST_CASE("blocks are cached only once their tokens are computed", "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(16);
  auto a = Tokens(12);
  BlockTableId ta = *kv.Allocate({a, {}}, PrefixHit{}, 12);
  CHECK(kv.FindCachedPrefix({a, {}}).num_tokens == 0);
  kv.CacheFullBlocks(ta, {a, {}}, 6);  // chunk 1 computed: one full block
  CHECK(kv.FindCachedPrefix({a, {}}).num_tokens == 4);
  CHECK(kv.stats().num_cached_blocks == 1);
  kv.CacheFullBlocks(ta, {a, {}}, 12);
  CHECK(kv.stats().num_cached_blocks == 3);
  CHECK(kv.FindCachedPrefix({a, {}}).num_tokens == 8);  // one token left to compute
}

TEST_CASE("two running requests share cached prefix blocks with matching ref counts",
          "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(16);
  auto a = Tokens(9);
  BlockTableId ta = AllocateComputed(kv, {a, {}});
  BlockTableId tb = AllocateComputed(kv, {a, {}});
  CHECK(kv.block_table(ta)[0] == kv.block_table(tb)[0]);
  CHECK(kv.block_table(ta)[1] == kv.block_table(tb)[1]);
  CHECK(kv.block_table(ta)[2] != kv.block_table(tb)[2]);
  CHECK(kv.stats().num_used_blocks == 4);
  CHECK(kv.CheckInvariants().ok());
  kv.Free(ta);
  CHECK(kv.stats().num_used_blocks == 3);
  kv.Free(tb);
  CHECK(kv.stats().num_used_blocks == 0);
  CHECK(kv.CheckInvariants().ok());
}

TEST_CASE("requests with equal placeholder tokens but different images share no KV",
          "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(16);
  std::vector<TokenId> tokens(9, 151655);
  std::vector<MultimodalSpan> cat = {{0, 8, HashBytes("cat.png")}};
  std::vector<MultimodalSpan> dog = {{0, 8, HashBytes("dog.png")}};
  kv.Free(AllocateComputed(kv, {tokens, cat}));
  CHECK(kv.FindCachedPrefix({tokens, dog}).num_tokens == 0);
  CHECK(kv.FindCachedPrefix({tokens, {}}).num_tokens == 0);
  CHECK(kv.FindCachedPrefix({tokens, cat}).num_tokens == 8);
}

TEST_CASE("free hit blocks count against the pool and are never evicted by the same allocation",
          "[kv_cache_manager]") {
  // 3 blocks. A caches 2 full blocks and frees them: all 3 blocks free, 2 cached.
  KvCacheManager kv = MakeManager(3);
  auto a = Tokens(9);
  kv.Free(AllocateComputed(kv, {a, {}}));
  // B hits both cached blocks and needs 2 more: 2 hits + 2 new > 3 free.
  auto b = Tokens(16);
  PrefixHit hit = kv.FindCachedPrefix({b, {}});
  REQUIRE(hit.num_tokens == 8);
  CHECK_FALSE(kv.CanAllocate(hit, 16));
  CHECK(kv.Allocate({b, {}}, hit, 16).status().code() == absl::StatusCode::kResourceExhausted);
  // With one new block it fits: the new block must be the uncached one.
  REQUIRE(kv.CanAllocate(hit, 12));
  BlockTableId tb = *kv.Allocate({b, {}}, hit, 12);
  std::set<int> distinct;
  for (BlockId blk : kv.block_table(tb)) distinct.insert(blk.value);
  CHECK(distinct.size() == 3);
  CHECK(kv.stats().num_evictions == 0);
  CHECK(kv.CheckInvariants().ok());
}

TEST_CASE("reusing a freed cached block evicts its hash and counts it", "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(3);
  auto a = Tokens(9);  // 3 blocks, the first 2 cached
  kv.Free(AllocateComputed(kv, {a, {}}));
  CHECK(kv.stats().num_cached_blocks == 2);
  auto c = Tokens(8, /*first=*/500);
  BlockTableId tc = *kv.Allocate({c, {}}, PrefixHit{}, 8);
  // The uncached block goes first, then the least recently used cached one.
  CHECK(kv.stats().num_evictions == 1);
  CHECK(kv.FindCachedPrefix({a, {}}).num_tokens == 4);
  CHECK(kv.AppendSlots(tc, 12));
  CHECK(kv.stats().num_evictions == 2);
  CHECK(kv.FindCachedPrefix({a, {}}).num_tokens == 0);
  CHECK(kv.CheckInvariants().ok());
}

TEST_CASE("with prefix caching off nothing is ever hit", "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(8, /*prefix_caching=*/false);
  auto a = Tokens(9);
  kv.Free(AllocateComputed(kv, {a, {}}));
  CHECK(kv.FindCachedPrefix({a, {}}).num_tokens == 0);
  CHECK(kv.stats().num_cached_blocks == 0);
}

TEST_CASE("freed table handles are reused and their blocks all return", "[kv_cache_manager]") {
  KvCacheManager kv = MakeManager(4);
  auto a = Tokens(16);
  BlockTableId t1 = *kv.Allocate({a, {}}, PrefixHit{}, 16);
  kv.Free(t1);
  BlockTableId t2 = *kv.Allocate({a, {}}, PrefixHit{}, 16);
  CHECK(t2 == t1);
  kv.Free(t2);
  CHECK(kv.num_free_blocks() == 4);
  CHECK(kv.CheckInvariants().ok());
}

}  // namespace
}  // namespace kvpool
}  // namespace mmserve
