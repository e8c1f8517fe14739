// The Qwen2-VL and Qwen2.5-VL vision towers on CPU (fp32 activations and
// accumulation): patch embedding (the 3-D convolution as one matmul), 2-D
// rotary embedding over each image's patch grid, transformer blocks whose
// attention stays inside each image, and the 2x2 patch merger that maps to
// the language model's hidden size. Qwen2.5-VL's blocks use RMSNorm and a
// gated SiLU MLP, and attend inside windows (vision_windows.h) except in
// its full-attention blocks; the patches run in window order and the merged
// tokens come back in image order. Qwen3-VL's tower adds learned position
// embeddings (vision_position_embed.h) to the patch embeddings, runs
// LayerNorm blocks with a GELU(tanh) MLP, and after each block in
// deepstack_visual_indexes a DeepStack merger (LayerNorm over each merged
// 2x2 group, then fc1, GELU, fc2) whose output ForwardAll returns beside the
// main embedding.
//
//   ASSIGN_OR_RETURN(auto tower, VisionTower::Load(*checkpoint, config));
//   ASSIGN_OR_RETURN(std::vector<float> emb, tower->Forward(pixels, grids));
//   // emb: [sum of grids[i].num_tokens()][config.text.hidden_size]
//
// Several images of different sizes run in one forward (their patches
// concatenated in order, as PreprocessImage lays them out); each linear layer
// then sees every image's rows at once. A video is a grid with grid_t
// temporal patches (frame pairs, rows [t][h][w] in merge-block order, as
// Qwen2VLVideoProcessor's pixel_values_videos): its rotary positions are the
// (h, w) ones repeated per temporal patch and attention stays inside each
// temporal patch (cu_seqlens = repeat(h * w, t)), exactly as for t images;
// MediaGrid::kind does not matter here. Images and videos mix in one call. bf16 weights are
// repacked at load into model/cpu's panels (linear.h: the 6x16 AVX2 kernel) and their mapped pages
// dropped, so memory holds one bf16 copy; fp32 weights stay in the mapped checkpoint and run
// through OpenBLAS sgemm; fp16 weights become fp32. With VisionTowerOptions::int8_group every
// linear layer is int8 instead. Attention is tiled (64 query rows of one head against all keys of
// their image at a time), so its scratch memory is linear in the patch count, and the MLP runs in
// row chunks: activations are 4 floats per patch and embed dimension (x, q, k, v) plus fixed chunk
// buffers. Forward is const and thread-compatible (call it from one thread at a time per tower, or
// keep one tower per thread); it uses every thread of the tower's pool.
#ifndef MMSERVE_MODEL_VISION_TOWER_H_
#define MMSERVE_MODEL_VISION_TOWER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/cpu/linear.h"
#include "model/cpu/thread_pool.h"
#include "model/dtype.h"
#include "model/image_tokens.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace mmserve::model {

// A dense layer y = x W^T + b with W [out][in] as in PyTorch.
struct DenseWeights {
  int out = 0;
  int in = 0;
  cpu::WeightMatrix matrix;  // kPanels (bf16 in `panels`, int8 in `int8`) or kRows fp32
  cpu::PanelWeights panels;  // owns bf16 panels
  cpu::Int8Weights int8;     // owns int8 panels (VisionTowerOptions::int8_group >= 0)
  cpu::LinearKernel kernel = cpu::LinearKernel::kDot;  // kOpenBlas for fp32
  const float* b = nullptr;                            // may be null
  std::vector<float> owned;       // fp32 weights converted from fp16 (or random)
  std::vector<float> bias_owned;  // biases converted to fp32 (or random)
};

// Intermediate activations and timings, for parity tests and benchmarks.
struct VisionTrace {
  bool record_activations = true;  // fill patch_embed and block0 (copies)
  std::vector<float> patch_embed;  // [patches][embed_dim]
  std::vector<float> block0;       // output of the first block
  double gemm_seconds = 0;         // time inside linear layers
  double attention_seconds = 0;    // time inside attention (its GEMMs and softmax)
  double norm_seconds = 0;         // LayerNorms (the blocks' and the merger's)
  double rope_seconds = 0;         // rotary tables, q/k rotation and the q/k/v scatter
  double elementwise_seconds = 0;  // residual adds, QuickGELU, the merger's GELU
  double total_seconds = 0;        // the whole forward
};

