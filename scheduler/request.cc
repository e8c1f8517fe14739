#include "scheduler/request.h"

#include <algorithm>
#include <utility>

namespace mmserve {
namespace scheduler {

const char* RequestStatusName(RequestStatus s) {
  switch (s) {
    case RequestStatus::kWaiting:
      return "waiting";
    case RequestStatus::kRunning:
      return "running";
    case RequestStatus::kMastering:
      return "mastering";
    case RequestStatus::kPreempted:
      return "preempted";
    case RequestStatus::kWaitingForKv:
      return "waiting_for_kv";
    case RequestStatus::kHoldingSpan:
      return "holding_span";
    case RequestStatus::kFinished:
      return "finished";
    case RequestStatus::kAborted:
      return "aborted";
  }
  return "unknown";
}

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kHandoff:
      return "handoff";
  }
  return "unknown";
}

Request::Request(RequestParams params, uint64_t arrival_seq)
    : params_(std::move(params)),
      arrival_seq_(arrival_seq),
      num_prompt_tokens_(static_cast<int>(params_.prompt_token_ids.size())) {
  // The prompt moves into token_ids_ (one copy of it, outputs appended).
  token_ids_ = std::move(params_.prompt_token_ids);
  params_.prompt_token_ids.clear();
  token_ids_.reserve(token_ids_.size() + std::max(params_.max_tokens, 0));
  token_ids_.insert(token_ids_.end(), params_.resumed_output_token_ids.begin(),
                    params_.resumed_output_token_ids.end());
  params_.resumed_output_token_ids.clear();
}

FinishReason Request::AppendOutputToken(TokenId token) {
  token_ids_.push_back(token);
  if (!params_.ignore_eos && token == params_.eos_token_id && token != kvpool::kNoToken) {
    return FinishReason::kStop;
  }
  const std::vector<TokenId>& stops = params_.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) return FinishReason::kStop;
  if (num_output_tokens() >= params_.max_tokens) return FinishReason::kLength;
  return FinishReason::kNone;
}

}  // namespace scheduler
}  // namespace mmserve
