// Scheduler::Schedule: one step of the continuous-batching policy described
// in scheduler.h (running pass, then FIFO admission).
#include <algorithm>
#include <limits>

#include "common/logging.h"
#include "scheduler/scheduler.h"

namespace mmserve {
namespace scheduler {

const SchedulerOutput& Scheduler::Schedule() {
  CHECK(!step_pending_) << "Schedule called again before UpdateFromOutput";
  ++step_;
  output_.Clear();
  output_.step = step_;
  scheduled_.clear();
  StepBudget budget;
  budget.tokens = config_.max_num_batched_tokens;
  budget.prefill_tokens = config_.max_prefill_tokens.value_or(std::numeric_limits<int>::max());
  ScheduleRunning(budget);
  ScheduleMastering(budget);
  // Admitting right after preempting would thrash: the preempted request sits
  // at the front of the queue and would get its blocks straight back.
  if (!budget.preempted) ScheduleWaiting(budget);
  step_pending_ = !output_.scheduled.empty();
  return output_;
}

void Scheduler::ScheduleRunning(StepBudget& budget) {
  for (size_t i = 0; i < running_.size() && budget.tokens > 0; ++i) {
    Request* r = running_[i];
    const int remaining = r->num_total_tokens() - r->num_computed_tokens();
    DCHECK_LT(0, remaining);
    const bool is_prefill = remaining > 1 || r->num_computed_tokens() < r->num_prompt_tokens();
    int n = std::min(remaining, budget.tokens);
    if (is_prefill) n = std::min(n, budget.prefill_tokens);
    // Without chunking a prefill is never split (admission gives it all at
    // once, so this only guards the invariant).
    if (n == 0 || (!config_.enable_chunked_prefill && n < remaining)) continue;
    if (!AppendSlotsOrPreempt(i, r->num_computed_tokens() + n, budget)) break;
    Emit(r, n, is_prefill, budget);
  }
}

bool Scheduler::AppendSlotsOrPreempt(size_t index, int num_tokens, StepBudget& budget) {
  Request* r = running_[index];
  while (!kv_.AppendSlots(r->block_table(), num_tokens)) {
    // Victims come from `index` on (none of them is scheduled yet): the
    // worst priority, the newest among equals.
    size_t v = running_.size() - 1;
    for (size_t j = running_.size() - 1; j > index; --j) {
      if (running_[j - 1]->priority() > running_[v]->priority()) v = j - 1;
    }
    Request* victim = running_[v];
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(v));
    Preempt(victim);
    budget.preempted = true;
    if (victim == r) return false;
  }
  return true;
}

void Scheduler::Preempt(Request* r) {
  kv_.Free(r->block_table());
  r->set_block_table(kvpool::BlockTableId{});
  r->set_num_computed_tokens(0);
  r->set_status(RequestStatus::kPreempted);
  r->CountPreemption();
  ++num_preemptions_;
  waiting_.push_front(r);
  output_.preempted.push_back(r->id());
}

std::vector<Request*> Scheduler::AdmissionOrder() const {
  std::vector<Request*> order(waiting_.begin(), waiting_.end());
  if (order.empty()) return order;
  int best = order.front()->priority();
  for (const Request* r : order) best = std::min(best, r->priority());
  // Aging: one class better per priority_aging_steps waited, down to the
  // best class waiting (so equal priorities keep the queue's order).
  auto effective = [&](const Request* r) {
    const int64_t aged = (step_ - r->arrival_step()) / config_.priority_aging_steps;
    return std::max<int64_t>(best, r->priority() - aged);
  };
  // Stable: within a class, the queue's order (preempted first, then
  // arrival).
  std::stable_sort(order.begin(), order.end(),
                   [&](const Request* a, const Request* b) { return effective(a) < effective(b); });
  return order;
}

void Scheduler::ScheduleWaiting(StepBudget& budget) {
  for (Request* r : AdmissionOrder()) {
    if (budget.tokens <= 0 ||
        static_cast<int>(running_.size() + waiting_for_kv_.size()) >= config_.max_num_seqs) {
      break;
    }
    Admission admission = PlanAdmission(*r, budget);
    if (!admission.admit ||
        !kv_.CanAllocate(admission.hit, admission.hit.num_tokens + admission.num_tokens)) {
      break;  // keeps the order: nobody overtakes the head
    }
    Admit(r, admission, budget);
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), r));
    if (admission.lone_oversize) break;
  }
}

Scheduler::Admission Scheduler::PlanAdmission(const Request& r, const StepBudget& budget) const {
  Admission a;
  a.hit = kv_.FindCachedPrefix(r.sequence());
  const int need = r.num_total_tokens() - a.hit.num_tokens;  // >= 1 by FindCachedPrefix
  const int fit = std::min({need, budget.tokens, budget.prefill_tokens});
  if (fit == need || (config_.enable_chunked_prefill && fit > 0)) {
    a.admit = true;
    a.num_tokens = fit;
    return a;
  }
  if (config_.enable_chunked_prefill) return a;
  // Chunking off, and the whole remainder does not fit: the lone-oversize rule.
  const int max_prefill = config_.max_prefill_tokens.value_or(std::numeric_limits<int>::max());
  const bool first_prefill = output_.num_prefill_tokens == 0;
  const bool nothing_scheduled = output_.scheduled.empty();
  if ((first_prefill && need > max_prefill && need <= budget.tokens) ||
      (nothing_scheduled && need > config_.max_num_batched_tokens)) {
    a.admit = true;
    a.lone_oversize = true;
    a.num_tokens = need;
  }
  return a;
}

void Scheduler::Admit(Request* r, Admission& admission, StepBudget& budget) {
  const int cached = admission.hit.num_tokens;
  absl::StatusOr<kvpool::BlockTableId> table =
      kv_.Allocate(r->sequence(), admission.hit, cached + admission.num_tokens);
  CHECK(table.ok()) << table.status() << " after CanAllocate said yes";
  r->set_block_table(*table);
  r->set_num_computed_tokens(cached);
  r->set_num_cached_tokens(cached);
  r->set_status(RequestStatus::kRunning);
  running_.push_back(r);
  if (admission.lone_oversize) output_.lone_oversize_prefill = true;
  Emit(r, admission.num_tokens, /*is_prefill=*/true, budget);
  if (admission.lone_oversize) budget.prefill_tokens = 0;  // the step's only prefill
}

void Scheduler::Emit(Request* r, int num_tokens, bool is_prefill, StepBudget& budget) {
  ScheduledRequest s;
  s.request = r;
  s.num_computed_tokens = r->num_computed_tokens();
  s.num_tokens = num_tokens;
  s.is_prefill = is_prefill;
  s.samples = r->num_computed_tokens() + num_tokens == r->num_total_tokens();
  output_.scheduled.push_back(s);
  scheduled_.push_back(r);
  output_.num_batched_tokens += num_tokens;
  // The lone-oversize rule may overdraw a budget; clamp at zero.
  budget.tokens = std::max(0, budget.tokens - num_tokens);
  if (is_prefill) {
    output_.num_prefill_tokens += num_tokens;
    budget.prefill_tokens = std::max(0, budget.prefill_tokens - num_tokens);
  }
  r->set_last_scheduled_step(step_);
}

}  // namespace scheduler
}  // namespace mmserve
