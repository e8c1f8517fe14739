#include "kvpool/block_hash.h"

#include "common/hash.h"
#include "common/logging.h"

namespace mmserve {
namespace kvpool {

uint64_t ExtraKeysHash(absl::Span<const MultimodalSpan> spans, int64_t begin, int64_t end) {
  uint64_t h = kNoExtraKeys;
  bool any = false;
  for (const MultimodalSpan& s : spans) {
    const int64_t s_begin = s.offset;
    const int64_t s_end = s_begin + s.length;
    if (s_end <= begin || s_begin >= end) continue;
    any = true;
    h = HashCombine(h, s.content_hash.high);
    h = HashCombine(h, s.content_hash.low);
    // Where the input starts relative to this block: the same image placed at
    // a different offset gives different embeddings for the block's tokens.
    h = HashCombine(h, static_cast<uint64_t>(s_begin - begin));
  }
  // Keep kNoExtraKeys reserved for "no multimodal input".
  if (any && h == kNoExtraKeys) h = 1;
  return h;
}

uint64_t ChainBlockHash(uint64_t parent_hash, absl::Span<const TokenId> tokens,
                        uint64_t extra_keys) {
  uint64_t h = HashCombine(parent_hash, Hash64(tokens.data(), tokens.size() * sizeof(TokenId)));
  return extra_keys == kNoExtraKeys ? h : HashCombine(h, extra_keys);
}

BlockKey MakeBlockKey(uint64_t parent_hash, absl::Span<const TokenId> tokens,
                      absl::Span<const MultimodalSpan> spans, int block_index, int block_size) {
  const int64_t begin = int64_t{block_index} * block_size;
  const int64_t end = begin + block_size;
  CHECK_LE(end, static_cast<int64_t>(tokens.size())) << "block " << block_index << " is not full";
  BlockKey key;
  key.parent_hash = parent_hash;
  key.extra_keys = spans.empty() ? kNoExtraKeys : ExtraKeysHash(spans, begin, end);
  key.hash = ChainBlockHash(parent_hash, tokens.subspan(begin, block_size), key.extra_keys);
  return key;
}

}  // namespace kvpool
}  // namespace mmserve
