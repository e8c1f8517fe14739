#include "scheduler/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace mmserve {
namespace scheduler {

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<Scheduler>(new Scheduler(config));
}

Scheduler::Scheduler(const SchedulerConfig& config) : config_(config), kv_(config.kv) {
  running_.reserve(config.max_num_seqs);
  scheduled_.reserve(config.max_num_seqs);
  output_.scheduled.reserve(config.max_num_seqs);
}

absl::Status Scheduler::ValidateParams(const RequestParams& p, bool fresh) const {
  if (fresh && requests_.contains(p.id)) {
    return absl::AlreadyExistsError(absl::StrCat(p.id.value, " is already live"));
  }
  if (p.prompt_token_ids.empty()) return absl::InvalidArgumentError("empty prompt");
  if (p.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", p.max_tokens));
  }
  for (TokenId t : p.prompt_token_ids) {
    if (t < 0) return absl::InvalidArgumentError(absl::StrCat("negative token id ", t));
  }
  if (p.resumed_output_token_ids.size() >= static_cast<size_t>(p.max_tokens)) {
    return absl::InvalidArgumentError(
        absl::StrCat(p.resumed_output_token_ids.size(),
                     " resumed tokens leave no room below max_tokens ", p.max_tokens));
  }
  for (TokenId t : p.resumed_output_token_ids) {
    if (t < 0) return absl::InvalidArgumentError(absl::StrCat("negative token id ", t));
  }
  const int64_t prompt_len = static_cast<int64_t>(p.prompt_token_ids.size());
  int64_t prev_end = 0;
  for (const kvpool::MultimodalSpan& s : p.mm_spans) {
    if (s.length < 1 || s.offset < prev_end || s.offset + int64_t{s.length} > prompt_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("multimodal span [", s.offset, ", +", s.length,
                       ") is empty, unsorted, overlapping or outside the prompt"));
    }
    prev_end = s.offset + int64_t{s.length};
  }
  if (!fresh) return absl::OkStatus();  // a span's: most of its KV is elsewhere
  // The last sampled token never needs KV.
  const int64_t max_kv_tokens = prompt_len + p.max_tokens - 1;
  if (kv_.BlocksFor(max_kv_tokens) > kv_.num_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("prompt + max_tokens need ", kv_.BlocksFor(max_kv_tokens),
                     " KV blocks, the pool has ", kv_.num_blocks()));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::AddRequest(RequestParams params) {
  RETURN_IF_ERROR(ValidateParams(params));
  const RequestId id = params.id;
  auto request = std::make_unique<Request>(std::move(params), next_arrival_seq_++);
  request->set_arrival_step(step_);
  waiting_.push_back(request.get());
  requests_.emplace(id, std::move(request));
  return absl::OkStatus();
}

absl::Status Scheduler::Abort(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat(id.value, " is not live"));
  Request* r = it->second.get();
  if (r->status() == RequestStatus::kHoldingSpan) return ReleaseSpan(id);
  if (r->status() == RequestStatus::kRunning || r->status() == RequestStatus::kMastering) {
    std::vector<Request*>& list = r->status() == RequestStatus::kRunning ? running_ : mastering_;
    list.erase(std::find(list.begin(), list.end(), r));
    kv_.Free(r->block_table());
    r->set_block_table(kvpool::BlockTableId{});
  } else if (r->status() == RequestStatus::kWaitingForKv) {
    waiting_for_kv_.erase(std::find(waiting_for_kv_.begin(), waiting_for_kv_.end(), r));
    kv_.Free(r->block_table());
    r->set_block_table(kvpool::BlockTableId{});
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), r));
  }
  r->Finish(RequestStatus::kAborted, FinishReason::kAbort);
  // output_ still points at it until UpdateFromOutput: keep it alive till then.
  if (step_pending_ && r->last_scheduled_step() == step_) {
    aborted_pending_.push_back(std::move(it->second));
  }
  requests_.erase(it);
  return absl::OkStatus();
}

