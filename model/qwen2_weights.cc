#include "model/qwen2_weights.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/cpu/thread_pool.h"
#include "model/expert_weights.h"

namespace mmserve::model {
namespace {

// Looks tensors up by name and checks them against expected shapes.
class TensorBinder {
 public:
  TensorBinder(const SafetensorsCheckpoint& ckpt,
               std::vector<std::unique_ptr<std::vector<float>>>* owned)
      : ckpt_(ckpt), owned_(owned) {}

  absl::StatusOr<const TensorView*> Find(const std::string& name,
                                         const std::vector<int64_t>& shape) const {
    return FindWeightTensor(ckpt_, name, shape);
  }

  absl::StatusOr<cpu::WeightMatrix> Matrix(const std::string& name, int64_t rows,
                                           int64_t cols) const {
    ASSIGN_OR_RETURN(const TensorView* t, Find(name, {rows, cols}));
    return cpu::WeightMatrix{t->dtype, t->data, rows, cols};
  }

  // A 1-D tensor widened to an owned fp32 copy.
  absl::StatusOr<const float*> Vector(const std::string& name, int64_t n) {
    ASSIGN_OR_RETURN(const TensorView* t, Find(name, {n}));
    auto v = std::make_unique<std::vector<float>>(n);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t* half = reinterpret_cast<const uint16_t*>(t->data);
      (*v)[i] = t->dtype == DType::kF32    ? reinterpret_cast<const float*>(t->data)[i]
                : t->dtype == DType::kBF16 ? Bf16ToF32(half[i])
                                           : F16ToF32(half[i]);
    }
    owned_->push_back(std::move(v));
    return owned_->back()->data();
  }

 private:
  const SafetensorsCheckpoint& ckpt_;
  std::vector<std::unique_ptr<std::vector<float>>>* owned_;
};

absl::Status CheckDims(const TextConfig& cfg) {
  if (cfg.hidden_size <= 0 || cfg.num_attention_heads <= 0 || cfg.num_key_value_heads <= 0 ||
      cfg.num_hidden_layers <= 0 || cfg.intermediate_size <= 0 || cfg.vocab_size <= 0 ||
      (cfg.explicit_head_dim == 0 && cfg.hidden_size % cfg.num_attention_heads != 0) ||
      cfg.num_attention_heads % cfg.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("text config dimensions are inconsistent: hidden ", cfg.hidden_size,
                     ", heads ", cfg.num_attention_heads, ", kv heads ", cfg.num_key_value_heads,
                     ", layers ", cfg.num_hidden_layers, ", intermediate ", cfg.intermediate_size,
                     ", vocab ", cfg.vocab_size));
  }
  return absl::OkStatus();
}

// Rows [begin, begin + count) of a row-major matrix, in place.
cpu::WeightMatrix RowSlice(const cpu::WeightMatrix& m, int64_t begin, int64_t count) {
  CHECK(m.layout == cpu::WeightLayout::kRows);
  cpu::WeightMatrix s = m;
  s.data = static_cast<const char*>(m.data) + begin * m.cols * DTypeSize(m.dtype);
  s.rows = count;
  return s;
}

// True when p points into the `bytes` bytes at base.
bool Within(const void* p, const void* base, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  const char* b = static_cast<const char*>(base);
  return c >= b && c < b + bytes;
}

}  // namespace

VocabSlice VocabSliceOf(int64_t vocab_size, const TensorParallelShard& shard) {
  VocabSlice v;
  v.padded = (vocab_size + shard.size - 1) / shard.size;
  v.begin = std::min(vocab_size, shard.rank * v.padded);
  v.end = std::min(vocab_size, v.begin + v.padded);
  return v;
}

