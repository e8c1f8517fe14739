// The physical blocks of one KV pool: reference counts, the free list in
// eviction order, and the prefix cache's hash -> block map.
//
//   BlockPool pool(/*num_blocks=*/1024, /*block_size=*/16);
//   std::optional<BlockId> b = pool.TakeFreeBlock();  // ref 1; its old hash is evicted
//   pool.CacheBlock(*b, key, kRootCacheUid, block_tokens);  // findable under key.hash
//   pool.Release(*b);                                 // ref 0: free, but still cached
//   auto hit = pool.FindCached(key, kRootCacheUid, block_tokens);
//   if (hit) pool.Acquire(*hit);                      // reused: ref 1, off the free list
//
// Free list: every block with ref count 0, in the order it will be reused.
// Blocks holding no cached content go to the front (reusing them loses
// nothing); cached blocks go to the back when released, so the front-most
// cached block is the least recently used. Taking a block from the front
// evicts its hash. Every operation is O(1): the list is intrusive over block
// indices.
//
// A hit is re-checked against the block's stored tokens, parent hash and extra
// keys, and its parent link: every time a block enters the cache it gets a
// fresh cache uid, and a cached block records the uid of the cached block
// that precedes it in its sequence. A lookup walks the chain from the root,
// so a hit means the whole prefix matched block by block, and a 64-bit hash
// collision (of a block or of a parent) cannot hand out the wrong KV.
//
// Not thread-safe: owned by the scheduler thread, like the KvCacheManager
// that wraps it.
#ifndef MMSERVE_KVPOOL_BLOCK_POOL_H_
#define MMSERVE_KVPOOL_BLOCK_POOL_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvpool/block_hash.h"
#include "kvpool/kv_types.h"

namespace mmserve {
namespace kvpool {

// Parent uid of a sequence's first block.
inline constexpr uint64_t kRootCacheUid = 0;
// A parent that is not (or no longer) cached: nothing chains to it.
inline constexpr uint64_t kNoCacheUid = ~uint64_t{0};

class BlockPool {
 public:
  // Requires num_blocks >= 1 and block_size >= 1 (CHECKed: config is
  // validated by the caller).
  BlockPool(int num_blocks, int block_size);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  // Blocks with ref count 0, cached or not; all of them can be taken.
  int num_free_blocks() const { return num_free_; }
  // Blocks findable by hash, free or in use.
  int num_cached_blocks() const { return static_cast<int>(cached_.size()); }
  // Cached blocks whose hash was dropped to reuse the block.
  int64_t num_evictions() const { return num_evictions_; }

  int ref_count(BlockId b) const { return blocks_[b.value].ref_count; }
  bool is_cached(BlockId b) const { return blocks_[b.value].cached; }
  // Unique to this stay of `b` in the cache; meaningless when not cached.
  uint64_t cache_uid(BlockId b) const { return blocks_[b.value].uid; }

  // Takes the front block of the free list and returns it with ref count 1,
  // evicting its cached hash if it had one. nullopt when no block is free.
  [[nodiscard]] std::optional<BlockId> TakeFreeBlock();

  // Adds a reference to `b` (a prefix-cache hit), taking it off the free list
  // if it was free.
  void Acquire(BlockId b);

  // Drops one reference; at zero the block joins the free list (at the back
  // when cached, at the front otherwise). CHECKs that `b` was referenced.
  void Release(BlockId b);

  // The cached block under `key.hash`, only if its parent hash, extra keys,
  // parent uid and stored tokens equal `key`, `parent_uid` and `tokens`
  // (block_size of them).
  std::optional<BlockId> FindCached(const BlockKey& key, uint64_t parent_uid,
                                    absl::Span<const TokenId> tokens) const;

  // Makes in-use block `b` findable under `key` after the cached block with
  // uid `parent_uid` (kRootCacheUid for a first block), storing `tokens` for
  // later re-checks, and gives it a fresh cache uid. Returns false and
  // changes nothing when `b` is already cached or another block already
  // caches `key.hash` (identical content computed twice).
  bool CacheBlock(BlockId b, const BlockKey& key, uint64_t parent_uid,
                  absl::Span<const TokenId> tokens);

  // Test/debug helper: the free list holds exactly the blocks with ref count
  // 0, each once; the hash map and the blocks' cached flags agree.
  [[nodiscard]] absl::Status CheckInvariants() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    int32_t prev = -1;  // free-list neighbours (indices; the sentinel is num_blocks)
    int32_t next = -1;
    bool cached = false;
    BlockKey key;
    uint64_t uid = 0;         // cache uid while cached
    uint64_t parent_uid = 0;  // cache uid of the preceding block
  };

  int32_t sentinel() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t& prev_of(int32_t i) { return i == sentinel() ? head_prev_ : blocks_[i].prev; }
  int32_t& next_of(int32_t i) { return i == sentinel() ? head_next_ : blocks_[i].next; }
  void LinkAfter(int32_t pos, int32_t i);
  void Unlink(int32_t i);
  void Evict(int32_t i);

  const int block_size_;
  std::vector<Block> blocks_;
  std::vector<TokenId> tokens_;  // block_size tokens per cached block
  // Sentinel links of the circular free list: head_next_ is the front.
  int32_t head_next_;
  int32_t head_prev_;
  int num_free_ = 0;
  int64_t num_evictions_ = 0;
  uint64_t next_uid_ = 1;  // 0 is kRootCacheUid
  absl::flat_hash_map<uint64_t, BlockId> cached_;
};

}  // namespace kvpool
}  // namespace mmserve

#endif  // MMSERVE_KVPOOL_BLOCK_POOL_H_
