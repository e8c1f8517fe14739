// One generation request as the scheduler tracks it: its tokens, how many of
// them have KV computed, its limits, and where it is in its lifecycle.
//
//   RequestParams p;
//   p.id = RequestId{42};
//   p.prompt_token_ids = {151644, 872, 198};
//   p.max_tokens = 128;
//   p.eos_token_id = 151645;
//   ASSERT_OK(scheduler.AddRequest(std::move(p)));
//
// The scheduler owns every Request; others see them as `const Request&`
// (e.g. through SchedulerOutput) and only between scheduler calls.
// Not thread-safe.
#ifndef MMSERVE_SCHEDULER_REQUEST_H_
#define MMSERVE_SCHEDULER_REQUEST_H_

#include <cstdint>
#include <ostream>
#include <vector>

#include "absl/types/span.h"
#include "kvpool/kv_cache_manager.h"
#include "kvpool/kv_types.h"

namespace mmserve {
namespace scheduler {

using kvpool::TokenId;

// Caller-chosen request handle (the service maps its string ids to these).
struct RequestId {
  uint64_t value = 0;

  bool operator==(RequestId o) const { return value == o.value; }
  bool operator!=(RequestId o) const { return value != o.value; }
  template <typename H>
  friend H AbslHashValue(H h, RequestId id) {
    return H::combine(std::move(h), id.value);
  }
  friend std::ostream& operator<<(std::ostream& os, RequestId id) {
    return os << "req#" << id.value;
  }
};

// Lifecycle, in order: not yet admitted, admitted, terminal. Transitions
// (each by the event that causes it; docs/lifecycle.md draws them):
//   (AddRequest) -> kWaiting               queued for admission
//   (ReserveRemoteKv) -> kWaitingForKv     holds blocks another instance
//                                          writes the prompt's KV into
//   (HoldSpan) -> kHoldingSpan             holds a span of a group's KV for
//                                          another instance's decode; never
//                                          scheduled (role elastic)
//   kWaiting, kPreempted -> kRunning       admitted by Schedule (holds KV)
//   kWaitingForKv -> kRunning              CommitRemoteKv (with the first token)
//   kHoldingSpan -> kMastering             StartMastering: decodes on its span
//                                          (its other tokens' KV is elsewhere)
//   kMastering -> kHoldingSpan             StopMastering: the next master
//                                          decodes on; the span stays
//   kRunning -> kPreempted                 KV pool exhausted: KV dropped,
//                                          recomputed when admitted again
//   kRunning, kMastering,                  stop token, eos or max_tokens
//   kWaitingForKv -> kFinished
//                                          (UpdateFromOutput, CommitRemoteKv)
//   any non-terminal -> kAborted           Abort (ReleaseSpan for a span)
// Every status from kFinished on is terminal (IsFinished).
enum class RequestStatus : uint8_t {
  kWaiting = 0,
  kWaitingForKv = 1,
  kHoldingSpan = 2,
  kRunning = 3,
  kMastering = 4,
  kPreempted = 5,
  kFinished = 6,
  kAborted = 7,
};

inline bool IsFinished(RequestStatus s) { return s >= RequestStatus::kFinished; }
const char* RequestStatusName(RequestStatus s);

// Why a request ended: the one finish reason of the scheduler and the
// engine (worker::FinishReason is this type). The scheduler sets kStop,
// kLength and kAbort; the engine adds the ones only it can see.
enum class FinishReason : uint8_t {
  kNone = 0,        // not finished
  kStop = 1,        // sampled a stop token id, or eos unless ignore_eos
  kLength = 2,      // produced max_tokens
  kAbort = 3,       // Abort (a client, a commit deadline, a lost KV hand-off)
  kStopString = 4,  // engine: the text matched a stop string
  kHandoff = 5,     // engine: the prompt's KV and first token go to a decode
                    // engine, which continues the request (KvConnector)
};

const char* FinishReasonName(FinishReason r);

// What a client asks for. Multimodal spans must be sorted by offset, not
// overlap, and lie inside the prompt.
struct RequestParams {
  RequestId id;
  std::vector<TokenId> prompt_token_ids;
  std::vector<kvpool::MultimodalSpan> mm_spans;
  int max_tokens = 16;  // output tokens, >= 1
  std::vector<TokenId> stop_token_ids;
  TokenId eos_token_id = kvpool::kNoToken;
  bool ignore_eos = false;
  // Scheduling priority: lower is admitted first, and preempted last
  // (SchedulerConfig::priority_aging_steps bounds the wait).
  int priority = 0;
  // When it finishes (stop, eos, max_tokens; not on Abort), its blocks and
  // their KV stay held under its id as a span (kHoldingSpan, as HoldSpan's)
  // until ReleaseSpan: a prompt another instance is still reading.
  bool hold_kv_when_finished = false;
  // A request resumed after its instance was lost: the tokens it generated
  // there, fewer than max_tokens. They follow the prompt as its first
  // outputs (counted by max_tokens and the penalties) and are computed with
  // it at admission, as a preempted request's are.
  std::vector<TokenId> resumed_output_token_ids;
};

class Request {
 public:
  Request(RequestParams params, uint64_t arrival_seq);
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  RequestId id() const { return params_.id; }
  // Order of AddRequest calls; admission is FIFO in this order among
  // requests of one effective priority.
  uint64_t arrival_seq() const { return arrival_seq_; }
  int priority() const { return params_.priority; }
  // The scheduler step during which it was added (its wait ages from there).
  int64_t arrival_step() const { return arrival_step_; }
  void set_arrival_step(int64_t step) { arrival_step_ = step; }
  RequestStatus status() const { return status_; }
  FinishReason finish_reason() const { return finish_reason_; }
  // The limits and spans it was added with. Its prompt_token_ids is empty:
  // the prompt moved into token_ids().
  const RequestParams& params() const { return params_; }