struct VisionTowerOptions {
  // Borrowed; null: the tower owns a pool of ThreadPool::DefaultThreads().
  cpu::ThreadPool* pool = nullptr;
  // >= 0: every linear layer (patch embedding, blocks, merger) is quantized
  // at load to symmetric int8 (cpu::Int8Weights) with one scale per this
  // many columns, 0 meaning one per output row, and runs on the int8 panel
  // kernel; from bf16, fp16 or fp32 weights alike. -1: weights as stored.
  int64_t int8_group = -1;
  // true: the bf16 linear layers round their inputs to bf16 and run
  // LinearKernel::kBf16Dot (vdpbf16ps, fp32 accumulation); fp32 and int8
  // layers are unchanged.
  bool bf16_activations = false;
  // true: the int8 linear layers quantize their inputs to int8, one scale
  // per 32 columns, and run LinearKernel::kInt8Act (vpdpbusd); other layers
  // are unchanged.
  bool int8_activations = false;
};

// VisionTowerOptions::int8_group for a --quantize flag as ParseQuantize
// (qwen2_weights.h) reads it: "" or "none" -1, "int8" 0, "int8_g32" 32;
// InvalidArgument otherwise (the language model's int4 schemes with a
// message saying the tower does not take them).
[[nodiscard]] absl::StatusOr<int64_t> VisionInt8Group(const std::string& quantize);

// The linear layers' activations an --activation_dtype flag asks for.
enum class ActivationDtype {
  kF32,   // fp32 (int8 layers: int16, one scale per row)
  kBf16,  // VisionTowerOptions::bf16_activations, LinearKernel::kBf16Dot
  kInt8,  // VisionTowerOptions::int8_activations, LinearKernel::kInt8Act
};

// "" or "f32", "bf16", "int8"; InvalidArgument otherwise, for "bf16" with a
// --quantize other than "" or "none" (--quantize makes every linear layer
// an int8 panel, on which kBf16Dot runs kDot, so the pair would silently be
// fp32 activations), and for "int8" without one (only int8 layers take
// int8 activations, so the flag would silently do nothing).
[[nodiscard]] absl::StatusOr<ActivationDtype> ParseActivationDtype(
    const std::string& activation_dtype, const std::string& quantize);

// A forward's merged tokens: the main embedding and, for Qwen3-VL, one
// DeepStack feature per deepstack_visual_indexes entry, each
// [tokens][hidden_size] in the same token order.
struct VisionEmbeddings {
  std::vector<float> main;
  std::vector<std::vector<float>> deepstack;
};

// The embedding rows the language model takes, [tokens][(1 + levels) *
// hidden]: each token's main embedding, then its DeepStack features in order
// (ModelConfig::EmbeddingRowWidth). `e.main` itself when there are none.
std::vector<float> TokenRows(VisionEmbeddings e, int64_t hidden);

