// Knobs of the continuous-batching scheduler.
//
//   SchedulerConfig config;
//   config.max_num_batched_tokens = 2048;  // prefill + decode tokens per step
//   config.max_num_seqs = 256;
//   config.max_prefill_tokens = 512;        // prefill token budget per step
//   config.kv.num_blocks = 4096;
//   RETURN_IF_ERROR(config.Validate());
//
// Plain value; thread-compatible.
#ifndef MMSERVE_SCHEDULER_SCHEDULER_CONFIG_H_
#define MMSERVE_SCHEDULER_SCHEDULER_CONFIG_H_

#include <optional>

#include "absl/status/status.h"
#include "kvpool/kv_cache_manager.h"

namespace mmserve {
namespace scheduler {

struct SchedulerConfig {
  // Token budget of one step, shared by decodes and prefill chunks.
  int max_num_batched_tokens = 2048;
  // Requests holding KV (running) at most.
  int max_num_seqs = 256;
  // Seed 003: a separate cap on prefill tokens per step, so a burst of long
  // prompts cannot crowd out decodes. nullopt: only the shared budget applies.
  // A prompt larger than the cap is admitted as the step's only prefill when
  // chunking is off (otherwise it would starve).
  std::optional<int> max_prefill_tokens;
  // On: prompts are split into chunks that fit the budget left in a step.
  // Off: a prompt is prefilled in one step (see max_prefill_tokens and the
  // lone-oversize rule in scheduler.h).
  bool enable_chunked_prefill = true;
  // Priorities (RequestParams::priority, lower first) order admission and
  // preemption. The starvation bound: a waiting request's priority counts
  // one better for every this many steps it has waited, down to the best
  // priority waiting, so a request of priority p ranks with the best
  // waiting class after at most (p - best) * priority_aging_steps steps and
  // then by arrival. With equal priorities admission is FIFO.
  int priority_aging_steps = 128;
  // The KV pool the scheduler allocates from.
  kvpool::KvCacheOptions kv;

  // InvalidArgument for non-positive sizes or budgets.
  [[nodiscard]] absl::Status Validate() const;
};

}  // namespace scheduler
}  // namespace mmserve

#endif  // MMSERVE_SCHEDULER_SCHEDULER_CONFIG_H_
