#include "kvpool/block_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mmserve {
namespace kvpool {

BlockPool::BlockPool(int num_blocks, int block_size)
    : block_size_(block_size),
      blocks_(num_blocks),
      tokens_(static_cast<size_t>(num_blocks) * block_size),
      head_next_(num_blocks),
      head_prev_(num_blocks) {
  CHECK_GE(num_blocks, 1);
  CHECK_GE(block_size, 1);
  // All blocks start free, in index order.
  for (int32_t i = 0; i < num_blocks; ++i) LinkAfter(head_prev_, i);
  cached_.reserve(num_blocks);
}

void BlockPool::LinkAfter(int32_t pos, int32_t i) {
  const int32_t nxt = next_of(pos);
  blocks_[i].prev = pos;
  blocks_[i].next = nxt;
  next_of(pos) = i;
  prev_of(nxt) = i;
  ++num_free_;
}

void BlockPool::Unlink(int32_t i) {
  Block& b = blocks_[i];
  next_of(b.prev) = b.next;
  prev_of(b.next) = b.prev;
  b.prev = b.next = -1;
  --num_free_;
}

void BlockPool::Evict(int32_t i) {
  Block& b = blocks_[i];
  if (!b.cached) return;
  cached_.erase(b.key.hash);
  b.cached = false;
  b.uid = 0;
  ++num_evictions_;
}

std::optional<BlockId> BlockPool::TakeFreeBlock() {
  const int32_t i = head_next_;
  if (i == sentinel()) return std::nullopt;
  Unlink(i);
  Evict(i);
  blocks_[i].ref_count = 1;
  return BlockId{i};
}

void BlockPool::Acquire(BlockId id) {
  Block& b = blocks_[id.value];
  if (b.ref_count++ == 0) Unlink(id.value);
}

void BlockPool::Release(BlockId id) {
  Block& b = blocks_[id.value];
  CHECK_GT(b.ref_count, 0) << id << " released more often than acquired";
  if (--b.ref_count > 0) return;
  // Uncached blocks are reused first; cached ones wait at the back (LRU).
  LinkAfter(b.cached ? head_prev_ : sentinel(), id.value);
}

std::optional<BlockId> BlockPool::FindCached(const BlockKey& key, uint64_t parent_uid,
                                             absl::Span<const TokenId> tokens) const {
  auto it = cached_.find(key.hash);
  if (it == cached_.end()) return std::nullopt;
  const BlockId id = it->second;
  const Block& b = blocks_[id.value];
  if (b.parent_uid != parent_uid || b.key.parent_hash != key.parent_hash ||
      b.key.extra_keys != key.extra_keys) {
    return std::nullopt;
  }
  const TokenId* stored = &tokens_[static_cast<size_t>(id.value) * block_size_];
  if (tokens.size() != static_cast<size_t>(block_size_) ||
      !std::equal(tokens.begin(), tokens.end(), stored)) {
    return std::nullopt;
  }
  return id;
}

bool BlockPool::CacheBlock(BlockId id, const BlockKey& key, uint64_t parent_uid,
                           absl::Span<const TokenId> tokens) {
  Block& b = blocks_[id.value];
  CHECK_GT(b.ref_count, 0) << "only in-use blocks are cached: " << id;
  CHECK_EQ(tokens.size(), static_cast<size_t>(block_size_));
  if (b.cached) return false;
  if (!cached_.try_emplace(key.hash, id).second) return false;
  b.cached = true;
  b.key = key;
  b.uid = next_uid_++;
  b.parent_uid = parent_uid;
  std::copy(tokens.begin(), tokens.end(), &tokens_[static_cast<size_t>(id.value) * block_size_]);
  return true;
}

absl::Status BlockPool::CheckInvariants() const {
  std::vector<bool> on_list(blocks_.size(), false);
  int listed = 0;
  int32_t prev = sentinel();
  for (int32_t i = head_next_; i != sentinel(); i = blocks_[i].next) {
    if (i < 0 || i > sentinel() || on_list[i]) {
      return absl::InternalError(absl::StrCat("free list is corrupt at block ", i));
    }
    if (blocks_[i].prev != prev) return absl::InternalError(absl::StrCat("bad prev link ", i));
    if (blocks_[i].ref_count != 0) {
      return absl::InternalError(
          absl::StrCat("block ", i, " on the free list has ref count ", blocks_[i].ref_count));
    }
    on_list[i] = true;
    prev = i;
    ++listed;
  }
  if (listed != num_free_) {
    return absl::InternalError(
        absl::StrCat("free list holds ", listed, " blocks, count says ", num_free_));
  }
  int num_cached_flags = 0;
  for (int32_t i = 0; i < sentinel(); ++i) {
    const Block& b = blocks_[i];
    if (b.ref_count < 0) return absl::InternalError(absl::StrCat("negative ref count ", i));
    if (b.ref_count == 0 && !on_list[i]) {
      return absl::InternalError(absl::StrCat("free block ", i, " is not on the free list"));
    }
    if (!b.cached) continue;
    ++num_cached_flags;
    auto it = cached_.find(b.key.hash);
    if (it == cached_.end() || it->second.value != i) {
      return absl::InternalError(absl::StrCat("cached block ", i, " is missing from the map"));
    }
  }
  if (num_cached_flags != static_cast<int>(cached_.size())) {
    return absl::InternalError(absl::StrCat("hash map holds ", cached_.size(), " blocks, ",
                                            num_cached_flags, " are flagged cached"));
  }
  return absl::OkStatus();
}

}  // namespace kvpool
}  // namespace mmserve
