// Where a parallel task of the panel kernels (linear.cc, linear_int8.cc)
// writes its outputs: full panels straight into y, a last partial panel
// (n % 16 columns) into a 16-wide scratch whose real columns Flush() copies
// into y. A detail of model/cpu.
#ifndef MMSERVE_MODEL_CPU_PANEL_OUTPUT_H_
#define MMSERVE_MODEL_CPU_PANEL_OUTPUT_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/cpu/linear.h"

namespace mmserve::model::cpu::internal {

class PanelOutput {
 public:
  // Panels [.., p1) of job for m rows of x.
  PanelOutput(const LinearJob& job, int64_t m, int64_t p1)
      : y_(job.y), m_(m), n_(job.w->rows), p1_(p1), partial_(p1 * kPanelRows > n_) {
    if (partial_) Scratch().assign(m * kPanelRows, 0.0f);
  }
  PanelOutput(const PanelOutput&) = delete;
  PanelOutput& operator=(const PanelOutput&) = delete;

  // Whether panel p is the partial one.
  bool Partial(int64_t p) const { return partial_ && p == p1_ - 1; }
  // Row 0 of panel p's 16 columns; *ldc gets the row stride.
  float* At(int64_t p, int64_t* ldc) const {
    if (Partial(p)) {
      *ldc = kPanelRows;
      return Scratch().data();
    }
    *ldc = n_;
    return y_ + p * kPanelRows;
  }
  // Real columns of panel p (16 but for the partial one).
  int Columns(int64_t p) const {
    return static_cast<int>(std::min<int64_t>(kPanelRows, n_ - p * kPanelRows));
  }
  // Copies the partial panel's real columns into y.
  void Flush() const {
    if (!partial_) return;
    const int64_t first = (p1_ - 1) * kPanelRows, cols = n_ - first;
    for (int64_t i = 0; i < m_; ++i) {
      std::memcpy(y_ + i * n_ + first, &Scratch()[i * kPanelRows], cols * sizeof(float));
    }
  }

 private:
  // One per thread: each task runs on one thread from start to Flush().
  static std::vector<float>& Scratch() {
    thread_local std::vector<float> scratch;
    return scratch;
  }

  float* y_;
  int64_t m_, n_, p1_;
  bool partial_;
};

}  // namespace mmserve::model::cpu::internal

#endif  // MMSERVE_MODEL_CPU_PANEL_OUTPUT_H_
