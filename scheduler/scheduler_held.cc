// Scheduler::HoldSpan and ReleaseSpan: spans of a request's KV kept on a
// member of an elastic-sequence-parallelism group (role elastic).
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/scheduler.h"

namespace mmserve {
namespace scheduler {

absl::StatusOr<std::vector<kvpool::BlockId>> Scheduler::HoldSpan(RequestId id, int num_tokens) {
  if (num_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a span of ", num_tokens, " tokens"));
  }
  if (requests_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat(id.value, " is live here already"));
  }
  const kvpool::PrefixHit none;
  if (!kv_.CanAllocate(none, num_tokens)) {
    return absl::ResourceExhaustedError(absl::StrCat("no room for ", kv_.BlocksFor(num_tokens),
                                                     " KV blocks (", kv_.num_free_blocks(),
                                                     " free)"));
  }
  // The span's tokens are not hashed (its blocks are never cached), so the
  // view only sizes the allocation.
  const std::vector<TokenId> sizing(static_cast<size_t>(num_tokens), 0);
  ASSIGN_OR_RETURN(kvpool::BlockTableId table,
                   kv_.Allocate(kvpool::SequenceView{sizing, {}}, none, num_tokens));
  RequestParams params;
  params.id = id;
  auto holder = std::make_unique<Request>(std::move(params), next_arrival_seq_++);
  holder->set_status(RequestStatus::kHoldingSpan);
  holder->set_block_table(table);
  requests_.emplace(id, std::move(holder));
  ++num_holding_;
  absl::Span<const kvpool::BlockId> blocks = kv_.block_table(table);
  return std::vector<kvpool::BlockId>(blocks.begin(), blocks.end());
}

absl::Status Scheduler::ReleaseSpan(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->status() != RequestStatus::kHoldingSpan) {
    return absl::NotFoundError(absl::StrCat(id.value, " holds no span"));
  }
  kv_.Free(it->second->block_table());
  requests_.erase(it);
  --num_holding_;
  return absl::OkStatus();
}

}  // namespace scheduler
}  // namespace mmserve