  // Prompt then outputs.
  absl::Span<const TokenId> token_ids() const { return token_ids_; }
  absl::Span<const TokenId> prompt_token_ids() const {
    return absl::MakeConstSpan(token_ids_).first(num_prompt_tokens_);
  }
  absl::Span<const TokenId> output_token_ids() const {
    return absl::MakeConstSpan(token_ids_).subspan(num_prompt_tokens_);
  }
  int num_prompt_tokens() const { return num_prompt_tokens_; }
  int num_output_tokens() const { return num_total_tokens() - num_prompt_tokens_; }
  int num_total_tokens() const { return static_cast<int>(token_ids_.size()); }
  // Tokens whose KV exists; catches up to num_total_tokens() step by step.
  int num_computed_tokens() const { return num_computed_tokens_; }
  // Tokens taken from the prefix cache at the last admission.
  int num_cached_tokens() const { return num_cached_tokens_; }
  int num_preemptions() const { return num_preemptions_; }
  kvpool::BlockTableId block_table() const { return block_table_; }
  // Tokens before it have their KV on other instances (kMastering: the
  // group's span holders); the block table holds token kv_offset() + j at
  // its position j. 0 for every other request.
  int kv_offset() const { return kv_offset_; }
  // kHoldingSpan, kMastering: the tokens its span holds (a master decodes
  // while token kv_offset() + span_tokens() - 1 is not computed).
  int span_tokens() const { return span_tokens_; }
  // kMastering: requests of one decode group share their span holders.
  uint64_t decode_group() const { return decode_group_; }
  kvpool::SequenceView sequence() const { return {token_ids_, params_.mm_spans}; }

  // Mutators for the Scheduler, which enforces the transitions above.
  void set_status(RequestStatus s) { status_ = s; }
  void set_block_table(kvpool::BlockTableId t) { block_table_ = t; }
  void set_num_computed_tokens(int n) { num_computed_tokens_ = n; }
  void set_num_cached_tokens(int n) { num_cached_tokens_ = n; }
  void set_kv_offset(int n) { kv_offset_ = n; }
  void set_span_tokens(int n) { span_tokens_ = n; }
  void set_decode_group(uint64_t g) { decode_group_ = g; }
  void CountPreemption() { ++num_preemptions_; }
  void Finish(RequestStatus s, FinishReason r) {
    status_ = s;
    finish_reason_ = r;
  }
  // Appends a sampled token and returns the finish reason it causes (kNone
  // when the request goes on).
  FinishReason AppendOutputToken(TokenId token);

  // The scheduler step that last scheduled this request (-1: never).
  int64_t last_scheduled_step() const { return last_scheduled_step_; }
  void set_last_scheduled_step(int64_t step) { last_scheduled_step_ = step; }

 private:
  RequestParams params_;
  uint64_t arrival_seq_;
  int64_t arrival_step_ = 0;
  std::vector<TokenId> token_ids_;
  int num_prompt_tokens_;
  int num_computed_tokens_ = 0;
  int num_cached_tokens_ = 0;
  int num_preemptions_ = 0;
  int kv_offset_ = 0;
  int span_tokens_ = 0;
  uint64_t decode_group_ = 0;
  int64_t last_scheduled_step_ = -1;
  RequestStatus status_ = RequestStatus::kWaiting;
  FinishReason finish_reason_ = FinishReason::kNone;
  kvpool::BlockTableId block_table_;
};

}  // namespace scheduler
}  // namespace mmserve

#endif  // MMSERVE_SCHEDULER_REQUEST_H_
