// LlmEngine::HoldSpan and ReleaseSpan: spans of a request's KV kept on a
// member of an elastic-sequence-parallelism group (role elastic).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/engine.h"
#include "worker/engine_live.h"

namespace mmserve::worker {

absl::StatusOr<std::vector<kvpool::BlockId>> LlmEngine::HoldSpan(const std::string& id,
                                                                 int tokens) {
  if (requests_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("request \"", id, "\" is here already"));
  }
  const scheduler::RequestId sched_id{next_id_++};
  ASSIGN_OR_RETURN(std::vector<kvpool::BlockId> blocks, scheduler_->HoldSpan(sched_id, tokens));
  auto live = std::make_unique<Live>();
  live->id = id;
  live->sched_id = sched_id;
  live->holds_span = true;
  requests_[id] = std::move(live);
  return blocks;
}

absl::Status LlmEngine::ReleaseSpan(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second->holds_span) {
    return absl::NotFoundError(absl::StrCat("no span of \"", id, "\""));
  }
  const absl::Status s = scheduler_->ReleaseSpan(it->second->sched_id);
  requests_.erase(it);
  return s;
}

}  // namespace mmserve::worker
