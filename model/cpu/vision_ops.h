// Row-wise kernels of the vision tower (model/vision_tower.cc): attention's
// softmax over a block of score rows, QuickGELU and LayerNorm.
//
//   SoftmaxRows(scores, rows, cols);           // each row -> probabilities
//   QuickGeluInPlace(mlp + r0 * dim, n * dim);  // x * sigmoid(1.702 x)
//   LayerNormRows(x, rows, dim, w, b, 1e-6f, y);
//
// They run on the calling thread (callers split the rows over their pool).
// At the kAvx2 level (cpu_isa.h) they are the scalar loops with std::exp
// the tower has always run (the same bits). At kAvx512 they run on 16 lanes
// with a polynomial e^x (exp8.h's, relative error ~1e-7), softmax's row sum
// in 16 lanes then a fixed tree: each row's result still depends only on
// that row, but is not bitwise the kAvx2 result. LayerNormRows is bitwise
// the same at both levels (below).
// Thread-safety: no shared state.
#ifndef MMSERVE_MODEL_CPU_VISION_OPS_H_
#define MMSERVE_MODEL_CPU_VISION_OPS_H_

#include <cstdint>

namespace mmserve::model::cpu {

// Each of `rows` rows of `cols` floats (row stride cols): s <- e^(s - max)
// / sum of those (the maximum subtracted, as torch.softmax).
void SoftmaxRows(float* s, int64_t rows, int64_t cols);

// x[i] <- x[i] / (1 + e^(-1.702 x[i])) (QuickGELU) over count floats.
void QuickGeluInPlace(float* x, int64_t count);

// y[r] = (x[r] - mean) / sqrt(var + eps) * weight + bias for `rows` rows of
// `dim` floats (torch.nn.LayerNorm: the biased variance of the row, summed
// as squares of x - mean). Element i of a row adds into the (i % 64)th of
// 64 partial sums (independent chains), which then add in a fixed tree;
// the variance's squares are FMAs, and so is the last step, (x - mean) *
// inv * weight + bias: the same operations at both levels (8-lane
// registers at kAvx2, 16-lane at kAvx512, masked tails), bitwise the same
// results, each row's depending only on that row. y may alias x.
void LayerNormRows(const float* x, int64_t rows, int64_t dim, const float* weight,
                   const float* bias, float eps, float* y);

namespace internal {
// The kAvx512 bodies (vision_ops_avx512.cc); CPU must have AVX-512.
void SoftmaxRowsAvx512(float* s, int64_t rows, int64_t cols);
void QuickGeluInPlaceAvx512(float* x, int64_t count);
void LayerNormRowAvx512(const float* x, int64_t dim, const float* weight, const float* bias,
                        float eps, float* y);
// 16 partial sums added in LayerNormRows' fixed tree (both levels; also
// the AVX-512 softmax's row sum).
float SumSixteen(const float* part);
}  // namespace internal

}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_VISION_OPS_H_
