#include "scheduler/request.h"

#include <catch2/catch.hpp>

namespace mmserve {
namespace scheduler {
namespace {

RequestParams Params(int prompt_len, int max_tokens) {
  RequestParams p;
  p.id = RequestId{1};
  p.prompt_token_ids.assign(prompt_len, 5);
  p.max_tokens = max_tokens;
  return p;
}

TEST_CASE("statuses are ordered by lifecycle and only finished and aborted are terminal",
          "[request]") {
  CHECK(RequestStatus::kWaiting < RequestStatus::kWaitingForKv);
  CHECK(RequestStatus::kWaitingForKv < RequestStatus::kRunning);
  CHECK(RequestStatus::kRunning < RequestStatus::kPreempted);
  CHECK(RequestStatus::kPreempted < RequestStatus::kFinished);
  CHECK_FALSE(IsFinished(RequestStatus::kWaitingForKv));
  CHECK_FALSE(IsFinished(RequestStatus::kWaiting));
  CHECK_FALSE(IsFinished(RequestStatus::kRunning));
  CHECK_FALSE(IsFinished(RequestStatus::kPreempted));
  CHECK(IsFinished(RequestStatus::kFinished));
  CHECK(IsFinished(RequestStatus::kAborted));
  CHECK(std::string(RequestStatusName(RequestStatus::kPreempted)) == "preempted");
  CHECK(std::string(FinishReasonName(FinishReason::kLength)) == "length");
  CHECK(std::string(FinishReasonName(FinishReason::kHandoff)) == "handoff");
}

TEST_CASE("a new request starts waiting, with or without images", "[request]") {
  RequestParams p = Params(8, 4);
  p.mm_spans = {{2, 4, HashBytes("img")}};
  Request r(std::move(p), 0);
  CHECK(r.status() == RequestStatus::kWaiting);
  Request text_only(Params(8, 4), 1);
  CHECK(text_only.status() == RequestStatus::kWaiting);
}

TEST_CASE("output tokens follow the prompt and max_tokens ends with reason length", "[request]") {
  Request r(Params(3, 2), 0);
  CHECK(r.num_total_tokens() == 3);
  CHECK(r.AppendOutputToken(9) == FinishReason::kNone);
  CHECK(r.AppendOutputToken(10) == FinishReason::kLength);
  CHECK(r.num_output_tokens() == 2);
  CHECK(r.prompt_token_ids().size() == 3);
  CHECK(r.output_token_ids()[1] == 10);
  CHECK(r.token_ids().size() == 5);
}

TEST_CASE("eos stops unless ignore_eos, and stop token ids always stop", "[request]") {
  RequestParams p = Params(3, 10);
  p.eos_token_id = 2;
  p.stop_token_ids = {7};
  Request r(p, 0);
  CHECK(r.AppendOutputToken(2) == FinishReason::kStop);
  p.ignore_eos = true;
  Request ignoring(p, 1);
  CHECK(ignoring.AppendOutputToken(2) == FinishReason::kNone);
  CHECK(ignoring.AppendOutputToken(7) == FinishReason::kStop);
}

}  // namespace
}  // namespace scheduler
}  // namespace mmserve
