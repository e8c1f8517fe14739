#include "model/qwen2_model.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/cpu/ops.h"
#include "model/cpu/paged_attention.h"
#include "model/deepstack.h"

namespace mmserve::model {

Qwen2Model::Qwen2Model(const TextConfig& cfg, const Qwen2Weights& weights, cpu::ThreadPool& pool,
                       Qwen2ModelOptions options)
    : cfg_(cfg),
      weights_(weights),
      pool_(pool),
      options_(options),
      parallel_(weights.shard().size > 1),
      vocab_(VocabSliceOf(cfg.vocab_size, weights.shard())),
      rope_(cfg.head_dim(), cfg.rope_theta, cfg.mrope_section, cfg.mrope_interleaved),
      hidden_(cfg.hidden_size),
      heads_(cfg.num_attention_heads / weights.shard().size),
      kv_heads_(cfg.num_key_value_heads / weights.shard().size),
      head_dim_(cfg.head_dim()),
      inter_(cfg.intermediate_size / weights.shard().size) {
  CHECK_EQ(static_cast<int64_t>(weights.layers().size()), cfg.num_hidden_layers);
  if (parallel_) {
    CHECK(options_.comm != nullptr) << "sharded weights need a communicator";
    CHECK_EQ(options_.comm->world_size(), weights.shard().size);
    CHECK_EQ(options_.comm->rank(), weights.shard().rank);
  }
}

namespace {

// Adds its scope's wall time to *sum when sum is set (Qwen2StepTimes).
class ScopedSeconds {
 public:
  explicit ScopedSeconds(double* sum) : sum_(sum) {
    if (sum_ != nullptr) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedSeconds() {
    if (sum_ != nullptr) {
      *sum_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
  }
  ScopedSeconds(const ScopedSeconds&) = delete;
  ScopedSeconds& operator=(const ScopedSeconds&) = delete;

 private:
  double* sum_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

KvCacheShape Qwen2Model::KvShape(int64_t num_blocks, int64_t block_size) const {
  return {cfg_.num_hidden_layers, num_blocks, block_size, kv_heads_, head_dim_};
}

void Qwen2Model::Linear(const float* x, int64_t m, const cpu::WeightMatrix& w, const float* bias,
                        float* y) {
  ScopedSeconds timed(options_.step_times ? &options_.step_times->linear_seconds : nullptr);
  cpu::Linear(pool_, x, m, w, bias, y, options_.linear_kernel);
}

void Qwen2Model::LinearMany(const float* x, int64_t m, const std::vector<cpu::LinearJob>& jobs) {
  ScopedSeconds timed(options_.step_times ? &options_.step_times->linear_seconds : nullptr);
  cpu::LinearMany(pool_, x, m, jobs, options_.linear_kernel);
}

absl::Status Qwen2Model::CheckKvShape(const KvCache& kv) const {
  const KvCacheShape& ks = kv.shape();
  const KvCacheShape want = KvShape(ks.num_blocks, ks.block_size);
  if (ks.num_layers != want.num_layers || ks.num_kv_heads != want.num_kv_heads ||
      ks.head_dim != want.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache has ", ks.num_layers, " layers x ", ks.num_kv_heads,
                     " kv heads x head_dim ", ks.head_dim, "; the model needs ", want.num_layers,
                     " x ", want.num_kv_heads, " x ", want.head_dim));
  }
  return absl::OkStatus();
}

absl::Status Qwen2Model::Forward(const ForwardBatch& batch, KvCache& kv,
                                 std::vector<float>* logits) {
  RETURN_IF_ERROR(CheckKvShape(kv));
  const KvCacheShape& ks = kv.shape();
  RETURN_IF_ERROR(ValidateForwardBatch(batch, {cfg_.vocab_size, ks.block_size, ks.num_blocks}));
  return Run(
      batch,
      [&](int layer) {
        Attention(layer, batch, kv);
        return absl::OkStatus();
      },
      logits);
}

absl::Status Qwen2Model::Run(const ForwardBatch& rows,
                             absl::FunctionRef<absl::Status(int)> attention,
                             std::vector<float>* logits) {
  const int64_t t = rows.num_tokens();
  RETURN_IF_ERROR(CheckDeepstack(rows, cfg_.num_hidden_layers));
  h_.resize(t * hidden_);
  x_.resize(t * hidden_);
  Embed(rows);
  rope_.ComputeAngles(rows.positions.data(), t, &angles_);
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    RETURN_IF_ERROR(Layer(l, t, [&] { return attention(l); }));
    AddDeepstack(rows, l, hidden_, h_.data());
    if (rows.on_layers_written) rows.on_layers_written(l + 1);
  }
  return Logits(rows.logits_rows, logits);
}

absl::Status Qwen2Model::Logits(const std::vector<int64_t>& logits_rows,
                                std::vector<float>* logits) {
  // Final norm and lm_head only for the requested rows.
  const int64_t t = static_cast<int64_t>(h_.size()) / hidden_;
  const int64_t rows = static_cast<int64_t>(logits_rows.size());
  x_.resize(std::max(t, rows) * hidden_);
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(&x_[i * hidden_], &h_[logits_rows[i] * hidden_], hidden_ * sizeof(float));
  }
  cpu::RmsNorm(pool_, x_.data(), rows, hidden_, weights_.final_norm(),
               static_cast<float>(cfg_.rms_norm_eps), x_.data());
  if (parallel_) return LmHead(rows, logits);
  logits->resize(rows * static_cast<int64_t>(cfg_.vocab_size));
  Linear(x_.data(), rows, weights_.lm_head(), nullptr, logits->data());
  return absl::OkStatus();
}

absl::Status Qwen2Model::AllReduce(std::vector<float>& v, int64_t n) {
  if (!parallel_) return absl::OkStatus();
  return options_.comm->AllReduceSum(absl::MakeSpan(v.data(), n));
}

absl::Status Qwen2Model::LmHead(int64_t rows, std::vector<float>* logits) {
  // Each rank's slice padded to vocab_.padded columns, so that the gather
  // is [rank][row][padded]; rank 0 then drops the padding.
  const int64_t local = vocab_.end - vocab_.begin, padded = vocab_.padded;
  const int world = options_.comm->world_size();
  local_logits_.assign(rows * padded, 0.0f);
  if (local > 0) {
    o_.resize(rows * local);
    Linear(x_.data(), rows, weights_.lm_head(), nullptr, o_.data());
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(&local_logits_[i * padded], &o_[i * local], local * sizeof(float));
    }
  }
  const bool root = options_.comm->rank() == 0;
  gathered_.resize(root ? world * rows * padded : 0);
  RETURN_IF_ERROR(options_.comm->Gather(local_logits_, absl::MakeSpan(gathered_)));
  if (!root) {
    logits->clear();
    return absl::OkStatus();
  }
  const int64_t vocab = cfg_.vocab_size;
  logits->resize(rows * vocab);
  for (int r = 0; r < world; ++r) {
    const VocabSlice s = VocabSliceOf(vocab, {r, world});
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(&(*logits)[i * vocab + s.begin], &gathered_[(r * rows + i) * padded],
                  (s.end - s.begin) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

void Qwen2Model::Embed(const ForwardBatch& batch) {
  const cpu::WeightMatrix& e = weights_.embed();
  // An overridden row's id may lie outside the vocabulary (ForwardBatch
  // allows it): never look it up.
  std::vector<bool> overridden(batch.num_tokens(), false);
  for (const EmbeddingOverride& o : batch.embedding_overrides) overridden[o.row] = true;
  for (int64_t r = 0; r < batch.num_tokens(); ++r) {
    if (!overridden[r]) cpu::WeightRowToF32(e, batch.token_ids[r], &h_[r * hidden_]);
  }
  for (const EmbeddingOverride& o : batch.embedding_overrides) {
    std::memcpy(&h_[o.row * hidden_], o.values, hidden_ * sizeof(float));
  }
}

absl::Status Qwen2Model::Layer(int layer, int64_t t, absl::FunctionRef<absl::Status()> attention) {
  const Qwen2LayerWeights& w = weights_.layers()[layer];
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  cpu::RmsNorm(pool_, h_.data(), t, hidden_, w.input_norm, eps, x_.data());
  RETURN_IF_ERROR(attention());
  o_.resize(t * hidden_);
  Linear(attn_.data(), t, w.o, nullptr, o_.data());
  RETURN_IF_ERROR(AllReduce(o_, t * hidden_));
  if (w.o_bias != nullptr) {  // after the sum over ranks: added once
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t i = 0; i < hidden_; ++i) o_[r * hidden_ + i] += w.o_bias[i];
    }
  }
  cpu::AddInPlace(pool_, h_.data(), o_.data(), t * hidden_);
  cpu::RmsNorm(pool_, h_.data(), t, hidden_, w.post_norm, eps, x_.data());
  return Mlp(layer, t);
}

void Qwen2Model::ProjectQkv(int layer, int64_t t) {
  const Qwen2LayerWeights& w = weights_.layers()[layer];
  const int64_t q_width = heads_ * head_dim_, kv_width = kv_heads_ * head_dim_;
  q_.resize(t * q_width);
  k_.resize(t * kv_width);
  v_.resize(t * kv_width);
  attn_.resize(t * q_width);
  LinearMany(
      x_.data(), t,
      {{&w.q, w.q_bias, q_.data()}, {&w.k, w.k_bias, k_.data()}, {&w.v, w.v_bias, v_.data()}});
  if (w.q_norm != nullptr) {  // Qwen3: each head normalized before the rotation
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    cpu::RmsNorm(pool_, q_.data(), t * heads_, head_dim_, w.q_norm, eps, q_.data());
    cpu::RmsNorm(pool_, k_.data(), t * kv_heads_, head_dim_, w.k_norm, eps, k_.data());
  }
  rope_.Apply(angles_, q_.data(), t, heads_);
  rope_.Apply(angles_, k_.data(), t, kv_heads_);
}

float Qwen2Model::AttentionScale() const {
  return static_cast<float>(std::pow(static_cast<double>(head_dim_), -0.5));
}

void Qwen2Model::WriteKv(absl::Span<const int64_t> slots, const float* k, const float* v,
                         float* key, float* value) const {
  const int64_t kv_width = kv_heads_ * head_dim_;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t slot = slots[i], r = static_cast<int64_t>(i);
    std::memcpy(key + slot * kv_width, k + r * kv_width, kv_width * sizeof(float));
    std::memcpy(value + slot * kv_width, v + r * kv_width, kv_width * sizeof(float));
  }
}

