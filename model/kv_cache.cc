#include "model/kv_cache.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mmserve::model {

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheShape& shape) {
  if (shape.num_layers <= 0 || shape.num_blocks <= 0 || shape.block_size <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache dimensions must be positive: layers ", shape.num_layers, ", blocks ",
                     shape.num_blocks, ", block_size ", shape.block_size, ", kv_heads ",
                     shape.num_kv_heads, ", head_dim ", shape.head_dim));
  }
  return std::unique_ptr<KvCache>(new KvCache(shape));
}

KvCache::KvCache(const KvCacheShape& shape)
    : shape_(shape), data_(static_cast<size_t>(shape.num_layers) * 2 * shape.LayerPlaneFloats()) {}

}  // namespace mmserve::model
