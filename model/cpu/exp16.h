// e^x on 16 fp32 lanes: exp8.h's Exp8InRange on zmm registers, the same
// operations in the same order, so each lane gives the same bits as exp8.h
// gives it. Shared by the AVX-512 bodies of SiluMul (ops_avx512.cc) and the
// vision tower's softmax and QuickGELU (vision_ops_avx512.cc). Callable
// only at the kAvx512 level (cpu_isa.h): the functions are compiled for
// AVX-512 whatever the file's flags. A detail of model/cpu.
#ifndef MMSERVE_MODEL_CPU_EXP16_H_
#define MMSERVE_MODEL_CPU_EXP16_H_

#include <immintrin.h>

#include <cmath>

// The target of every AVX-512 body in model/cpu.
#define MMSERVE_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace mmserve::model::cpu::internal {

// All lanes: the maskz form of an intrinsic is then the plain instruction
// (GCC 12 warns about the undefined source of some unmasked intrinsics).
constexpr __mmask16 kAllLanes = 0xFFFF;

// For x in [-87.3, 88.37] (e^x normal); callers clamp first.
MMSERVE_AVX512_TARGET inline __m512 Exp16InRange(__m512 x) {
  const __m512 n =
      _mm512_maskz_roundscale_ps(kAllLanes, _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i pow2n = _mm512_maskz_slli_epi32(
      kAllLanes, _mm512_add_epi32(_mm512_maskz_cvtps_epi32(kAllLanes, n), _mm512_set1_epi32(127)),
      23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(pow2n));
}

// e^x: 0 below -87.3 (and for -inf), +inf above 88.37 (NaN gives 0).
MMSERVE_AVX512_TARGET inline __m512 Exp16(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-87.3f), highest = _mm512_set1_ps(88.3762626647949f);
  const __mmask16 normal = _mm512_cmp_ps_mask(x, lowest, _CMP_GE_OQ);
  const __mmask16 overflow = _mm512_cmp_ps_mask(x, highest, _CMP_GT_OQ);
  x = _mm512_maskz_min_ps(kAllLanes, _mm512_maskz_max_ps(kAllLanes, x, lowest), highest);
  const __m512 y = _mm512_maskz_mov_ps(normal, Exp16InRange(x));
  return _mm512_mask_mov_ps(y, overflow, _mm512_set1_ps(INFINITY));
}

// The mask of the first n lanes, n in [0, 16].
inline __mmask16 FirstLanes(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

}  // namespace mmserve::model::cpu::internal

#endif  // MMSERVE_MODEL_CPU_EXP16_H_
