// Per-request block tables over one BlockPool, with prefix caching: the paged
// KV block manager of a language model instance.
//
//   KvCacheManager kv(KvCacheOptions{/*num_blocks=*/1024, /*block_size=*/16});
//   SequenceView seq{request_tokens, image_spans};
//   PrefixHit hit = kv.FindCachedPrefix(seq);               // full cached blocks to reuse
//   const int n = hit.num_tokens + chunk;                   // tokens that need slots
//   if (!kv.CanAllocate(hit, n)) return;                    // wait: pool is full
//   ASSIGN_OR_RETURN(BlockTableId t, kv.Allocate(seq, hit, n));
//   // every step: grow before computing, cache blocks once their KV exists
//   if (!kv.AppendSlots(t, num_computed + num_new)) { /* preempt someone */ }
//   kv.CacheFullBlocks(t, seq, num_computed);
//   kv.Free(t);                                             // on finish, abort or preempt
//
// The model runner reads kv.block_table(t) and kv.Slot(t, position): token
// position p lives in slot block_table[p / block_size] * block_size +
// p % block_size of the KV storage.
//
// Prefix caching: only full blocks are cached, and only once their KV has been
// computed (CacheFullBlocks, called after the step that computed them). The key
// is the chained block hash of block_hash.h, with multimodal content hashes as
// extra keys. A freed block keeps its hash on the free list until it is
// reused, so later requests can still hit it. Hit blocks are acquired before
// any new block is taken, so one allocation never hits and evicts the same
// block.
//
// Not thread-safe: one scheduler thread owns it.
#ifndef MMSERVE_KVPOOL_KV_CACHE_MANAGER_H_
#define MMSERVE_KVPOOL_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpool/block_pool.h"
#include "kvpool/kv_types.h"

namespace mmserve {
namespace kvpool {

struct KvCacheOptions {
  int num_blocks = 1024;
  int block_size = 16;
  bool enable_prefix_caching = true;
};

// Borrowed view of what the manager needs to know about a request: all of its
// known tokens (prompt, then outputs) and its multimodal spans (by offset).
struct SequenceView {
  absl::Span<const TokenId> token_ids;
  absl::Span<const MultimodalSpan> mm_spans;
};

// The longest cached prefix of a sequence, in full blocks.
struct PrefixHit {
  std::vector<BlockId> blocks;
  int num_tokens = 0;                   // blocks.size() * block_size
  uint64_t last_hash = kRootBlockHash;  // chain hash of the last hit block
  uint64_t last_uid = kRootCacheUid;    // cache uid of the last hit block
};

struct KvCacheStats {
  int num_blocks = 0;
  int num_used_blocks = 0;    // ref count > 0
  int num_cached_blocks = 0;  // findable by hash, used or free
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t num_evictions = 0;

  double usage() const { return num_blocks ? double(num_used_blocks) / num_blocks : 0.0; }
  double hit_rate() const {
    return prefix_query_tokens ? double(prefix_hit_tokens) / prefix_query_tokens : 0.0;
  }
};

class KvCacheManager {
 public:
  // Requires num_blocks >= 1 and block_size >= 1 (CHECKed; validate first).
  explicit KvCacheManager(const KvCacheOptions& options);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int block_size() const { return pool_.block_size(); }
  int num_blocks() const { return pool_.num_blocks(); }
  int num_free_blocks() const { return pool_.num_free_blocks(); }
  // Live block tables (allocated, not yet freed).
  int num_tables() const { return num_live_tables_; }
  // Blocks needed to hold `num_tokens` tokens.
  int BlocksFor(int64_t num_tokens) const {
    return static_cast<int>((num_tokens + block_size() - 1) / block_size());
  }

  // The longest run of full cached blocks that starts the sequence and whose
  // tokens, extra keys and chain match. Always leaves at least one token
  // uncached (so the last position's logits get computed). Empty when prefix
  // caching is off. Changes nothing.
  PrefixHit FindCachedPrefix(const SequenceView& seq) const;

  // Whether Allocate(seq, hit, num_tokens) would succeed: counts the blocks to
  // take plus the hit blocks that are free now (using them takes them too).
  bool CanAllocate(const PrefixHit& hit, int num_tokens) const;

  // Creates a block table that holds the hit blocks (ref counts +1) and new
  // blocks for tokens up to `num_tokens`. `hit` must come from
  // FindCachedPrefix(seq) with no pool change in between.
  // InvalidArgument unless hit.num_tokens <= num_tokens <= seq size;
  // ResourceExhausted when !CanAllocate (nothing changes then).
  [[nodiscard]] absl::StatusOr<BlockTableId> Allocate(const SequenceView& seq, const PrefixHit& hit,
                                                      int num_tokens);

  // Grows table `t` to hold `num_tokens` tokens, taking blocks only when a
  // block boundary is crossed. Returns false and changes nothing when the pool
  // has too few free blocks.
  [[nodiscard]] bool AppendSlots(BlockTableId t, int num_tokens);

  // Caches the blocks of `t` that the first `num_computed_tokens` tokens of
  // `seq` fill completely and that are not yet hashed. Call after the KV of
  // those tokens has been written.
  void CacheFullBlocks(BlockTableId t, const SequenceView& seq, int num_computed_tokens);

  // Releases every block of `t` (cached ones stay findable until reused) and
  // retires the handle.
  void Free(BlockTableId t);

  absl::Span<const BlockId> block_table(BlockTableId t) const { return tables_[t.value].blocks; }
  // KV slot of token `position` of `t`; the position must have a block.
  int64_t Slot(BlockTableId t, int position) const;

  KvCacheStats stats() const;

  // Test/debug helper: the pool's own invariants, plus: every block's ref
  // count equals the number of live tables holding it, a block held more than
  // once is a cached (shared) block, used + free = total.
  [[nodiscard]] absl::Status CheckInvariants() const;

 private:
  struct Table {
    std::vector<BlockId> blocks;
    int num_hashed_blocks = 0;  // leading blocks whose chain hash is known
    uint64_t last_hash = kRootBlockHash;
    // Cache uid of the cached block with the same content as the last hashed
    // block (kNoCacheUid once the chain is not cached: nothing after it can
    // ever be found, so it is not cached either).
    uint64_t last_uid = kRootCacheUid;
    bool live = false;
  };

  Table& table(BlockTableId t);

  const bool enable_prefix_caching_;
  BlockPool pool_;
  std::vector<Table> tables_;  // indexed by BlockTableId; retired ones are reused
  std::vector<int32_t> free_table_ids_;
  int num_live_tables_ = 0;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace kvpool
}  // namespace mmserve

#endif  // MMSERVE_KVPOOL_KV_CACHE_MANAGER_H_
