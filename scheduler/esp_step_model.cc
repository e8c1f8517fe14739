// FitStepTimeModel (esp_manager.h): least squares for T(S) = a + b S + c S^2.
#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "scheduler/esp_manager.h"

namespace mmserve::scheduler {
namespace {

// Solves the n x n system m x = y (n <= 3) by Gaussian elimination with
// partial pivoting; false when it is singular.
bool Solve(std::vector<std::vector<double>> m, std::vector<double> y, std::vector<double>* x) {
  const size_t n = y.size();
  for (size_t col = 0; col < n; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < n; ++r) {
      if (std::fabs(m[r][col]) > std::fabs(m[pivot][col])) pivot = r;
    }
    if (std::fabs(m[pivot][col]) < 1e-300) return false;
    std::swap(m[col], m[pivot]);
    std::swap(y[col], y[pivot]);
    for (size_t r = col + 1; r < n; ++r) {
      const double f = m[r][col] / m[col][col];
      for (size_t c = col; c < n; ++c) m[r][c] -= f * m[col][c];
      y[r] -= f * y[col];
    }
  }
  x->assign(n, 0.0);
  for (size_t i = n; i-- > 0;) {
    double v = y[i];
    for (size_t c = i + 1; c < n; ++c) v -= m[i][c] * (*x)[c];
    (*x)[i] = v / m[i][i];
  }
  return true;
}

}  // namespace

StepTimeModel FitStepTimeModel(const std::vector<StepSample>& samples) {
  std::set<int64_t> distinct;
  for (const StepSample& s : samples) distinct.insert(s.tokens);
  const size_t n = std::min<size_t>(3, distinct.size());
  StepTimeModel model;
  if (n == 0) return model;
  // Scaled by the largest token count so the normal equations stay well
  // conditioned (S^4 terms at 32k tokens would otherwise reach 1e18).
  const double scale = static_cast<double>(*distinct.rbegin());
  std::vector<std::vector<double>> m(n, std::vector<double>(n, 0.0));
  std::vector<double> y(n, 0.0);
  for (const StepSample& s : samples) {
    const double x = static_cast<double>(s.tokens) / scale;
    double powers[5] = {1, x, x * x, x * x * x, x * x * x * x};
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) m[i][j] += powers[i + j];
      y[i] += powers[i] * s.seconds;
    }
  }
  std::vector<double> coef;
  if (!Solve(m, y, &coef)) return model;
  model.a = coef[0];
  if (n > 1) model.b = coef[1] / scale;
  if (n > 2) model.c = coef[2] / (scale * scale);
  return model;
}

}  // namespace mmserve::scheduler
