// What one scheduler step decided: which requests compute how many tokens,
// and which were preempted. The model runner consumes it and answers with one
// sampled token per scheduled entry (Scheduler::UpdateFromOutput).
//
//   const SchedulerOutput& out = scheduler.Schedule();
//   for (const ScheduledRequest& s : out.scheduled) {
//     absl::Span<const TokenId> chunk =
//         s.request->token_ids().subspan(s.num_computed_tokens, s.num_tokens);
//     // positions [s.num_computed_tokens, +s.num_tokens), slots from
//     // kv_cache().Slot(s.request->block_table(), position)
//   }
//
// Pointers are borrowed from the scheduler and stay valid until
// UpdateFromOutput returns. The object is reused by the next step.
#ifndef MMSERVE_SCHEDULER_SCHEDULER_OUTPUT_H_
#define MMSERVE_SCHEDULER_SCHEDULER_OUTPUT_H_

#include <cstdint>
#include <vector>

#include "scheduler/request.h"

namespace mmserve {
namespace scheduler {

struct ScheduledRequest {
  const Request* request = nullptr;
  // The chunk is token positions [num_computed_tokens, + num_tokens).
  int num_computed_tokens = 0;
  int num_tokens = 0;
  // A prefill chunk (prompt tokens, or a recompute after preemption) rather
  // than the single decode token of a running request.
  bool is_prefill = false;
  // The chunk reaches the last known token, so its logits yield a new token.
  // Otherwise (a middle prefill chunk) the sampled token is ignored.
  bool samples = false;
};

struct SchedulerOutput {
  int64_t step = 0;
  // Running requests first (in running order), then newly admitted ones.
  std::vector<ScheduledRequest> scheduled;
  // Requests preempted this step: their KV is gone and will be recomputed.
  std::vector<RequestId> preempted;
  int num_batched_tokens = 0;  // sum of num_tokens
  int num_prefill_tokens = 0;  // sum of num_tokens over prefill chunks
  // Set when the lone-oversize rule admitted a prompt beyond a budget.
  bool lone_oversize_prefill = false;

  void Clear() {
    scheduled.clear();
    preempted.clear();
    num_batched_tokens = 0;
    num_prefill_tokens = 0;
    lone_oversize_prefill = false;
  }
};

}  // namespace scheduler
}  // namespace mmserve

#endif  // MMSERVE_SCHEDULER_SCHEDULER_OUTPUT_H_
