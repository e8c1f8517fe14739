// LlmEngine::HoldSpan and ReleaseSpan: spans of a request's KV kept on a
// member of an elastic-sequence-parallelism group (role elastic).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/engine.h"

namespace mmserve::worker {

absl::StatusOr<std::vector<kvpool::BlockId>> LlmEngine::HoldSpan(const std::string& id,
                                                                 int tokens) {
  if (requests_.contains(id) || held_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("request \"", id, "\" is here already"));
  }
  const scheduler::RequestId sched_id{next_id_++};
  ASSIGN_OR_RETURN(std::vector<kvpool::BlockId> blocks, scheduler_->HoldSpan(sched_id, tokens));
  held_.emplace(id, sched_id);
  return blocks;
}

absl::Status LlmEngine::ReleaseSpan(const std::string& id) {
  auto it = held_.find(id);
  if (it == held_.end()) return absl::NotFoundError(absl::StrCat("no span of \"", id, "\""));
  const absl::Status s = scheduler_->ReleaseSpan(it->second);
  held_.erase(it);
  return s;
}

}  // namespace mmserve::worker
