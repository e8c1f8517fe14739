// VisionTower's weights: Load from a checkpoint (Qwen2-VL's, Qwen2.5-VL's
// and Qwen3-VL's tensor names), CreateRandom for benchmarks, and weight_bytes.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/vision_tower.h"

namespace mmserve::model {
namespace {

// Finds `name` under "visual." or "model.visual." and checks its shape. A
// missing tensor is NotFound, as the language model's are (qwen2_weights.h),
// naming both spellings.
absl::StatusOr<const TensorView*> FindTensor(const SafetensorsCheckpoint& ckpt,
                                             const std::string& name,
                                             const std::vector<int64_t>& shape) {
  const TensorView* t = ckpt.Find("visual." + name);
  if (t == nullptr) t = ckpt.Find("model.visual." + name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("missing tensor visual.", name, " (or model.visual.",
                                            name, "), expected [", absl::StrJoin(shape, ", "),
                                            "]"));
  }
  if (t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor visual.", name, " is ", t->Describe(),
                                                   ", expected [", absl::StrJoin(shape, ", "),
                                                   "]"));
  }
  if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor visual.", name, " has unsupported dtype ", DTypeName(t->dtype)));
  }
  return t;
}

std::vector<float> ToF32(const TensorView& t) {
  std::vector<float> out(t.numel());
  const auto* u16 = reinterpret_cast<const uint16_t*>(t.data);
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == DType::kF32) {
      std::memcpy(&out[i], t.data + i * 4, 4);
    } else {
      out[i] = t.dtype == DType::kBF16 ? Bf16ToF32(u16[i]) : F16ToF32(u16[i]);
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> LoadVector(const SafetensorsCheckpoint& ckpt,
                                              const std::string& name, int n) {
  ASSIGN_OR_RETURN(const TensorView* t, FindTensor(ckpt, name, {n}));
  return ToF32(*t);
}

// d's matrix quantized to int8 panels from the row-major `src` (which the
// caller may free afterwards).
void QuantizeDense(cpu::ThreadPool& pool, const cpu::WeightMatrix& src, int64_t group,
                   DenseWeights* d) {
  d->int8 = cpu::Int8Weights::Quantize(pool, src, group);
  d->matrix = d->int8.matrix();
  d->kernel = cpu::LinearKernel::kDot;
}

absl::Status LoadDense(const SafetensorsCheckpoint& ckpt, const std::string& prefix, int out,
                       int in, bool bias, cpu::ThreadPool& pool, int64_t int8_group,
                       DenseWeights* d, std::vector<int64_t> shape = {}) {
  d->out = out;
  d->in = in;
  if (shape.empty()) shape = {out, in};
  ASSIGN_OR_RETURN(const TensorView* w, FindTensor(ckpt, prefix + ".weight", shape));
  if (w->dtype == DType::kBF16 && int8_group >= 0) {
    QuantizeDense(pool, cpu::WeightMatrix{DType::kBF16, w->data, out, in}, int8_group, d);
    ckpt.ReleasePages(*w);
  } else if (w->dtype == DType::kBF16) {
    // One bf16 copy: repacked into panels, the mapped pages dropped.
    d->panels = cpu::PanelWeights::Pack(pool, cpu::WeightMatrix{DType::kBF16, w->data, out, in});
    d->matrix = d->panels.matrix();
    d->kernel = cpu::LinearKernel::kDot;
    ckpt.ReleasePages(*w);
  } else {
    const float* data = reinterpret_cast<const float*>(w->data);
    if (w->dtype != DType::kF32) {
      d->owned = ToF32(*w);
      data = d->owned.data();
    }
    d->matrix = cpu::WeightMatrix{DType::kF32, data, out, in};
    d->kernel = cpu::LinearKernel::kOpenBlas;
    if (int8_group >= 0) {
      QuantizeDense(pool, d->matrix, int8_group, d);
      std::vector<float>().swap(d->owned);
      ckpt.ReleasePages(*w);
    }
  }
  if (bias) {
    ASSIGN_OR_RETURN(const TensorView* b, FindTensor(ckpt, prefix + ".bias", {out}));
    if (b->dtype == DType::kF32) {
      d->b = reinterpret_cast<const float*>(b->data);
    } else {
      d->bias_owned = ToF32(*b);
      d->b = d->bias_owned.data();
    }
  }
  return absl::OkStatus();
}

// A small fast generator for random weights (uniform, given std).
class WeightRng {
 public:
  explicit WeightRng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  float Next(float std_dev) {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    const float u = static_cast<float>(s_ >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    return (2.0f * u - 1.0f) * std_dev * 1.7320508f;                      // sqrt(3): unit std
  }

 private:
  uint64_t s_;
};

}  // namespace

size_t VisionTower::weight_bytes() const {
  size_t total =
      patch_embed_.matrix.bytes() + merger_fc1_.matrix.bytes() + merger_fc2_.matrix.bytes();
  for (const Block& b : blocks_) {
    total += b.qkv.matrix.bytes() + b.proj.matrix.bytes() + b.fc1.matrix.bytes() +
             b.up.matrix.bytes() + b.fc2.matrix.bytes();
  }
  for (const DeepstackMerger& m : deepstack_) total += m.fc1.matrix.bytes() + m.fc2.matrix.bytes();
  return total;
}

std::unique_ptr<VisionTower> VisionTower::CreateRandom(const VisionConfig& c, uint64_t seed,
                                                       DType dtype,
                                                       const VisionTowerOptions& options) {
  std::unique_ptr<VisionTower> t(new VisionTower());
  t->cfg_ = c;
  t->SetPool(options);
  WeightRng rng(seed);
  std::vector<uint16_t> bf16;
  auto dense = [&](DenseWeights* d, int out, int in, bool bias) {
    d->out = out;
    d->in = in;
    const size_t count = static_cast<size_t>(out) * in;
    if (dtype == DType::kBF16) {
      bf16.resize(count);
      for (uint16_t& v : bf16) v = F32ToBf16(rng.Next(0.02f));
      const cpu::WeightMatrix src{DType::kBF16, bf16.data(), out, in};
      if (options.int8_group >= 0) {
        QuantizeDense(*t->pool_, src, options.int8_group, d);
      } else {
        d->panels = cpu::PanelWeights::Pack(*t->pool_, src);
        d->matrix = d->panels.matrix();
        d->kernel = cpu::LinearKernel::kDot;
      }
    } else {
      d->owned.resize(count);
      for (float& v : d->owned) v = rng.Next(0.02f);
      d->matrix = cpu::WeightMatrix{DType::kF32, d->owned.data(), out, in};
      d->kernel = cpu::LinearKernel::kOpenBlas;
      if (options.int8_group >= 0) {
        QuantizeDense(*t->pool_, d->matrix, options.int8_group, d);
        std::vector<float>().swap(d->owned);
      }
    }
    if (bias) {
      d->bias_owned.resize(out);
      for (float& v : d->bias_owned) v = rng.Next(0.02f);
      d->b = d->bias_owned.data();
    }
  };
  auto ones = [](int n) { return std::vector<float>(n, 1.0f); };
  auto zeros = [](int n) { return std::vector<float>(n, 0.0f); };
  const int e = c.embed_dim, mlp = e * c.mlp_ratio;
  const int merged = e * c.spatial_merge_size * c.spatial_merge_size;
  const bool qwen3 = c.arch == VisionConfig::Arch::kQwen3Vl;
  dense(&t->patch_embed_, e, c.in_channels * c.temporal_patch_size * c.patch_size * c.patch_size,
        qwen3);
  t->blocks_.resize(c.depth);
  const bool gated = c.arch == VisionConfig::Arch::kQwen25Vl;
  const int width = gated || qwen3 ? c.intermediate_size : mlp;
  if (qwen3) {
    t->pos_embed_.resize(static_cast<size_t>(c.num_position_embeddings) * e);
    for (float& v : t->pos_embed_) v = rng.Next(0.02f);
    t->deepstack_.resize(c.deepstack_visual_indexes.size());
    for (DeepstackMerger& m : t->deepstack_) {
      m.norm_w = ones(merged);
      m.norm_b = zeros(merged);
      dense(&m.fc1, merged, merged, true);
      dense(&m.fc2, c.hidden_size, merged, true);
    }
  }
  for (Block& b : t->blocks_) {
    b.norm1_w = b.norm2_w = ones(e);
    if (!gated) b.norm1_b = b.norm2_b = zeros(e);  // RMSNorms have no bias
    dense(&b.qkv, 3 * e, e, true);
    dense(&b.proj, e, e, true);
    dense(&b.fc1, width, e, true);
    if (gated) dense(&b.up, width, e, true);
    dense(&b.fc2, e, width, true);
  }
  t->ln_q_w_ = ones(e);
  if (!gated) t->ln_q_b_ = zeros(e);
  dense(&t->merger_fc1_, merged, merged, true);
  dense(&t->merger_fc2_, c.hidden_size, merged, true);
  return t;
}

// Qwen3-VL: the position embedding table, the merger (merger.norm and
// linear_fc1/2) and the DeepStack mergers (deepstack_merger_list.k, with
// their norm over merged rows).
absl::Status VisionTower::LoadQwen3Parts(const SafetensorsCheckpoint& ckpt, const VisionConfig& c,
                                         cpu::ThreadPool& pool, int64_t group, VisionTower* t) {
  const int e = c.embed_dim, merged = e * c.spatial_merge_size * c.spatial_merge_size;
  ASSIGN_OR_RETURN(const TensorView* pos,
                   FindTensor(ckpt, "pos_embed.weight", {c.num_position_embeddings, e}));
  t->pos_embed_ = ToF32(*pos);
  ASSIGN_OR_RETURN(t->ln_q_w_, LoadVector(ckpt, "merger.norm.weight", e));
  ASSIGN_OR_RETURN(t->ln_q_b_, LoadVector(ckpt, "merger.norm.bias", e));
  RETURN_IF_ERROR(
      LoadDense(ckpt, "merger.linear_fc1", merged, merged, true, pool, group, &t->merger_fc1_));
  RETURN_IF_ERROR(LoadDense(ckpt, "merger.linear_fc2", c.hidden_size, merged, true, pool, group,
                            &t->merger_fc2_));
  t->deepstack_.resize(c.deepstack_visual_indexes.size());
  for (size_t k = 0; k < t->deepstack_.size(); ++k) {
    DeepstackMerger& m = t->deepstack_[k];
    const std::string p = absl::StrCat("deepstack_merger_list.", k, ".");
    ASSIGN_OR_RETURN(m.norm_w, LoadVector(ckpt, p + "norm.weight", merged));
    ASSIGN_OR_RETURN(m.norm_b, LoadVector(ckpt, p + "norm.bias", merged));
    RETURN_IF_ERROR(LoadDense(ckpt, p + "linear_fc1", merged, merged, true, pool, group, &m.fc1));
    RETURN_IF_ERROR(
        LoadDense(ckpt, p + "linear_fc2", c.hidden_size, merged, true, pool, group, &m.fc2));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<VisionTower>> VisionTower::Load(const SafetensorsCheckpoint& ckpt,
                                                               const ModelConfig& config,
                                                               const VisionTowerOptions& options) {
  if (!config.vision) return absl::InvalidArgumentError("the model has no vision_config");
  std::unique_ptr<VisionTower> t(new VisionTower());
  const VisionConfig& c = t->cfg_ = *config.vision;
  const bool gated = c.arch == VisionConfig::Arch::kQwen25Vl;
  const bool qwen3 = c.arch == VisionConfig::Arch::kQwen3Vl;
  const char* act = gated ? "silu" : qwen3 ? "gelu_pytorch_tanh" : "quick_gelu";
  if (c.hidden_act != act) {
    return absl::InvalidArgumentError(
        absl::StrCat("vision hidden_act \"", c.hidden_act, "\" is not supported (", act, ")"));
  }
  if (c.embed_dim / c.num_heads > 512 || (c.embed_dim / c.num_heads) % 4 != 0) {
    return absl::InvalidArgumentError("vision head_dim must be a multiple of 4 and at most 512");
  }
  t->SetPool(options);
  cpu::ThreadPool& pool = *t->pool_;
  const int64_t group = options.int8_group;
  const int e = c.embed_dim,
            patch_dim = c.in_channels * c.temporal_patch_size * c.patch_size * c.patch_size;
  RETURN_IF_ERROR(LoadDense(ckpt, "patch_embed.proj", e, patch_dim, qwen3, pool, group,
                            &t->patch_embed_,
                            {e, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}));
  t->blocks_.resize(c.depth);
  // Qwen2.5-VL: RMSNorms (weights only) and the gated MLP
  // (mlp.gate_proj/up_proj/down_proj) in place of LayerNorms and fc1/fc2.
  const int mlp = gated || qwen3 ? c.intermediate_size : e * c.mlp_ratio;
  for (int i = 0; i < c.depth; ++i) {
    Block& b = t->blocks_[i];
    const std::string p = absl::StrCat("blocks.", i, ".");
    ASSIGN_OR_RETURN(b.norm1_w, LoadVector(ckpt, p + "norm1.weight", e));
    ASSIGN_OR_RETURN(b.norm2_w, LoadVector(ckpt, p + "norm2.weight", e));
    if (!gated) {
      ASSIGN_OR_RETURN(b.norm1_b, LoadVector(ckpt, p + "norm1.bias", e));
      ASSIGN_OR_RETURN(b.norm2_b, LoadVector(ckpt, p + "norm2.bias", e));
    }
    RETURN_IF_ERROR(LoadDense(ckpt, p + "attn.qkv", 3 * e, e, true, pool, group, &b.qkv));
    RETURN_IF_ERROR(LoadDense(ckpt, p + "attn.proj", e, e, true, pool, group, &b.proj));
    const std::string fc1 = gated ? "mlp.gate_proj" : qwen3 ? "mlp.linear_fc1" : "mlp.fc1";
    const std::string fc2 = gated ? "mlp.down_proj" : qwen3 ? "mlp.linear_fc2" : "mlp.fc2";
    RETURN_IF_ERROR(LoadDense(ckpt, p + fc1, mlp, e, true, pool, group, &b.fc1));
    if (gated)
      RETURN_IF_ERROR(LoadDense(ckpt, p + "mlp.up_proj", mlp, e, true, pool, group, &b.up));
    RETURN_IF_ERROR(LoadDense(ckpt, p + fc2, e, mlp, true, pool, group, &b.fc2));
  }
  const int merged = e * c.spatial_merge_size * c.spatial_merge_size;
  if (qwen3) {
    RETURN_IF_ERROR(LoadQwen3Parts(ckpt, c, pool, group, t.get()));
    return t;
  }
  ASSIGN_OR_RETURN(t->ln_q_w_, LoadVector(ckpt, "merger.ln_q.weight", e));
  if (!gated) {
    ASSIGN_OR_RETURN(t->ln_q_b_, LoadVector(ckpt, "merger.ln_q.bias", e));
  }
  RETURN_IF_ERROR(
      LoadDense(ckpt, "merger.mlp.0", merged, merged, true, pool, group, &t->merger_fc1_));
  RETURN_IF_ERROR(
      LoadDense(ckpt, "merger.mlp.2", c.hidden_size, merged, true, pool, group, &t->merger_fc2_));
  return t;
}

}  // namespace mmserve::model
