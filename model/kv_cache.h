// The language model's KV cache on the CPU: one fp32 allocation laid out as
//   [layers][2 (key, value)][blocks][block_size][kv_heads][head_dim]
// A token's K or V for one layer is a contiguous
// kv_heads * head_dim run at slot = block * block_size + offset, so a block
// of one layer's keys is one contiguous region (what KV transfer sends).
//
//   ASSIGN_OR_RETURN(auto kv, KvCache::Create({layers, blocks, 16, kv_heads, head_dim}));
//   float* k = kv->Key(layer);  // [blocks][block_size][kv_heads][head_dim]
//
// Which blocks belong to which sequence is not known here: callers pass block
// tables and slot mappings (see forward_batch.h). The memory is zeroed at
// creation.
// Thread-safety: none; the owner of the forward pass reads and writes it.
#ifndef MMSERVE_MODEL_KV_CACHE_H_
#define MMSERVE_MODEL_KV_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace mmserve::model {

struct KvCacheShape {
  int64_t num_layers = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;

  // Floats in one layer's keys (or values).
  int64_t LayerPlaneFloats() const { return num_blocks * block_size * num_kv_heads * head_dim; }
  size_t TotalBytes() const {
    return static_cast<size_t>(num_layers) * 2 * LayerPlaneFloats() * sizeof(float);
  }
};

class KvCache {
 public:
  // InvalidArgument for a non-positive dimension.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheShape& shape);
  // The same over `memory` the caller owns (e.g. a UCX shared-memory region
  // peers write KV into), which must hold shape.TotalBytes() and outlive the
  // cache; zeroed here. InvalidArgument also when `bytes` is too small.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvCache>> CreateOn(const KvCacheShape& shape,
                                                                         void* memory,
                                                                         size_t bytes);

  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheShape& shape() const { return shape_; }
  int64_t num_slots() const { return shape_.num_blocks * shape_.block_size; }
  size_t bytes() const { return shape_.TotalBytes(); }

  float* Key(int64_t layer) { return data_ + (2 * layer) * shape_.LayerPlaneFloats(); }
  float* Value(int64_t layer) { return data_ + (2 * layer + 1) * shape_.LayerPlaneFloats(); }
  const float* Key(int64_t layer) const { return data_ + (2 * layer) * shape_.LayerPlaneFloats(); }
  const float* Value(int64_t layer) const {
    return data_ + (2 * layer + 1) * shape_.LayerPlaneFloats();
  }

 private:
  KvCache(const KvCacheShape& shape, float* memory);

  KvCacheShape shape_;
  std::vector<float> owned_;  // empty with CreateOn
  float* data_;
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_KV_CACHE_H_
