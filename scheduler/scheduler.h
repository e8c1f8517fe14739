// A continuous-batching scheduler in the unified style (vLLM v1, nano-vllm):
// every request has num_computed_tokens catching up to num_total_tokens, and
// each step hands out one token budget, so chunked prefills and decodes share
// a step.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> s, Scheduler::Create(config));
//   RETURN_IF_ERROR(s->AddRequest(std::move(params)));
//   while (s->has_unfinished()) {
//     const SchedulerOutput& out = s->Schedule();
//     std::vector<TokenId> sampled = model_runner.Run(out);  // one per entry
//     RETURN_IF_ERROR(s->UpdateFromOutput(sampled, &finished));
//   }
//
// One step (Schedule):
//  1. Running requests, oldest first, each get min(tokens left to compute,
//     budget left) (and, for prefill chunks, the prefill budget left). When
//     the KV pool cannot give a request its slots, the running request of
//     the worst priority not yet scheduled this step (the newest among
//     equals) is preempted (recompute: KV freed, num_computed_tokens = 0,
//     put at the front of the waiting queue) and the request retries; when
//     it is itself that one, it is preempted and the running pass ends.
//     Then the kMastering requests (role elastic) of one decode group
//     decode one token each, within the token budget.
//  2. Unless something was preempted, waiting requests are admitted by
//     priority (lower first; aged by SchedulerConfig::priority_aging_steps,
//     the starvation bound), and within one priority in FIFO order
//     (preempted ones first). Admission stops at the first request that
//     does not fit the token budget, the prefill budget, max_num_seqs or
//     the KV pool, so order is kept. A prefix-cache hit sets
//     num_computed_tokens to the cached length. With chunked prefill, a
//     request may start with a chunk of whatever budget is left. Without it a
//     prompt is prefilled whole; the lone-oversize rule admits a
//     prompt larger than max_prefill_tokens as the step's only prefill (when
//     it fits the token budget), and one larger than max_num_batched_tokens
//     when nothing else is scheduled in the step. Otherwise it would starve.
//
// UpdateFromOutput advances num_computed_tokens, caches newly full blocks,
// appends the sampled token of every entry that samples, and finishes
// requests on a stop token id, eos (unless ignore_eos) or max_tokens, freeing
// their KV.
//
// Invalid input (duplicate id, empty prompt, a request that could never fit
// the whole KV pool, bad spans) is an error status, never a crash.
//
// Thread-compatible, not thread-safe: one engine-loop thread owns the
// scheduler; other threads post AddRequest/Abort to it.
#ifndef MMSERVE_SCHEDULER_SCHEDULER_H_
#define MMSERVE_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpool/kv_cache_manager.h"
#include "scheduler/request.h"
#include "scheduler/scheduler_config.h"
#include "scheduler/scheduler_output.h"

namespace mmserve {
namespace scheduler {

class Scheduler {
 public:
  // InvalidArgument when the config does not validate.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerConfig& config);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request at the back of the waiting queue. AlreadyExists for an id
  // that is live; InvalidArgument for an empty prompt, max_tokens < 1, a
  // negative token id or bad multimodal spans; ResourceExhausted when prompt
  // + max_tokens could never fit the whole KV pool.
  [[nodiscard]] absl::Status AddRequest(RequestParams params);

  // Decides the next step. Must not be called while the previous step's
  // output is pending (CHECKed: a programming error). The reference stays
  // valid until the next Schedule.
  const SchedulerOutput& Schedule();

  // Applies the step's results: `sampled_token_ids[i]` is the token sampled
  // for `Schedule().scheduled[i]` (ignored unless that entry samples; use
  // kNoToken there). Finished requests are moved into `*finished` (cleared
  // first; may be null to drop them). InvalidArgument (and nothing changes)
  // when the count does not match or a sampling entry has a negative token;
  // FailedPrecondition when no step is pending and tokens were given.
  [[nodiscard]] absl::Status UpdateFromOutput(absl::Span<const TokenId> sampled_token_ids,
                                              std::vector<std::unique_ptr<Request>>* finished);

  // Ends a request in any non-terminal state and frees everything it holds.
  // Allowed between Schedule and UpdateFromOutput (the caller guarantees no
  // KV write of that step is still outstanding); the entry is then skipped.
  // NotFound for an unknown or already finished id.
  [[nodiscard]] absl::Status Abort(RequestId id);

