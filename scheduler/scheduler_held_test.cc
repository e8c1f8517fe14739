// HoldSpan / ReleaseSpan (role elastic): a held span is a request in
// kHoldingSpan, never scheduled, and Abort frees it.
#include <catch2/catch.hpp>
#include <memory>
#include <utility>
#include <vector>

#include "scheduler/scheduler.h"

namespace mmserve {
namespace scheduler {
namespace {

std::unique_ptr<Scheduler> Make(int num_blocks) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 1;
  c.kv.num_blocks = num_blocks;
  c.kv.block_size = 4;
  absl::StatusOr<std::unique_ptr<Scheduler>> s = Scheduler::Create(c);
  REQUIRE(s.ok());
  return std::move(*s);
}

RequestParams Req(uint64_t id, int len) {
  RequestParams p;
  p.id = RequestId{id};
  for (int i = 0; i < len; ++i) p.prompt_token_ids.push_back(static_cast<TokenId>(100 + i));
  p.max_tokens = 2;
  p.eos_token_id = 7;
  return p;
}

TEST_CASE("a held span takes its blocks, is never scheduled and Abort frees it",
          "[scheduler][held]") {
  auto s = Make(8);
  auto blocks = s->HoldSpan(RequestId{1}, 9);
  REQUIRE(blocks.ok());
  CHECK(blocks->size() == 3);
  CHECK(s->kv_cache().num_free_blocks() == 5);
  CHECK(s->num_held_spans() == 1);
  CHECK(s->Find(RequestId{1}) == nullptr);
  REQUIRE(s->CheckInvariants().ok());
  // A request of its own still runs (held spans do not count as sequences).
  REQUIRE(s->AddRequest(Req(2, 5)).ok());
  const SchedulerOutput& out = s->Schedule();
  REQUIRE(out.scheduled.size() == 1);
  CHECK(out.scheduled[0].request->id() == RequestId{2});
  REQUIRE(s->CheckInvariants().ok());
  CHECK(s->Abort(RequestId{1}).ok());
  CHECK(s->num_held_spans() == 0);
  CHECK(s->Abort(RequestId{1}).code() == absl::StatusCode::kNotFound);
  REQUIRE(s->CheckInvariants().ok());
}

TEST_CASE("HoldSpan refuses a live id, a second span, no room and empty spans",
          "[scheduler][held]") {
  auto s = Make(4);
  REQUIRE(s->AddRequest(Req(1, 5)).ok());
  CHECK(s->HoldSpan(RequestId{1}, 4).status().code() == absl::StatusCode::kAlreadyExists);
  REQUIRE(s->HoldSpan(RequestId{2}, 4).ok());
  CHECK(s->HoldSpan(RequestId{2}, 4).status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(s->HoldSpan(RequestId{3}, 13).status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(s->HoldSpan(RequestId{3}, 0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(s->kv_cache().num_free_blocks() == 3);
  CHECK(s->ReleaseSpan(RequestId{2}).ok());
  CHECK(s->ReleaseSpan(RequestId{2}).code() == absl::StatusCode::kNotFound);
  CHECK(s->kv_cache().num_free_blocks() == 4);
  REQUIRE(s->CheckInvariants().ok());
}

TEST_CASE("a held span is a request holding blocks: no other use of its id, nothing to run",
          "[scheduler][held]") {
  auto s = Make(8);
  REQUIRE(s->HoldSpan(RequestId{1}, 4).ok());
  CHECK_FALSE(s->has_unfinished());
  CHECK(s->AddRequest(Req(1, 5)).code() == absl::StatusCode::kAlreadyExists);
  CHECK(s->ReserveRemoteKv(Req(1, 5)).status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(s->CommitRemoteKv(RequestId{1}, 3, nullptr).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(s->Schedule().scheduled.empty());
  REQUIRE(s->UpdateFromOutput({}, nullptr).ok());
  // A request of its own is live beside it; its release leaves the span.
  REQUIRE(s->AddRequest(Req(2, 5)).ok());
  CHECK(s->has_unfinished());
  CHECK(s->ReleaseSpan(RequestId{2}).code() == absl::StatusCode::kNotFound);
  CHECK(s->num_held_spans() == 1);
  REQUIRE(s->CheckInvariants().ok());
  CHECK(s->ReleaseSpan(RequestId{1}).ok());
  CHECK(s->kv_cache().num_free_blocks() == 8);
  REQUIRE(s->CheckInvariants().ok());
}

}  // namespace
}  // namespace scheduler
}  // namespace mmserve