// A sparse layer's router and experts: transformers' Qwen3MoeSparseMoeBlock
// (mlp.gate, mlp.experts.<e>.{gate,up,down}_proj) or the fused experts of
// Qwen3VLMoeTextSparseMoeBlock (expert_weights.h).
absl::Status BindExperts(const TensorBinder& bind, const SafetensorsCheckpoint& ckpt,
                         const TextConfig& cfg, const std::string& p, OwnedWeightStorage owned,
                         Qwen2LayerWeights* lw) {
  const int64_t hidden = cfg.hidden_size, width = cfg.moe_intermediate_size;
  ASSIGN_OR_RETURN(lw->router, bind.Matrix(p + "mlp.gate.weight", cfg.num_experts, hidden));
  if (HasFusedExperts(ckpt, p)) return BindFusedExperts(ckpt, p, cfg, owned, &lw->experts);
  lw->experts.resize(cfg.num_experts);
  for (int e = 0; e < cfg.num_experts; ++e) {
    const std::string ep = absl::StrCat(p, "mlp.experts.", e, ".");
    Qwen2LayerWeights::Expert& x = lw->experts[e];
    ASSIGN_OR_RETURN(x.gate, bind.Matrix(ep + "gate_proj.weight", width, hidden));
    ASSIGN_OR_RETURN(x.up, bind.Matrix(ep + "up_proj.weight", width, hidden));
    ASSIGN_OR_RETURN(x.down, bind.Matrix(ep + "down_proj.weight", hidden, width));
  }
  return absl::OkStatus();
}

absl::Status CheckTensorParallel(const TextConfig& cfg, const TensorParallelShard& shard) {
  if (shard.size < 1 || shard.rank < 0 || shard.rank >= shard.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel rank ", shard.rank, " is outside [0, ", shard.size, ")"));
  }
  if (cfg.num_key_value_heads % shard.size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_key_value_heads ", cfg.num_key_value_heads,
        " is not divisible by the tensor-parallel size ", shard.size,
        ": KV heads are split across ranks, not replicated; choose a size that divides it"));
  }
  if (cfg.num_experts > 0 && cfg.moe_intermediate_size % shard.size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe_intermediate_size ", cfg.moe_intermediate_size,
                     " is not divisible by the tensor-parallel size ", shard.size));
  }
  if (cfg.intermediate_size % shard.size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("intermediate_size ", cfg.intermediate_size,
                                                   " is not divisible by the tensor-parallel size ",
                                                   shard.size));
  }
  return absl::OkStatus();
}

