// The wire plan (proto EspPlan, language_service/esp_plan.h) of one request
// of a batch the ESP global manager formed (scheduler/esp_manager.h):
// what the router sends to each member of the group.
//
//   for (const EspRequestPlan& r : batch.requests) {
//     ASSIGN_OR_RETURN(v1::EspPlan plan, EspWirePlan(batch, r, instance_ids));
//     // EspPrefill(request, plan, member i) to plan.members(i) for each i
//   }
//
// Thread-safety: pure functions.
#ifndef MMSERVE_ROUTER_ESP_GROUP_PLAN_H_
#define MMSERVE_ROUTER_ESP_GROUP_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/language.pb.h"
#include "scheduler/esp_manager.h"

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
[[nodiscard]] absl::StatusOr<internal::v1::EspPlan> EspWirePlan(
    const scheduler::EspBatchPlan& batch, const scheduler::EspRequestPlan& request,
    const std::vector<std::string>& instance_ids);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_ESP_GROUP_PLAN_H_
