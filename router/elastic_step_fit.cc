#include "router/elastic_step_fit.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

namespace mmserve::router {
namespace {

// Degree d's coefficient from degree 1's fitted one: the given ratio
// between them, or the given excess where degree 1's given one is 0.
double Scaled(double fitted_one, double given_one, double given_d) {
  if (given_one > 0) return fitted_one * given_d / given_one;
  return fitted_one + std::max(0.0, given_d);
}

}  // namespace

ElasticStepFit::ElasticStepFit(std::vector<scheduler::StepTimeModel> given, size_t window)
    : given_(std::move(given)),
      window_(std::max<size_t>(window, 3)),
      samples_(given_.size()),
      fitted_(given_.size(), false),
      models_(given_) {}

void ElasticStepFit::Add(int degree, int64_t tokens, double seconds) {
  if (degree < 1 || static_cast<size_t>(degree) > given_.size() || tokens <= 0 ||
      !std::isfinite(seconds) || seconds < 0) {
    return;
  }
  std::deque<scheduler::StepSample>& s = samples_[static_cast<size_t>(degree) - 1];
  s.push_back({.tokens = tokens, .seconds = seconds});
  if (s.size() > window_) s.pop_front();
  Refit();
}

bool ElasticStepFit::fitted(int degree) const {
  return degree >= 1 && static_cast<size_t>(degree) <= fitted_.size() &&
         fitted_[static_cast<size_t>(degree) - 1];
}

bool ElasticStepFit::Enough(const std::deque<scheduler::StepSample>& samples) const {
  std::set<int64_t> lengths;
  for (const scheduler::StepSample& s : samples) lengths.insert(s.tokens);
  return lengths.size() >= 3 && *lengths.rbegin() >= 2 * *lengths.begin();
}

void ElasticStepFit::Refit() {
  std::fill(fitted_.begin(), fitted_.end(), false);
  models_ = given_;
  if (given_.empty() || !Enough(samples_[0])) return;
  const scheduler::StepTimeModel one = scheduler::FitStepTimeModel(
      std::vector<scheduler::StepSample>(samples_[0].begin(), samples_[0].end()));
  models_[0] = one;
  fitted_[0] = true;
  for (size_t d = 1; d < given_.size(); ++d) {
    if (Enough(samples_[d])) {
      models_[d] = scheduler::FitStepTimeModel(
          std::vector<scheduler::StepSample>(samples_[d].begin(), samples_[d].end()));
      fitted_[d] = true;
      continue;
    }
    models_[d] = {.a = Scaled(one.a, given_[0].a, given_[d].a),
                  .b = Scaled(one.b, given_[0].b, given_[d].b),
                  .c = Scaled(one.c, given_[0].c, given_[d].c)};
  }
}

}  // namespace mmserve::router
