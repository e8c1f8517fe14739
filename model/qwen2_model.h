// The Qwen2 decoder on the CPU (the language model of Qwen2-VL): embedding,
// per layer RMSNorm -> q/k/v projections (with bias) -> M-RoPE -> paged
// grouped-query attention -> o_proj -> residual -> RMSNorm -> SwiGLU MLP ->
// residual, then the final norm and lm_head on the rows that want logits.
//
//   cpu::ThreadPool pool(cpu::ThreadPool::DefaultThreads());
//   Qwen2Model model(cfg.text, *weights, pool);
//   ASSIGN_OR_RETURN(auto kv, KvCache::Create(model.KvShape(num_blocks, 16)));
//   std::vector<float> logits;  // [batch.logits_rows.size()][vocab]
//   RETURN_IF_ERROR(model.Forward(batch, *kv, &logits));
//
// One Forward is one scheduler step (see forward_batch.h): it writes each
// row's K/V into its slot, then attends over the cache. Rows are computed
// independently with fixed-order kernels, so a row's logits are bitwise the
// same whatever else is in the batch (with LinearKernel::kDot).
// Activations are fp32; weights are used as stored (F32 or BF16).
//
// Tensor parallelism: with weights loaded for rank r of n (see
// TensorParallelShard) and a Communicator of n ranks, each rank computes its
// heads and its part of the MLP; o_proj's and down_proj's partial outputs
// are all-reduced (summed in rank order), and the lm_head slices' logits are
// gathered on rank 0. Every rank calls Forward with the same batch; the KV
// cache of a rank holds only its KV heads (KvShape). With n == 1 (or no
// communicator) the code path is exactly the single-rank one: no
// collective is called and the results are bitwise the same as before.
// Thread-safety: not thread-safe; one caller drives Forward (it uses the
// pool and member scratch buffers). The weights must outlive the model.
#ifndef MMSERVE_MODEL_QWEN2_MODEL_H_
#define MMSERVE_MODEL_QWEN2_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/communicator.h"
#include "model/cpu/linear.h"
#include "model/cpu/thread_pool.h"
#include "model/elastic.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/qwen2_weights.h"
#include "model/rope.h"

namespace mmserve::model {

// Wall time of a step's parts, summed over every Forward while
// Qwen2ModelOptions::step_times points here (the benchmarks' breakdowns).
// Each part is timed inside the step, so the step's time minus the parts is
// never negative.
struct Qwen2StepTimes {
  double linear_seconds = 0;     // every linear layer: projections, MLPs, routers, lm_head
  double attention_seconds = 0;  // the paged attention kernel of each layer
};

struct Qwen2ModelOptions {
  cpu::LinearKernel linear_kernel = cpu::LinearKernel::kDot;
  // Required when the weights are sharded (shard().size > 1): the ranks of
  // the instance, with this rank's rank and size. Borrowed; must outlive the
  // model.
  mmserve::Communicator* comm = nullptr;
  // Optional, borrowed: Forward adds the seconds of its parts to it.
  Qwen2StepTimes* step_times = nullptr;
};

class Qwen2Model {
 public:
  Qwen2Model(const TextConfig& cfg, const Qwen2Weights& weights, cpu::ThreadPool& pool,
             Qwen2ModelOptions options = {});
  Qwen2Model(const Qwen2Model&) = delete;
  Qwen2Model& operator=(const Qwen2Model&) = delete;

  const TextConfig& config() const { return cfg_; }

  // The cache shape this model needs for num_blocks blocks of block_size
  // (this rank's KV heads only).
  KvCacheShape KvShape(int64_t num_blocks, int64_t block_size) const;

  // Runs one step. InvalidArgument if the batch fails ValidateForwardBatch
  // or the cache does not have this model's shape; nothing is written then.
  // On success *logits holds logits_rows.size() rows of vocab_size floats
  // (on rank 0; other ranks' *logits is cleared). A failed collective
  // returns its status (UNAVAILABLE: the instance is out of service).
  [[nodiscard]] absl::Status Forward(const ForwardBatch& batch, KvCache& kv,
                                     std::vector<float>* logits);

