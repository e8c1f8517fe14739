// ReserveRemoteKv / CommitRemoteKv (role decode).
#include <catch2/catch.hpp>
#include <memory>
#include <utility>
#include <vector>

#include "scheduler/scheduler.h"

namespace mmserve {
namespace scheduler {
namespace {

constexpr int kBlockSize = 4;

std::unique_ptr<Scheduler> Make(int max_seqs, int num_blocks) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = max_seqs;
  c.kv.num_blocks = num_blocks;
  c.kv.block_size = kBlockSize;
  absl::StatusOr<std::unique_ptr<Scheduler>> s = Scheduler::Create(c);
  REQUIRE(s.ok());
  return std::move(*s);
}

RequestParams Req(uint64_t id, int len, int max_tokens, int base = -1) {
  RequestParams p;
  p.id = RequestId{id};
  const int b = base < 0 ? static_cast<int>(id) * 1000 : base;
  for (int i = 0; i < len; ++i) p.prompt_token_ids.push_back(static_cast<TokenId>(b + i));
  p.max_tokens = max_tokens;
  p.eos_token_id = 7;
  return p;
}

TEST_CASE("a reserved request is never scheduled, then decodes from its first token after commit",
          "[scheduler][remote_kv]") {
  auto s = Make(4, 16);
  auto r = s->ReserveRemoteKv(Req(1, 6, 3));
  REQUIRE(r.ok());
  CHECK(r->blocks.size() == 2);  // 6 tokens in blocks of 4
  CHECK(r->num_cached_tokens == 0);
  CHECK(s->num_waiting_for_kv() == 1);
  CHECK(s->Find(RequestId{1})->status() == RequestStatus::kWaitingForKv);
  REQUIRE(s->CheckInvariants().ok());
  // Nothing to run while the KV is in flight.
  const SchedulerOutput& empty = s->Schedule();
  CHECK(empty.scheduled.empty());
  REQUIRE(s->UpdateFromOutput({}, nullptr).ok());

  std::vector<std::unique_ptr<Request>> finished;
  REQUIRE(s->CommitRemoteKv(RequestId{1}, 11, &finished).ok());
  CHECK(finished.empty());
  REQUIRE(s->CheckInvariants().ok());
  const Request* req = s->Find(RequestId{1});
  REQUIRE(req != nullptr);
  CHECK(req->status() == RequestStatus::kRunning);
  CHECK(req->num_computed_tokens() == 6);
  // The committed blocks are the request's table.
  auto table = s->kv_cache().block_table(req->block_table());
  CHECK(std::vector<kvpool::BlockId>(table.begin(), table.end()) == r->blocks);

  // Step 1 computes the first token's KV and samples the second.
  const SchedulerOutput& out = s->Schedule();
  REQUIRE(out.scheduled.size() == 1);
  CHECK(out.scheduled[0].num_tokens == 1);
  CHECK(out.scheduled[0].samples);
  CHECK(out.num_prefill_tokens == 0);
  REQUIRE(s->UpdateFromOutput(std::vector<TokenId>{12}, &finished).ok());
  s->Schedule();
  REQUIRE(s->UpdateFromOutput(std::vector<TokenId>{13}, &finished).ok());
  REQUIRE(finished.size() == 1);
  CHECK(finished[0]->finish_reason() == FinishReason::kLength);
  auto out_ids = finished[0]->output_token_ids();
  CHECK(std::vector<TokenId>(out_ids.begin(), out_ids.end()) == std::vector<TokenId>{11, 12, 13});
  CHECK(s->kv_cache().stats().num_used_blocks == 0);
  REQUIRE(s->CheckInvariants().ok());
}

TEST_CASE("a first token that finishes the request frees its blocks at commit",
          "[scheduler][remote_kv]") {
  auto s = Make(4, 16);
  REQUIRE(s->ReserveRemoteKv(Req(1, 5, 8)).ok());
  REQUIRE(s->ReserveRemoteKv(Req(2, 5, 1)).ok());
  std::vector<std::unique_ptr<Request>> finished;
  REQUIRE(s->CommitRemoteKv(RequestId{1}, 7, &finished).ok());  // eos
  REQUIRE(finished.size() == 1);
  CHECK(finished[0]->finish_reason() == FinishReason::kStop);
  REQUIRE(s->CommitRemoteKv(RequestId{2}, 3, &finished).ok());  // max_tokens 1
  REQUIRE(finished.size() == 1);
  CHECK(finished[0]->finish_reason() == FinishReason::kLength);
  CHECK_FALSE(s->has_unfinished());
  CHECK(s->kv_cache().stats().num_used_blocks == 0);
  REQUIRE(s->CheckInvariants().ok());
}

TEST_CASE("reservations are refused when full and bad commits change nothing",
          "[scheduler][remote_kv]") {
  auto s = Make(2, 4);  // 16 tokens of KV, two sequences
  REQUIRE(s->ReserveRemoteKv(Req(1, 8, 2)).ok());
  CHECK(s->ReserveRemoteKv(Req(2, 12, 1)).status().code() ==
        absl::StatusCode::kResourceExhausted);  // 3 blocks, 2 free
  CHECK(s->ReserveRemoteKv(Req(1, 4, 1)).status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(s->ReserveRemoteKv(Req(3, 0, 1)).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(s->ReserveRemoteKv(Req(4, 4, 1)).ok());
  CHECK(s->ReserveRemoteKv(Req(5, 1, 1)).status().code() ==
        absl::StatusCode::kResourceExhausted);  // max_num_seqs
  // A waiting local request is not admitted past max_num_seqs either.
  REQUIRE(s->AddRequest(Req(6, 1, 1)).ok());
  CHECK(s->Schedule().scheduled.empty());
  REQUIRE(s->UpdateFromOutput({}, nullptr).ok());

  CHECK(s->CommitRemoteKv(RequestId{9}, 1, nullptr).code() == absl::StatusCode::kNotFound);
  CHECK(s->CommitRemoteKv(RequestId{6}, 1, nullptr).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(s->CommitRemoteKv(RequestId{1}, -1, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(s->Find(RequestId{1})->status() == RequestStatus::kWaitingForKv);
  REQUIRE(s->CheckInvariants().ok());

  // Abort of a reservation (the prefill side died; the deadline passed)
  // frees its blocks; a second abort is NotFound, not a double free.
  REQUIRE(s->Abort(RequestId{1}).ok());
  CHECK(s->Abort(RequestId{1}).code() == absl::StatusCode::kNotFound);
  REQUIRE(s->Abort(RequestId{4}).ok());
  REQUIRE(s->Abort(RequestId{6}).ok());
  CHECK(s->kv_cache().stats().num_used_blocks == 0);
  CHECK(s->kv_cache().num_tables() == 0);
  REQUIRE(s->CheckInvariants().ok());
}

TEST_CASE("a decode-side prefix hit leaves the shared blocks out of the reservation",
          "[scheduler][remote_kv]") {
  auto s = Make(4, 16);
  // 9-token prompts sharing their first 8 tokens.
  auto first = s->ReserveRemoteKv(Req(1, 9, 4, /*base=*/100));
  REQUIRE(first.ok());
  CHECK(first->blocks.size() == 3);
  REQUIRE(s->CommitRemoteKv(RequestId{1}, 1, nullptr).ok());  // caches 2 full blocks
  auto second = s->ReserveRemoteKv(Req(2, 9, 4, /*base=*/100));
  REQUIRE(second.ok());
  CHECK(second->num_cached_tokens == 8);
  REQUIRE(second->blocks.size() == 1);
  CHECK(second->blocks[0] != first->blocks[2]);
  auto table = s->kv_cache().block_table(s->Find(RequestId{2})->block_table());
  CHECK(table[0] == first->blocks[0]);
  CHECK(table[1] == first->blocks[1]);
  REQUIRE(s->CheckInvariants().ok());
}

}  // namespace
}  // namespace scheduler
}  // namespace mmserve