  // Role decode: a request whose prompt KV another instance
  // computes. Validates `params` like AddRequest, takes the cached prefix of
  // the prompt from this pool and allocates blocks for the rest; the request
  // holds them in kWaitingForKv, in neither queue and never scheduled, until
  // CommitRemoteKv or Abort. It counts against max_num_seqs from now on.
  // ResourceExhausted (nothing changes) when the pool or max_num_seqs has no
  // room now.
  struct RemoteKvReservation {
    // The blocks the prefill instance must write, in prompt order: the
    // table's blocks after the prefix hit.
    std::vector<kvpool::BlockId> blocks;
    // Prompt tokens the hit covers (a multiple of the block size): their KV
    // is here already and is not sent.
    int num_cached_tokens = 0;
  };
  [[nodiscard]] absl::StatusOr<RemoteKvReservation> ReserveRemoteKv(RequestParams params);

  // The prompt KV of a kWaitingForKv request has been written (and
  // verified): it joins the running requests with `first_token`, sampled by
  // the prefill instance, as its first output, and the prompt's full blocks
  // are cached. When that token already finishes it (stop, eos, max_tokens
  // 1) it is finished here, its KV freed, and moved into `*finished`
  // (cleared first; may be null). NotFound for an unknown id,
  // FailedPrecondition unless it waits for KV, InvalidArgument for a
  // negative token (nothing changes on error). Not while a step is pending.
  [[nodiscard]] absl::Status CommitRemoteKv(RequestId id, TokenId first_token,
                                            std::vector<std::unique_ptr<Request>>* finished);
  // Requests holding blocks in kWaitingForKv.
  int num_waiting_for_kv() const { return static_cast<int>(waiting_for_kv_.size()); }

  // Role elastic: a span of a request's KV that this instance
  // keeps for a group prefill while another instance decodes the request.
  // The span's blocks (BlocksFor(num_tokens), no prefix-cache hit) are held
  // by a request `id` in kHoldingSpan, outside every queue: never
  // scheduled, not counted against max_num_seqs nor by has_unfinished and
  // Find, freed by ReleaseSpan or by Abort(id). AlreadyExists when
  // `id` is live or holds a span; ResourceExhausted (nothing changes) when
  // the pool has no room; InvalidArgument for num_tokens < 1.
  [[nodiscard]] absl::StatusOr<std::vector<kvpool::BlockId>> HoldSpan(RequestId id, int num_tokens);
  // Frees the span held under `id`: NotFound when none.
  [[nodiscard]] absl::Status ReleaseSpan(RequestId id);
  int num_held_spans() const { return num_holding_; }
  // The cached prefix of `params`' prompt (its full blocks found by hash)
  // kept from eviction: a block table of those blocks outside every
  // request, for a request admitted without the rows of images whose KV it
  // expects cached (preempted, it finds them again). FailedPrecondition
  // (nothing changes) when fewer than `min_tokens` are cached. Unpin frees
  // the table; its blocks stay cached.
  [[nodiscard]] absl::StatusOr<kvpool::BlockTableId> PinCachedPrefix(const RequestParams& params,
                                                                     int min_tokens);
  void Unpin(kvpool::BlockTableId pin);
  // The span held under `id` becomes the request `params` (validated as
  // AddRequest's, but its id is `id`'s) mastered here: prompt then
  // `generated` (at least one token, the last not yet computed), its KV
  // elsewhere before token kv_offset and in the span from there
  // (kv_offset() of the Request). kMastering: each step decodes one token
  // of it while its span (of HoldSpan's num_tokens) has a slot for it, never preempted, not counted
  // against max_num_seqs; only the requests of one decode group are
  // decoded in a step (the groups take turns). It finishes as a running
  // request does (stop, eos, max_tokens: its blocks freed) or goes back to
  // holding its span (StopMastering). NotFound when `id` holds no span;
  // InvalidArgument for bad params, no generated token, a token that ends
  // it or a span without the slot of its next token (nothing changes on
  // error). Not while a step is pending.
  [[nodiscard]] absl::Status StartMastering(RequestId id, RequestParams params, int kv_offset,
                                            absl::Span<const TokenId> generated,
                                            uint64_t decode_group);
  // A kMastering request holds its span again (its blocks and their KV
  // stay). NotFound unless `id` is mastered here. Not while a step is
  // pending.
  [[nodiscard]] absl::Status StopMastering(RequestId id);
  // Whether the span of kMastering request `id` has the slot of its next
  // token (false for any other id).
  bool HasDecodeSlot(RequestId id) const;
  // The span of kMastering request `id` grows to reach KV index `kv_end`
  // (exclusive), taking whole blocks from the pool as a running request's
  // table takes them (a master that reserves its decode KV a window at a
  // time instead of all of max_tokens at placement). A kv_end its blocks
  // reach already changes nothing. Returns the span's blocks, in order.
  // NotFound unless `id` is mastered here; ResourceExhausted (nothing
  // changes) when the pool lacks the blocks; InvalidArgument for a kv_end
  // not past the span's first token. Not while a step is pending.
  [[nodiscard]] absl::StatusOr<std::vector<kvpool::BlockId>> GrowSpan(RequestId id, int64_t kv_end);
  int num_mastering() const { return static_cast<int>(mastering_.size()); }

