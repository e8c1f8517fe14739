#include "model/cpu/linear_blas.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

namespace mmserve::model::cpu::internal {
namespace {

// Rows [n0, n0 + rows) of w widened to fp32, row-major, into out.
void WidenRows(const WeightMatrix& w, int64_t n0, int64_t rows, float* out) {
  for (int64_t r = 0; r < rows; ++r) WeightRowToF32(w, n0 + r, out + r * w.cols);
}

}  // namespace

void BlasLinear(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w,
                const float* bias, float* y) {
  static std::once_flag once;
  // The pool supplies the parallelism; OpenBLAS's own threads would fight it.
  std::call_once(once, [] { openblas_set_num_threads(1); });
  const int64_t n = w.rows, k = w.cols;
  // bf16 panels are widened into ~128 KiB of fp32 per call.
  const int64_t nb = w.dtype == DType::kF32
                         ? 256
                         : std::max<int64_t>(16, std::min<int64_t>(256, (32768 / k) / 16 * 16));
  const int64_t blocks = (n + nb - 1) / nb;
  pool.ParallelFor(blocks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> panel;
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * nb, cols = std::min(nb, n - n0);
      const float* wp;
      if (w.dtype == DType::kF32) {
        wp = static_cast<const float*>(w.data) + n0 * k;
      } else {
        panel.resize(cols * k);
        WidenRows(w, n0, cols, panel.data());
        wp = panel.data();
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                  static_cast<int>(cols), static_cast<int>(k), 1.0f, x, static_cast<int>(k), wp,
                  static_cast<int>(k), 0.0f, y + n0, static_cast<int>(n));
      if (bias != nullptr) {
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < cols; ++j) y[i * n + n0 + j] += bias[n0 + j];
        }
      }
    }
  });
}

}  // namespace mmserve::model::cpu::internal