absl::StatusOr<Qwen2WeightsOptions> ParseQuantize(const std::string& name) {
  Qwen2WeightsOptions o;
  if (name.empty() || name == "none") return o;
  o.quantize = Quantization::kInt8;
  if (name == "int8") return o;
  if (name == "int8_g32") {
    o.int8_group = 32;
    return o;
  }
  o.quantize = Quantization::kInt4;
  for (int64_t group : {32, 128}) {
    for (bool zero_point : {false, true}) {
      if (name == absl::StrCat("int4_g", group, zero_point ? "_zp" : "")) {
        o.int4 = {group, zero_point};
        return o;
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--quantize: unknown scheme '", name,
      "' (expected none, int8, int8_g32, int4_g32, int4_g128, int4_g32_zp or int4_g128_zp)"));
}

absl::StatusOr<std::unique_ptr<Qwen2Weights>> Qwen2Weights::Load(
    const SafetensorsCheckpoint& ckpt, const TextConfig& cfg, const Qwen2WeightsOptions& options) {
  RETURN_IF_ERROR(CheckDims(cfg));
  RETURN_IF_ERROR(CheckTensorParallel(cfg, options.shard));
  if (options.shard.size > 1 && options.quantize != Quantization::kNone) {
    return absl::InvalidArgumentError(
        "quantization is not supported with tensor parallelism (a column slice's per-row "
        "scales would differ from the whole row's)");
  }
  std::unique_ptr<Qwen2Weights> w(new Qwen2Weights());
  w->shard_ = options.shard;
  TensorBinder bind(ckpt, &w->owned_f32_);
  const std::string prefix = ckpt.Find("model.language_model.embed_tokens.weight") != nullptr
                                 ? "model.language_model."
                                 : "model.";
  const int64_t hidden = cfg.hidden_size, inter = cfg.intermediate_size;
  const int64_t q_out = static_cast<int64_t>(cfg.num_attention_heads) * cfg.head_dim();
  const int64_t kv_out = static_cast<int64_t>(cfg.num_key_value_heads) * cfg.head_dim();
  ASSIGN_OR_RETURN(w->embed_, bind.Matrix(prefix + "embed_tokens.weight", cfg.vocab_size, hidden));
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat(prefix, "layers.", l, ".");
    Qwen2LayerWeights lw;
    ASSIGN_OR_RETURN(lw.input_norm, bind.Vector(p + "input_layernorm.weight", hidden));
    ASSIGN_OR_RETURN(lw.q, bind.Matrix(p + "self_attn.q_proj.weight", q_out, hidden));
    ASSIGN_OR_RETURN(lw.k, bind.Matrix(p + "self_attn.k_proj.weight", kv_out, hidden));
    ASSIGN_OR_RETURN(lw.v, bind.Matrix(p + "self_attn.v_proj.weight", kv_out, hidden));
    if (cfg.attention_bias) {
      ASSIGN_OR_RETURN(lw.q_bias, bind.Vector(p + "self_attn.q_proj.bias", q_out));
      ASSIGN_OR_RETURN(lw.k_bias, bind.Vector(p + "self_attn.k_proj.bias", kv_out));
      ASSIGN_OR_RETURN(lw.v_bias, bind.Vector(p + "self_attn.v_proj.bias", kv_out));
    }
    if (cfg.attention_bias && cfg.qk_norm) {  // Qwen3's o_proj has one too
      ASSIGN_OR_RETURN(lw.o_bias, bind.Vector(p + "self_attn.o_proj.bias", hidden));
    }
    if (cfg.qk_norm) {
      ASSIGN_OR_RETURN(lw.q_norm, bind.Vector(p + "self_attn.q_norm.weight", cfg.head_dim()));
      ASSIGN_OR_RETURN(lw.k_norm, bind.Vector(p + "self_attn.k_norm.weight", cfg.head_dim()));
    }
    ASSIGN_OR_RETURN(lw.o, bind.Matrix(p + "self_attn.o_proj.weight", hidden, q_out));
    ASSIGN_OR_RETURN(lw.post_norm, bind.Vector(p + "post_attention_layernorm.weight", hidden));
    if (cfg.moe_layer(l)) {
      RETURN_IF_ERROR(BindExperts(bind, ckpt, cfg, p, {&w->owned_f32_, &w->owned_bf16_}, &lw));
    } else {
      ASSIGN_OR_RETURN(lw.gate, bind.Matrix(p + "mlp.gate_proj.weight", inter, hidden));
      ASSIGN_OR_RETURN(lw.up, bind.Matrix(p + "mlp.up_proj.weight", inter, hidden));
      ASSIGN_OR_RETURN(lw.down, bind.Matrix(p + "mlp.down_proj.weight", hidden, inter));
    }
    w->layers_.push_back(lw);
  }
  ASSIGN_OR_RETURN(w->final_norm_, bind.Vector(prefix + "norm.weight", hidden));
  w->tied_ = cfg.tie_word_embeddings;
  w->top_k_ = cfg.num_experts_per_tok;
  if (w->tied_) {
    w->lm_head_ = w->embed_;
  } else {
    ASSIGN_OR_RETURN(w->lm_head_, bind.Matrix("lm_head.weight", cfg.vocab_size, hidden));
  }
  auto release = [&ckpt, &w](const void* data) {
    if (w->ReleaseOwned(data)) return;  // a column slice's copy, once packed
    // Every other matrix (or row slice) came from a tensor; find the one
    // holding it.
    for (const std::string& name : ckpt.Names()) {
      const TensorView* t = ckpt.Find(name);
      if (Within(data, t->data, t->nbytes)) {
        ckpt.ReleasePages(*t);
        return;
      }
    }
  };
  // F16 matrices are quantized from directly; unquantized, they become fp32.
  if (options.quantize == Quantization::kNone) w->WidenF16(release);
  if (w->shard_.size > 1) w->Shard(cfg, release);
  if (options.quantize != Quantization::kNone) w->Quantize(options, release);
  w->PackBf16(release);  // what is left: an untied BF16 embedding stays row-major
  return w;
}

