#include "model/cpu/ops.h"

#include <cmath>
#include <cstring>

#include "common/logging.h"

namespace mmserve::model::cpu {
namespace {

// Element-wise loops are handed out in chunks this long.
constexpr int64_t kElementGrain = 16384;

}  // namespace

void RmsNorm(ThreadPool& pool, const float* x, int64_t rows, int64_t n, const float* weight,
             float eps, float* out) {
  const int64_t grain = n >= 1024 ? 1 : 16;
  pool.ParallelFor(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * n;
      float* yr = out + r * n;
      // Eight partial sums in a fixed order (the loop vectorizes without
      // reassociation because the lanes are explicit).
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        for (int l = 0; l < 8; ++l) part[l] += xr[i + l] * xr[i + l];
      }
      for (; i < n; ++i) part[0] += xr[i] * xr[i];
      float sum =
          ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
      const float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
      for (int64_t j = 0; j < n; ++j) yr[j] = weight[j] * (xr[j] * inv);
    }
  });
}

void SiluMul(ThreadPool& pool, const float* gate, const float* up, int64_t count, float* out) {
  pool.ParallelFor(count, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

void AddInPlace(ThreadPool& pool, float* x, const float* y, int64_t count) {
  pool.ParallelFor(count, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] += y[i];
  });
}

}  // namespace mmserve::model::cpu
