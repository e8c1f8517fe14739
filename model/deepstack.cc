#include "model/deepstack.h"

#include "absl/strings/str_cat.h"

namespace mmserve::model {

absl::Status CheckDeepstack(const ForwardBatch& batch, int num_layers) {
  for (const EmbeddingOverride& o : batch.embedding_overrides) {
    if (o.deepstack_layers > num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("row ", o.row, " has ", o.deepstack_layers,
                                                     " DeepStack features for a model of ",
                                                     num_layers, " layers"));
    }
  }
  return absl::OkStatus();
}

void AddDeepstack(const ForwardBatch& batch, int layer, int64_t hidden, float* h) {
  for (const EmbeddingOverride& o : batch.embedding_overrides) {
    if (layer >= o.deepstack_layers) continue;
    const float* feature = o.deepstack + layer * hidden;
    float* row = h + o.row * hidden;
    for (int64_t i = 0; i < hidden; ++i) row[i] += feature[i];
  }
}

}  // namespace mmserve::model
