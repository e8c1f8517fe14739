// Scheduler::ReserveRemoteKv and CommitRemoteKv: requests whose prompt KV a
// prefill instance computes and writes into this scheduler's blocks (role
// decode).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/scheduler.h"

namespace mmserve {
namespace scheduler {

absl::StatusOr<Scheduler::RemoteKvReservation> Scheduler::ReserveRemoteKv(RequestParams params) {
  if (step_pending_) return absl::FailedPreconditionError("a step is pending");
  RETURN_IF_ERROR(ValidateParams(params));
  if (static_cast<int>(running_.size() + waiting_for_kv_.size()) >= config_.max_num_seqs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("max_num_seqs (", config_.max_num_seqs, ") sequences already live"));
  }
  const RequestId id = params.id;
  auto request = std::make_unique<Request>(std::move(params), next_arrival_seq_++);
  Request* r = request.get();
  const int prompt_len = r->num_prompt_tokens();
  const kvpool::PrefixHit hit = kv_.FindCachedPrefix(r->sequence());
  if (!kv_.CanAllocate(hit, prompt_len)) {
    return absl::ResourceExhaustedError(absl::StrCat("no room for ", kv_.BlocksFor(prompt_len),
                                                     " KV blocks (", kv_.num_free_blocks(),
                                                     " free)"));
  }
  ASSIGN_OR_RETURN(kvpool::BlockTableId table, kv_.Allocate(r->sequence(), hit, prompt_len));
  r->set_block_table(table);
  r->set_num_cached_tokens(hit.num_tokens);
  r->set_status(RequestStatus::kWaitingForKv);
  absl::Span<const kvpool::BlockId> blocks = kv_.block_table(table);
  RemoteKvReservation reservation;
  reservation.num_cached_tokens = hit.num_tokens;
  reservation.blocks.assign(blocks.begin() + hit.blocks.size(), blocks.end());
  waiting_for_kv_.push_back(r);
  requests_.emplace(id, std::move(request));
  return reservation;
}

absl::Status Scheduler::CommitRemoteKv(RequestId id, TokenId first_token,
                                       std::vector<std::unique_ptr<Request>>* finished) {
  if (finished != nullptr) finished->clear();
  if (step_pending_) return absl::FailedPreconditionError("a step is pending");
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat(id.value, " is not live"));
  Request* r = it->second.get();
  if (r->status() != RequestStatus::kWaitingForKv) {
    return absl::FailedPreconditionError(
        absl::StrCat(id.value, " does not wait for KV (", RequestStatusName(r->status()), ")"));
  }
  if (first_token < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative first token ", first_token));
  }
  waiting_for_kv_.erase(std::find(waiting_for_kv_.begin(), waiting_for_kv_.end(), r));
  r->set_num_computed_tokens(r->num_prompt_tokens());
  kv_.CacheFullBlocks(r->block_table(), r->sequence(), r->num_computed_tokens());
  r->set_status(RequestStatus::kRunning);
  running_.push_back(r);
  const FinishReason why = r->AppendOutputToken(first_token);
  if (why != FinishReason::kNone) {
    kv_.Free(r->block_table());
    r->set_block_table(kvpool::BlockTableId{});
    r->Finish(RequestStatus::kFinished, why);
    FinishRequests(finished);
  }
  return absl::OkStatus();
}

}  // namespace scheduler
}  // namespace mmserve
