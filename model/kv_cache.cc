#include "model/kv_cache.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mmserve::model {

namespace {

absl::Status CheckShape(const KvCacheShape& shape) {
  if (shape.num_layers <= 0 || shape.num_blocks <= 0 || shape.block_size <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache dimensions must be positive: layers ", shape.num_layers, ", blocks ",
                     shape.num_blocks, ", block_size ", shape.block_size, ", kv_heads ",
                     shape.num_kv_heads, ", head_dim ", shape.head_dim));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheShape& shape) {
  if (absl::Status s = CheckShape(shape); !s.ok()) return s;
  return std::unique_ptr<KvCache>(new KvCache(shape, nullptr));
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::CreateOn(const KvCacheShape& shape, void* memory,
                                                           size_t bytes) {
  if (absl::Status s = CheckShape(shape); !s.ok()) return s;
  if (memory == nullptr || bytes < shape.TotalBytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache memory of ", bytes, " bytes; needs ", shape.TotalBytes()));
  }
  std::memset(memory, 0, shape.TotalBytes());
  return std::unique_ptr<KvCache>(new KvCache(shape, static_cast<float*>(memory)));
}

KvCache::KvCache(const KvCacheShape& shape, float* memory) : shape_(shape) {
  if (memory == nullptr) {
    owned_.resize(static_cast<size_t>(shape.num_layers) * 2 * shape.LayerPlaneFloats());
    memory = owned_.data();
  }
  data_ = memory;
}

}  // namespace mmserve::model
