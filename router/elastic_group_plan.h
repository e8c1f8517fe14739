// The wire plan (proto ElasticPlan, language_service/elastic_plan.h) of one request
// of a batch the elastic global manager formed (scheduler/elastic_manager.h):
// what the router sends to each member of the group.
//
//   for (const ElasticRequestPlan& r : batch.requests) {
//     ASSIGN_OR_RETURN(v1::ElasticPlan plan, ElasticWirePlan(batch, r, instance_ids));
//     // ElasticPrefill(request, plan, member i) to plan.members(i) for each i
//   }
//
// Thread-safety: pure functions.
#ifndef MMSERVE_ROUTER_ELASTIC_GROUP_PLAN_H_
#define MMSERVE_ROUTER_ELASTIC_GROUP_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/language.pb.h"
#include "scheduler/elastic_manager.h"

namespace mmserve::router {

// Members: batch.instances in order (instance_ids[i] names manager
// instance i). Rows: the prompt in contiguous runs as equal as can be, in
// member order (the last member computes the last row and samples). Keep:
// each member's span clipped to the prompt (empty when it holds only
// decode tail or nothing). Decode: each span's part past the prompt, so
// the members master the decode tail in span order (master moves); master:
// the one whose span holds the prompt's end or starts at it, or the
// request's master when there is no tail (max_tokens 1). Internal when the
// plan names an instance outside the batch or twice, or an unknown id.
[[nodiscard]] absl::StatusOr<internal::v1::ElasticPlan> ElasticWirePlan(
    const scheduler::ElasticBatchPlan& batch, const scheduler::ElasticRequestPlan& request,
    const std::vector<std::string>& instance_ids);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_ELASTIC_GROUP_PLAN_H_
