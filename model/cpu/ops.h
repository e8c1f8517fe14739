// Row-wise and element-wise CPU kernels of the decoder: RMSNorm, SwiGLU's
// silu(gate) * up, residual add, and embedding-row lookup.
//
//   RmsNorm(pool, hidden, num_tokens, hidden_size, norm_weight, eps, normed);
//   SiluMul(pool, gate, up, num_tokens * intermediate, act);
//
// Each row's (or element's) result depends only on that row's inputs, never
// on the batch around it or the thread that computes it. fp32 throughout.
// RmsNorm and SiluMul run on 16-lane registers at the kAvx512 level
// (cpu_isa.h), with the same operations per element as at kAvx2 (the sum of
// squares keeps kAvx2's eight FMA chains): bitwise the kAvx2 results.
// Thread-safety: as ThreadPool::ParallelFor (one caller per pool).
#ifndef MMSERVE_MODEL_CPU_OPS_H_
#define MMSERVE_MODEL_CPU_OPS_H_

#include <cstdint>

#include "model/cpu/thread_pool.h"

namespace mmserve::model::cpu {

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for `rows` rows of
// width n (Qwen2RMSNorm). out may alias x.
void RmsNorm(ThreadPool& pool, const float* x, int64_t rows, int64_t n, const float* weight,
             float eps, float* out);

// out[i] = gate[i] * sigmoid(gate[i]) * up[i], with an 8-lane e^x (relative
// error ~1e-7). out may alias gate or up.
void SiluMul(ThreadPool& pool, const float* gate, const float* up, int64_t count, float* out);

// x[i] += y[i].
void AddInPlace(ThreadPool& pool, float* x, const float* y, int64_t count);

namespace internal {
// 1 / sqrt(mean(x^2) + eps) over one row, the sum in eight FMA chains (both
// levels use it).
float RmsInverse(const float* x, int64_t n, float eps);
// The kAvx512 bodies (ops_avx512.cc); CPU must have AVX-512.
void RmsScaleRowAvx512(const float* x, int64_t n, const float* weight, float inv, float* out);
void SiluMulAvx512(const float* gate, const float* up, int64_t count, float* out);
}  // namespace internal

}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_OPS_H_
