// The Qwen2 decoder's weights (the language half of Qwen2-VL), bound to
// tensors of a mapped checkpoint or generated at random for benchmarks.
//
//   ASSIGN_OR_RETURN(auto ckpt, SafetensorsCheckpoint::Open(dir));
//   ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(dir));
//   ASSIGN_OR_RETURN(auto weights, Qwen2Weights::Load(*ckpt, cfg.text));
//   // `ckpt` must outlive `weights`: matrices point into its mapping.
//
// Names: transformers >= 4.52 saves Qwen2-VL's language model under
// "model.language_model." (vision under "model.visual."); older versions and
// plain Qwen2 use "model." (vision under "visual."). Both are accepted; the
// prefix is chosen by where model.*embed_tokens.weight is found. lm_head is
// "lm_head.weight", or the embedding table when tie_word_embeddings.
// Experts: one tensor per expert and projection (Qwen3-MoE) or Qwen3-VL-MoE's
// fused input-major tensors, transposed at load (model/expert_weights.h).
//
// F32 matrices are used in place from the mapping (fp32 is the compute
// dtype: no copy). BF16 matrices are repacked into the panel layout of
// model/cpu/linear.h (about twice as fast for batched rows on AVX2) and the
// mapped pages they came from are dropped, so they too are held once. An
// untied BF16 embedding stays in the mapping (it is only gathered from); a
// tied one is gathered from lm_head's panels (cpu::WeightRowToF32).
// With Quantization::kInt8 every projection matrix and lm_head (so also a
// tied embedding) is quantized at load to int8 panels (cpu::Int8Weights),
// from F32, BF16 or F16, and the mapped pages it came from are dropped; an
// untied embedding stays as stored. Quantization::kInt4 does the same with
// group-wise 4-bit panels (cpu::Int4Weights). Without either, F16 matrices (which the
// kernels do not take) are widened to owned fp32 copies at load, except an
// untied embedding, which stays F16 in the mapping.
// Norm weights and biases (a few KiB) are widened to fp32 copies. A missing
// tensor is NotFound and a wrong shape or dtype InvalidArgument, naming the
// tensor and expected vs actual.
// Thread-safety: immutable after construction.
#ifndef MMSERVE_MODEL_QWEN2_WEIGHTS_H_
#define MMSERVE_MODEL_QWEN2_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/cpu/linear.h"
#include "model/cpu/linear_int4.h"
#include "model/dtype.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace mmserve::model {

enum class Quantization { kNone, kInt8, kInt4 };

// Which slices of the model one rank of a tensor-parallel instance holds
// (Megatron's layout). With size n and rank r:
//  - column-parallel q/k/v (with their biases), gate and up: rank r keeps
//    output rows [r * out / n, (r + 1) * out / n), i.e. attention heads
//    [r * heads / n, ...) and KV heads [r * kv_heads / n, ...) (each rank's
//    query heads use only its own KV heads), and 1/n of the MLP;
//  - row-parallel o and down: the matching input columns; each rank's
//    output is a partial sum that the model all-reduces;
//  - lm_head: vocabulary rows VocabSliceOf(vocab, shard), gathered on rank 0.
// The embedding table stays whole on every rank: it is only gathered from,
// so only the rows looked up become resident (a tied one is lm_head's full
// mapping; bf16 tied tables are not repacked then).
// Row slices of row-major matrices are used in place; column slices are
// copied (and then packed, for bf16); the full tensors' pages are released.
struct TensorParallelShard {
  int rank = 0;
  int size = 1;
};

struct VocabSlice {
  int64_t begin = 0;   // first vocabulary id of the slice
  int64_t end = 0;     // one past the last
  int64_t padded = 0;  // ceil(vocab / n): every rank's gather contribution
};
VocabSlice VocabSliceOf(int64_t vocab_size, const TensorParallelShard& shard);

// InvalidArgument unless 0 <= rank < size, and num_key_value_heads and
// intermediate_size are divisible by size (KV heads are split, never
// replicated).
[[nodiscard]] absl::Status CheckTensorParallel(const TextConfig& cfg,
                                               const TensorParallelShard& shard);

struct Qwen2WeightsOptions {
  Quantization quantize = Quantization::kNone;
  // kInt8: columns per scale; 0 = one scale per output row.
  int64_t int8_group = 0;
  // kInt4: columns per scale and whether groups have zero points.
  cpu::Int4Scheme int4;
  // size > 1: load only this rank's slices (see TensorParallelShard). Not
  // with quantization (per-row scales of a column slice would differ from
  // TP=1's).
  TensorParallelShard shard;
};

// The --quantize flag of generate, the engine and the benchmarks: "" or
// "none", "int8" (one scale per output row: the faster scheme, see
// README), "int8_g32" (one scale per 32 columns), and 4-bit weights
// "int4_g32", "int4_g128" (symmetric, one scale per 32 or 128 columns) and
// "int4_g32_zp", "int4_g128_zp" (with a zero point per group).
// InvalidArgument otherwise, naming the flag and the accepted values.
[[nodiscard]] absl::StatusOr<Qwen2WeightsOptions> ParseQuantize(const std::string& name);