absl::Status Scheduler::UpdateFromOutput(absl::Span<const TokenId> sampled_token_ids,
                                         std::vector<std::unique_ptr<Request>>* finished) {
  if (finished != nullptr) finished->clear();
  if (!step_pending_) {
    return sampled_token_ids.empty()
               ? absl::OkStatus()
               : absl::FailedPreconditionError("no scheduled step is waiting for output");
  }
  if (sampled_token_ids.size() != output_.scheduled.size()) {
    return absl::InvalidArgumentError(absl::StrCat(sampled_token_ids.size(), " sampled tokens for ",
                                                   output_.scheduled.size(), " scheduled"));
  }
  for (size_t i = 0; i < scheduled_.size(); ++i) {
    const RequestStatus st = scheduled_[i]->status();
    if (output_.scheduled[i].samples && sampled_token_ids[i] < 0 &&
        (st == RequestStatus::kRunning || st == RequestStatus::kMastering)) {
      return absl::InvalidArgumentError(
          absl::StrCat("no sampled token for request ", scheduled_[i]->id().value));
    }
  }
  bool any_finished = false;
  for (size_t i = 0; i < scheduled_.size(); ++i) {
    Request* r = scheduled_[i];
    const bool mastering = r->status() == RequestStatus::kMastering;
    if (r->status() != RequestStatus::kRunning && !mastering) continue;  // aborted meanwhile
    const ScheduledRequest& s = output_.scheduled[i];
    r->set_num_computed_tokens(r->num_computed_tokens() + s.num_tokens);
    // A span's blocks do not hold the sequence from its start: never cached.
    if (!mastering) kv_.CacheFullBlocks(r->block_table(), r->sequence(), r->num_computed_tokens());
    if (!s.samples) continue;
    const FinishReason why = r->AppendOutputToken(sampled_token_ids[i]);
    if (why == FinishReason::kNone) continue;
    // A held request's table goes to its span holder (FinishRequests).
    if (!r->params().hold_kv_when_finished) {
      kv_.Free(r->block_table());
      r->set_block_table(kvpool::BlockTableId{});
    }
    r->Finish(RequestStatus::kFinished, why);
    any_finished = true;
  }
  if (any_finished) FinishRequests(finished);
  aborted_pending_.clear();
  step_pending_ = false;
  return absl::OkStatus();
}

void Scheduler::FinishRequests(std::vector<std::unique_ptr<Request>>* finished) {
  // Stable in-place compaction: running order is admission order.
  size_t kept = 0;
  for (Request* r : running_) {
    if (r->status() == RequestStatus::kRunning) {
      running_[kept++] = r;
      continue;
    }
    auto it = requests_.find(r->id());
    std::unique_ptr<Request> holder = HolderOf(*r);
    if (finished != nullptr) finished->push_back(std::move(it->second));
    if (holder == nullptr) {
      requests_.erase(it);
    } else {
      it->second = std::move(holder);
    }
  }
  running_.resize(kept);
  kept = 0;
  for (Request* r : mastering_) {
    if (r->status() == RequestStatus::kMastering) {
      mastering_[kept++] = r;
      continue;
    }
    auto it = requests_.find(r->id());
    if (finished != nullptr) finished->push_back(std::move(it->second));
    requests_.erase(it);
  }
  mastering_.resize(kept);
}

std::unique_ptr<Request> Scheduler::HolderOf(Request& r) {
  if (!r.params().hold_kv_when_finished || r.status() != RequestStatus::kFinished) return nullptr;
  RequestParams params;
  params.id = r.id();
  auto holder = std::make_unique<Request>(std::move(params), r.arrival_seq());
  holder->set_status(RequestStatus::kHoldingSpan);
  holder->set_block_table(r.block_table());
  holder->set_span_tokens(r.num_computed_tokens());
  r.set_block_table(kvpool::BlockTableId{});
  ++num_holding_;
  return holder;
}

const Request* Scheduler::Find(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->status() == RequestStatus::kHoldingSpan) return nullptr;
  return it->second.get();
}

}  // namespace scheduler
}  // namespace mmserve
