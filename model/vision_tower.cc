#include "model/vision_tower.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "model/cpu/ops.h"
#include "model/cpu/rope_ops.h"
#include "model/cpu/vision_ops.h"
#include "model/vision_position_embed.h"
#include "model/vision_windows.h"

namespace mmserve::model {
namespace {

constexpr float kLayerNormEps = 1e-6f;
constexpr float kRopeTheta = 10000.0f;
// Adds the time from its construction to its end to *seconds (none if null).
class StageTimer {
 public:
  explicit StageTimer(double* seconds) : seconds_(seconds) {}
  ~StageTimer() {
    if (seconds_ != nullptr) *seconds_ += watch_.ElapsedSeconds();
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

 private:
  double* seconds_;
  Stopwatch watch_;
};

// The trace's timing field for a stage (null without a trace).
double* StageSeconds(VisionTrace* trace, double VisionTrace::*field) {
  return trace == nullptr ? nullptr : &(trace->*field);
}

// x += h on the calling thread (an add gives the same bits at any vector
// width; -ffast-math lets GCC vectorize it). Handing it to the pool
// (cpu::AddInPlace) measured slower in vision_bench on the shared 2-core
// machine: 64 hand-offs per forward at depth 8 for ~0.1 ms of work each.
void AddResidual(const float* h, int64_t count, float* x) {
  for (int64_t i = 0; i < count; ++i) x[i] += h[i];
}

// Row-parallel helpers; `grain` rows per chunk handed to a thread.
void LayerNorm(cpu::ThreadPool& pool, const float* x, int64_t n, int dim,
               const std::vector<float>& w, const std::vector<float>& b, float* y) {
  pool.ParallelFor(n, 8, [&](int64_t begin, int64_t end) {
    cpu::LayerNormRows(x + begin * dim, end - begin, dim, w.data(), b.data(), kLayerNormEps,
                       y + begin * dim);
  });
}

float Gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

// torch's gelu(approximate="tanh") (gelu_pytorch_tanh).
float GeluTanh(float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(kBeta * (x + 0.044715f * x * x * x)));
}

template <typename F>
void MapRows(cpu::ThreadPool& pool, float* x, int64_t n, int dim, F f) {
  pool.ParallelFor(n, 4, [&](int64_t begin, int64_t end) {
    for (float* v = x + begin * dim; v < x + end * dim; ++v) *v = f(*v);
  });
}

// cos/sin [patches][head_dim / 2] of the 2-D rotary embedding: each patch's
// (row, column) in its image grid, listed in merge-block order. transformers'
// tables, cat(freqs, freqs), repeat these in the second half of each head;
// cpu::RotateHalf takes the first half (rope_ops.h), with the same results.
void RotaryTables(absl::Span<const MediaGrid> grids, int merge, int head_dim,
                  std::vector<float>* cos_t, std::vector<float>* sin_t) {
  const int quarter = head_dim / 4;  // frequencies per axis
  std::vector<float> inv_freq(quarter);
  for (int i = 0; i < quarter; ++i) {
    inv_freq[i] = 1.0f / std::pow(kRopeTheta, static_cast<float>(2 * i) / (head_dim / 2));
  }
  cos_t->clear();
  sin_t->clear();
  std::vector<float> angle(2 * quarter);
  for (const MediaGrid& g : grids) {
    for (int t = 0; t < g.grid_t; ++t) {
      for (int bh = 0; bh < g.grid_h / merge; ++bh) {
        for (int bw = 0; bw < g.grid_w / merge; ++bw) {
          for (int mh = 0; mh < merge; ++mh) {
            for (int mw = 0; mw < merge; ++mw) {
              const float row = static_cast<float>(bh * merge + mh);
              const float col = static_cast<float>(bw * merge + mw);
              for (int i = 0; i < quarter; ++i) {
                angle[i] = row * inv_freq[i];
                angle[i + quarter] = col * inv_freq[i];
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

// Rotates q and k of `rows` fused q|k|v rows (patches r0 on) in place, then
// scatters them: q row-major into q, k and v head-major ([heads][n][head_dim])
// into k and v. Row by row, so that each row is scattered while in cache.
void RotateAndScatter(cpu::ThreadPool& pool, int64_t r0, int64_t rows, int64_t n, int heads,
                      int head_dim, const std::vector<float>& cos_t,
                      const std::vector<float>& sin_t, float* qkv, float* q, float* k, float* v) {
  const int e = heads * head_dim, half = head_dim / 2;
  pool.ParallelFor(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* src = qkv + r * 3 * e;
      // q's heads then k's: 2 * heads head vectors at the patch's angles.
      cpu::RotateHalf({&cos_t[(r0 + r) * half], &sin_t[(r0 + r) * half], 1, 2 * heads, head_dim},
                      src);
      for (int hd = 0; hd < heads; ++hd) {
        const size_t at = (static_cast<size_t>(hd) * n + r0 + r) * head_dim;
        std::memcpy(k + at, src + e + hd * head_dim, head_dim * sizeof(float));
        std::memcpy(v + at, src + 2 * e + hd * head_dim, head_dim * sizeof(float));
      }
      std::memcpy(q + (r0 + r) * e, src, e * sizeof(float));
    }
  });
}

// Rows of the MLP, projections and q/k/v per chunk: bounds the scratch
// buffers (activation memory matters next to 1.3 GB of bf16 weights) while
// keeping the linear layers fast (linear_bench: the panel kernel reaches
// 150-180 GFLOP/s from 32 rows).
constexpr int64_t kRowChunk = 256;
// Query rows of one head per attention task.
constexpr int kQueryTile = 64;
// The patch rows where each image's (and frame's) attention segment starts,
// then the total: {0, n_0, n_0 + n_1, ..., n}. InvalidArgument for an empty
// grid, one not a multiple of the merge size, or too many patches.
// Rows of `width` floats in groups: group order[i] moves to position i
// (inverse: position i moves back to group order[i]).
void PermuteGroups(const std::vector<int>& order, int64_t width, bool inverse,
                   std::vector<float>* v) {
  std::vector<float> out(v->size());
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t from = inverse ? i : order[i], to = inverse ? order[i] : i;
    std::memcpy(&out[to * width], &(*v)[from * width], width * sizeof(float));
  }
  v->swap(out);
}

absl::StatusOr<std::vector<int>> AttentionBounds(absl::Span<const MediaGrid> grids, int merge) {
  int64_t n = 0;
  std::vector<int> bounds = {0};
  for (const MediaGrid& g : grids) {
    if (g.grid_t <= 0 || g.grid_h <= 0 || g.grid_w <= 0 || g.grid_h % merge != 0 ||
        g.grid_w % merge != 0) {
      return absl::InvalidArgumentError("image grid is empty or not a multiple of the merge size");
    }
    for (int t = 0; t < g.grid_t; ++t) {
      n += static_cast<int64_t>(g.grid_h) * g.grid_w;
      if (n > INT32_MAX / 4) return absl::InvalidArgumentError("too many patches in one forward");
      bounds.push_back(static_cast<int>(n));
    }
  }
  return bounds;
}

}  // namespace

void VisionTower::SetPool(const VisionTowerOptions& options) {
  static std::once_flag once;
  // The pool supplies the parallelism; OpenBLAS's own threads would fight it.
  std::call_once(once, [] { openblas_set_num_threads(1); });
  bf16_activations_ = options.bf16_activations;
  int8_activations_ = options.int8_activations;
  if (options.pool != nullptr) {
    pool_ = options.pool;
  } else {
    own_pool_ = std::make_unique<cpu::ThreadPool>(cpu::ThreadPool::DefaultThreads());
    pool_ = own_pool_.get();
  }
}

absl::StatusOr<int64_t> VisionInt8Group(const std::string& quantize) {
  if (quantize.empty() || quantize == "none") return -1;
  if (quantize == "int8") return 0;
  if (quantize == "int8_g32") return 32;
  if (absl::StartsWith(quantize, "int4")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--quantize=", quantize,
        ": the vision tower's linear layers take none, int8 or int8_g32 (4-bit weights are for "
        "the language model)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --quantize \"", quantize, "\" (none, int8 or int8_g32)"));
}

absl::StatusOr<ActivationDtype> ParseActivationDtype(const std::string& activation_dtype,
                                                     const std::string& quantize) {
  const bool quantized = !quantize.empty() && quantize != "none";
  if (activation_dtype.empty() || activation_dtype == "f32") return ActivationDtype::kF32;
  if (activation_dtype == "bf16") {
    if (quantized) {
      return absl::InvalidArgumentError(
          "--activation_dtype=bf16 does not combine with --quantize (int8 layers run fp32 "
          "activations)");
    }
    return ActivationDtype::kBf16;
  }
  if (activation_dtype == "int8") {
    if (!quantized) {
      return absl::InvalidArgumentError(
          "--activation_dtype=int8 needs --quantize=int8 or int8_g32 (only int8 layers take "
          "int8 activations)");
    }
    return ActivationDtype::kInt8;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --activation_dtype \"", activation_dtype, "\" (f32, bf16 or int8)"));
}
void VisionTower::Linear(const DenseWeights& d, const float* x, int64_t rows, float* y,
                         VisionTrace* trace) const {
  Stopwatch w;
  // kBf16Dot runs bf16 panels only; others keep their kernel.
  const bool bf16_panels =
      d.matrix.dtype == DType::kBF16 && d.matrix.layout == cpu::WeightLayout::kPanels;
  const bool int8 = d.matrix.dtype == DType::kI8;
  cpu::LinearKernel kernel = d.kernel;
  if (bf16_activations_ && bf16_panels) kernel = cpu::LinearKernel::kBf16Dot;
  if (int8_activations_ && int8) kernel = cpu::LinearKernel::kInt8Act;
  cpu::Linear(*pool_, x, rows, d.matrix, d.b, y, kernel);
  if (trace != nullptr) trace->gemm_seconds += w.ElapsedSeconds();
}

// Bidirectional attention inside each segment [bounds[i], bounds[i + 1]),
// in tasks of (head, 64 query rows) spread over the pool. q is [n][heads *
// head_dim]; k and v are head-major, [heads][n][head_dim], so each task's
// keys and values are contiguous. Each task writes its output over its own
// query block (read by no other task): q then holds the attention output.
void VisionTower::Attention(float* q, const float* k, const float* v, int64_t n,
                            absl::Span<const int> bounds, VisionTrace* trace) const {
  Stopwatch watch;
  const int e = cfg_.embed_dim, heads = cfg_.num_heads, hd = e / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  struct Task {
    int begin, len, q0, q1, head;
  };
  std::vector<Task> tasks;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    const int len = bounds[i + 1] - bounds[i];
    for (int h = 0; h < heads; ++h) {
      for (int q0 = 0; q0 < len; q0 += kQueryTile) {
        tasks.push_back({bounds[i], len, q0, std::min(len, q0 + kQueryTile), h});
      }
    }
  }
  pool_->ParallelFor(static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores, out;
    for (int64_t ti = begin; ti < end; ++ti) {
      const Task& t = tasks[ti];
      const int m = t.q1 - t.q0, s = t.len;
      float* qt = q + static_cast<int64_t>(t.begin + t.q0) * e + t.head * hd;
      const float* kh = k + (t.head * n + t.begin) * hd;
      const float* vh = v + (t.head * n + t.begin) * hd;
      scores.resize(static_cast<size_t>(m) * s);
      out.resize(static_cast<size_t>(m) * hd);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, s, hd, scale, qt, e, kh, hd, 0.0f,
                  scores.data(), s);
      cpu::SoftmaxRows(scores.data(), m, s);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hd, s, 1.0f, scores.data(), s, vh,
                  hd, 0.0f, out.data(), hd);
      for (int r = 0; r < m; ++r) {
        std::memcpy(qt + static_cast<int64_t>(r) * e, out.data() + static_cast<size_t>(r) * hd,
                    hd * sizeof(float));
      }
    }
  });
  if (trace != nullptr) trace->attention_seconds += watch.ElapsedSeconds();
}

