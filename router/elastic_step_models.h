// The elastic manager's per-degree prefill step-time models (router --elastic;
// scheduler::StepTimeModel, T_d(S) = a + b S + c S^2 seconds for S prompt
// tokens at degree d): a documented default, or a file of fitted ones.
//
//   ASSIGN_OR_RETURN(auto models, ParseElasticStepModels(text));  // "d a b c" lines
//   auto models = DefaultElasticStepModels(4);
//   std::string file = FormatElasticStepModels(fitted, {"fitted by bench:elastic_profile"});
//
// The default gives no degree a speedup: T_d = T_1 plus the K/V exchange's
// cost, (d - 1) (1 ms + 1 us S). That is what bench:elastic_bench measured on
// the 2-core machine (degree-2 TTFT 0.95x to 1.15x of one instance's, with
// a parallel ceiling of 0.88), so the batching DP keeps a request on one
// instance whenever its KV fits and forms groups for memory only. T_1 is
// the demo model's order of magnitude on one core (10 us a token plus a
// quadratic attention term). A file of models fitted on faster hardware
// (scheduler::FitStepTimeModel over profiled steps) lets the DP split long
// prompts that would fit one instance too.
//
// Thread-safe (pure functions).
#ifndef MMSERVE_ROUTER_ELASTIC_STEP_MODELS_H_
#define MMSERVE_ROUTER_ELASTIC_STEP_MODELS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/elastic_manager.h"

namespace mmserve::router {

// Degrees 1..max_degree (max_degree >= 1).
std::vector<scheduler::StepTimeModel> DefaultElasticStepModels(int max_degree);

// One model a line, "degree a b c" (blank lines and # comments skipped);
// the degrees must be exactly 1..n. INVALID_ARGUMENT otherwise.
[[nodiscard]] absl::StatusOr<std::vector<scheduler::StepTimeModel>> ParseElasticStepModels(
    absl::string_view text);

// The file ParseElasticStepModels reads back exactly (every double in 17
// significant digits): each of `comments` as a "# " line (newlines in one
// become more lines), then models[d - 1] as "d a b c" for d = 1..n.
std::string FormatElasticStepModels(const std::vector<scheduler::StepTimeModel>& models,
                                    const std::vector<std::string>& comments = {});

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_ELASTIC_STEP_MODELS_H_
