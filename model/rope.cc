#include "model/rope.h"

#include <cmath>
#include <numeric>

#include "common/logging.h"
#include "model/cpu/rope_ops.h"

namespace mmserve::model {

MRope::MRope(int head_dim, double theta, std::vector<int> mrope_section, bool interleaved)
    : head_dim_(head_dim) {
  CHECK(head_dim > 0 && head_dim % 2 == 0) << "head_dim " << head_dim;
  const int half = head_dim / 2;
  if (!mrope_section.empty()) {
    CHECK_EQ(std::accumulate(mrope_section.begin(), mrope_section.end(), 0), half);
    CHECK_LE(mrope_section.size(), 3u);
  }
  inv_freq_.resize(half);
  component_.assign(half, 0);
  const float base = static_cast<float>(theta);
  for (int j = 0; j < half; ++j) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in fp32.
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    inv_freq_[j] = 1.0f / std::pow(base, exponent);
  }
  if (interleaved) {
    // transformers' Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope.
    CHECK_EQ(mrope_section.size(), 3u);
    for (int c = 1; c <= 2; ++c) {
      for (int j = c; j < 3 * mrope_section[c] && j < half; j += 3) component_[j] = c;
    }
    return;
  }
  int j = 0;
  for (size_t c = 0; c < mrope_section.size(); ++c) {
    for (int i = 0; i < mrope_section[c]; ++i) component_[j++] = static_cast<int>(c);
  }
}

void MRope::ComputeAngles(const int64_t* positions, int64_t num_tokens, RopeAngles* out) const {
  const int half = head_dim_ / 2;
  out->cos.resize(num_tokens * half);
  out->sin.resize(num_tokens * half);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int j = 0; j < half; ++j) {
      const float pos = static_cast<float>(positions[component_[j] * num_tokens + t]);
      const float angle = pos * inv_freq_[j];
      out->cos[t * half + j] = std::cos(angle);
      out->sin[t * half + j] = std::sin(angle);
    }
  }
}

void MRope::Apply(const RopeAngles& angles, float* x, int64_t num_tokens, int64_t num_heads) const {
  const int half = head_dim_ / 2;
  CHECK_GE(static_cast<int64_t>(angles.cos.size()), num_tokens * half);
  cpu::RotateHalf({angles.cos.data(), angles.sin.data(), num_tokens, num_heads, head_dim_}, x);
}

}  // namespace mmserve::model