// Forward's buffers. x: the residual stream; q (then the attention output),
// k, v: see Attention; about 4 floats per patch and embed dim. h, qkv, mlp:
// one row chunk's; cos, sin: RotaryTables.
struct VisionTower::Activations {
  int64_t n = 0, chunk = 0;
  std::vector<float> x, q, k, v, h, qkv, mlp, up, cos, sin;
};

void VisionTower::Norm(const std::vector<float>& w, const std::vector<float>& b, const float* x,
                       int64_t n, float* y) const {
  if (b.empty()) {
    cpu::RmsNorm(*pool_, x, n, cfg_.embed_dim, w.data(), kLayerNormEps, y);
  } else {
    LayerNorm(*pool_, x, n, cfg_.embed_dim, w, b, y);
  }
}

void VisionTower::AttentionHalf(const Block& b, absl::Span<const int> bounds, Activations* a,
                                VisionTrace* trace) const {
  const int e = cfg_.embed_dim, heads = cfg_.num_heads;
  for (int64_t r0 = 0; r0 < a->n; r0 += a->chunk) {
    const int64_t rows = std::min(a->chunk, a->n - r0);
    {
      const StageTimer t(StageSeconds(trace, &VisionTrace::norm_seconds));
      Norm(b.norm1_w, b.norm1_b, &a->x[r0 * e], rows, a->h.data());
    }
    Linear(b.qkv, a->h.data(), rows, a->qkv.data(), trace);
    const StageTimer t(StageSeconds(trace, &VisionTrace::rope_seconds));
    RotateAndScatter(*pool_, r0, rows, a->n, heads, e / heads, a->cos, a->sin, a->qkv.data(),
                     a->q.data(), a->k.data(), a->v.data());
  }
  Attention(a->q.data(), a->k.data(), a->v.data(), a->n, bounds, trace);
}

