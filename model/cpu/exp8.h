// e^x on 8 fp32 lanes, Cephes' expf: x = n ln2 + r with n = round(x / ln2),
// then a degree-6 polynomial for e^r (relative error ~1e-7), times 2^n.
// Shared by SiluMul (ops.cc) and paged attention, which each handle the
// ends of the range their own way. A detail of model/cpu.
#ifndef MMSERVE_MODEL_CPU_EXP8_H_
#define MMSERVE_MODEL_CPU_EXP8_H_

#include <immintrin.h>

namespace mmserve::model::cpu::internal {

// For x in [-87.3, 88.37] (e^x normal); callers clamp first.
inline __m256 Exp8InRange(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i pow2n =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n));
}

}  // namespace mmserve::model::cpu::internal

#endif  // MMSERVE_MODEL_CPU_EXP8_H_
