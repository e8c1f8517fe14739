// The elastic manager's step-time models refitted from what the pool
// measures (router --elastic): the seconds from placement to first token of a
// text request placed on instances that serve nothing else, at its degree
// and prompt length, is a sample of T_d(S); scheduler::FitStepTimeModel
// turns a degree's recent samples into its model.
//
//   ElasticStepFit fit(given);  // the file's models or DefaultElasticStepModels
//   fit.Add(/*degree=*/1, /*tokens=*/812, /*seconds=*/0.094);
//   config.per_degree = fit.models();  // what the next iteration plans by
//
// A degree is fitted once its last `window` samples cover at least 3
// distinct prompt lengths, the longest at least twice the shortest (fewer
// would let the fit's extrapolation decide). Measured and assumed times
// are never compared: degrees above 1 take their fits only once degree 1
// has its own, and until a degree d > 1 is fitted it is degree 1's fit
// scaled by the given models' ratio of degree d to degree 1, coefficient by
// coefficient (where degree 1's given coefficient is 0, degree d's is
// added), so the given models' judgement of what degree d gains stands
// until the pool measured degree d itself. A sample includes the call's
// set-up (gRPC, the group's join) besides the prefill: what placing a
// request on idle instances costs until its first token.
//
// Not thread-safe (the pool calls it under its lock).
#ifndef MMSERVE_ROUTER_ELASTIC_STEP_FIT_H_
#define MMSERVE_ROUTER_ELASTIC_STEP_FIT_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "scheduler/elastic_manager.h"

namespace mmserve::router {

class ElasticStepFit {
 public:
  // `given`: degrees 1..n, what the manager plans by until the samples say
  // otherwise (none: nothing is ever fitted).
  explicit ElasticStepFit(std::vector<scheduler::StepTimeModel> given, size_t window = 64);

  // A prefill of `tokens` prompt tokens at `degree` took `seconds`. Degrees
  // outside 1..n, non-positive lengths and negative or non-finite times are
  // ignored.
  void Add(int degree, int64_t tokens, double seconds);

  // Degrees 1..n: fitted, derived from degree 1's fit, or given.
  const std::vector<scheduler::StepTimeModel>& models() const { return models_; }
  // Whether degree d's model is its own fit.
  bool fitted(int degree) const;

 private:
  bool Enough(const std::deque<scheduler::StepSample>& samples) const;
  void Refit();

  const std::vector<scheduler::StepTimeModel> given_;
  const size_t window_;
  std::vector<std::deque<scheduler::StepSample>> samples_;  // per degree, the newest last
  std::vector<bool> fitted_;
  std::vector<scheduler::StepTimeModel> models_;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_ELASTIC_STEP_FIT_H_
