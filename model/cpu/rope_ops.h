// The rotation of rotary position embeddings (RoPE and Qwen2-VL's M-RoPE,
// model/rope.h) applied to query or key rows, with HF's rotate_half
// convention: for pair j of a head of width d,
//   out[j]         = x[j] * cos[j] - x[j + d/2] * sin[j]
//   out[j + d/2]   = x[j + d/2] * cos[j] + x[j] * sin[j]
// each a product, a product and one add, rounded in that order (no fused
// multiply-add, as transformers computes q * cos + rotate_half(q) * sin).
//
//   RotateHalf({angles.cos.data(), angles.sin.data(), tokens, heads, head_dim}, q);
//
// HF's full-width tables (cos = cat(freqs, freqs).cos()) hold each pair's
// value in both halves of the head: their first halves are the tables here,
// and x * cos + rotate_half(x) * sin over the full width gives the same bits
// (a + (-b) * s rounds as a - b * s). The vision tower's 2-D tables take the
// same path: q and k of one patch share its row of cos/sin, so one call
// rotates both (2 * heads head vectors).
//
// At the kAvx2 level (cpu_isa.h) on 8 lanes, at kAvx512 on 16 lanes with a
// masked tail: the same operations per element, bitwise the same results.
// Runs on the calling thread. Thread-safety: no shared state.
#ifndef MMSERVE_MODEL_CPU_ROPE_OPS_H_
#define MMSERVE_MODEL_CPU_ROPE_OPS_H_

#include <cstdint>

namespace mmserve::model::cpu {

struct RotaryRows {
  const float* cos;  // [tokens][head_dim / 2]
  const float* sin;  // [tokens][head_dim / 2]
  int64_t tokens;
  int64_t heads;
  int head_dim;  // even
};

// Rotates x, [tokens][heads][head_dim], in place.
void RotateHalf(const RotaryRows& rows, float* x);

namespace internal {
// The kAvx512 body of one head vector (rope_ops_avx512.cc); CPU must have
// AVX-512.
void RotateHalfHeadAvx512(const float* cos, const float* sin, int half, float* v);
}  // namespace internal

}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_ROPE_OPS_H_
