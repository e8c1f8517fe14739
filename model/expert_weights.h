// Binding checkpoint tensors to Qwen2Weights: the shared tensor lookup with
// its checks, and the fused mixture-of-experts tensors of Qwen3-VL-MoE.
//
// transformers' Qwen3VLMoeTextExperts stores a sparse layer's experts as two
// 3-D tensors multiplied input-major (x @ W[e]):
//   mlp.experts.gate_up_proj  [experts][hidden][2 x width]  (gate, then up)
//   mlp.experts.down_proj     [experts][width][hidden]
// where Qwen3-MoE saves one nn.Linear per expert and projection
// ([out][in]). BindFusedExperts transposes each expert's three projections
// into owned [out][in] matrices of their own (one allocation each, so that
// sharding, packing or quantizing one releases just it), in the stored
// dtype (F16 widened to F32, which the kernels take), then drops the fused
// tensors' mapped pages. The result is the per-expert layout, so routing,
// tensor parallelism and int8 treat both storages the same.
// Used by Qwen2Weights::Load; exported for its tests.
#ifndef MMSERVE_MODEL_EXPERT_WEIGHTS_H_
#define MMSERVE_MODEL_EXPERT_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"

namespace mmserve::model {

// The tensor `name` with exactly `shape`, in F32, BF16 or F16. NotFound
// naming the tensor and the expected shape when absent; InvalidArgument
// naming it with expected vs actual shape, or its dtype.
[[nodiscard]] absl::StatusOr<const TensorView*> FindWeightTensor(const SafetensorsCheckpoint& ckpt,
                                                                 const std::string& name,
                                                                 const std::vector<int64_t>& shape);

// Where owned copies go (Qwen2Weights' owned storage).
struct OwnedWeightStorage {
  std::vector<std::unique_ptr<std::vector<float>>>* f32;
  std::vector<std::unique_ptr<std::vector<uint16_t>>>* bf16;
};

// True when the sparse layer at `prefix` ("...layers.<l>.") stores fused
// experts.
bool HasFusedExperts(const SafetensorsCheckpoint& ckpt, const std::string& prefix);

// The experts of the sparse layer at `prefix`, transposed as above into
// `owned`; `experts` gets num_experts entries of [width][hidden] gate and
// up and [hidden][width] down.
[[nodiscard]] absl::Status BindFusedExperts(const SafetensorsCheckpoint& ckpt,
                                            const std::string& prefix, const TextConfig& cfg,
                                            OwnedWeightStorage owned,
                                            std::vector<Qwen2LayerWeights::Expert>* experts);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_EXPERT_WEIGHTS_H_