void VisionTower::MlpHalf(const Block& b, Activations* a, VisionTrace* trace) const {
  const int e = cfg_.embed_dim, mlp_dim = b.fc1.out;
  double* elementwise = StageSeconds(trace, &VisionTrace::elementwise_seconds);
  for (int64_t r0 = 0; r0 < a->n; r0 += a->chunk) {
    const int64_t rows = std::min(a->chunk, a->n - r0);
    float* xr = &a->x[r0 * e];
    Linear(b.proj, &a->q[r0 * e], rows, a->h.data(), trace);
    {
      const StageTimer t(elementwise);
      AddResidual(a->h.data(), rows * e, xr);
    }
    {
      const StageTimer t(StageSeconds(trace, &VisionTrace::norm_seconds));
      Norm(b.norm2_w, b.norm2_b, xr, rows, a->h.data());
    }
    Linear(b.fc1, a->h.data(), rows, a->mlp.data(), trace);
    if (b.up.out > 0) Linear(b.up, a->h.data(), rows, a->up.data(), trace);
    {
      const StageTimer t(elementwise);
      if (b.up.out > 0) {
        cpu::SiluMul(*pool_, a->mlp.data(), a->up.data(), rows * mlp_dim, a->mlp.data());
      } else if (cfg_.arch == VisionConfig::Arch::kQwen3Vl) {
        MapRows(*pool_, a->mlp.data(), rows, mlp_dim, GeluTanh);
      } else {
        pool_->ParallelFor(rows, 4, [&](int64_t begin, int64_t end) {
          cpu::QuickGeluInPlace(&a->mlp[begin * mlp_dim], (end - begin) * mlp_dim);
        });
      }
    }
    Linear(b.fc2, a->mlp.data(), rows, a->h.data(), trace);
    const StageTimer t(elementwise);
    AddResidual(a->h.data(), rows * e, xr);
  }
}

