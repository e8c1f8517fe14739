#include "scheduler/linear_solve.h"

#include <cmath>
#include <utility>

namespace mmserve::scheduler {

bool SolveLinearSystem(std::vector<std::vector<double>> m, std::vector<double> y, double min_pivot,
                       std::vector<double>* x) {
  const size_t n = y.size();
  for (size_t col = 0; col < n; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < n; ++r) {
      if (std::fabs(m[r][col]) > std::fabs(m[pivot][col])) pivot = r;
    }
    if (std::fabs(m[pivot][col]) < min_pivot) return false;
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

}  // namespace mmserve::scheduler
