#include "model/vision_tower.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace mmserve::model {
namespace {

constexpr float kLayerNormEps = 1e-6f;
constexpr float kRopeTheta = 10000.0f;

// Finds `name` under "visual." or "model.visual." and checks its shape.
absl::StatusOr<const TensorView*> FindTensor(const SafetensorsCheckpoint& ckpt,
                                             const std::string& name,
                                             const std::vector<int64_t>& shape) {
  const TensorView* t = ckpt.Find("visual." + name);
  if (t == nullptr) t = ckpt.Find("model.visual." + name);
  if (t == nullptr) return absl::InvalidArgumentError("missing tensor visual." + name);
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

absl::Status LoadDense(const SafetensorsCheckpoint& ckpt, const std::string& prefix, int out,
                       int in, bool bias, DenseWeights* d, std::vector<int64_t> shape = {}) {
  d->out = out;
  d->in = in;
  if (shape.empty()) shape = {out, in};
  ASSIGN_OR_RETURN(const TensorView* w, FindTensor(ckpt, prefix + ".weight", shape));
  size_t bias_at = 0;
  if (w->dtype == DType::kF32) {
    d->w = reinterpret_cast<const float*>(w->data);
  } else {
    d->owned = ToF32(*w);
    bias_at = d->owned.size();
  }
  if (bias) {
    ASSIGN_OR_RETURN(const TensorView* b, FindTensor(ckpt, prefix + ".bias", {out}));
    if (b->dtype == DType::kF32) {
      d->b = reinterpret_cast<const float*>(b->data);
    } else {
      std::vector<float> bf = ToF32(*b);
      d->owned.insert(d->owned.end(), bf.begin(), bf.end());
    }
  }
  // Pointers into `owned` only once it has stopped growing.
  if (w->dtype != DType::kF32) d->w = d->owned.data();
  if (bias && d->b == nullptr) d->b = d->owned.data() + bias_at;
  return absl::OkStatus();
}

// y[n][out] = x[n][in] W^T + b.
void Dense(const DenseWeights& d, const float* x, int n, float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, d.out, d.in, 1.0f, x, d.in, d.w, d.in,
              0.0f, y, d.out);
  if (d.b == nullptr) return;
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < d.out; ++c) y[static_cast<size_t>(r) * d.out + c] += d.b[c];
  }
}

void LayerNorm(const float* x, int n, int dim, const std::vector<float>& w,
               const std::vector<float>& b, float* y) {
  for (int r = 0; r < n; ++r) {
    const float* row = x + static_cast<size_t>(r) * dim;
    float mean = 0;
    for (int i = 0; i < dim; ++i) mean += row[i];
    mean /= dim;
    float var = 0;
    for (int i = 0; i < dim; ++i) var += (row[i] - mean) * (row[i] - mean);
    var /= dim;
    const float inv = 1.0f / std::sqrt(var + kLayerNormEps);
    float* out = y + static_cast<size_t>(r) * dim;
    for (int i = 0; i < dim; ++i) out[i] = (row[i] - mean) * inv * w[i] + b[i];
  }
}

// cos/sin [patches][head_dim] of the 2-D rotary embedding: each patch's
// (row, column) in its image grid, listed in merge-block order.
void RotaryTables(absl::Span<const ImageGrid> grids, int merge, int head_dim,
                  std::vector<float>* cos_t, std::vector<float>* sin_t) {
  const int quarter = head_dim / 4;  // frequencies per axis
  std::vector<float> inv_freq(quarter);
  for (int i = 0; i < quarter; ++i) {
    inv_freq[i] = 1.0f / std::pow(kRopeTheta, static_cast<float>(2 * i) / (head_dim / 2));
  }
  cos_t->clear();
  sin_t->clear();
  std::vector<float> angle(head_dim);
  for (const ImageGrid& g : grids) {
    for (int t = 0; t < g.grid_t; ++t) {
      for (int bh = 0; bh < g.grid_h / merge; ++bh) {
        for (int bw = 0; bw < g.grid_w / merge; ++bw) {
          for (int mh = 0; mh < merge; ++mh) {
            for (int mw = 0; mw < merge; ++mw) {
              const float row = static_cast<float>(bh * merge + mh);
              const float col = static_cast<float>(bw * merge + mw);
              for (int i = 0; i < quarter; ++i) {
                angle[i] = angle[i + 2 * quarter] = row * inv_freq[i];
                angle[i + quarter] = angle[i + 3 * quarter] = col * inv_freq[i];
              }
              for (float a : angle) {
                cos_t->push_back(std::cos(a));
                sin_t->push_back(std::sin(a));
              }
            }
          }
        }
      }
    }
  }
}

