// The kAvx512 body of rope_ops.h: rope_ops.cc's operations on 16 lanes.
// Built with -ffp-contract=off (BUILD.bazel), as rope_ops.cc.
#include <immintrin.h>

#include <cstdint>

#include "model/cpu/exp16.h"
#include "model/cpu/rope_ops.h"

namespace mmserve::model::cpu::internal {

namespace {

// One block of up to 16 pairs, the lanes past n masked off.
MMSERVE_AVX512_TARGET inline void RotateBlock(const float* c, const float* s, int half, __mmask16 m,
                                              float* v) {
  const __m512 a = _mm512_maskz_loadu_ps(m, v), b = _mm512_maskz_loadu_ps(m, v + half);
  const __m512 cj = _mm512_maskz_loadu_ps(m, c), sj = _mm512_maskz_loadu_ps(m, s);
  _mm512_mask_storeu_ps(v, m, _mm512_sub_ps(_mm512_mul_ps(a, cj), _mm512_mul_ps(b, sj)));
  _mm512_mask_storeu_ps(v + half, m, _mm512_add_ps(_mm512_mul_ps(b, cj), _mm512_mul_ps(a, sj)));
}

}  // namespace

MMSERVE_AVX512_TARGET void RotateHalfHeadAvx512(const float* c, const float* s, int half,
                                                float* v) {
  int j = 0;
  for (; j + 16 <= half; j += 16) {
    const __m512 a = _mm512_loadu_ps(v + j), b = _mm512_loadu_ps(v + j + half);
    const __m512 cj = _mm512_loadu_ps(c + j), sj = _mm512_loadu_ps(s + j);
    _mm512_storeu_ps(v + j, _mm512_sub_ps(_mm512_mul_ps(a, cj), _mm512_mul_ps(b, sj)));
    _mm512_storeu_ps(v + j + half, _mm512_add_ps(_mm512_mul_ps(b, cj), _mm512_mul_ps(a, sj)));
  }
  // Eight pairs left (half = 40 in the 2B vision tower's heads of 80): one
  // unmasked 8-lane block. The masked block cost this CPU (Zen 5) more
  // than the rest of the head: 162 against 68 us for a 256-patch chunk.
  if (j + 8 <= half) {
    const __m256 a = _mm256_loadu_ps(v + j), b = _mm256_loadu_ps(v + j + half);
    const __m256 cj = _mm256_loadu_ps(c + j), sj = _mm256_loadu_ps(s + j);
    _mm256_storeu_ps(v + j, _mm256_sub_ps(_mm256_mul_ps(a, cj), _mm256_mul_ps(b, sj)));
    _mm256_storeu_ps(v + j + half, _mm256_add_ps(_mm256_mul_ps(b, cj), _mm256_mul_ps(a, sj)));
    j += 8;
  }
  if (j < half) RotateBlock(c + j, s + j, half, FirstLanes(half - j), v + j);
}

}  // namespace mmserve::model::cpu::internal
