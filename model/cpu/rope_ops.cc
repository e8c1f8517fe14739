#include "model/cpu/rope_ops.h"

#include <immintrin.h>

#include "model/cpu/cpu_isa.h"

// This file is built with -ffp-contract=off (BUILD.bazel): a product
// followed by an add stays two roundings.

namespace mmserve::model::cpu {
namespace {

void RotateHalfHeadAvx2(const float* c, const float* s, int half, float* v) {
  int j = 0;
  for (; j + 8 <= half; j += 8) {
    const __m256 a = _mm256_loadu_ps(v + j), b = _mm256_loadu_ps(v + j + half);
    const __m256 cj = _mm256_loadu_ps(c + j), sj = _mm256_loadu_ps(s + j);
    _mm256_storeu_ps(v + j, _mm256_sub_ps(_mm256_mul_ps(a, cj), _mm256_mul_ps(b, sj)));
    _mm256_storeu_ps(v + j + half, _mm256_add_ps(_mm256_mul_ps(b, cj), _mm256_mul_ps(a, sj)));
  }
  for (; j < half; ++j) {
    const float a = v[j], b = v[j + half];
    v[j] = a * c[j] - b * s[j];
    v[j + half] = b * c[j] + a * s[j];
  }
}

}  // namespace

void RotateHalf(const RotaryRows& rows, float* x) {
  const int half = rows.head_dim / 2;
  const auto head =
      ActiveCpuIsa() == CpuIsa::kAvx512 ? internal::RotateHalfHeadAvx512 : RotateHalfHeadAvx2;
  for (int64_t t = 0; t < rows.tokens; ++t) {
    const float* c = rows.cos + t * half;
    const float* s = rows.sin + t * half;
    float* row = x + t * rows.heads * rows.head_dim;
    for (int64_t h = 0; h < rows.heads; ++h) head(c, s, half, row + h * rows.head_dim);
  }
}

}  // namespace mmserve::model::cpu
