#include "kvpool/kv_cache_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mmserve {
namespace kvpool {

KvCacheManager::KvCacheManager(const KvCacheOptions& options)
    : enable_prefix_caching_(options.enable_prefix_caching),
      pool_(options.num_blocks, options.block_size) {}

KvCacheManager::Table& KvCacheManager::table(BlockTableId t) {
  DCHECK(t.valid() && t.value < static_cast<int32_t>(tables_.size()));
  Table& tab = tables_[t.value];
  DCHECK(tab.live);
  return tab;
}

PrefixHit KvCacheManager::FindCachedPrefix(const SequenceView& seq) const {
  PrefixHit hit;
  if (!enable_prefix_caching_ || seq.token_ids.empty()) return hit;
  const int bs = block_size();
  // Leave at least one token to compute.
  const int max_blocks = static_cast<int>((seq.token_ids.size() - 1) / bs);
  for (int b = 0; b < max_blocks; ++b) {
    const BlockKey key = MakeBlockKey(hit.last_hash, seq.token_ids, seq.mm_spans, b, bs);
    std::optional<BlockId> block =
        pool_.FindCached(key, hit.last_uid, seq.token_ids.subspan(size_t(b) * bs, bs));
    if (!block) break;
    hit.blocks.push_back(*block);
    hit.last_hash = key.hash;
    hit.last_uid = pool_.cache_uid(*block);
  }
  hit.num_tokens = static_cast<int>(hit.blocks.size()) * bs;
  return hit;
}

bool KvCacheManager::CanAllocate(const PrefixHit& hit, int num_tokens) const {
  const int new_blocks = std::max(0, BlocksFor(num_tokens) - static_cast<int>(hit.blocks.size()));
  int free_hits = 0;  // hit blocks on the free list: acquiring them uses free blocks too
  for (BlockId b : hit.blocks) free_hits += pool_.ref_count(b) == 0;
  return new_blocks + free_hits <= pool_.num_free_blocks();
}

absl::StatusOr<BlockTableId> KvCacheManager::Allocate(const SequenceView& seq, const PrefixHit& hit,
                                                      int num_tokens) {
  if (num_tokens < hit.num_tokens || num_tokens > static_cast<int>(seq.token_ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", num_tokens,
                                                   " tokens: prefix hit has ", hit.num_tokens,
                                                   ", sequence has ", seq.token_ids.size()));
  }
  if (!CanAllocate(hit, num_tokens)) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool has ", pool_.num_free_blocks(),
                                                     " free blocks, ", num_tokens,
                                                     " tokens need more"));
  }
  BlockTableId id;
  if (!free_table_ids_.empty()) {
    id.value = free_table_ids_.back();
    free_table_ids_.pop_back();
  } else {
    id.value = static_cast<int32_t>(tables_.size());
    tables_.emplace_back();
  }
  Table& t = tables_[id.value];
  t.live = true;
  ++num_live_tables_;
  // Acquire the hits first: taking new blocks may evict free cached blocks,
  // and a block acquired here is no longer free, so it cannot be evicted.
  for (BlockId b : hit.blocks) {
    DCHECK(pool_.is_cached(b));
    pool_.Acquire(b);
    t.blocks.push_back(b);
  }
  t.num_hashed_blocks = static_cast<int>(hit.blocks.size());
  t.last_hash = hit.last_hash;
  t.last_uid = hit.last_uid;
  CHECK(AppendSlots(id, num_tokens)) << "CanAllocate promised enough free blocks";
  prefix_query_tokens_ += static_cast<int64_t>(seq.token_ids.size());
  prefix_hit_tokens_ += hit.num_tokens;
  return id;
}

bool KvCacheManager::AppendSlots(BlockTableId id, int num_tokens) {
  Table& t = table(id);
  const int needed = BlocksFor(num_tokens) - static_cast<int>(t.blocks.size());
  if (needed <= 0) return true;
  if (needed > pool_.num_free_blocks()) return false;
  for (int i = 0; i < needed; ++i) {
    std::optional<BlockId> b = pool_.TakeFreeBlock();
    CHECK(b.has_value());
    t.blocks.push_back(*b);
  }
  return true;
}

