#include "bench/elastic_profile_fit.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mmserve::bench {

absl::StatusOr<ElasticProfileFit> FitElasticProfile(
    const std::vector<ElasticProfilePoint>& points) {
  std::map<int, std::vector<scheduler::StepSample>> by_degree;
  for (const ElasticProfilePoint& p : points) {
    if (p.degree < 1 || p.tokens <= 0 || !(p.seconds > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("elastic profile: a bad point at degree ",
                                                     p.degree, ", ", p.tokens, " tokens"));
    }
    by_degree[p.degree].push_back({p.tokens, p.seconds});
  }
  if (by_degree.empty() || by_degree.rbegin()->first != static_cast<int>(by_degree.size())) {
    return absl::InvalidArgumentError("elastic profile: degrees must be exactly 1..n");
  }
  ElasticProfileFit fit;
  for (auto& [degree, samples] : by_degree) {
    const scheduler::StepTimeModel m = scheduler::FitStepTimeModel(samples);
    fit.models.push_back(m);
    std::sort(samples.begin(), samples.end(),
              [](const auto& x, const auto& y) { return x.tokens < y.tokens; });
    double worst = 0;
    for (const scheduler::StepSample& s : samples) {
      ElasticProfileFit::Row r{degree, s.tokens, s.seconds, m.Predict(s.tokens), 0};
      r.relative_error = (r.fitted - r.measured) / r.measured;
      worst = std::max(worst, std::fabs(r.relative_error));
      fit.rows.push_back(r);
    }
    fit.max_abs_error.push_back(worst);
  }
  return fit;
}

std::string ElasticProfileTable(const ElasticProfileFit& fit) {
  std::string out = absl::StrFormat("%-7s %8s %12s %12s %9s\n", "degree", "tokens", "measured s",
                                    "fitted s", "rel err");
  for (const ElasticProfileFit::Row& r : fit.rows) {
    absl::StrAppendFormat(&out, "%-7d %8d %12.4f %12.4f %+8.1f%%\n", r.degree, r.tokens, r.measured,
                          r.fitted, 100 * r.relative_error);
  }
  for (size_t d = 0; d < fit.models.size(); ++d) {
    const scheduler::StepTimeModel& m = fit.models[d];
    absl::StrAppendFormat(&out, "T_%d(S) = %.4g + %.4g S + %.4g S^2 s   (largest error %.1f%%)\n",
                          d + 1, m.a, m.b, m.c, 100 * fit.max_abs_error[d]);
  }
  return out;
}

}  // namespace mmserve::bench