// x = x * cos + rotate_half(x) * sin for one head vector.
void Rotate(float* x, const float* cos_r, const float* sin_r, int head_dim) {
  const int half = head_dim / 2;
  float tmp[512];
  std::copy(x, x + head_dim, tmp);
  for (int i = 0; i < head_dim; ++i) {
    const float rot = i < half ? -tmp[i + half] : tmp[i - half];
    x[i] = tmp[i] * cos_r[i] + rot * sin_r[i];
  }
}

// Bidirectional attention inside [begin, end) for every head; qkv rows are
// [3][heads][head_dim], out rows [heads][head_dim].
void SegmentAttention(const float* qkv, int begin, int end, int heads, int head_dim, float* out,
                      std::vector<float>* scores) {
  const int e = heads * head_dim;
  const int s = end - begin;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  scores->resize(static_cast<size_t>(s) * s);
  for (int h = 0; h < heads; ++h) {
    const float* q = qkv + static_cast<size_t>(begin) * 3 * e + h * head_dim;
    const float* k = q + e;
    const float* v = q + 2 * e;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, head_dim, scale, q, 3 * e, k, 3 * e,
                0.0f, scores->data(), s);
    for (int r = 0; r < s; ++r) {
      float* row = scores->data() + static_cast<size_t>(r) * s;
      const float m = *std::max_element(row, row + s);
      float sum = 0;
      for (int c = 0; c < s; ++c) sum += row[c] = std::exp(row[c] - m);
      const float inv = 1.0f / sum;
      for (int c = 0; c < s; ++c) row[c] *= inv;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, head_dim, s, 1.0f, scores->data(), s,
                v, 3 * e, 0.0f, out + static_cast<size_t>(begin) * e + h * head_dim, e);
  }
}

float QuickGelu(float x) { return x / (1.0f + std::exp(-1.702f * x)); }
float Gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

}  // namespace

absl::StatusOr<std::unique_ptr<VisionTower>> VisionTower::Load(const SafetensorsCheckpoint& ckpt,
                                                               const ModelConfig& config) {
  if (!config.vision) return absl::InvalidArgumentError("the model has no vision_config");
  std::unique_ptr<VisionTower> t(new VisionTower());
  const VisionConfig& c = t->cfg_ = *config.vision;
  if (c.hidden_act != "quick_gelu") {
    return absl::InvalidArgumentError(
        absl::StrCat("vision hidden_act \"", c.hidden_act, "\" is not supported (quick_gelu)"));
  }
  if (c.embed_dim / c.num_heads > 512 || (c.embed_dim / c.num_heads) % 4 != 0) {
    return absl::InvalidArgumentError("vision head_dim must be a multiple of 4 and at most 512");
  }
  const int e = c.embed_dim,
            patch_dim = c.in_channels * c.temporal_patch_size * c.patch_size * c.patch_size;
  RETURN_IF_ERROR(LoadDense(ckpt, "patch_embed.proj", e, patch_dim, false, &t->patch_embed_,
                            {e, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}));
  t->blocks_.resize(c.depth);
  const int mlp = e * c.mlp_ratio;
  for (int i = 0; i < c.depth; ++i) {
    Block& b = t->blocks_[i];
    const std::string p = absl::StrCat("blocks.", i, ".");
    ASSIGN_OR_RETURN(b.norm1_w, LoadVector(ckpt, p + "norm1.weight", e));
    ASSIGN_OR_RETURN(b.norm1_b, LoadVector(ckpt, p + "norm1.bias", e));
    ASSIGN_OR_RETURN(b.norm2_w, LoadVector(ckpt, p + "norm2.weight", e));
    ASSIGN_OR_RETURN(b.norm2_b, LoadVector(ckpt, p + "norm2.bias", e));
    RETURN_IF_ERROR(LoadDense(ckpt, p + "attn.qkv", 3 * e, e, true, &b.qkv));
    RETURN_IF_ERROR(LoadDense(ckpt, p + "attn.proj", e, e, true, &b.proj));
    RETURN_IF_ERROR(LoadDense(ckpt, p + "mlp.fc1", mlp, e, true, &b.fc1));
    RETURN_IF_ERROR(LoadDense(ckpt, p + "mlp.fc2", e, mlp, true, &b.fc2));
  }
  const int merged = e * c.spatial_merge_size * c.spatial_merge_size;
  ASSIGN_OR_RETURN(t->ln_q_w_, LoadVector(ckpt, "merger.ln_q.weight", e));
  ASSIGN_OR_RETURN(t->ln_q_b_, LoadVector(ckpt, "merger.ln_q.bias", e));
  RETURN_IF_ERROR(LoadDense(ckpt, "merger.mlp.0", merged, merged, true, &t->merger_fc1_));
  RETURN_IF_ERROR(LoadDense(ckpt, "merger.mlp.2", c.hidden_size, merged, true, &t->merger_fc2_));
  return t;
}