class VisionTower {
 public:
  // Reads "visual.*" (or "model.visual.*") tensors; InvalidArgument naming a
  // missing or mis-shaped tensor. `checkpoint` must outlive the tower.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<VisionTower>> Load(
      const SafetensorsCheckpoint& checkpoint, const ModelConfig& config,
      const VisionTowerOptions& options = {});

  // `pixels` holds sum(num_patches) rows of 3 * temporal * patch^2 values.
  // InvalidArgument when sizes disagree with the grids.
  [[nodiscard]] absl::StatusOr<std::vector<float>> Forward(absl::Span<const float> pixels,
                                                           absl::Span<const MediaGrid> grids,
                                                           VisionTrace* trace = nullptr) const;
  // The same with the DeepStack features (none but for Qwen3-VL).
  [[nodiscard]] absl::StatusOr<VisionEmbeddings> ForwardAll(absl::Span<const float> pixels,
                                                            absl::Span<const MediaGrid> grids,
                                                            VisionTrace* trace = nullptr) const;

  // A tower with random weights (uniform, std 0.02) of the given shape and
  // dtype (kF32 or kBF16; then int8 with options.int8_group >= 0), for
  // benchmarks that need real dimensions without a checkpoint.
  static std::unique_ptr<VisionTower> CreateRandom(const VisionConfig& config, uint64_t seed,
                                                   DType dtype = DType::kF32,
                                                   const VisionTowerOptions& options = {});

  int out_hidden() const { return merger_fc2_.out; }
  // Bytes of the weight matrices as held (bf16 or int8 panels, or fp32).
  size_t weight_bytes() const;

 private:
  // Qwen2-VL: LayerNorms, fc1 -> QuickGELU -> fc2. Qwen2.5-VL: RMSNorms (no
  // biases), fc1 = gate_proj and fc2 = down_proj around silu(gate) * up.
  struct Block {
    std::vector<float> norm1_w, norm1_b, norm2_w, norm2_b;  // *_b empty: RMSNorm
    DenseWeights qkv, proj, fc1, up, fc2;                   // up: gated MLPs only
  };
  // Qwen3-VL's DeepStack merger: LayerNorm over merged rows (merge^2 x
  // embed_dim wide), fc1, GELU, fc2.
  struct DeepstackMerger {
    std::vector<float> norm_w, norm_b;
    DenseWeights fc1, fc2;
  };
  VisionTower() = default;
  // Loads Qwen3-VL's position embeddings, merger and DeepStack mergers into t.
  static absl::Status LoadQwen3Parts(const SafetensorsCheckpoint& ckpt, const VisionConfig& c,
                                     cpu::ThreadPool& pool, int64_t group, VisionTower* t);
  // Sets the pool and the other run-time options.
  void SetPool(const VisionTowerOptions& options);
  void Linear(const DenseWeights& d, const float* x, int64_t rows, float* y,
              VisionTrace* trace) const;
  void Attention(float* q, const float* k, const float* v, int64_t n, absl::Span<const int> bounds,
                 VisionTrace* trace) const;
  struct Activations;  // Forward's buffers (vision_tower.cc)
  // One block over a->x: norm1, qkv, rotary embedding and attention (the
  // output left in a->q), then proj + residual, norm2, fc1, QuickGELU and
  // fc2 + residual.
  void AttentionHalf(const Block& b, absl::Span<const int> bounds, Activations* a,
                     VisionTrace* trace) const;
  void MlpHalf(const Block& b, Activations* a, VisionTrace* trace) const;
  // A merger on a->x (q and k as scratch): the norm (over each patch, or
  // over each merged row when `postshuffle`), fc1, GELU and fc2.
  std::vector<float> Merge(const std::vector<float>& norm_w, const std::vector<float>& norm_b,
                           bool postshuffle, const DenseWeights& fc1, const DenseWeights& fc2,
                           Activations* a, VisionTrace* trace) const;
  // LayerNorm with a bias, RMSNorm without, over n rows of the tower's width.
  void Norm(const std::vector<float>& w, const std::vector<float>& b, const float* x, int64_t n,
            float* y) const;

  VisionConfig cfg_;
  std::unique_ptr<cpu::ThreadPool> own_pool_;
  cpu::ThreadPool* pool_ = nullptr;
  bool bf16_activations_ = false;  // VisionTowerOptions::bf16_activations
  bool int8_activations_ = false;  // VisionTowerOptions::int8_activations
  DenseWeights patch_embed_;
  std::vector<Block> blocks_;
  std::vector<float> ln_q_w_, ln_q_b_;  // ln_q_b_ empty: RMSNorm
  DenseWeights merger_fc1_, merger_fc2_;
  std::vector<float> pos_embed_;            // kQwen3Vl: [num_position_embeddings][embed_dim]
  std::vector<DeepstackMerger> deepstack_;  // kQwen3Vl: one per deepstack index
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_VISION_TOWER_H_
