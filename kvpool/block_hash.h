// Chained hashes of full KV blocks, the keys of the prefix cache.
//
//   uint64_t parent = kRootBlockHash;
//   for (int b = 0; b < num_full_blocks; ++b) {
//     BlockKey key = MakeBlockKey(parent, tokens, spans, b, block_size);
//     ...  // look key.hash up, or cache the block under it
//     parent = key.hash;
//   }
//
// hash(block b) = HashCombine(HashCombine(parent hash, Hash64(block tokens)),
//                             extra keys hash)
// where the extra keys are, for every multimodal span that overlaps the block,
// its content hash and where the span starts relative to the block. Because
// the parent hash is folded in, equal hashes mean equal whole prefixes (up to
// 64-bit collisions, which the pool guards against by re-checking the block's
// tokens, parent hash and extra keys on every hit).
//
// Pure functions; thread-safe.
#ifndef MMSERVE_KVPOOL_BLOCK_HASH_H_
#define MMSERVE_KVPOOL_BLOCK_HASH_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kvpool/kv_types.h"

namespace mmserve {
namespace kvpool {

// The parent hash of a sequence's first block.
inline constexpr uint64_t kRootBlockHash = 0x6d6d73657276652dULL;

// Extra-keys hash of a block with no multimodal input.
inline constexpr uint64_t kNoExtraKeys = 0;

// Everything that identifies the contents of one full block.
struct BlockKey {
  uint64_t hash = 0;         // the chained hash (the cache key)
  uint64_t parent_hash = 0;  // hash of the previous block, or kRootBlockHash
  uint64_t extra_keys = kNoExtraKeys;
};

// Hash of the extra keys of token range [begin, end): the content hashes (and
// start offsets relative to `begin`) of the spans in `spans` that overlap it,
// in span order. kNoExtraKeys when none overlaps.
uint64_t ExtraKeysHash(absl::Span<const MultimodalSpan> spans, int64_t begin, int64_t end);

// The chained hash of a block with `tokens` under `parent_hash`.
uint64_t ChainBlockHash(uint64_t parent_hash, absl::Span<const TokenId> tokens,
                        uint64_t extra_keys);

// The key of full block `block_index` of a sequence whose tokens are `tokens`
// (which must hold at least (block_index + 1) * block_size of them).
BlockKey MakeBlockKey(uint64_t parent_hash, absl::Span<const TokenId> tokens,
                      absl::Span<const MultimodalSpan> spans, int block_index, int block_size);

}  // namespace kvpool
}  // namespace mmserve

#endif  // MMSERVE_KVPOOL_BLOCK_HASH_H_
