// FitStepTimeModel (elastic_manager.h): non-negative least squares for
// T(S) = a + b S + c S^2.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "scheduler/elastic_manager.h"
#include "scheduler/linear_solve.h"

namespace mmserve::scheduler {
namespace {

// m x = y (linear_solve.h); only an exactly degenerate system is singular.
bool Solve(const std::vector<std::vector<double>>& m, const std::vector<double>& y,
           std::vector<double>* x) {
  return SolveLinearSystem(m, y, 1e-300, x);
}

// The least-squares coefficients of the powers in `terms` (0: 1, 1: x,
// 2: x^2) over the samples, x = tokens / scale; false when singular.
bool FitTerms(const std::vector<StepSample>& samples, double scale, const std::vector<int>& terms,
              std::vector<double>* coef) {
  const size_t n = terms.size();
  std::vector<std::vector<double>> m(n, std::vector<double>(n, 0.0));
  std::vector<double> y(n, 0.0);
  for (const StepSample& s : samples) {
    const double x = static_cast<double>(s.tokens) / scale;
    const double powers[5] = {1, x, x * x, x * x * x, x * x * x * x};
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) m[i][j] += powers[terms[i] + terms[j]];
      y[i] += powers[terms[i]] * s.seconds;
    }
  }
  return Solve(m, y, coef);
}

double SquaredError(const std::vector<StepSample>& samples, double scale,
                    const std::vector<int>& terms, const std::vector<double>& coef) {
  double sum = 0;
  for (const StepSample& s : samples) {
    const double x = static_cast<double>(s.tokens) / scale;
    double t = 0;
    for (size_t i = 0; i < terms.size(); ++i) t += coef[i] * std::pow(x, terms[i]);
    sum += (t - s.seconds) * (t - s.seconds);
  }
  return sum;
}

}  // namespace

StepTimeModel FitStepTimeModel(const std::vector<StepSample>& samples) {
  std::set<int64_t> distinct;
  for (const StepSample& s : samples) distinct.insert(s.tokens);
  const int n = static_cast<int>(std::min<size_t>(3, distinct.size()));
  StepTimeModel model;
  if (n == 0) return model;
  // Scaled by the largest token count so the normal equations stay well
  // conditioned (S^4 terms at 32k tokens would otherwise reach 1e18).
  const double scale = static_cast<double>(*distinct.rbegin());
  // The unconstrained fit over the first n terms when it is non-negative;
  // else the non-negative optimum, which is the unconstrained fit over one
  // of the proper subsets of those terms (the others at 0): the feasible
  // one with the least squared error.
  std::vector<int> best_terms;
  std::vector<double> best;
  double best_error = std::numeric_limits<double>::infinity();
  for (int mask = (1 << n) - 1; mask > 0; --mask) {
    std::vector<int> terms;
    for (int t = 0; t < n; ++t) {
      if (mask & (1 << t)) terms.push_back(t);
    }
    std::vector<double> coef;
    if (!FitTerms(samples, scale, terms, &coef)) continue;
    if (std::any_of(coef.begin(), coef.end(), [](double c) { return c < 0; })) continue;
    const double error = SquaredError(samples, scale, terms, coef);
    if (mask == (1 << n) - 1 || error < best_error) {
      best_terms = terms;
      best = coef;
      best_error = error;
      if (mask == (1 << n) - 1) break;
    }
  }
  double* out[3] = {&model.a, &model.b, &model.c};
  for (size_t i = 0; i < best_terms.size(); ++i) {
    *out[best_terms[i]] = best[i] / std::pow(scale, best_terms[i]);
  }
  return model;
}

}  // namespace mmserve::scheduler