  // The live (not finished, not aborted) request with `id`, or null.
  const Request* Find(RequestId id) const;
  int num_running() const { return static_cast<int>(running_.size()); }
  // Includes preempted requests.
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  // Requests to run: held spans are not.
  bool has_unfinished() const { return static_cast<int>(requests_.size()) > num_holding_; }
  int64_t num_preemptions() const { return num_preemptions_; }
  const SchedulerConfig& config() const { return config_; }
  // The model runner reads block tables and slots through this.
  const kvpool::KvCacheManager& kv_cache() const { return kv_; }

  // Test/debug helper: the KV manager's invariants, plus every live request
  // is in exactly one of running/waiting with a status to match, only running
  // requests hold a block table (with slots for their computed tokens), the
  // waiting queue is preempted requests then fresh ones in arrival order, and
  // running <= max_num_seqs.
  [[nodiscard]] absl::Status CheckInvariants() const;

 private:
  // What is left of one step's budgets.
  struct StepBudget {
    int tokens = 0;
    int prefill_tokens = 0;
    bool preempted = false;
  };
  // How a waiting request would be admitted this step.
  struct Admission {
    bool admit = false;
    bool lone_oversize = false;
    int num_tokens = 0;  // tokens to compute this step, after the prefix hit
    kvpool::PrefixHit hit;
  };

  explicit Scheduler(const SchedulerConfig& config);

  // scheduler_step.cc
  void ScheduleRunning(StepBudget& budget);
  // scheduler_held.cc: one decode group's kMastering requests.
  void ScheduleMastering(StepBudget& budget);
  bool HasDecodeSlot(const Request& r) const;
  void ScheduleWaiting(StepBudget& budget);
  // The waiting queue in admission order: by effective priority (aged),
  // then the queue's own order.
  std::vector<Request*> AdmissionOrder() const;
  Admission PlanAdmission(const Request& r, const StepBudget& budget) const;
  void Admit(Request* r, Admission& admission, StepBudget& budget);
  bool AppendSlotsOrPreempt(size_t index, int num_tokens, StepBudget& budget);
  void Preempt(Request* r);
  void Emit(Request* r, int num_tokens, bool is_prefill, StepBudget& budget);

  // scheduler.cc
  // fresh: a new id, and prompt + max_tokens fit the whole pool (not so
  // for a span's request, whose id holds the span and whose KV is mostly
  // elsewhere).
  absl::Status ValidateParams(const RequestParams& params, bool fresh = true) const;
  void FinishRequests(std::vector<std::unique_ptr<Request>>* finished);
  // The kHoldingSpan request that keeps finished `r`'s blocks (taking its
  // table), when its params ask for that (hold_kv_when_finished); else null.
  std::unique_ptr<Request> HolderOf(Request& r);

  const SchedulerConfig config_;
  kvpool::KvCacheManager kv_;
  // Every live request; running_ and waiting_ point into it.
  absl::flat_hash_map<RequestId, std::unique_ptr<Request>> requests_;
  // Admission order: the back is the newest, preempted first.
  std::vector<Request*> running_;
  // Preempted requests at the front, then fresh ones in arrival order.
  std::deque<Request*> waiting_;
  // kWaitingForKv requests (role decode), reservation order.
  std::vector<Request*> waiting_for_kv_;
  // Requests in kHoldingSpan (role elastic), in requests_ only.
  int num_holding_ = 0;
  int num_pins_ = 0;  // PinCachedPrefix's tables
  // kMastering requests (role elastic), in the order they started; the
  // decode group whose turn is next.
  std::vector<Request*> mastering_;
  size_t mastering_turn_ = 0;
  // The pending step: output_.scheduled[i] is scheduled_[i].
  SchedulerOutput output_;
  std::vector<Request*> scheduled_;
  bool step_pending_ = false;
  int64_t step_ = 0;
  // Requests aborted while their step was pending, freed by UpdateFromOutput.
  std::vector<std::unique_ptr<Request>> aborted_pending_;
  uint64_t next_arrival_seq_ = 0;
  int64_t num_preemptions_ = 0;
};

}  // namespace scheduler
}  // namespace mmserve

#endif  // MMSERVE_SCHEDULER_SCHEDULER_H_
