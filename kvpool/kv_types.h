// Small value types shared by the KV pool and its users: token ids, typed
// block and block-table handles, and the multimodal placeholder span whose
// content hash keys prefix-cache blocks.
//
//   kvpool::BlockId b{7};
//   if (b.valid()) slot = int64_t{b.value} * block_size + offset;
//   kvpool::MultimodalSpan image{/*offset=*/5, /*length=*/64, HashBytes(png)};
//
// All types are plain values; thread-compatible.
#ifndef MMSERVE_KVPOOL_KV_TYPES_H_
#define MMSERVE_KVPOOL_KV_TYPES_H_

#include <cstdint>
#include <ostream>

#include "common/hash.h"

namespace mmserve {
namespace kvpool {

// A vocabulary token id.
using TokenId = int32_t;

// "No token": used where a slot holds no sampled token (e.g. a prefill chunk
// that does not reach the end of the prompt).
inline constexpr TokenId kNoToken = -1;

// Index of one physical KV block in the pool, in [0, num_blocks). A
// default-constructed BlockId is invalid.
struct BlockId {
  int32_t value = -1;

  bool valid() const { return value >= 0; }
  bool operator==(BlockId o) const { return value == o.value; }
  bool operator!=(BlockId o) const { return value != o.value; }
  friend std::ostream& operator<<(std::ostream& os, BlockId b) { return os << "block#" << b.value; }
};

// Handle of one request's block table inside a KvCacheManager. Handles are
// recycled after Free(); a default-constructed one is invalid.
struct BlockTableId {
  int32_t value = -1;

  bool valid() const { return value >= 0; }
  bool operator==(BlockTableId o) const { return value == o.value; }
  bool operator!=(BlockTableId o) const { return value != o.value; }
  friend std::ostream& operator<<(std::ostream& os, BlockTableId t) {
    return os << "table#" << t.value;
  }
};

// The run of placeholder tokens [offset, offset + length) that a multimodal
// input (an image) expands to, and the content hash of that input. Blocks that
// overlap the span carry the hash as an extra key, so two prompts with equal
// placeholder tokens but different images never share KV.
struct MultimodalSpan {
  int32_t offset = 0;
  int32_t length = 0;
  ContentHash content_hash;
};

}  // namespace kvpool
}  // namespace mmserve

#endif  // MMSERVE_KVPOOL_KV_TYPES_H_
