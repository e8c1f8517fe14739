// The kAvx512 bodies of ops.h: the same operations per element as the
// kAvx2 ones in ops.cc, on 16 lanes with masked tails. Each function is
// compiled for AVX-512 (MMSERVE_AVX512_TARGET) and runs only at kAvx512.
#include <immintrin.h>

#include <cstdint>

#include "model/cpu/exp16.h"
#include "model/cpu/ops.h"

namespace mmserve::model::cpu::internal {
namespace {

// ops.cc's SiluMul8: gate / (1 + e^-gate) * up.
MMSERVE_AVX512_TARGET inline __m512 SiluMul16(__m512 g, __m512 u) {
  const __m512 e = Exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

MMSERVE_AVX512_TARGET void ScaleRow(const float* x, int64_t n, const float* weight, float inv,
                                    float* out) {
  const __m512 inv_v = _mm512_set1_ps(inv);
  const int64_t full = n / 16 * 16;
  for (int64_t j = 0; j < full; j += 16) {
    const __m512 scaled = _mm512_mul_ps(_mm512_loadu_ps(x + j), inv_v);
    _mm512_storeu_ps(out + j, _mm512_mul_ps(_mm512_loadu_ps(weight + j), scaled));
  }
  if (full < n) {
    const __mmask16 tail = FirstLanes(n - full);
    const __m512 scaled = _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + full), inv_v);
    _mm512_mask_storeu_ps(out + full, tail,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, weight + full), scaled));
  }
}

MMSERVE_AVX512_TARGET void SiluMulAll(const float* gate, const float* up, int64_t count,
                                      float* out) {
  const int64_t full = count / 16 * 16;
  for (int64_t i = 0; i < full; i += 16) {
    _mm512_storeu_ps(out + i, SiluMul16(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  }
  if (full < count) {
    const __mmask16 tail = FirstLanes(count - full);
    _mm512_mask_storeu_ps(out + full, tail,
                          SiluMul16(_mm512_maskz_loadu_ps(tail, gate + full),
                                    _mm512_maskz_loadu_ps(tail, up + full)));
  }
}

}  // namespace

void RmsScaleRowAvx512(const float* x, int64_t n, const float* weight, float inv, float* out) {
  ScaleRow(x, n, weight, inv, out);
}

void SiluMulAvx512(const float* gate, const float* up, int64_t count, float* out) {
  SiluMulAll(gate, up, count, out);
}

}  // namespace mmserve::model::cpu::internal
