// HoldSpan / ReleaseSpan (role elastic): a held span is a request in
// kHoldingSpan, never scheduled, and Abort frees it. PinCachedPrefix keeps
// a cached prefix from eviction until Unpin.
#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <utility>
#include <vector>

#include "common/hash.h"
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

TEST_CASE("a request that holds its KV when finished keeps its blocks as a span till released",
          "[scheduler][held]") {
  auto s = Make(8);
  RequestParams p = Req(1, 9);
  p.max_tokens = 1;
  p.hold_kv_when_finished = true;
  REQUIRE(s->AddRequest(std::move(p)).ok());
  const SchedulerOutput& out = s->Schedule();
  REQUIRE(out.scheduled.size() == 1);
  std::vector<kvpool::BlockId> blocks;
  for (kvpool::BlockId b : s->kv_cache().block_table(out.scheduled[0].request->block_table())) {
    blocks.push_back(b);
  }
  CHECK(blocks.size() == 3);
  std::vector<std::unique_ptr<Request>> finished;
  REQUIRE(s->UpdateFromOutput({42}, &finished).ok());
  REQUIRE(finished.size() == 1);
  CHECK(finished[0]->finish_reason() == FinishReason::kLength);
  CHECK(s->num_held_spans() == 1);
  CHECK_FALSE(s->has_unfinished());
  CHECK(s->Find(RequestId{1}) == nullptr);
  CHECK(s->kv_cache().num_free_blocks() == 5);
  REQUIRE(s->CheckInvariants().ok());
  // Another request (another prompt: no prefix hit) runs meanwhile and
  // never gets the held blocks.
  RequestParams other = Req(2, 17);
  for (TokenId& t : other.prompt_token_ids) t += 50;
  REQUIRE(s->AddRequest(std::move(other)).ok());
  const SchedulerOutput& next = s->Schedule();
  REQUIRE(next.scheduled.size() == 1);
  for (kvpool::BlockId b : s->kv_cache().block_table(next.scheduled[0].request->block_table())) {
    CHECK(std::find(blocks.begin(), blocks.end(), b) == blocks.end());
  }
  REQUIRE(s->UpdateFromOutput({43}, nullptr).ok());
  REQUIRE(s->ReleaseSpan(RequestId{1}).ok());
  CHECK(s->num_held_spans() == 0);
  CHECK(s->ReleaseSpan(RequestId{1}).code() == absl::StatusCode::kNotFound);
  REQUIRE(s->CheckInvariants().ok());
}

