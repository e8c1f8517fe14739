// FitDecodeStepModel (elastic_growth.h): non-negative least squares for
// T = a + per_row rows + per_kv_token kv + per_holder holders.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "scheduler/elastic_growth.h"
#include "scheduler/linear_solve.h"

namespace mmserve::scheduler {
namespace {

// m x = y (linear_solve.h); a pivot below 1e-12 counts as singular.
bool Solve(const std::vector<std::vector<double>>& m, const std::vector<double>& y,
           std::vector<double>* x) {
  return SolveLinearSystem(m, y, 1e-12, x);
}

// Feature f of a sample: 0 the intercept, 1 rows, 2 KV tokens, 3 holders.
double Feature(const DecodeStepSample& s, int f) {
  switch (f) {
    case 1:
      return static_cast<double>(s.rows);
    case 2:
      return static_cast<double>(s.kv_tokens);
    case 3:
      return static_cast<double>(s.holders);
    default:
      return 1.0;
  }
}

// The least-squares coefficients of the features `use` (scaled by
// `scale`) for the times `y`, and their squared error; false when
// singular.
bool FitSubset(const std::vector<DecodeStepSample>& samples, const std::vector<double>& y,
               const std::vector<int>& use, const double* scale, std::vector<double>* x,
               double* error) {
  const size_t k = use.size();
  auto at = [&](size_t i, size_t p) { return Feature(samples[i], use[p]) / scale[use[p]]; };
  std::vector<std::vector<double>> m(k, std::vector<double>(k, 0.0));
  std::vector<double> rhs(k, 0.0);
  for (size_t i = 0; i < samples.size(); ++i) {
    for (size_t p = 0; p < k; ++p) {
      rhs[p] += at(i, p) * y[i];
      for (size_t q = 0; q < k; ++q) m[p][q] += at(i, p) * at(i, q);
    }
  }
  if (!Solve(m, rhs, x)) return false;
  *error = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    double t = 0;
    for (size_t p = 0; p < k; ++p) t += (*x)[p] * at(i, p);
    *error += (t - y[i]) * (t - y[i]);
  }
  return true;
}

}  // namespace

DecodeStepModel FitDecodeStepModel(const std::vector<DecodeStepSample>& samples,
                                   const DecodeStepModel& prior) {
  if (samples.empty()) return prior;
  // Each feature scaled to its largest value so the normal equations stay
  // well conditioned.
  const double priors[4] = {prior.a, prior.per_row, prior.per_kv_token, prior.per_holder};
  double scale[4] = {1, 1, 1, 1};
  std::vector<int> terms{0};  // the intercept and the features that vary
  for (int f = 1; f <= 3; ++f) {
    std::set<double> values;
    for (const DecodeStepSample& s : samples) {
      values.insert(Feature(s, f));
      scale[f] = std::max(scale[f], std::fabs(Feature(s, f)));
    }
    if (values.size() > 1) terms.push_back(f);
  }
  auto fitted = [&](int f) { return std::find(terms.begin(), terms.end(), f) != terms.end(); };
  // The fixed terms' share of each sample's time comes off first.
  std::vector<double> y;
  for (const DecodeStepSample& s : samples) {
    double t = s.seconds;
    for (int f = 1; f <= 3; ++f) {
      if (!fitted(f)) t -= priors[f] * Feature(s, f);
    }
    y.push_back(t);
  }
  // The best non-negative fit is the unconstrained fit over some subset of
  // the terms (the others at 0): the feasible one with the least error.
  const int n = static_cast<int>(terms.size());
  double best_error = std::numeric_limits<double>::infinity();
  double coef[4] = {0, 0, 0, 0};
  for (int mask = (1 << n) - 1; mask > 0; --mask) {
    std::vector<int> use;
    for (int t = 0; t < n; ++t) {
      if (mask & (1 << t)) use.push_back(terms[t]);
    }
    std::vector<double> x;
    double error = 0;
    if (!FitSubset(samples, y, use, scale, &x, &error)) continue;
    if (std::any_of(x.begin(), x.end(), [](double c) { return c < 0; })) continue;
    if (error >= best_error) continue;
    best_error = error;
    std::fill(coef, coef + 4, 0.0);
    for (size_t p = 0; p < use.size(); ++p) coef[use[p]] = x[p] / scale[use[p]];
  }
  if (best_error == std::numeric_limits<double>::infinity()) return prior;
  DecodeStepModel model;
  double* out[4] = {&model.a, &model.per_row, &model.per_kv_token, &model.per_holder};
  for (int f = 0; f <= 3; ++f) *out[f] = fitted(f) ? coef[f] : priors[f];
  return model;
}

}  // namespace mmserve::scheduler