void Qwen2Weights::WidenF16(const std::function<void(const void*)>& release) {
  absl::flat_hash_map<const void*, cpu::WeightMatrix> done;
  auto widen = [&](cpu::WeightMatrix* m) {
    if (m->dtype != DType::kF16) return;
    const void* source = m->data;
    auto it = done.find(source);
    if (it == done.end()) {
      auto v = std::make_unique<std::vector<float>>(m->rows * m->cols);
      for (int64_t r = 0; r < m->rows; ++r) cpu::WeightRowToF32(*m, r, v->data() + r * m->cols);
      cpu::WeightMatrix wide = *m;
      wide.dtype = DType::kF32;
      wide.data = v->data();
      owned_f32_.push_back(std::move(v));
      it = done.emplace(source, wide).first;
      release(source);
    }
    *m = it->second;
  };
  for (Qwen2LayerWeights& l : layers_) {
    for (cpu::WeightMatrix* m : l.Projections()) widen(m);
    if (l.router.data != nullptr) widen(&l.router);
  }
  widen(&lm_head_);
  if (tied_) widen(&embed_);  // an untied one is only looked up (WeightRowToF32)
}

void Qwen2Weights::PackBf16(const std::function<void(const void*)>& release) {
  cpu::ThreadPool pool(cpu::ThreadPool::DefaultThreads());
  // Packs one matrix in place of its row-major original, once per distinct
  // source (embed and a tied lm_head share one), then lets the source go.
  absl::flat_hash_map<const void*, cpu::WeightMatrix> done;
  // A sharded tied lm_head is a slice of the embedding, which stays
  // row-major for lookups: its source is kept.
  const bool keep_embed = tied_ && shard_.size > 1;
  auto pack = [&](cpu::WeightMatrix* m) {
    if (m->dtype != DType::kBF16 || m->layout != cpu::WeightLayout::kRows) return;
    const void* source = m->data;
    auto it = done.find(source);
    if (it == done.end()) {
      packed_.push_back(cpu::PanelWeights::Pack(pool, *m));
      it = done.emplace(source, packed_.back().matrix()).first;
      if (!(keep_embed && Within(source, embed_.data, embed_.bytes()))) release(source);
    }
    *m = it->second;
  };
  for (Qwen2LayerWeights& l : layers_) {
    for (cpu::WeightMatrix* m : l.Projections()) pack(m);
    if (l.router.data != nullptr) pack(&l.router);
  }
  // An untied embedding is only gathered from: it stays row-major (only the
  // rows looked up become resident). A tied one is read from the panels.
  pack(&lm_head_);
  if (tied_ && !keep_embed) pack(&embed_);
}

