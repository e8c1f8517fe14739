// FitDecodeStepModel (elastic_growth.h): non-negative least squares for
// T = a + per_row rows + per_kv_token kv + per_holder holders.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "scheduler/elastic_growth.h"

namespace mmserve::scheduler {
namespace {

// Solves m x = y (n <= 4) by Gaussian elimination with partial pivoting;
// false when singular.
bool Solve(std::vector<std::vector<double>> m, std::vector<double> y, std::vector<double>* x) {
  const size_t n = y.size();
  for (size_t col = 0; col < n; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < n; ++r) {
      if (std::fabs(m[r][col]) > std::fabs(m[pivot][col])) pivot = r;
    }
    if (std::fabs(m[pivot][col]) < 1e-12) return false;
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

DecodeStepModel FitDecodeStepModel(const std::vector<DecodeStepSample>& samples,
                                   const DecodeStepModel& prior) {
  if (samples.empty()) return prior;
  // Features 1..3 (rows, kv, holders), each scaled to its largest value so
  // the normal equations stay well conditioned; 0 is the intercept.
  auto feature = [](const DecodeStepSample& s, int f) {
    return f == 1   ? static_cast<double>(s.rows)
           : f == 2 ? static_cast<double>(s.kv_tokens)
                    : static_cast<double>(s.holders);
  };
  const double priors[4] = {prior.a, prior.per_row, prior.per_kv_token, prior.per_holder};
  double scale[4] = {1, 1, 1, 1};
  std::vector<int> varying;
  for (int f = 1; f <= 3; ++f) {
    std::set<double> values;
    for (const DecodeStepSample& s : samples) {
      values.insert(feature(s, f));
      scale[f] = std::max(scale[f], std::fabs(feature(s, f)));
    }
    if (values.size() > 1) varying.push_back(f);
  }
  // The fixed terms' share of each sample's time comes off first.
  std::vector<double> y;
  for (const DecodeStepSample& s : samples) {
    double t = s.seconds;
    for (int f = 1; f <= 3; ++f) {
      if (std::find(varying.begin(), varying.end(), f) == varying.end()) {
        t -= priors[f] * feature(s, f);
      }
    }
    y.push_back(t);
  }
  // The best non-negative fit is the unconstrained fit over some subset of
  // the terms (the others at 0): the feasible one with the least error.
  std::vector<int> terms{0};
  terms.insert(terms.end(), varying.begin(), varying.end());
  const int n = static_cast<int>(terms.size());
  double best_error = std::numeric_limits<double>::infinity();
  double coef[4] = {0, 0, 0, 0};
  bool found = false;
  for (int mask = (1 << n) - 1; mask > 0; --mask) {
    std::vector<int> use;
    for (int t = 0; t < n; ++t) {
      if (mask & (1 << t)) use.push_back(terms[t]);
    }
    const size_t k = use.size();
    std::vector<std::vector<double>> m(k, std::vector<double>(k, 0.0));
    std::vector<double> rhs(k, 0.0);
    for (size_t i = 0; i < samples.size(); ++i) {
      for (size_t p = 0; p < k; ++p) {
        const double xp = use[p] == 0 ? 1.0 : feature(samples[i], use[p]) / scale[use[p]];
        rhs[p] += xp * y[i];
        for (size_t q = 0; q < k; ++q) {
          const double xq = use[q] == 0 ? 1.0 : feature(samples[i], use[q]) / scale[use[q]];
          m[p][q] += xp * xq;
        }
      }
    }
    std::vector<double> x;
    if (!Solve(m, rhs, &x)) continue;
    if (std::any_of(x.begin(), x.end(), [](double c) { return c < 0; })) continue;
    double error = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      double t = 0;
      for (size_t p = 0; p < k; ++p) {
        t += x[p] * (use[p] == 0 ? 1.0 : feature(samples[i], use[p]) / scale[use[p]]);
      }
      error += (t - y[i]) * (t - y[i]);
    }
    if (error < best_error) {
      best_error = error;
      found = true;
      std::fill(coef, coef + 4, 0.0);
      for (size_t p = 0; p < k; ++p) coef[use[p]] = x[p] / scale[use[p]];
    }
  }
  if (!found) return prior;
  DecodeStepModel model;
  double* out[4] = {&model.a, &model.per_row, &model.per_kv_token, &model.per_holder};
  for (int f = 0; f <= 3; ++f) {
    const bool fitted = std::find(terms.begin(), terms.end(), f) != terms.end();
    *out[f] = fitted ? coef[f] : priors[f];
  }
  return model;
}

}  // namespace mmserve::scheduler
