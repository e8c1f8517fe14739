#include "worker/tp_step_loop.h"

#include <memory>

#include "common/status_macros.h"

namespace mmserve::worker {

absl::Status ForwardOnAllRanks(StepRing& ring, model::Qwen2Model& model, model::KvCache& kv,
                               const model::ForwardBatch& batch, EmbeddingPlacement placement,
                               std::vector<float>* logits,
                               absl::Span<const uint8_t> shared_buffer) {
  ASSIGN_OR_RETURN(StepMessage m, StepMessageFromBatch(batch, model.config().hidden_size, placement,
                                                       shared_buffer));
  RETURN_IF_ERROR(ring.Publish(m));
  return model.Forward(batch, kv, logits);
}

absl::Status AllocateKvOnAllRanks(StepRing& ring, int64_t num_blocks, int64_t block_size) {
  StepMessage m;
  m.kind = StepKind::kAllocateKv;
  m.kv_blocks = num_blocks;
  m.kv_block_size = block_size;
  return ring.Publish(m);
}

absl::Status StopShardSteps(StepRing& ring) {
  StepMessage m;
  m.kind = StepKind::kStop;
  return ring.Publish(m);
}

absl::Status RunShardSteps(StepRing& ring, model::Qwen2Model& model,
                           absl::Span<const uint8_t> shared_buffer, ShardKvHooks* kv_hooks) {
  StepMessage m;
  std::unique_ptr<model::KvCache> owned_kv;  // unless the hooks made it
  model::KvCache* kv = nullptr;
  std::vector<float> logits;  // stays empty: only rank 0 gets logits
  // The hooks stop exposing the cache before it goes, whatever ends the loop.
  struct ReleaseOnExit {
    ShardKvHooks* hooks;
    ~ReleaseOnExit() {
      if (hooks != nullptr) hooks->Release();
    }
  } release{kv_hooks};
  while (true) {
    RETURN_IF_ERROR(ring.Next(&m));
    switch (m.kind) {
      case StepKind::kStop:
        return absl::OkStatus();
      case StepKind::kAllocateKv: {
        // The old cache goes first: both may not fit.
        kv = nullptr;
        if (kv_hooks != nullptr) kv_hooks->Release();
        owned_kv.reset();
        const model::KvCacheShape shape = model.KvShape(m.kv_blocks, m.kv_block_size);
        if (kv_hooks != nullptr) {
          ASSIGN_OR_RETURN(kv, kv_hooks->Allocate(shape));
        }
        if (kv == nullptr) {
          ASSIGN_OR_RETURN(owned_kv, model::KvCache::Create(shape));
          kv = owned_kv.get();
        }
        break;
      }
      case StepKind::kKvRegister:
      case StepKind::kKvCheck: {
        if (kv_hooks == nullptr || kv == nullptr) {
          return absl::FailedPreconditionError(
              "a KV hand-off step on a rank without a KV receiver or cache");
        }
        if (m.kind == StepKind::kKvRegister) {
          RETURN_IF_ERROR(kv_hooks->Register(*kv));
        } else {
          static const std::vector<int32_t> kNone;
          RETURN_IF_ERROR(kv_hooks->Check(
              *kv, m.batch.sequences.empty() ? kNone : m.batch.sequences[0].block_table));
        }
        break;
      }
      case StepKind::kForward:
        if (kv == nullptr) {
          return absl::FailedPreconditionError("a forward step before any kAllocateKv");
        }
        RETURN_IF_ERROR(ResolveEmbeddings(shared_buffer, model.config().hidden_size, &m));
        RETURN_IF_ERROR(model.Forward(m.batch, *kv, &logits));
        break;
    }
  }
}

}  // namespace mmserve::worker