TEST_CASE("a request that would hold its KV frees it when aborted", "[scheduler][held]") {
  auto s = Make(8);
  RequestParams p = Req(1, 9);
  p.max_tokens = 1;
  p.hold_kv_when_finished = true;
  REQUIRE(s->AddRequest(std::move(p)).ok());
  s->Schedule();
  REQUIRE(s->Abort(RequestId{1}).ok());
  REQUIRE(s->UpdateFromOutput({kvpool::kNoToken}, nullptr).ok());
  CHECK(s->num_held_spans() == 0);
  CHECK(s->kv_cache().num_free_blocks() == 8);
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

// The first entry of `out` for request `id`, or null.
const ScheduledRequest* Entry(const SchedulerOutput& out, uint64_t id) {
  for (const ScheduledRequest& e : out.scheduled) {
    if (e.request->id() == RequestId{id}) return &e;
  }
  return nullptr;
}

TEST_CASE("a mastered span decodes one token a step beside others until its span is full",
          "[scheduler][held]") {
  auto s = Make(8);
  REQUIRE(s->HoldSpan(RequestId{1}, 8).ok());  // tokens [6, 14) of request 1
  RequestParams p = Req(1, 10);
  p.max_tokens = 20;
  REQUIRE(s->StartMastering(RequestId{1}, p, 6, {50}, 7).ok());
  CHECK(s->num_held_spans() == 0);
  CHECK(s->num_mastering() == 1);
  CHECK(s->has_unfinished());
  REQUIRE(s->Find(RequestId{1}) != nullptr);
  CHECK(s->Find(RequestId{1})->status() == RequestStatus::kMastering);
  REQUIRE(s->CheckInvariants().ok());
  REQUIRE(s->AddRequest(Req(2, 5)).ok());
  int decoded = 0;
  for (int step = 0; step < 8; ++step) {
    const SchedulerOutput& out = s->Schedule();
    const ScheduledRequest* e = Entry(out, 1);
    if (e == nullptr) break;
    CHECK(e->num_computed_tokens == 10 + decoded);
    CHECK(e->num_tokens == 1);
    CHECK(e->samples);
    CHECK_FALSE(e->is_prefill);
    std::vector<TokenId> tokens(out.scheduled.size(), 60);
    REQUIRE(s->UpdateFromOutput(tokens, nullptr).ok());
    REQUIRE(s->CheckInvariants().ok());
    ++decoded;
  }
  // Tokens 10..13 are the span's last slots: 4 decodes, then it waits.
  CHECK(decoded == 4);
  CHECK_FALSE(s->HasDecodeSlot(RequestId{1}));
  REQUIRE(s->StopMastering(RequestId{1}).ok());
  CHECK(s->num_held_spans() == 1);
  CHECK(s->Find(RequestId{1}) == nullptr);
  REQUIRE(s->CheckInvariants().ok());
  REQUIRE(s->ReleaseSpan(RequestId{1}).ok());
  CHECK(s->Find(RequestId{2}) == nullptr);  // it ran to max_tokens beside
  CHECK(s->kv_cache().num_free_blocks() == 8);
}

TEST_CASE("a mastered request finishes as a running one does, and groups take turns",
          "[scheduler][held]") {
  auto s = Make(8);
  REQUIRE(s->HoldSpan(RequestId{1}, 8).ok());
  REQUIRE(s->HoldSpan(RequestId{2}, 8).ok());
  REQUIRE(s->HoldSpan(RequestId{3}, 8).ok());
  RequestParams p = Req(1, 4);
  p.max_tokens = 2;
  REQUIRE(s->StartMastering(RequestId{1}, p, 0, {50}, 7).ok());
  p.id = RequestId{2};
  REQUIRE(s->StartMastering(RequestId{2}, p, 0, {50}, 7).ok());
  p.id = RequestId{3};
  REQUIRE(s->StartMastering(RequestId{3}, p, 0, {50}, 9).ok());
  const SchedulerOutput& first = s->Schedule();
  REQUIRE(first.scheduled.size() == 2);  // group 7's two
  CHECK(Entry(first, 3) == nullptr);
  std::vector<std::unique_ptr<Request>> finished;
  REQUIRE(s->UpdateFromOutput({61, 7}, &finished).ok());  // max_tokens 2, eos
  REQUIRE(finished.size() == 2);
  CHECK(finished[0]->finish_reason() == FinishReason::kLength);
  CHECK(finished[1]->finish_reason() == FinishReason::kStop);
  const SchedulerOutput& second = s->Schedule();
  REQUIRE(second.scheduled.size() == 1);
  CHECK(Entry(second, 3) != nullptr);
  REQUIRE(s->Abort(RequestId{3}).ok());
  REQUIRE(s->UpdateFromOutput({62}, &finished).ok());
  CHECK(finished.empty());
  CHECK(s->kv_cache().num_free_blocks() == 8);
  REQUIRE(s->CheckInvariants().ok());
}

TEST_CASE("StartMastering refuses what is no span, no token, an ending token, no slot",
          "[scheduler][held]") {
  auto s = Make(8);
  RequestParams p = Req(1, 10);
  CHECK(s->StartMastering(RequestId{1}, p, 6, {50}, 0).code() == absl::StatusCode::kNotFound);
  REQUIRE(s->HoldSpan(RequestId{1}, 4).ok());
  CHECK(s->StartMastering(RequestId{1}, p, 6, {}, 0).code() == absl::StatusCode::kInvalidArgument);
  CHECK(s->StartMastering(RequestId{1}, p, 6, {7}, 0).code() ==
        absl::StatusCode::kInvalidArgument);  // eos
  CHECK(s->StartMastering(RequestId{1}, p, 2, {50}, 0).code() ==
        absl::StatusCode::kInvalidArgument);  // token 10 is past [2, 6)
  CHECK(s->StartMastering(RequestId{1}, p, 11, {50}, 0).code() ==
        absl::StatusCode::kInvalidArgument);  // its KV would begin past the token
  CHECK(s->num_held_spans() == 1);
  CHECK(s->StopMastering(RequestId{1}).code() == absl::StatusCode::kNotFound);
  REQUIRE(s->CheckInvariants().ok());
}

TEST_CASE("a mastered span grows by blocks as it decodes, and its blocks go at the finish",
          "[scheduler][held]") {
  auto s = Make(6);
  REQUIRE(s->HoldSpan(RequestId{1}, 5).ok());  // tokens [6, 11): 2 blocks of 4
  RequestParams p = Req(1, 10);
  p.max_tokens = 9;  // tokens 10..18 decode: its KV ends at index 17
  REQUIRE(s->StartMastering(RequestId{1}, p, 6, {50}, 7).ok());
  int decoded = 0;
  std::vector<std::unique_ptr<Request>> finished;
  while (finished.empty()) {
    if (!s->HasDecodeSlot(RequestId{1})) {
      // The next window: one more block, as the master reserves it.
      const int kv_end = s->Find(RequestId{1})->num_computed_tokens() + 4;
      absl::StatusOr<std::vector<kvpool::BlockId>> blocks = s->GrowSpan(RequestId{1}, kv_end);
      REQUIRE(blocks.ok());
      CHECK(static_cast<int>(blocks->size()) == (kv_end - 6 + 3) / 4);
      REQUIRE(s->CheckInvariants().ok());
    }
    const SchedulerOutput& out = s->Schedule();
    const ScheduledRequest* e = Entry(out, 1);
    REQUIRE(e != nullptr);
    CHECK(e->num_computed_tokens == 10 + decoded);
    ++decoded;
    REQUIRE(s->UpdateFromOutput({60}, &finished).ok());
    REQUIRE(s->CheckInvariants().ok());
  }
  // max_tokens 9: the first came with StartMastering, 8 decoded here, past
  // the 2 blocks it started with (slots for tokens 6..13).
  CHECK(decoded == 8);
  REQUIRE(finished.size() == 1);
  CHECK(finished[0]->finish_reason() == FinishReason::kLength);
  CHECK(finished[0]->num_output_tokens() == 9);
  CHECK(s->kv_cache().num_free_blocks() == 6);
  REQUIRE(s->CheckInvariants().ok());
}

TEST_CASE("GrowSpan refuses what is not mastered, an empty pool (nothing changes), no tokens",
          "[scheduler][held]") {
  auto s = Make(4);
  CHECK(s->GrowSpan(RequestId{1}, 8).status().code() == absl::StatusCode::kNotFound);
  REQUIRE(s->HoldSpan(RequestId{1}, 4).ok());
  CHECK(s->GrowSpan(RequestId{1}, 8).status().code() == absl::StatusCode::kNotFound);  // held only
  REQUIRE(s->HoldSpan(RequestId{2}, 12).ok());  // the pool's last 3 blocks
  RequestParams p = Req(1, 3);
  p.max_tokens = 20;
  REQUIRE(s->StartMastering(RequestId{1}, p, 0, {50}, 0).ok());
  absl::StatusOr<std::vector<kvpool::BlockId>> grown = s->GrowSpan(RequestId{1}, 8);
  CHECK(grown.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(s->kv_cache().block_table(s->Find(RequestId{1})->block_table()).size() == 1);
  CHECK(s->GrowSpan(RequestId{1}, 0).status().code() == absl::StatusCode::kInvalidArgument);
  grown = s->GrowSpan(RequestId{1}, 3);  // within its block: nothing to take
  REQUIRE(grown.ok());
  CHECK(grown->size() == 1);
  REQUIRE(s->ReleaseSpan(RequestId{2}).ok());
  grown = s->GrowSpan(RequestId{1}, 8);
  REQUIRE(grown.ok());
  CHECK(grown->size() == 2);
  CHECK(s->kv_cache().num_free_blocks() == 2);
  s->Schedule();
  CHECK(s->GrowSpan(RequestId{1}, 12).status().code() ==
        absl::StatusCode::kFailedPrecondition);  // a step is pending
  REQUIRE(s->UpdateFromOutput({60}, nullptr).ok());
  REQUIRE(s->Abort(RequestId{1}).ok());
  CHECK(s->kv_cache().num_free_blocks() == 4);
  REQUIRE(s->CheckInvariants().ok());
}

// A prompt of 10 tokens whose first 8 are a picture of `image`.
RequestParams Pictured(uint64_t id, const char* image) {
  RequestParams p = Req(id, 10);
  p.max_tokens = 1;
  p.mm_spans = {{0, 8, HashBytes(image)}};
  return p;
}

TEST_CASE("a pinned cached prefix survives a pool that fills, and Unpin lets it go",
          "[scheduler][held]") {
  auto s = Make(8);  // blocks of 4 tokens
  REQUIRE(s->AddRequest(Pictured(1, "cat.png")).ok());
  REQUIRE(s->Schedule().scheduled.size() == 1);
  std::vector<std::unique_ptr<Request>> finished;
  REQUIRE(s->UpdateFromOutput({42}, &finished).ok());
  REQUIRE(finished.size() == 1);  // its two full blocks stay cached
  // Not cached that far, or another picture: nothing is pinned.
  CHECK(s->PinCachedPrefix(Pictured(2, "cat.png"), 9).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(s->PinCachedPrefix(Pictured(2, "dog.png"), 8).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(s->kv_cache().num_free_blocks() == 8);
  absl::StatusOr<kvpool::BlockTableId> pin = s->PinCachedPrefix(Pictured(2, "cat.png"), 8);
  REQUIRE(pin.ok());
  CHECK(s->kv_cache().num_free_blocks() == 6);
  REQUIRE(s->CheckInvariants().ok());
  // The rest of the pool can be taken, not the pinned blocks.
  CHECK(s->HoldSpan(RequestId{9}, 7 * 4).status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(s->HoldSpan(RequestId{9}, 6 * 4).ok());
  REQUIRE(s->ReleaseSpan(RequestId{9}).ok());
  // The pinned request finds its 8 tokens cached and computes the rest.
  REQUIRE(s->AddRequest(Pictured(2, "cat.png")).ok());
  const SchedulerOutput& out = s->Schedule();
  REQUIRE(out.scheduled.size() == 1);
  CHECK(out.scheduled[0].request->num_cached_tokens() == 8);
  REQUIRE(s->UpdateFromOutput({42}, &finished).ok());
  s->Unpin(*pin);
  CHECK(s->kv_cache().num_free_blocks() == 8);
  REQUIRE(s->CheckInvariants().ok());
  // Unpinned, the blocks may go: a span of the whole pool takes them.
  REQUIRE(s->HoldSpan(RequestId{9}, 8 * 4).ok());
  REQUIRE(s->ReleaseSpan(RequestId{9}).ok());
  CHECK(s->PinCachedPrefix(Pictured(3, "cat.png"), 8).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace scheduler
}  // namespace mmserve
