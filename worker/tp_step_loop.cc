#include "worker/tp_step_loop.h"

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

absl::Status StopShardSteps(StepRing& ring) {
  StepMessage m;
  m.kind = StepKind::kStop;
  return ring.Publish(m);
}

absl::Status RunShardSteps(StepRing& ring, model::Qwen2Model& model, model::KvCache& kv,
                           absl::Span<const uint8_t> shared_buffer) {
  StepMessage m;
  std::vector<float> logits;  // stays empty: only rank 0 gets logits
  while (true) {
    RETURN_IF_ERROR(ring.Next(&m));
    if (m.kind == StepKind::kStop) return absl::OkStatus();
    RETURN_IF_ERROR(ResolveEmbeddings(shared_buffer, model.config().hidden_size, &m));
    RETURN_IF_ERROR(model.Forward(m.batch, kv, &logits));
  }
}

}  // namespace mmserve::worker
