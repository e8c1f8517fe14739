// The Qwen2-VL vision tower on CPU (fp32 compute): patch embedding (the 3-D
// convolution as one matmul), 2-D rotary embedding over each image's patch
// grid, transformer blocks whose attention stays inside each image, and the
// 2x2 patch merger that maps to the language model's hidden size.
//
//   ASSIGN_OR_RETURN(auto tower, VisionTower::Load(*checkpoint, config));
//   ASSIGN_OR_RETURN(std::vector<float> emb, tower->Forward(pixels, grids));
//   // emb: [sum of grids[i].num_tokens()][config.text.hidden_size]
//
// Several images run in one forward (their patches concatenated in order, as
// PreprocessImage lays them out). Weights stay in the mapped checkpoint when
// they are fp32; bf16/fp16 weights are converted to fp32 once at load.
// Forward is const and thread-compatible (call it from one thread at a time
// per tower, or keep one tower per thread).
#ifndef MMSERVE_MODEL_VISION_TOWER_H_
#define MMSERVE_MODEL_VISION_TOWER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/image_tokens.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace mmserve::model {

// A dense layer y = x W^T + b with W [out][in] as in PyTorch.
struct DenseWeights {
  int out = 0;
  int in = 0;
  const float* w = nullptr;
  const float* b = nullptr;  // may be null
  std::vector<float> owned;  // backing store when converted from bf16/fp16
};

// Intermediate activations, for parity tests.
struct VisionTrace {
  std::vector<float> patch_embed;  // [patches][embed_dim]
  std::vector<float> block0;       // output of the first block
};

class VisionTower {
 public:
  // Reads "visual.*" (or "model.visual.*") tensors; InvalidArgument naming a
  // missing or mis-shaped tensor. `checkpoint` must outlive the tower.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<VisionTower>> Load(
      const SafetensorsCheckpoint& checkpoint, const ModelConfig& config);

  // `pixels` holds sum(num_patches) rows of 3 * temporal * patch^2 values.
  // InvalidArgument when sizes disagree with the grids.
  [[nodiscard]] absl::StatusOr<std::vector<float>> Forward(absl::Span<const float> pixels,
                                                           absl::Span<const ImageGrid> grids,
                                                           VisionTrace* trace = nullptr) const;

  int out_hidden() const { return merger_fc2_.out; }

 private:
  struct Block {
    std::vector<float> norm1_w, norm1_b, norm2_w, norm2_b;
    DenseWeights qkv, proj, fc1, fc2;
  };
  VisionTower() = default;

  VisionConfig cfg_;
  DenseWeights patch_embed_;
  std::vector<Block> blocks_;
  std::vector<float> ln_q_w_, ln_q_b_;
  DenseWeights merger_fc1_, merger_fc2_;
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_VISION_TOWER_H_