struct Qwen2LayerWeights {
  const float* input_norm = nullptr;  // [hidden]
  cpu::WeightMatrix q, k, v,
      o;  // q: [heads * head_dim][hidden], k/v: [kv_heads * head_dim][hidden]
  const float* q_bias = nullptr;  // null without attention_bias (Qwen3)
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* o_bias = nullptr;  // [hidden]; Qwen3 with attention_bias only
  const float* q_norm = nullptr;  // [head_dim], per-head RMSNorm weights (Qwen3)
  const float* k_norm = nullptr;
  const float* post_norm = nullptr;  // [hidden]
  cpu::WeightMatrix gate, up,
      down;  // gate/up: [intermediate][hidden], down: [hidden][intermediate]; dense layers
  // A sparse (mixture-of-experts) layer: the router [num_experts][hidden]
  // and one MLP per expert (gate/up: [moe_intermediate][hidden], down:
  // [hidden][moe_intermediate]); empty in a dense layer.
  cpu::WeightMatrix router;
  struct Expert {
    cpu::WeightMatrix gate, up, down;
  };
  std::vector<Expert> experts;

  // Every projection a token's path multiplies (attention, then the dense
  // MLP or every expert's), the router excluded.
  std::vector<cpu::WeightMatrix*> Projections();
};

class Qwen2Weights {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Qwen2Weights>> Load(
      const SafetensorsCheckpoint& ckpt, const TextConfig& cfg,
      const Qwen2WeightsOptions& options = {});

  // N(0, 0.02)-like uniform values in `dtype` (kF32 or kBF16), norms 1, for
  // benchmarks at a model's dimensions without its checkpoint. With kInt8 or kInt4,
  // each matrix is quantized from `dtype` as soon as it is drawn.
  static std::unique_ptr<Qwen2Weights> Random(const TextConfig& cfg, DType dtype, uint64_t seed,
                                              const Qwen2WeightsOptions& options = {});

  Qwen2Weights(const Qwen2Weights&) = delete;
  Qwen2Weights& operator=(const Qwen2Weights&) = delete;

  const cpu::WeightMatrix& embed() const { return embed_; }  // [vocab][hidden]
  const std::vector<Qwen2LayerWeights>& layers() const { return layers_; }
  const float* final_norm() const { return final_norm_; }
  // [vocab][hidden]; with tensor parallelism, this rank's vocabulary slice.
  const cpu::WeightMatrix& lm_head() const { return lm_head_; }
  const TensorParallelShard& shard() const { return shard_; }

  // Bytes of the matrices one decode step of one sequence reads: every
  // layer's projections (of a sparse layer, the router and top-k experts)
  // plus lm_head (the embedding table is only gathered from).
  size_t StepWeightBytes() const;
  // Bytes of all distinct matrices (embed and lm_head once when tied).
  size_t TotalWeightBytes() const;

 private:
  Qwen2Weights() = default;
  // Repacks every kRows BF16 matrix into panels; release(data) is called once
  // per source matrix that is no longer needed.
  void PackBf16(const std::function<void(const void*)>& release);
  // Frees the owned fp32 or bf16 matrix that holds data (a whole matrix or
  // a row slice of it); false if no owned matrix does.
  bool ReleaseOwned(const void* data);
  // Replaces every matrix (and q/k/v bias) with this rank's slice; release
  // as for PackBf16, for column-sliced sources.
  void Shard(const TextConfig& cfg, const std::function<void(const void*)>& release);
  // Replaces every F16 matrix with an owned fp32 copy (the kernels take no
  // F16); release as for PackBf16.
  void WidenF16(const std::function<void(const void*)>& release);
  // Quantizes every projection and lm_head (and a tied embedding, the same
  // matrix) as options ask (int8 or int4); release as for PackBf16.
  void Quantize(const Qwen2WeightsOptions& options,
                const std::function<void(const void*)>& release);
  // One kRows matrix quantized as options ask, owned by this object.
  cpu::WeightMatrix QuantizeMatrix(cpu::ThreadPool& pool, const cpu::WeightMatrix& m,
                                   const Qwen2WeightsOptions& options);

  cpu::WeightMatrix embed_;
  std::vector<Qwen2LayerWeights> layers_;
  const float* final_norm_ = nullptr;
  cpu::WeightMatrix lm_head_;
  bool tied_ = false;
  int top_k_ = 0;  // experts per token, sparse layers
  TensorParallelShard shard_;
  // fp32 copies of norms and biases, and for Random() the matrices too.
  std::vector<std::unique_ptr<std::vector<float>>> owned_f32_;
  std::vector<std::unique_ptr<std::vector<uint16_t>>> owned_bf16_;
  std::vector<cpu::PanelWeights> packed_;
  std::vector<cpu::Int8Weights> quantized_;
  std::vector<cpu::Int4Weights> quantized4_;
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_QWEN2_WEIGHTS_H_