void Qwen2Weights::Shard(const TextConfig& cfg, const std::function<void(const void*)>& release) {
  const int64_t n = shard_.size, r = shard_.rank;
  const int64_t head_dim = cfg.head_dim();
  const int64_t q_rows = cfg.num_attention_heads / n * head_dim;
  const int64_t kv_rows = cfg.num_key_value_heads / n * head_dim;
  const int64_t inter = cfg.intermediate_size / n;
  // Columns [begin, begin + count) of a row-major matrix, copied.
  auto columns = [&](const cpu::WeightMatrix& m, int64_t begin, int64_t count) {
    CHECK(m.layout == cpu::WeightLayout::kRows);
    cpu::WeightMatrix s = m;
    s.cols = count;
    if (m.dtype == DType::kF32) {
      auto v = std::make_unique<std::vector<float>>(m.rows * count);
      const float* src = static_cast<const float*>(m.data);
      for (int64_t i = 0; i < m.rows; ++i) {
        std::copy_n(src + i * m.cols + begin, count, v->data() + i * count);
      }
      s.data = v->data();
      owned_f32_.push_back(std::move(v));
    } else {
      CHECK(m.dtype == DType::kBF16) << DTypeName(m.dtype);
      auto v = std::make_unique<std::vector<uint16_t>>(m.rows * count);
      const uint16_t* src = static_cast<const uint16_t*>(m.data);
      for (int64_t i = 0; i < m.rows; ++i) {
        std::copy_n(src + i * m.cols + begin, count, v->data() + i * count);
      }
      s.data = v->data();
      owned_bf16_.push_back(std::move(v));
    }
    release(m.data);
    return s;
  };
  for (Qwen2LayerWeights& l : layers_) {
    l.q = RowSlice(l.q, r * q_rows, q_rows);
    l.k = RowSlice(l.k, r * kv_rows, kv_rows);
    l.v = RowSlice(l.v, r * kv_rows, kv_rows);
    if (l.q_bias != nullptr) {
      l.q_bias += r * q_rows;
      l.k_bias += r * kv_rows;
      l.v_bias += r * kv_rows;
    }
    l.o = columns(l.o, r * q_rows, q_rows);
    if (l.experts.empty()) {
      l.gate = RowSlice(l.gate, r * inter, inter);
      l.up = RowSlice(l.up, r * inter, inter);
      l.down = columns(l.down, r * inter, inter);
    }
    // Each expert is split like the dense MLP; the router is whole on every
    // rank, so every rank routes a token the same way.
    const int64_t width = cfg.moe_intermediate_size / n;
    for (Qwen2LayerWeights::Expert& x : l.experts) {
      x.gate = RowSlice(x.gate, r * width, width);
      x.up = RowSlice(x.up, r * width, width);
      x.down = columns(x.down, r * width, width);
    }
  }
  const VocabSlice vocab = VocabSliceOf(cfg.vocab_size, shard_);
  lm_head_ = RowSlice(lm_head_, vocab.begin, vocab.end - vocab.begin);
}

cpu::WeightMatrix Qwen2Weights::QuantizeMatrix(cpu::ThreadPool& pool, const cpu::WeightMatrix& m,
                                               const Qwen2WeightsOptions& options) {
  if (options.quantize == Quantization::kInt4) {
    quantized4_.push_back(cpu::Int4Weights::Quantize(pool, m, options.int4));
    return quantized4_.back().matrix();
  }
  quantized_.push_back(cpu::Int8Weights::Quantize(pool, m, options.int8_group));
  return quantized_.back().matrix();
}

void Qwen2Weights::Quantize(const Qwen2WeightsOptions& options,
                            const std::function<void(const void*)>& release) {
  cpu::ThreadPool pool(cpu::ThreadPool::DefaultThreads());
  absl::flat_hash_map<const void*, cpu::WeightMatrix> done;
  auto quantize = [&](cpu::WeightMatrix* m) {
    if (m->layout != cpu::WeightLayout::kRows) return;
    const void* source = m->data;
    auto it = done.find(source);
    if (it == done.end()) {
      it = done.emplace(source, QuantizeMatrix(pool, *m, options)).first;
      release(source);
    }
    *m = it->second;
  };
  // The router stays in its own precision: quantized logits could route a token
  // to other experts.
  for (Qwen2LayerWeights& l : layers_) {
    for (cpu::WeightMatrix* m : l.Projections()) quantize(m);
  }
  quantize(&lm_head_);
  if (tied_) quantize(&embed_);
}