std::vector<float> VisionTower::Merge(const std::vector<float>& norm_w,
                                      const std::vector<float>& norm_b, bool postshuffle,
                                      const DenseWeights& fc1, const DenseWeights& fc2,
                                      Activations* a, VisionTrace* trace) const {
  // transformers' Qwen3VLVisionPatchMerger (and Qwen2-VL's PatchMerger
  // without postshuffle): each run of merge^2 patches becomes one row.
  const int m2 = cfg_.spatial_merge_size * cfg_.spatial_merge_size;
  const int64_t tokens = a->n / m2;
  {
    const StageTimer t(StageSeconds(trace, &VisionTrace::norm_seconds));
    if (postshuffle) {
      LayerNorm(*pool_, a->x.data(), tokens, cfg_.embed_dim * m2, norm_w, norm_b, a->q.data());
    } else {
      Norm(norm_w, norm_b, a->x.data(), a->n, a->q.data());
    }
  }
  Linear(fc1, a->q.data(), tokens, a->k.data(), trace);
  {
    const StageTimer t(StageSeconds(trace, &VisionTrace::elementwise_seconds));
    MapRows(*pool_, a->k.data(), tokens, fc1.out, Gelu);
  }
  std::vector<float> out(static_cast<size_t>(tokens) * fc2.out);
  Linear(fc2, a->k.data(), tokens, out.data(), trace);
  return out;
}

absl::StatusOr<std::vector<float>> VisionTower::Forward(absl::Span<const float> pixels,
                                                        absl::Span<const MediaGrid> grids,
                                                        VisionTrace* trace) const {
  ASSIGN_OR_RETURN(VisionEmbeddings all, ForwardAll(pixels, grids, trace));
  return std::move(all.main);
}

