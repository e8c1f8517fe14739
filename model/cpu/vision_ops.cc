#include "model/cpu/vision_ops.h"

#include <algorithm>
#include <cmath>

#include "model/cpu/cpu_isa.h"

namespace mmserve::model::cpu {

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

}  // namespace mmserve::model::cpu