namespace {

// The values of Random: xorshift64* from the seed, uniform on [-a, a] with
// a = 0.02 * sqrt(3) (standard deviation 0.02).
class RandomDraws {
 public:
  explicit RandomDraws(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  float operator()() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    const uint32_t bits = static_cast<uint32_t>((state_ * 0x2545F4914F6CDD1Dull) >> 40);
    return (static_cast<float>(bits) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * 0.034641f;
  }

 private:
  uint64_t state_;
};

// One layer of Random's draws, in the order Random has always drawn them
// (`matrix` and `vector` as there).
Qwen2LayerWeights DrawLayer(const TextConfig& cfg, int l,
                            const std::function<cpu::WeightMatrix(int64_t, int64_t, bool)>& matrix,
                            const std::function<const float*(int64_t, bool)>& vector) {
  const int64_t hidden = cfg.hidden_size, inter = cfg.intermediate_size;
  const int64_t q_out = static_cast<int64_t>(cfg.num_attention_heads) * cfg.head_dim();
  const int64_t kv_out = static_cast<int64_t>(cfg.num_key_value_heads) * cfg.head_dim();
  Qwen2LayerWeights lw;
  lw.input_norm = vector(hidden, true);
  lw.q = matrix(q_out, hidden, false);
  lw.k = matrix(kv_out, hidden, false);
  lw.v = matrix(kv_out, hidden, false);
  if (cfg.attention_bias) {
    lw.q_bias = vector(q_out, false);
    lw.k_bias = vector(kv_out, false);
    lw.v_bias = vector(kv_out, false);
  }
  if (cfg.attention_bias && cfg.qk_norm) lw.o_bias = vector(hidden, false);
  if (cfg.qk_norm) {
    lw.q_norm = vector(cfg.head_dim(), true);
    lw.k_norm = vector(cfg.head_dim(), true);
  }
  lw.o = matrix(hidden, q_out, false);
  lw.post_norm = vector(hidden, true);
  if (cfg.moe_layer(l)) {
    lw.router = matrix(cfg.num_experts, hidden, /*keep_rows=*/true);
    const int64_t width = cfg.moe_intermediate_size;
    for (int e = 0; e < cfg.num_experts; ++e) {
      lw.experts.push_back({matrix(width, hidden, false), matrix(width, hidden, false),
                            matrix(hidden, width, false)});
    }
  } else {
    lw.gate = matrix(inter, hidden, false);
    lw.up = matrix(inter, hidden, false);
    lw.down = matrix(hidden, inter, false);
  }
  return lw;
}

}  // namespace

std::unique_ptr<Qwen2Weights> Qwen2Weights::Random(const TextConfig& cfg, DType dtype,
                                                   uint64_t seed,
                                                   const Qwen2WeightsOptions& options) {
  CHECK_OK(CheckDims(cfg));
  CHECK_OK(CheckTensorParallel(cfg, options.shard));
  CHECK(dtype == DType::kF32 || dtype == DType::kBF16) << DTypeName(dtype);
  CHECK(options.shard.size == 1 || options.quantize == Quantization::kNone)
      << "quantization with tensor parallelism";
  std::unique_ptr<Qwen2Weights> w(new Qwen2Weights());
  w->shard_ = options.shard;
  RandomDraws next(seed);
  const bool quantized = options.quantize != Quantization::kNone;
  std::unique_ptr<cpu::ThreadPool> pool;
  if (quantized) pool = std::make_unique<cpu::ThreadPool>(cpu::ThreadPool::DefaultThreads());
  // Draws a matrix; quantizes it right away when asked (so that the drawn
  // values of at most one matrix are held at a time) unless keep_rows.
  auto matrix = [&](int64_t rows, int64_t cols, bool keep_rows = false) {
    const size_t n = static_cast<size_t>(rows * cols);
    if (quantized && !keep_rows) {
      std::vector<uint16_t> b(dtype == DType::kBF16 ? n : 0);
      std::vector<float> f(dtype == DType::kF32 ? n : 0);
      for (uint16_t& x : b) x = F32ToBf16(next());
      for (float& x : f) x = next();
      const cpu::WeightMatrix drawn{
          dtype, dtype == DType::kBF16 ? static_cast<const void*>(b.data()) : f.data(), rows, cols};
      return w->QuantizeMatrix(*pool, drawn, options);
    }
    if (dtype == DType::kF32) {
      auto v = std::make_unique<std::vector<float>>(n);
      for (float& x : *v) x = next();
      w->owned_f32_.push_back(std::move(v));
      return cpu::WeightMatrix{dtype, w->owned_f32_.back()->data(), rows, cols};
    }
    auto v = std::make_unique<std::vector<uint16_t>>(n);
    for (uint16_t& x : *v) x = F32ToBf16(next());
    w->owned_bf16_.push_back(std::move(v));
    return cpu::WeightMatrix{dtype, w->owned_bf16_.back()->data(), rows, cols};
  };
  auto vector = [&](int64_t n, bool ones) {
    auto v = std::make_unique<std::vector<float>>(n);
    for (float& x : *v) x = ones ? 1.0f : next();
    w->owned_f32_.push_back(std::move(v));
    return static_cast<const float*>(w->owned_f32_.back()->data());
  };
  const int64_t hidden = cfg.hidden_size;
  w->tied_ = cfg.tie_word_embeddings;
  w->top_k_ = cfg.num_experts_per_tok;
  w->embed_ = matrix(cfg.vocab_size, hidden, /*keep_rows=*/!w->tied_);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    w->layers_.push_back(DrawLayer(cfg, l, matrix, vector));
  }
  w->final_norm_ = vector(hidden, true);
  w->lm_head_ = w->tied_ ? w->embed_ : matrix(cfg.vocab_size, hidden);
  auto release = [&w](const void* data) { w->ReleaseOwned(data); };
  // The same draws as one rank, then this rank's slices of them.
  if (w->shard_.size > 1) w->Shard(cfg, release);
  if (dtype == DType::kBF16 && !quantized) {
    // The row-major originals are freed once packed, except an untied
    // embedding (see PackBf16).
    w->PackBf16(release);
  }
  return w;
}

