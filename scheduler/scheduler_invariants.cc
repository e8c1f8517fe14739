// Scheduler::CheckInvariants: the consistency checks that tests run after
// every step.
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/scheduler.h"

namespace mmserve {
namespace scheduler {
namespace {

absl::Status Broken(const Request& r, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat(r.id().value, " (", RequestStatusName(r.status()), "): ", what));
}

absl::Status CheckRunning(const Request& r, const kvpool::KvCacheManager& kv) {
  if (r.status() != RequestStatus::kRunning) return Broken(r, "in running but not running");
  if (!r.block_table().valid()) return Broken(r, "running without a block table");
  if (r.num_computed_tokens() >= r.num_total_tokens()) {
    return Broken(r, "computed tokens caught up but no token was appended");
  }
  if (static_cast<int>(kv.block_table(r.block_table()).size()) <
      kv.BlocksFor(r.num_computed_tokens())) {
    return Broken(r, "fewer blocks than its computed tokens need");
  }
  return absl::OkStatus();
}

absl::Status CheckWaiting(const Request& r) {
  if (r.status() != RequestStatus::kWaiting && r.status() != RequestStatus::kPreempted) {
    return Broken(r, "in waiting with a non-waiting status");
  }
  if (r.block_table().valid()) return Broken(r, "waiting but holds a block table");
  if (r.num_computed_tokens() != 0) return Broken(r, "waiting with computed tokens");
  return absl::OkStatus();
}

}  // namespace

absl::Status Scheduler::CheckInvariants() const {
  RETURN_IF_ERROR(kv_.CheckInvariants());
  if (static_cast<int>(running_.size() + waiting_for_kv_.size()) > config_.max_num_seqs) {
    return absl::InternalError(absl::StrCat(running_.size(), " running > max_num_seqs"));
  }
  absl::flat_hash_set<const Request*> seen;
  for (const Request* r : running_) {
    RETURN_IF_ERROR(CheckRunning(*r, kv_));
    if (!seen.insert(r).second) return Broken(*r, "listed twice");
  }
  bool fresh_seen = false;
  uint64_t last_fresh_arrival = 0;
  for (const Request* r : waiting_) {
    RETURN_IF_ERROR(CheckWaiting(*r));
    if (!seen.insert(r).second) return Broken(*r, "listed twice");
    if (r->status() == RequestStatus::kPreempted) {
      if (fresh_seen) return Broken(*r, "preempted request behind a fresh one");
      continue;
    }
    if (fresh_seen && r->arrival_seq() < last_fresh_arrival) {
      return Broken(*r, "waiting queue is out of arrival order");
    }
    fresh_seen = true;
    last_fresh_arrival = r->arrival_seq();
  }
  for (const Request* r : waiting_for_kv_) {
    if (r->status() != RequestStatus::kWaitingForKv) return Broken(*r, "waits for KV by mistake");
    if (!r->block_table().valid() || static_cast<int>(kv_.block_table(r->block_table()).size()) <
                                         kv_.BlocksFor(r->num_prompt_tokens())) {
      return Broken(*r, "waits for KV without blocks for its prompt");
    }
    if (!seen.insert(r).second) return Broken(*r, "listed twice");
  }
  for (const Request* r : mastering_) {
    if (r->status() != RequestStatus::kMastering) return Broken(*r, "masters by mistake");
    if (!r->block_table().valid()) return Broken(*r, "masters without blocks");
    if (!seen.insert(r).second) return Broken(*r, "listed twice");
  }
  int holding = 0;
  for (const auto& [id, r] : requests_) {
    if (r->status() != RequestStatus::kHoldingSpan) continue;
    if (!r->block_table().valid()) return Broken(*r, "holds a span without blocks");
    seen.insert(r.get());
    ++holding;
  }
  if (holding != num_holding_) {
    return absl::InternalError(absl::StrCat(holding, " held spans, counted ", num_holding_));
  }
  if (seen.size() != requests_.size()) {
    return absl::InternalError(
        absl::StrCat(requests_.size(), " live requests, ", seen.size(), " queued"));
  }
  for (const auto& [id, r] : requests_) {
    if (!seen.contains(r.get())) return Broken(*r, "live but in no queue");
  }
  if (kv_.num_tables() !=
      static_cast<int>(running_.size() + waiting_for_kv_.size() + mastering_.size()) +
          num_holding_ + num_pins_) {
    return absl::InternalError(absl::StrCat(kv_.num_tables(), " block tables for ", running_.size(),
                                            " running requests, ", waiting_for_kv_.size(),
                                            " waiting for KV, ", num_holding_, " held spans and ",
                                            num_pins_, " pins"));
  }
  return absl::OkStatus();
}

}  // namespace scheduler
}  // namespace mmserve
