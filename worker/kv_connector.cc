#include "worker/kv_connector.h"

#include "common/logging.h"

namespace mmserve::worker {

bool PrefillKvConnector::OnPromptDone(const KvPromptDone& done) {
  // Its first token ended it (stop token, eos, or a max_tokens of 1): it
  // finishes here; otherwise the decode engine produces the rest.
  return done.reason == scheduler::FinishReason::kLength && done.max_tokens > 1;
}

void DecodeKvConnector::OnReserved(absl::string_view id, const KvRequestInfo& request) {
  commit_by_.emplace(id, Deadline::After(options_.commit_timeout));
  if (request.num_handoff_images > 0) has_images_.emplace(id);
}

std::vector<std::string> DecodeKvConnector::TakeExpired() {
  std::vector<std::string> expired;
  for (const auto& [id, deadline] : commit_by_) {
    if (!deadline.Expired()) continue;
    LOG(WARNING) << "request " << id << ": no KV commit before its deadline; freeing its blocks";
    expired.push_back(id);
  }
  return expired;
}

absl::Status DecodeKvConnector::OnPreempted(absl::string_view id) {
  if (!has_images_.contains(id)) return absl::OkStatus();
  LOG(WARNING) << "request " << id << ": preempted, and its handed-off images cannot be "
               << "recomputed here; aborting it";
  return absl::ResourceExhaustedError(
      "the decode instance ran out of KV blocks and cannot recompute a handed-off image prompt");
}

void DecodeKvConnector::OnFinished(absl::string_view id) {
  commit_by_.erase(id);
  has_images_.erase(id);
}

}  // namespace mmserve::worker
