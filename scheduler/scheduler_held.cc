// Scheduler::HoldSpan, ReleaseSpan, GrowSpan and the kMastering requests: spans of a
// request's KV kept on a member of an elastic-sequence-parallelism group
// (role elastic), and the master's decode on its span; PinCachedPrefix and
// Unpin, tables that keep a cached prefix from eviction.
#include <algorithm>
#include <limits>
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
  holder->set_span_tokens(num_tokens);
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

absl::StatusOr<kvpool::BlockTableId> Scheduler::PinCachedPrefix(const RequestParams& params,
                                                                int min_tokens) {
  const kvpool::SequenceView seq{params.prompt_token_ids, params.mm_spans};
  const kvpool::PrefixHit hit = kv_.FindCachedPrefix(seq);
  if (hit.num_tokens < min_tokens || !kv_.CanAllocate(hit, hit.num_tokens)) {
    return absl::FailedPreconditionError(absl::StrCat(
        hit.num_tokens, " tokens of the prompt are cached, not the first ", min_tokens));
  }
  ASSIGN_OR_RETURN(kvpool::BlockTableId pin, kv_.Allocate(seq, hit, hit.num_tokens));
  ++num_pins_;
  return pin;
}

void Scheduler::Unpin(kvpool::BlockTableId pin) {
  kv_.Free(pin);
  --num_pins_;
}

absl::Status Scheduler::StartMastering(RequestId id, RequestParams params, int kv_offset,
                                       absl::Span<const TokenId> generated, uint64_t decode_group) {
  if (step_pending_) return absl::FailedPreconditionError("a step is pending");
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->status() != RequestStatus::kHoldingSpan) {
    return absl::NotFoundError(absl::StrCat(id.value, " holds no span"));
  }
  RETURN_IF_ERROR(ValidateParams(params, /*fresh=*/false));
  if (generated.empty()) return absl::InvalidArgumentError("a master needs the first token");
  params.id = id;
  auto r = std::make_unique<Request>(std::move(params), it->second->arrival_seq());
  for (TokenId t : generated) {
    if (t < 0) return absl::InvalidArgumentError("a negative token id");
    if (r->AppendOutputToken(t) != FinishReason::kNone) {
      return absl::InvalidArgumentError("the generated tokens end the request");
    }
  }
  r->set_num_computed_tokens(r->num_total_tokens() - 1);
  r->set_kv_offset(kv_offset);
  r->set_decode_group(decode_group);
  r->set_block_table(it->second->block_table());
  r->set_span_tokens(it->second->span_tokens());
  r->set_status(RequestStatus::kMastering);
  r->set_arrival_step(step_);
  if (kv_offset < 0 || kv_offset > r->num_computed_tokens() || !HasDecodeSlot(*r)) {
    return absl::InvalidArgumentError("the span has no slot for the master's next token");
  }
  mastering_.push_back(r.get());
  it->second = std::move(r);
  --num_holding_;
  return absl::OkStatus();
}

absl::Status Scheduler::StopMastering(RequestId id) {
  if (step_pending_) return absl::FailedPreconditionError("a step is pending");
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->status() != RequestStatus::kMastering) {
    return absl::NotFoundError(absl::StrCat(id.value, " is not mastered here"));
  }
  mastering_.erase(std::find(mastering_.begin(), mastering_.end(), it->second.get()));
  it->second->set_status(RequestStatus::kHoldingSpan);
  ++num_holding_;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<kvpool::BlockId>> Scheduler::GrowSpan(RequestId id, int64_t kv_end) {
  if (step_pending_) return absl::FailedPreconditionError("a step is pending");
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->status() != RequestStatus::kMastering) {
    return absl::NotFoundError(absl::StrCat(id.value, " is not mastered here"));
  }
  Request& r = *it->second;
  const int64_t tokens = kv_end - r.kv_offset();
  if (tokens < 1 || tokens > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("a span of ", tokens, " tokens"));
  }
  if (!kv_.AppendSlots(r.block_table(), static_cast<int>(tokens))) {
    const int have = static_cast<int>(kv_.block_table(r.block_table()).size());
    return absl::ResourceExhaustedError(absl::StrCat("no room for ", kv_.BlocksFor(tokens) - have,
                                                     " more KV blocks (", kv_.num_free_blocks(),
                                                     " free)"));
  }
  r.set_span_tokens(std::max(r.span_tokens(), static_cast<int>(tokens)));
  absl::Span<const kvpool::BlockId> blocks = kv_.block_table(r.block_table());
  return std::vector<kvpool::BlockId>(blocks.begin(), blocks.end());
}

bool Scheduler::HasDecodeSlot(RequestId id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && it->second->status() == RequestStatus::kMastering &&
         HasDecodeSlot(*it->second);
}

bool Scheduler::HasDecodeSlot(const Request& r) const {
  const int64_t slots =
      static_cast<int64_t>(kv_.block_table(r.block_table()).size()) * kv_.block_size();
  return r.num_computed_tokens() - r.kv_offset() < slots;
}

void Scheduler::ScheduleMastering(StepBudget& budget) {
  if (mastering_.empty()) return;
  const uint64_t group = mastering_[mastering_turn_++ % mastering_.size()]->decode_group();
  for (Request* r : mastering_) {
    if (budget.tokens == 0) break;
    if (r->decode_group() != group || !HasDecodeSlot(*r)) continue;
    Emit(r, 1, /*is_prefill=*/false, budget);
  }
}

}  // namespace scheduler
}  // namespace mmserve
