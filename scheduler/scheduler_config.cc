#include "scheduler/scheduler_config.h"

#include "absl/strings/str_cat.h"

namespace mmserve {
namespace scheduler {

absl::Status SchedulerConfig::Validate() const {
  auto positive = [](const char* name, int v) {
    return v > 0 ? absl::OkStatus()
                 : absl::InvalidArgumentError(absl::StrCat(name, " must be positive, got ", v));
  };
  for (absl::Status s :
       {positive("max_num_batched_tokens", max_num_batched_tokens),
        positive("max_num_seqs", max_num_seqs),
        positive("priority_aging_steps", priority_aging_steps),
        positive("max_prefill_tokens", max_prefill_tokens.value_or(1)),
        positive("kv.num_blocks", kv.num_blocks), positive("kv.block_size", kv.block_size)}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace scheduler
}  // namespace mmserve