void KvCacheManager::CacheFullBlocks(BlockTableId id, const SequenceView& seq,
                                     int num_computed_tokens) {
  Table& t = table(id);
  const int bs = block_size();
  const int limit = std::min<int>(num_computed_tokens, static_cast<int>(seq.token_ids.size()));
  const int full = std::min(limit / bs, static_cast<int>(t.blocks.size()));
  if (t.num_hashed_blocks >= full) return;
  if (!enable_prefix_caching_) {
    t.num_hashed_blocks = full;
    return;
  }
  for (; t.num_hashed_blocks < full; ++t.num_hashed_blocks) {
    if (t.last_uid == kNoCacheUid) {  // the chain left the cache: nothing more to find
      t.num_hashed_blocks = full;
      break;
    }
    const int b = t.num_hashed_blocks;
    const BlockKey key = MakeBlockKey(t.last_hash, seq.token_ids, seq.mm_spans, b, bs);
    const absl::Span<const TokenId> tokens = seq.token_ids.subspan(size_t(b) * bs, bs);
    const BlockId block = t.blocks[b];
    DCHECK(!pool_.is_cached(block));  // hit blocks are below num_hashed_blocks
    uint64_t uid = kNoCacheUid;
    if (pool_.CacheBlock(block, key, t.last_uid, tokens)) {
      uid = pool_.cache_uid(block);
    } else if (std::optional<BlockId> twin = pool_.FindCached(key, t.last_uid, tokens)) {
      uid = pool_.cache_uid(*twin);  // identical content computed twice: chain via the twin
    }
    t.last_hash = key.hash;
    t.last_uid = uid;
  }
}

void KvCacheManager::Free(BlockTableId id) {
  Table& t = table(id);
  // Release the tail first: the pool appends cached blocks to the back of its
  // free list, so a sequence's later blocks get evicted before its prefix,
  // which more requests share.
  for (auto it = t.blocks.rbegin(); it != t.blocks.rend(); ++it) pool_.Release(*it);
  t.blocks.clear();  // keeps capacity for the next user of this slot
  t.num_hashed_blocks = 0;
  t.last_hash = kRootBlockHash;
  t.last_uid = kRootCacheUid;
  t.live = false;
  --num_live_tables_;
  free_table_ids_.push_back(id.value);
}

int64_t KvCacheManager::Slot(BlockTableId id, int position) const {
  const Table& t = tables_[id.value];
  const int bs = block_size();
  DCHECK_LT(position / bs, static_cast<int>(t.blocks.size()));
  return int64_t{t.blocks[position / bs].value} * bs + position % bs;
}

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats s;
  s.num_blocks = pool_.num_blocks();
  s.num_used_blocks = pool_.num_blocks() - pool_.num_free_blocks();
  s.num_cached_blocks = pool_.num_cached_blocks();
  s.prefix_query_tokens = prefix_query_tokens_;
  s.prefix_hit_tokens = prefix_hit_tokens_;
  s.num_evictions = pool_.num_evictions();
  return s;
}

absl::Status KvCacheManager::CheckInvariants() const {
  if (absl::Status s = pool_.CheckInvariants(); !s.ok()) return s;
  std::vector<int> holders(pool_.num_blocks(), 0);
  std::vector<size_t> seen_in(pool_.num_blocks(), tables_.size());
  int live = 0;
  for (size_t ti = 0; ti < tables_.size(); ++ti) {
    const Table& t = tables_[ti];
    if (!t.live) {
      if (!t.blocks.empty()) return absl::InternalError(absl::StrCat("retired table ", ti));
      continue;
    }
    ++live;
    if (t.num_hashed_blocks > static_cast<int>(t.blocks.size())) {
      return absl::InternalError(absl::StrCat("table ", ti, " hashed more blocks than it has"));
    }
    for (BlockId b : t.blocks) {
      if (!b.valid() || b.value >= pool_.num_blocks()) {
        return absl::InternalError(absl::StrCat("table ", ti, " holds invalid ", b.value));
      }
      if (seen_in[b.value] == ti) {
        return absl::InternalError(absl::StrCat("table ", ti, " holds block ", b.value, " twice"));
      }
      seen_in[b.value] = ti;
      ++holders[b.value];
    }
  }
  if (live != num_live_tables_) return absl::InternalError("live table count is wrong");
  int used = 0;
  for (int b = 0; b < pool_.num_blocks(); ++b) {
    const int ref = pool_.ref_count(BlockId{b});
    used += ref > 0;
    if (ref != holders[b]) {
      return absl::InternalError(
          absl::StrCat("block ", b, " has ref count ", ref, " but ", holders[b], " holders"));
    }
    if (holders[b] > 1 && !pool_.is_cached(BlockId{b})) {
      return absl::InternalError(
          absl::StrCat("uncached block ", b, " is owned ", holders[b], " times"));
    }
  }
  if (used + pool_.num_free_blocks() != pool_.num_blocks()) {
    return absl::InternalError(absl::StrCat(used, " used + ", pool_.num_free_blocks(),
                                            " free != ", pool_.num_blocks(), " blocks"));
  }
  return absl::OkStatus();
}

}  // namespace kvpool
}  // namespace mmserve
