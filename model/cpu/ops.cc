#include "model/cpu/ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/logging.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/exp8.h"

namespace mmserve::model::cpu {
namespace {

// Element-wise loops are handed out in chunks this long.
constexpr int64_t kElementGrain = 16384;

// e^x, 8 lanes (exp8.h); 0 below -87.3 and +inf above 88.37, where e^x
// leaves the normal range.
inline __m256 Exp8(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.3f), highest = _mm256_set1_ps(88.3762626647949f);
  const __m256 underflow = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
  const __m256 overflow = _mm256_cmp_ps(x, highest, _CMP_GT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lowest), highest);
  __m256 y = internal::Exp8InRange(x);
  y = _mm256_andnot_ps(underflow, y);
  return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), overflow);
}

// gate / (1 + e^-gate) * up for 8 elements (NaN gates stay NaN).
inline __m256 SiluMul8(__m256 g, __m256 u) {
  const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

// out = weight * (x * inv) on eight lanes (the tail scalar: the same bits).
void RmsScaleRowAvx2(const float* x, int64_t n, const float* weight, float inv, float* out) {
  const __m256 inv_v = _mm256_set1_ps(inv);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(x + j), inv_v);
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_loadu_ps(weight + j), scaled));
  }
  for (; j < n; ++j) out[j] = weight[j] * (x[j] * inv);
}

void SiluMulAvx2(const float* gate, const float* up, int64_t count, float* out) {
  // Every element goes through SiluMul8, the last few too (padded to 8), so
  // an element's result does not depend on where its chunk ends.
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    _mm256_storeu_ps(out + i, SiluMul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < count) {
    const int64_t n = count - i;
    alignas(32) float g[8] = {}, u[8] = {}, y[8];
    std::copy(gate + i, gate + count, g);
    std::copy(up + i, up + count, u);
    _mm256_store_ps(y, SiluMul8(_mm256_load_ps(g), _mm256_load_ps(u)));
    std::copy(y, y + n, out + i);
  }
}

}  // namespace

namespace internal {

float RmsInverse(const float* x, int64_t n, float eps) {
  // Eight partial sums in a fixed order (the loop vectorizes without
  // reassociation because the lanes are explicit; each step is one FMA).
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) part[l] += x[i + l] * x[i + l];
  }
  for (; i < n; ++i) part[0] += x[i] * x[i];
  const float sum =
      ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
  return 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
}

}  // namespace internal

void RmsNorm(ThreadPool& pool, const float* x, int64_t rows, int64_t n, const float* weight,
             float eps, float* out) {
  const int64_t grain = n >= 1024 ? 1 : 16;
  const auto scale =
      ActiveCpuIsa() == CpuIsa::kAvx512 ? internal::RmsScaleRowAvx512 : RmsScaleRowAvx2;
  pool.ParallelFor(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * n;
      scale(xr, n, weight, internal::RmsInverse(xr, n, eps), out + r * n);
    }
  });
}

void SiluMul(ThreadPool& pool, const float* gate, const float* up, int64_t count, float* out) {
  const auto body = ActiveCpuIsa() == CpuIsa::kAvx512 ? internal::SiluMulAvx512 : SiluMulAvx2;
  pool.ParallelFor(count, kElementGrain, [&](int64_t begin, int64_t end) {
    body(gate + begin, up + begin, end - begin, out + begin);
  });
}

void AddInPlace(ThreadPool& pool, float* x, const float* y, int64_t count) {
  pool.ParallelFor(count, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] += y[i];
  });
}

}  // namespace mmserve::model::cpu