absl::StatusOr<VisionEmbeddings> VisionTower::ForwardAll(absl::Span<const float> pixels,
                                                         absl::Span<const MediaGrid> grids,
                                                         VisionTrace* trace) const {
  const VisionConfig& c = cfg_;
  const int e = c.embed_dim;
  const int m2 = c.spatial_merge_size * c.spatial_merge_size;
  absl::StatusOr<std::vector<int>> segments = AttentionBounds(grids, c.spatial_merge_size);
  if (!segments.ok()) return segments.status();
  const std::vector<int>& bounds = *segments;
  const int64_t n = bounds.back();
  const int patch_in = patch_embed_.in;
  if (n == 0 || pixels.size() != static_cast<size_t>(n) * patch_in) {
    return absl::InvalidArgumentError(absl::StrCat("pixel values hold ", pixels.size(),
                                                   " floats, the grids need ", n, " x ", patch_in));
  }
  Stopwatch total;
  Activations a;
  a.n = n;
  a.chunk = std::min<int64_t>(kRowChunk, n);
  const size_t ne = static_cast<size_t>(n) * e;
  a.x.resize(ne);
  a.q.resize(ne);
  a.k.resize(ne);
  a.v.resize(ne);
  a.h.resize(static_cast<size_t>(a.chunk) * e);
  a.qkv.resize(a.h.size() * 3);
  a.mlp.resize(static_cast<size_t>(a.chunk) * (blocks_.empty() ? 0 : blocks_[0].fc1.out));
  if (!blocks_.empty() && blocks_[0].up.out > 0) a.up.resize(a.mlp.size());
  for (int64_t r0 = 0; r0 < n; r0 += a.chunk) {
    Linear(patch_embed_, pixels.data() + r0 * patch_in, std::min(a.chunk, n - r0), &a.x[r0 * e],
           trace);
  }
  if (trace != nullptr && trace->record_activations) trace->patch_embed = a.x;
  if (!pos_embed_.empty())
    AddPositionEmbeddings(pos_embed_, e, grids, c.spatial_merge_size, a.x.data());
  {
    const StageTimer t(StageSeconds(trace, &VisionTrace::rope_seconds));
    RotaryTables(grids, c.spatial_merge_size, e / c.num_heads, &a.cos, &a.sin);
  }
  // Qwen2.5-VL: patches (and their angles) reordered window by window; the
  // frames stay contiguous, so the per-frame bounds hold for full attention.
  const bool windowed = c.arch == VisionConfig::Arch::kQwen25Vl;
  VisionWindows windows;
  if (windowed) {
    windows = PlanVisionWindows(grids, c.spatial_merge_size,
                                c.window_size / c.spatial_merge_size / c.patch_size);
    const int half = e / c.num_heads / 2;
    PermuteGroups(windows.group_order, int64_t{m2} * e, false, &a.x);
    PermuteGroups(windows.group_order, int64_t{m2} * half, false, &a.cos);
    PermuteGroups(windows.group_order, int64_t{m2} * half, false, &a.sin);
  }
  VisionEmbeddings result;
  for (size_t bi = 0; bi < blocks_.size(); ++bi) {
    const bool full =
        !windowed || std::find(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(),
                               static_cast<int>(bi)) != c.fullatt_block_indexes.end();
    AttentionHalf(blocks_[bi], full ? bounds : windows.bounds, &a, trace);
    MlpHalf(blocks_[bi], &a, trace);
    if (bi == 0 && trace != nullptr && trace->record_activations) {
      trace->block0 = a.x;  // in patch order
      if (windowed) PermuteGroups(windows.group_order, int64_t{m2} * e, true, &trace->block0);
    }
    // DeepStack (Qwen3-VL, never windowed): q and k are free between blocks.
    const auto& ds = c.deepstack_visual_indexes;
    const auto at = std::find(ds.begin(), ds.end(), static_cast<int>(bi));
    if (at != ds.end()) {
      const DeepstackMerger& m = deepstack_[at - ds.begin()];
      result.deepstack.push_back(Merge(m.norm_w, m.norm_b, true, m.fc1, m.fc2, &a, trace));
    }
  }
  // Merger: LayerNorm per patch, then each run of merge^2 patches as one row.
  std::vector<float> out = Merge(ln_q_w_, ln_q_b_, false, merger_fc1_, merger_fc2_, &a, trace);
  if (windowed) PermuteGroups(windows.group_order, merger_fc2_.out, true, &out);
  if (trace != nullptr) trace->total_seconds = total.ElapsedSeconds();
  result.main = std::move(out);
  return result;
}

std::vector<float> TokenRows(VisionEmbeddings e, int64_t hidden) {
  if (e.deepstack.empty()) return std::move(e.main);
  const int64_t levels = static_cast<int64_t>(e.deepstack.size());
  const int64_t tokens = static_cast<int64_t>(e.main.size()) / hidden;
  const int64_t width = (1 + levels) * hidden;
  std::vector<float> rows(tokens * width);
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = &rows[t * width];
    std::copy_n(&e.main[t * hidden], hidden, row);
    for (int64_t k = 0; k < levels; ++k) {
      std::copy_n(&e.deepstack[k][t * hidden], hidden, row + (1 + k) * hidden);
    }
  }
  return rows;
}

}  // namespace mmserve::model
