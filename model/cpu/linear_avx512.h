// The bf16 panel kernels of Linear on AVX-512 (a detail of model/cpu:
// include linear.h), run at the kAvx512 level of cpu_isa.h.
//
// One zmm register holds one k step of a whole panel (16 outputs), so a
// tile of 6 rows of x by 4 panels keeps 24 accumulators, 4 weight vectors
// and one broadcast x in the 32 registers. Each output element is still the
// single chain acc = fma(x[i][k], w[n][k], acc) over k = 0, 1, ... from 0,
// then + bias (the same vector add as the AVX2 kernels): lanes do not mix,
// so the results are bitwise those of the AVX2 kernels, whatever the tile.
#ifndef MMSERVE_MODEL_CPU_LINEAR_AVX512_H_
#define MMSERVE_MODEL_CPU_LINEAR_AVX512_H_

#include <cstdint>

#include "model/cpu/linear.h"

namespace mmserve::model::cpu::internal {

// k steps per cache block of the multi-row panel kernels (both levels).
inline constexpr int64_t kPanelKb = 256;
// Panels per parallel task of the panel kernels (both levels).
inline constexpr int64_t kPanelsPerTask = 4;

// Output columns of bf16 panels [p0, p1) of one job (p1 - p0 <=
// kPanelsPerTask), for all m > 1 rows of x. (One row, decode, stays on the
// AVX2 kernel at every level: on Zen 4, whose 512-bit units are two 256-bit
// halves, 512-bit one-row tiles of 4 and 8 panels measured 0.55-0.65x its
// speed.) `wide` is scratch of
// kPanelsPerTask * kPanelKb * kPanelRows floats. CPU must have AVX-512.
void PanelColumnsAvx512(const float* x, int64_t m, const LinearJob& job, int64_t p0, int64_t p1,
                        float* wide);

// Adds bias[j0 + j] to columns [0, cols) (cols <= 16) of `rows` rows of c
// (row stride ldc); a no-op when bias is null. The same additions at every
// level (linear.cc).
void AddBias(float* c, int64_t ldc, int rows, int64_t j0, int cols, const float* bias);

}  // namespace mmserve::model::cpu::internal

#endif  // MMSERVE_MODEL_CPU_LINEAR_AVX512_H_