void Qwen2Model::Attention(int layer, const ForwardBatch& batch, KvCache& kv) {
  const int64_t t = batch.num_tokens();
  ProjectQkv(layer, t);
  float* key = kv.Key(layer);
  float* value = kv.Value(layer);
  WriteKv(batch.slot_mapping, k_.data(), v_.data(), key, value);
  std::vector<cpu::AttentionSequence> seqs;
  seqs.reserve(batch.sequences.size());
  for (const SequenceChunk& s : batch.sequences) {
    seqs.push_back({s.query_start, s.query_len, s.context_len, s.block_table.data()});
  }
  const cpu::PagedKvLayer layer_kv{key, value, kv.shape().block_size, kv_heads_, head_dim_};
  ScopedSeconds timed(options_.step_times ? &options_.step_times->attention_seconds : nullptr);
  cpu::PagedAttention(pool_, q_.data(), heads_, layer_kv, seqs, AttentionScale(), attn_.data());
}

absl::Status Qwen2Model::Mlp(int layer, int64_t num_tokens) {
  const Qwen2LayerWeights& w = weights_.layers()[layer];
  if (!w.experts.empty()) {
    SparseMlp(w, num_tokens);
    RETURN_IF_ERROR(AllReduce(o_, num_tokens * hidden_));
    cpu::AddInPlace(pool_, h_.data(), o_.data(), num_tokens * hidden_);
    return absl::OkStatus();
  }
  gate_.resize(num_tokens * inter_);
  up_.resize(num_tokens * inter_);
  LinearMany(x_.data(), num_tokens,
             {{&w.gate, nullptr, gate_.data()}, {&w.up, nullptr, up_.data()}});
  cpu::SiluMul(pool_, gate_.data(), up_.data(), num_tokens * inter_, gate_.data());
  o_.resize(num_tokens * hidden_);
  Linear(gate_.data(), num_tokens, w.down, nullptr, o_.data());
  RETURN_IF_ERROR(AllReduce(o_, num_tokens * hidden_));
  cpu::AddInPlace(pool_, h_.data(), o_.data(), num_tokens * hidden_);
  return absl::OkStatus();
}

}  // namespace mmserve::model
