// Qwen3-VL's DeepStack on the language side (transformers'
// Qwen3VLTextModel._deepstack_process): after decoder layer k, each visual
// row's hidden state gets the k-th DeepStack feature of its vision token
// added (the tower's deepstack_merger_list[k] output,
// VisionEmbeddings::deepstack). Features travel with the row's embedding
// override (EmbeddingOverride::deepstack); rows without them are untouched.
//
//   RETURN_IF_ERROR(CheckDeepstack(batch, cfg.num_hidden_layers));
//   for (int l = 0; l < layers; ++l) {
//     RunLayer(l);
//     AddDeepstack(batch, l, hidden, h);
//   }
//
// Thread-safe (pure functions over the caller's buffers).
#ifndef MMSERVE_MODEL_DEEPSTACK_H_
#define MMSERVE_MODEL_DEEPSTACK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "model/forward_batch.h"

namespace mmserve::model {

// InvalidArgument when a row carries more DeepStack features than the model
// has layers.
[[nodiscard]] absl::Status CheckDeepstack(const ForwardBatch& batch, int num_layers);

// h[row] += feature `layer` of each override that has one; h is [T][hidden].
void AddDeepstack(const ForwardBatch& batch, int layer, int64_t hidden, float* h);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_DEEPSTACK_H_
