// The kAvx512 bodies of vision_ops.h.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "model/cpu/exp16.h"
#include "model/cpu/vision_ops.h"

namespace mmserve::model::cpu::internal {
namespace {

#include "model/cpu/avx512_region_begin.inc"

// The lanes' sum (SumSixteen's tree) and maximum in a fixed order.
inline float SumLanes(__m512 v) {
  alignas(64) float l[16];
  _mm512_store_ps(l, v);
  return SumSixteen(l);
}
inline float MaxLanes(__m512 v) {
  alignas(64) float l[16];
  _mm512_store_ps(l, v);
  float m = l[0];
  for (int i = 1; i < 16; ++i) m = l[i] > m ? l[i] : m;
  return m;
}

void SoftmaxRow(float* row, int64_t cols) {
  const int64_t full = cols / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (cols - full)) - 1);
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t c = 0; c < full; c += 16)
    mx = _mm512_maskz_max_ps(kAllLanes, mx, _mm512_loadu_ps(row + c));
  if (tail != 0) mx = _mm512_mask_max_ps(mx, tail, mx, _mm512_maskz_loadu_ps(tail, row + full));
  const __m512 max_v = _mm512_set1_ps(MaxLanes(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t c = 0; c < full; c += 16) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(row + c), max_v));
    _mm512_storeu_ps(row + c, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (tail != 0) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + full), max_v));
    _mm512_mask_storeu_ps(row + full, tail, e);
    sum = _mm512_mask_add_ps(sum, tail, sum, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / SumLanes(sum));
  for (int64_t c = 0; c < full; c += 16) {
    _mm512_storeu_ps(row + c, _mm512_mul_ps(_mm512_loadu_ps(row + c), inv));
  }
  if (tail != 0) {
    _mm512_mask_storeu_ps(row + full, tail,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, row + full), inv));
  }
}

inline __m512 QuickGelu16(__m512 x) {
  const __m512 e = Exp16(_mm512_mul_ps(x, _mm512_set1_ps(-1.702f)));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

void QuickGeluAll(float* x, int64_t count) {
  const int64_t full = count / 16 * 16;
  for (int64_t i = 0; i < full; i += 16) {
    _mm512_storeu_ps(x + i, QuickGelu16(_mm512_loadu_ps(x + i)));
  }
  if (full < count) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (count - full)) - 1);
    _mm512_mask_storeu_ps(x + full, tail, QuickGelu16(_mm512_maskz_loadu_ps(tail, x + full)));
  }
}

// vision_ops.cc's PartialSumsAvx2 in four registers of 16 sums each:
// add(acc, x, m) adds the floats at x in the lanes of m into acc.
template <typename Add>
void PartialSums(const float* x, int64_t dim, Add add, float* part) {
  __m512 a[4];
  for (__m512& v : a) v = _mm512_setzero_ps();
  const int64_t full = dim / 64 * 64;
  for (int64_t j = 0; j < full; j += 64) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) a[k] = add(a[k], x + j + 16 * k, kAllLanes);
  }
  for (int k = 0; k < 4; ++k) {
    const int64_t n = std::min<int64_t>(dim - full - 16 * k, 16);
    if (n > 0) a[k] = add(a[k], x + full + 16 * k, FirstLanes(n));
  }
  _mm512_store_ps(part, _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
}

// The floats at x in the lanes of m (0 in the others, not read).
inline __m512 LoadLanes(const float* x, __mmask16 m) {
  return m == kAllLanes ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(m, x);
}

// PartialSums' terms (function objects: lambdas' conversion thunks would
// fall outside the AVX-512 region): the floats, and the squares of their
// deviations from mean (0 in the lanes outside m).
struct AddLanes {
  __m512 operator()(__m512 acc, const float* p, __mmask16 m) const {
    return _mm512_add_ps(acc, LoadLanes(p, m));
  }
};
struct AddSquaredDeviation {
  __m512 mean;
  __m512 operator()(__m512 acc, const float* p, __mmask16 m) const {
    const __m512 d = _mm512_maskz_sub_ps(m, LoadLanes(p, m), mean);
    return _mm512_fmadd_ps(d, d, acc);
  }
};

// vision_ops.cc's LayerNormRowAvx2 on 16 lanes: the same 64 partial sums
// and the same operations per element.
void LayerNormRow(const float* x, int64_t dim, const float* w, const float* b, float eps,
                  float* y) {
  alignas(64) float part[16];
  PartialSums(x, dim, AddLanes{}, part);
  const __m512 mean = _mm512_set1_ps(SumSixteen(part) / static_cast<float>(dim));
  PartialSums(x, dim, AddSquaredDeviation{mean}, part);
  const __m512 inv =
      _mm512_set1_ps(1.0f / std::sqrt(SumSixteen(part) / static_cast<float>(dim) + eps));
  const int64_t full = dim / 16 * 16;
  for (int64_t j = 0; j < full; j += 16) {
    const __m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), mean), inv);
    _mm512_storeu_ps(y + j, _mm512_fmadd_ps(t, _mm512_loadu_ps(w + j), _mm512_loadu_ps(b + j)));
  }
  if (full < dim) {
    const __mmask16 tail = FirstLanes(dim - full);
    const __m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + full), mean), inv);
    _mm512_mask_storeu_ps(y + full, tail,
                          _mm512_fmadd_ps(t, _mm512_maskz_loadu_ps(tail, w + full),
                                          _mm512_maskz_loadu_ps(tail, b + full)));
  }
}

#include "model/cpu/avx512_region_end.inc"

}  // namespace

void SoftmaxRowsAvx512(float* s, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) SoftmaxRow(s + r * cols, cols);
}

void QuickGeluInPlaceAvx512(float* x, int64_t count) { QuickGeluAll(x, count); }

void LayerNormRowAvx512(const float* x, int64_t dim, const float* weight, const float* bias,
                        float eps, float* y) {
  LayerNormRow(x, dim, weight, bias, eps, y);
}

}  // namespace mmserve::model::cpu::internal
