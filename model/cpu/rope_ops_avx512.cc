// The kAvx512 body of rope_ops.h: rope_ops.cc's operations on 16 lanes.
// Built with -ffp-contract=off (BUILD.bazel), as rope_ops.cc.
#include <immintrin.h>

#include <cstdint>

#include "model/cpu/exp16.h"
#include "model/cpu/rope_ops.h"

namespace mmserve::model::cpu::internal {

MMSERVE_AVX512_TARGET void RotateHalfHeadAvx512(const float* c, const float* s, int half,
                                                float* v) {
  for (int j = 0; j < half; j += 16) {
    const __mmask16 m = FirstLanes(half - j < 16 ? half - j : 16);
    const __m512 a = _mm512_maskz_loadu_ps(m, v + j), b = _mm512_maskz_loadu_ps(m, v + j + half);
    const __m512 cj = _mm512_maskz_loadu_ps(m, c + j), sj = _mm512_maskz_loadu_ps(m, s + j);
    _mm512_mask_storeu_ps(v + j, m, _mm512_sub_ps(_mm512_mul_ps(a, cj), _mm512_mul_ps(b, sj)));
    _mm512_mask_storeu_ps(v + j + half, m,
                          _mm512_add_ps(_mm512_mul_ps(b, cj), _mm512_mul_ps(a, sj)));
  }
}

}  // namespace mmserve::model::cpu::internal
