// The step of a tensor-parallel instance on each side of the step ring.
//
//   // rank 0, once the KV cache is sized, and per scheduler step (instead
//   // of model.Forward):
//   RETURN_IF_ERROR(AllocateKvOnAllRanks(ring, num_blocks, block_size));
//   RETURN_IF_ERROR(ForwardOnAllRanks(ring, model, kv, batch, placement, &logits));
//   // ranks 1..n-1, their whole life after loading their shard:
//   absl::Status why = RunShardSteps(ring, model, shared_buffer);
//
// Rank 0 publishes the step before running its own part, so every rank
// enters the forward's collectives with the same batch. A rank's loop ends
// OK on a kStop step and otherwise with the first error: UNAVAILABLE when
// the instance is out of service (a rank died), which also fails rank 0's
// next collective or Publish.
// Thread-safety: each call is driven by its rank's one step thread.
#ifndef MMSERVE_WORKER_TP_STEP_LOOP_H_
#define MMSERVE_WORKER_TP_STEP_LOOP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/qwen2_model.h"
#include "worker/step_ring.h"

namespace mmserve::worker {

// Rank 0: sends `batch` to the other ranks (its image rows as `placement`
// descriptors; kSharedBuffer needs the rows' values inside shared_buffer),
// then runs this rank's forward. *logits as Qwen2Model::Forward on rank 0.
[[nodiscard]] absl::Status ForwardOnAllRanks(StepRing& ring, model::Qwen2Model& model,
                                             model::KvCache& kv, const model::ForwardBatch& batch,
                                             EmbeddingPlacement placement,
                                             std::vector<float>* logits,
                                             absl::Span<const uint8_t> shared_buffer = {});

// Rank 0: has the other ranks (re)create their KV caches (rank 0 creates
// its own), before the forwards that use them.
[[nodiscard]] absl::Status AllocateKvOnAllRanks(StepRing& ring, int64_t num_blocks,
                                                int64_t block_size);

// Rank 0: tells the other ranks to leave RunShardSteps.
[[nodiscard]] absl::Status StopShardSteps(StepRing& ring);

// Ranks 1..n-1 of a decode instance: what the step loop calls for the KV
// hand-off steps (worker/tp_kv_receiver.h implements it over UCX). Each call
// runs on the rank's step thread, in ring order with the forwards.
class ShardKvHooks {
 public:
  virtual ~ShardKvHooks() = default;
  // The rank's cache is about to be dropped (kAllocateKv, kStop, an error):
  // stop exposing it (and free it, when the hooks made it).
  virtual void Release() = 0;
  // kAllocateKv: a cache of `shape` the hooks make and hold until Release
  // (e.g. in memory the senders map), or null to have the loop create one in
  // private memory.
  [[nodiscard]] virtual absl::StatusOr<model::KvCache*> Allocate(const model::KvCacheShape& shape) {
    return nullptr;
  }
  // kKvRegister: expose `kv` and take part in rank 0's gather of targets.
  [[nodiscard]] virtual absl::Status Register(model::KvCache& kv) = 0;
  // kKvCheck: fence the landed writes, then take part in the gather of
  // each rank's CRC32C of `blocks`.
  [[nodiscard]] virtual absl::Status Check(model::KvCache& kv,
                                           const std::vector<int32_t>& blocks) = 0;
};

// Ranks 1..n-1: takes and runs steps until a kStop step (OK) or an error.
// The rank's KV cache is created by kAllocateKv steps; a forward before the
// first one is FailedPrecondition, and so is a kKvRegister or kKvCheck step
// without `kv_hooks` (or before any kAllocateKv).
[[nodiscard]] absl::Status RunShardSteps(StepRing& ring, model::Qwen2Model& model,
                                         absl::Span<const uint8_t> shared_buffer = {},
                                         ShardKvHooks* kv_hooks = nullptr);

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_TP_STEP_LOOP_H_
