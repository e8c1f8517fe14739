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

// LayerNormRows' 64 partial sums at kAvx2 (element i into sum i % 64, in
// eight registers: a[2k] and a[2k + 1] hold sums 16k to 16k + 15), four
// chains per 16 lanes against one add's latency; then reduced to 16 as
// (p[l] + p[l + 16]) + (p[l + 32] + p[l + 48]) into part. add(acc, x, n)
// adds the first n (1 to 8) floats at x into acc.
template <typename Add>
void PartialSumsAvx2(const float* x, int64_t dim, Add add, float* part) {
  __m256 a[8];
  for (__m256& v : a) v = _mm256_setzero_ps();
  const int64_t full = dim / 64 * 64;
  for (int64_t j = 0; j < full; j += 64) {
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) a[k] = add(a[k], x + j + 8 * k, 8);
  }
  for (int k = 0; k < 8; ++k) {
    const int64_t n = std::min<int64_t>(dim - full - 8 * k, 8);
    if (n > 0) a[k] = add(a[k], x + full + 8 * k, n);
  }
  _mm256_store_ps(part, _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[4], a[6])));
  _mm256_store_ps(part + 8, _mm256_add_ps(_mm256_add_ps(a[1], a[3]), _mm256_add_ps(a[5], a[7])));
}

// The first n of 8 floats at x (0 in the other lanes, not read).
inline __m256 LoadFirst(const float* x, int64_t n) {
  return n == 8 ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, FirstLanes8(n));
}

// LayerNormRows' row at kAvx2, the output on 8 lanes.
void LayerNormRowAvx2(const float* x, int64_t dim, const float* w, const float* b, float eps,
                      float* y) {
  alignas(32) float part[16];
  PartialSumsAvx2(
      x, dim,
      [](__m256 acc, const float* p, int64_t n) { return _mm256_add_ps(acc, LoadFirst(p, n)); },
      part);
  const __m256 mean = _mm256_set1_ps(internal::SumSixteen(part) / static_cast<float>(dim));
  PartialSumsAvx2(
      x, dim,
      [mean](__m256 acc, const float* p, int64_t n) {
        __m256 d = _mm256_sub_ps(LoadFirst(p, n), mean);
        if (n < 8) d = _mm256_and_ps(d, _mm256_castsi256_ps(FirstLanes8(n)));
        return _mm256_fmadd_ps(d, d, acc);
      },
      part);
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
