// The fit of bench:elastic_profile: per-degree prefill step-time
// models T_d(S) = a + b S + c S^2 seconds (scheduler::FitStepTimeModel,
// non-negative least squares) from profiled prefills, and the table that
// sets each measurement beside its model's prediction.
//
//   std::vector<ElasticProfilePoint> points = {{1, 512, 0.41}, {1, 1024, 0.83}, ...};
//   ASSIGN_OR_RETURN(ElasticProfileFit fit, FitElasticProfile(points));
//   std::fputs(ElasticProfileTable(fit).c_str(), stdout);
//   std::string file = router::FormatElasticStepModels(fit.models, {"fitted ..."});
//
// Thread-safe (pure functions).
#ifndef MMSERVE_BENCH_ELASTIC_PROFILE_FIT_H_
#define MMSERVE_BENCH_ELASTIC_PROFILE_FIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/elastic_manager.h"

namespace mmserve::bench {

// One measurement: a prefill of `tokens` prompt tokens at `degree` took
// `seconds` (a median over repetitions, say).
struct ElasticProfilePoint {
  int degree = 1;
  int64_t tokens = 0;
  double seconds = 0;
};

struct ElasticProfileFit {
  std::vector<scheduler::StepTimeModel> models;  // degree d at [d - 1]
  struct Row {
    int degree = 1;
    int64_t tokens = 0;
    double measured = 0, fitted = 0;
    double relative_error = 0;  // (fitted - measured) / measured
  };
  std::vector<Row> rows;              // the points, by degree then tokens
  std::vector<double> max_abs_error;  // per degree, the largest |relative_error|
};

// InvalidArgument unless the points' degrees are exactly 1..n (each with at
// least one point) and every point has tokens > 0 and seconds > 0.
[[nodiscard]] absl::StatusOr<ElasticProfileFit> FitElasticProfile(
    const std::vector<ElasticProfilePoint>& points);

// One line a point: degree, tokens, measured and fitted seconds, relative
// error; then each degree's a, b, c and largest error.
std::string ElasticProfileTable(const ElasticProfileFit& fit);

}  // namespace mmserve::bench

#endif  // MMSERVE_BENCH_ELASTIC_PROFILE_FIT_H_
