// Rotary position embedding as Qwen2-VL applies it (M-RoPE): every token has
// three position components (temporal, height, width), and each rotary pair
// takes its angle from the component whose section it falls in.
//
//   MRope rope(/*head_dim=*/128, /*theta=*/1e6, /*mrope_section=*/{16, 24, 24});
//   RopeAngles angles;
//   rope.ComputeAngles(positions, num_tokens, &angles);  // positions: [3][num_tokens]
//   rope.Apply(angles, q, num_tokens, num_heads);         // once per layer, q and k
//
// For pair j in [0, head_dim / 2): inv_freq[j] = 1 / theta^(2j / head_dim),
// component c(j) = the section containing j (sections in order t, h, w; an
// empty mrope_section means plain RoPE, c(j) = 0), angle = pos[c(j)] *
// inv_freq[j]. With `interleaved` (Qwen3-VL, transformers'
// apply_interleaved_mrope) the sections take pairs in turn instead:
// c(j) = 1 for j % 3 == 1 below 3 x mrope_section[1], 2 for j % 3 == 2 below
// 3 x mrope_section[2], and 0 for every other pair. With HF's rotate_half
// convention
//   out[j]          = x[j] * cos - x[j + d/2] * sin
//   out[j + d/2]    = x[j + d/2] * cos + x[j] * sin.
// Angles are formed in fp32 as transformers does (inv_freq in fp32, then
// pos * inv_freq), so large positions round the same way. For text tokens the
// three components are equal and this is ordinary RoPE.
// Thread-safety: immutable after construction; Apply may run concurrently on
// disjoint data.
#ifndef MMSERVE_MODEL_ROPE_H_
#define MMSERVE_MODEL_ROPE_H_

#include <cstdint>
#include <vector>

namespace mmserve::model {

// cos and sin for every (token, rotary pair): [num_tokens][head_dim / 2] each.
struct RopeAngles {
  std::vector<float> cos;
  std::vector<float> sin;
};

class MRope {
 public:
  // head_dim even; mrope_section empty or summing to head_dim / 2 (CHECKed:
  // LoadModelConfig validates configs before they get here).
  MRope(int head_dim, double theta, std::vector<int> mrope_section, bool interleaved = false);

  int head_dim() const { return head_dim_; }

  // positions holds three rows of num_tokens (t, h, w), row-major.
  void ComputeAngles(const int64_t* positions, int64_t num_tokens, RopeAngles* out) const;

  // Rotates x, [num_tokens][num_heads][head_dim], in place.
  void Apply(const RopeAngles& angles, float* x, int64_t num_tokens, int64_t num_heads) const;

 private:
  int head_dim_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  std::vector<int> component_;   // [head_dim / 2]: 0, 1 or 2
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_ROPE_H_