  // Elastic sequence parallelism (model/elastic.h; code in qwen2_elastic.cc). One
  // member's rows of a prompt prefilled by a group: its logits rows' logits
  // are bitwise those of a single-instance Forward over the whole prompt,
  // and only the kept range's K/V is written to kv. InvalidArgument for a
  // malformed batch or sharded weights; the exchange's status otherwise
  // (the exchange is aborted when this member fails on its own).
  [[nodiscard]] absl::Status ForwardElasticPrefill(const ElasticPrefillBatch& batch, KvCache& kv,
                                                   KvExchange& exchange,
                                                   std::vector<float>* logits);
  // A decode batch (every sequence's query_len 1) on the master of spread
  // KV: batch's sequences cover the master's own keys; peers add theirs.
  [[nodiscard]] absl::Status ForwardElasticDecode(const ForwardBatch& batch, KvCache& kv,
                                                  SpanAttentionPeers& peers,
                                                  std::vector<float>* logits);
  // One step of a batch mixing ordinary sequences (any chunk) and the
  // decodes of `spread` (their keys here are the master's own; the peers
  // add the others'). Each ordinary row's logits are bitwise Forward's;
  // ForwardElasticDecode is this with every sequence spread. InvalidArgument for
  // a malformed batch or spread list, or sharded weights (nothing written);
  // the peers' status otherwise.
  [[nodiscard]] absl::Status ForwardSpread(const ForwardBatch& batch, KvCache& kv,
                                           const SpreadSequences& spread,
                                           std::vector<float>* logits);

 private:
  // Embedding, every layer (with `attention` filling attn_ for a layer),
  // then the logits of rows.logits_rows.
  absl::Status Run(const ForwardBatch& rows, absl::FunctionRef<absl::Status(int)> attention,
                   std::vector<float>* logits);
  void Embed(const ForwardBatch& batch);
  // One decoder layer over the t rows in h_; `attention` fills attn_ from x_.
  absl::Status Layer(int layer, int64_t t, absl::FunctionRef<absl::Status()> attention);
  // q_, k_, v_ of x_'s t rows, RoPE applied (angles_).
  void ProjectQkv(int layer, int64_t t);
  float AttentionScale() const;
  absl::Status CheckKvShape(const KvCache& kv) const;
  // Rows i of k and v ([rows][kv_width]) into slots[i] of one layer's planes.
  void WriteKv(absl::Span<const int64_t> slots, const float* k, const float* v, float* key,
               float* value) const;
  void Attention(int layer, const ForwardBatch& batch, KvCache& kv);
  absl::Status ElasticPrefillAttention(int layer, const ElasticPrefillBatch& batch, KvCache& kv,
                                       KvExchange& exchange);
  absl::Status SpreadAttention(int layer, const ForwardBatch& batch, KvCache& kv,
                               const SpreadSequences& spread);
  // Final norm and lm_head on rows of h_.
  absl::Status Logits(const std::vector<int64_t>& logits_rows, std::vector<float>* logits);
  absl::Status Mlp(int layer, int64_t num_tokens);
  // A sparse layer's experts on rows of x_: this rank's partial sum into o_.
  void SparseMlp(const Qwen2LayerWeights& w, int64_t num_tokens);
  // Sums a row-parallel projection's partial output over the ranks.
  absl::Status AllReduce(std::vector<float>& v, int64_t n);
  // lm_head on rows of x_: this rank's slice, gathered into *logits.
  absl::Status LmHead(int64_t rows, std::vector<float>* logits);
  void Linear(const float* x, int64_t m, const cpu::WeightMatrix& w, const float* bias, float* y);
  void LinearMany(const float* x, int64_t m, const std::vector<cpu::LinearJob>& jobs);

  TextConfig cfg_;
  const Qwen2Weights& weights_;
  cpu::ThreadPool& pool_;
  Qwen2ModelOptions options_;
  bool parallel_;  // shard().size > 1
  VocabSlice vocab_;
  MRope rope_;
  // This rank's heads, KV heads and intermediate width.
  int64_t hidden_, heads_, kv_heads_, head_dim_, inter_;
  // Scratch, resized per step: [T][...] rows.
  std::vector<float> h_, x_, q_, k_, v_, attn_, o_, gate_, up_;
  std::vector<float> local_logits_, gathered_;  // tensor parallel only
  std::vector<float> span_out_, span_lse_;      // elastic decode: [member][row][...]
  std::vector<float> span_q_;                   // elastic decode: the spread rows' q
  // Sparse layers: router logits [T][experts], one expert's rows.
  std::vector<float> router_logits_, expert_x_, expert_y_;
  RopeAngles angles_;
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_QWEN2_MODEL_H_