bool Qwen2Weights::ReleaseOwned(const void* data) {
  for (auto& v : owned_bf16_) {
    if (v != nullptr && Within(data, v->data(), v->size() * sizeof(uint16_t))) {
      v.reset();
      return true;
    }
  }
  for (auto& v : owned_f32_) {
    if (v != nullptr && Within(data, v->data(), v->size() * sizeof(float))) {
      v.reset();
      return true;
    }
  }
  return false;
}

size_t Qwen2Weights::StepWeightBytes() const {
  size_t total = lm_head_.bytes();
  for (const Qwen2LayerWeights& l : layers_) {
    total += l.q.bytes() + l.k.bytes() + l.v.bytes() + l.o.bytes() + l.gate.bytes() + l.up.bytes() +
             l.down.bytes() + l.router.bytes();
    // One token reads its top-k experts' weights.
    if (!l.experts.empty()) {
      const Qwen2LayerWeights::Expert& x = l.experts[0];
      total += static_cast<size_t>(top_k_) * (x.gate.bytes() + x.up.bytes() + x.down.bytes());
    }
  }
  return total;
}

size_t Qwen2Weights::TotalWeightBytes() const {
  size_t total = StepWeightBytes() + (tied_ ? 0 : embed_.bytes());
  for (const Qwen2LayerWeights& l : layers_) {  // the experts no token of a step reads
    if (l.experts.empty()) continue;
    const Qwen2LayerWeights::Expert& x = l.experts[0];
    total += (l.experts.size() - static_cast<size_t>(top_k_)) *
             (x.gate.bytes() + x.up.bytes() + x.down.bytes());
  }
  return total;
}

std::vector<cpu::WeightMatrix*> Qwen2LayerWeights::Projections() {
  std::vector<cpu::WeightMatrix*> out = {&q, &k, &v, &o};
  if (experts.empty()) {
    out.insert(out.end(), {&gate, &up, &down});
  }
  for (Expert& x : experts) out.insert(out.end(), {&x.gate, &x.up, &x.down});
  return out;
}

}  // namespace mmserve::model