absl::StatusOr<std::vector<float>> VisionTower::Forward(absl::Span<const float> pixels,
                                                        absl::Span<const ImageGrid> grids,
                                                        VisionTrace* trace) const {
  const VisionConfig& c = cfg_;
  const int e = c.embed_dim, heads = c.num_heads, head_dim = e / heads;
  const int m2 = c.spatial_merge_size * c.spatial_merge_size;
  int n = 0;
  std::vector<int> bounds = {0};  // per image (and frame) attention segments
  for (const ImageGrid& g : grids) {
    if (g.grid_h % c.spatial_merge_size != 0 || g.grid_w % c.spatial_merge_size != 0) {
      return absl::InvalidArgumentError("image grid is not a multiple of the merge size");
    }
    for (int t = 0; t < g.grid_t; ++t) bounds.push_back(n += g.grid_h * g.grid_w);
  }
  if (n == 0 || pixels.size() != static_cast<size_t>(n) * patch_embed_.in) {
    return absl::InvalidArgumentError(absl::StrCat("pixel values hold ", pixels.size(),
                                                   " floats, the grids need ", n, " x ",
                                                   patch_embed_.in));
  }
  std::vector<float> x(static_cast<size_t>(n) * e), h(x.size()), attn(x.size());
  std::vector<float> qkv(static_cast<size_t>(n) * 3 * e), mlp, scores, cos_t, sin_t;
  Dense(patch_embed_, pixels.data(), n, x.data());
  if (trace != nullptr) trace->patch_embed = x;
  RotaryTables(grids, c.spatial_merge_size, head_dim, &cos_t, &sin_t);

  for (size_t bi = 0; bi < blocks_.size(); ++bi) {
    const Block& b = blocks_[bi];
    LayerNorm(x.data(), n, e, b.norm1_w, b.norm1_b, h.data());
    Dense(b.qkv, h.data(), n, qkv.data());
    for (int r = 0; r < n; ++r) {
      for (int part = 0; part < 2; ++part) {  // q and k
        for (int hd = 0; hd < heads; ++hd) {
          Rotate(&qkv[(static_cast<size_t>(r) * 3 + part) * e + hd * head_dim],
                 &cos_t[static_cast<size_t>(r) * head_dim],
                 &sin_t[static_cast<size_t>(r) * head_dim], head_dim);
        }
      }
    }
    for (size_t s = 0; s + 1 < bounds.size(); ++s) {
      SegmentAttention(qkv.data(), bounds[s], bounds[s + 1], heads, head_dim, attn.data(), &scores);
    }
    Dense(b.proj, attn.data(), n, h.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += h[i];
    LayerNorm(x.data(), n, e, b.norm2_w, b.norm2_b, h.data());
    mlp.resize(static_cast<size_t>(n) * b.fc1.out);
    Dense(b.fc1, h.data(), n, mlp.data());
    for (float& v : mlp) v = QuickGelu(v);
    Dense(b.fc2, mlp.data(), n, h.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += h[i];
    if (bi == 0 && trace != nullptr) trace->block0 = x;
  }
  // Merger: LayerNorm per patch, then each run of merge^2 patches as one row.
  LayerNorm(x.data(), n, e, ln_q_w_, ln_q_b_, h.data());
  const int tokens = n / m2;
  mlp.resize(static_cast<size_t>(tokens) * merger_fc1_.out);
  Dense(merger_fc1_, h.data(), tokens, mlp.data());
  for (float& v : mlp) v = Gelu(v);
  std::vector<float> out(static_cast<size_t>(tokens) * merger_fc2_.out);
  Dense(merger_fc2_, mlp.data(), tokens, out.data());
  return out;
}

}  // namespace mmserve::model
