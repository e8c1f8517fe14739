#include "model/cpu/vision_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "model/cpu/cpu_isa.h"

namespace mmserve::model::cpu {
namespace {

// The first n of 8 lanes (none for n <= 0), for maskload and maskstore.
inline __m256i FirstLanes8(int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(n, 0, 8))),
                            lane);
}

// x - mean on the first n lanes of x, 0 on the others (not read).
inline __m256 CenteredPart(const float* x, int64_t n, __m256 mean) {
  const __m256i m = FirstLanes8(n);
  return _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(x, m), mean), _mm256_castsi256_ps(m));
}

// LayerNormRows' row at kAvx2: lanes 0-7 and 8-15 of the 16 partial sums in
// two registers, the output on 8 lanes.
void LayerNormRowAvx2(const float* x, int64_t dim, const float* w, const float* b, float eps,
                      float* y) {
  const int64_t full = dim / 16 * 16;
  alignas(32) float part[16];
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  for (int64_t j = 0; j < full; j += 16) {
    s0 = _mm256_add_ps(s0, _mm256_loadu_ps(x + j));
    s1 = _mm256_add_ps(s1, _mm256_loadu_ps(x + j + 8));
  }
  if (full < dim) {
    s0 = _mm256_add_ps(s0, _mm256_maskload_ps(x + full, FirstLanes8(dim - full)));
    s1 = _mm256_add_ps(s1, _mm256_maskload_ps(x + full + 8, FirstLanes8(dim - full - 8)));
  }
  _mm256_store_ps(part, s0);
  _mm256_store_ps(part + 8, s1);
  const __m256 mean = _mm256_set1_ps(internal::SumSixteen(part) / static_cast<float>(dim));
  s0 = s1 = _mm256_setzero_ps();
  for (int64_t j = 0; j < full; j += 16) {
    const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + j), mean);
    const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + j + 8), mean);
    s0 = _mm256_fmadd_ps(d0, d0, s0);
    s1 = _mm256_fmadd_ps(d1, d1, s1);
  }
  if (full < dim) {
    const __m256 d0 = CenteredPart(x + full, dim - full, mean);
    const __m256 d1 = CenteredPart(x + full + 8, dim - full - 8, mean);
    s0 = _mm256_fmadd_ps(d0, d0, s0);
    s1 = _mm256_fmadd_ps(d1, d1, s1);
  }
  _mm256_store_ps(part, s0);
  _mm256_store_ps(part + 8, s1);
  const __m256 inv =
      _mm256_set1_ps(1.0f / std::sqrt(internal::SumSixteen(part) / static_cast<float>(dim) + eps));
  int64_t j = 0;
  for (; j + 8 <= dim; j += 8) {
    const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), mean), inv);
    _mm256_storeu_ps(y + j, _mm256_fmadd_ps(t, _mm256_loadu_ps(w + j), _mm256_loadu_ps(b + j)));
  }
  if (j < dim) {
    const __m256i m = FirstLanes8(dim - j);
    const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(x + j, m), mean), inv);
    _mm256_maskstore_ps(
        y + j, m, _mm256_fmadd_ps(t, _mm256_maskload_ps(w + j, m), _mm256_maskload_ps(b + j, m)));
  }
}

}  // namespace

namespace internal {

float SumSixteen(const float* p) {
  float s[8];
  for (int i = 0; i < 8; ++i) s[i] = p[i] + p[i + 8];
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

}  // namespace internal

void SoftmaxRows(float* s, int64_t rows, int64_t cols) {
  if (ActiveCpuIsa() == CpuIsa::kAvx512) return internal::SoftmaxRowsAvx512(s, rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * cols;
    const float mx = *std::max_element(row, row + cols);
    float sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += row[c] = std::exp(row[c] - mx);
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < cols; ++c) row[c] *= inv;
  }
}

void QuickGeluInPlace(float* x, int64_t count) {
  if (ActiveCpuIsa() == CpuIsa::kAvx512) return internal::QuickGeluInPlaceAvx512(x, count);
  for (int64_t i = 0; i < count; ++i) x[i] = x[i] / (1.0f + std::exp(-1.702f * x[i]));
}

void LayerNormRows(const float* x, int64_t rows, int64_t dim, const float* weight,
                   const float* bias, float eps, float* y) {
  const auto row =
      ActiveCpuIsa() == CpuIsa::kAvx512 ? internal::LayerNormRowAvx512 : LayerNormRowAvx2;
  for (int64_t r = 0; r < rows; ++r) row(x + r * dim, dim, weight, bias, eps, y + r * dim);
}

}  // namespace mmserve::model::cpu
