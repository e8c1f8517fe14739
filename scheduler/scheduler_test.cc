#include "scheduler/scheduler.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <utility>
#include <vector>

namespace mmserve {
namespace scheduler {
namespace {

constexpr int kBlockSize = 4;

SchedulerConfig Config(int budget, int max_seqs, int num_blocks, bool chunked) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.enable_chunked_prefill = chunked;
  c.kv.num_blocks = num_blocks;
  c.kv.block_size = kBlockSize;
  return c;
}

std::unique_ptr<Scheduler> Make(const SchedulerConfig& c) {
  absl::StatusOr<std::unique_ptr<Scheduler>> s = Scheduler::Create(c);
  REQUIRE(s.ok());
  return std::move(*s);
}

// A prompt of `len` tokens unique to `id` (no accidental prefix hits).
RequestParams Req(uint64_t id, int len, int max_tokens) {
  RequestParams p;
  p.id = RequestId{id};
  for (int i = 0; i < len; ++i) p.prompt_token_ids.push_back(static_cast<TokenId>(id * 1000 + i));
  p.max_tokens = max_tokens;
  return p;
}

// One step's decisions, copied out of the SchedulerOutput.
struct Step {
  std::vector<std::pair<uint64_t, int>> scheduled;  // id, num_tokens
  std::vector<uint64_t> preempted;
  int num_tokens = 0;
  int num_prefill_tokens = 0;
  bool lone_oversize = false;
  std::vector<std::unique_ptr<Request>> finished;
};

// Schedules one step and answers it with `token` for every entry.
Step RunStep(Scheduler& s, TokenId token = 1) {
  const SchedulerOutput& out = s.Schedule();
  Step step;
  for (const ScheduledRequest& e : out.scheduled) {
    step.scheduled.emplace_back(e.request->id().value, e.num_tokens);
  }
  for (RequestId id : out.preempted) step.preempted.push_back(id.value);
  step.num_tokens = out.num_batched_tokens;
  step.num_prefill_tokens = out.num_prefill_tokens;
  step.lone_oversize = out.lone_oversize_prefill;
  std::vector<TokenId> sampled(out.scheduled.size(), token);
  REQUIRE(s.UpdateFromOutput(sampled, &step.finished).ok());
  REQUIRE(s.CheckInvariants().ok());
  return step;
}

using Entries = std::vector<std::pair<uint64_t, int>>;

TEST_CASE("invalid configs and requests are rejected with a status", "[scheduler]") {
  CHECK(Scheduler::Create(Config(0, 4, 16, true)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  SchedulerConfig bad_prefill = Config(16, 4, 16, true);
  bad_prefill.max_prefill_tokens = 0;
  CHECK_FALSE(Scheduler::Create(bad_prefill).ok());

  auto s = Make(Config(16, 4, 4, true));  // 4 blocks = 16 tokens of KV
  REQUIRE(s->AddRequest(Req(1, 4, 2)).ok());
  CHECK(s->AddRequest(Req(1, 4, 2)).code() == absl::StatusCode::kAlreadyExists);
  CHECK(s->AddRequest(Req(2, 0, 2)).code() == absl::StatusCode::kInvalidArgument);
  CHECK(s->AddRequest(Req(3, 4, 0)).code() == absl::StatusCode::kInvalidArgument);
  RequestParams negative = Req(4, 4, 2);
  negative.prompt_token_ids[1] = -3;
  CHECK(s->AddRequest(negative).code() == absl::StatusCode::kInvalidArgument);
  RequestParams bad_span = Req(5, 4, 2);
  bad_span.mm_spans = {{2, 5, HashBytes("img")}};  // runs past the prompt
  CHECK(s->AddRequest(bad_span).code() == absl::StatusCode::kInvalidArgument);
  // 10 + 8 - 1 = 17 tokens of KV > 16: could never run.
  CHECK(s->AddRequest(Req(6, 10, 8)).code() == absl::StatusCode::kResourceExhausted);
  CHECK(s->AddRequest(Req(7, 10, 7)).ok());  // exactly 16
  CHECK(s->num_waiting() == 2);
  CHECK(s->CheckInvariants().ok());
}

TEST_CASE("a request prefills, decodes one token per step and finishes at max_tokens",
          "[scheduler]") {
  auto s = Make(Config(64, 4, 16, true));
  REQUIRE(s->AddRequest(Req(1, 6, 3)).ok());
  Step s1 = RunStep(*s, 11);
  CHECK(s1.scheduled == Entries{{1, 6}});
  CHECK(s1.num_prefill_tokens == 6);
  CHECK(s->Find(RequestId{1})->status() == RequestStatus::kRunning);
  Step s2 = RunStep(*s, 12);
  CHECK(s2.scheduled == Entries{{1, 1}});
  CHECK(s2.num_prefill_tokens == 0);
  Step s3 = RunStep(*s, 13);
  REQUIRE(s3.finished.size() == 1);
  const Request& done = *s3.finished[0];
  CHECK(done.status() == RequestStatus::kFinished);
  CHECK(done.finish_reason() == FinishReason::kLength);
  CHECK(std::vector<TokenId>(done.output_token_ids().begin(), done.output_token_ids().end()) ==
        std::vector<TokenId>{11, 12, 13});
  CHECK_FALSE(s->has_unfinished());
  CHECK(s->kv_cache().stats().num_used_blocks == 0);
}

TEST_CASE("a stop token id or eos finishes a request with reason stop", "[scheduler]") {
  auto s = Make(Config(64, 4, 16, true));
  RequestParams a = Req(1, 4, 10);
  a.stop_token_ids = {42};
  RequestParams b = Req(2, 4, 10);
  b.eos_token_id = 42;
  RequestParams c = Req(3, 4, 2);
  c.eos_token_id = 42;
  c.ignore_eos = true;
  REQUIRE(s->AddRequest(a).ok());
  REQUIRE(s->AddRequest(b).ok());
  REQUIRE(s->AddRequest(c).ok());
  Step step = RunStep(*s, 42);
  REQUIRE(step.finished.size() == 2);
  CHECK(step.finished[0]->finish_reason() == FinishReason::kStop);
  CHECK(step.finished[1]->finish_reason() == FinishReason::kStop);
  CHECK(s->Find(RequestId{3})->status() == RequestStatus::kRunning);
  Step next = RunStep(*s, 42);
  REQUIRE(next.finished.size() == 1);
  CHECK(next.finished[0]->finish_reason() == FinishReason::kLength);
}

TEST_CASE("running decodes are served first and a long prompt is chunked into the rest",
          "[scheduler]") {
  auto s = Make(Config(8, 8, 64, true));
  REQUIRE(s->AddRequest(Req(1, 3, 20)).ok());
  REQUIRE(s->AddRequest(Req(2, 3, 20)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 3}, {2, 3}});
  REQUIRE(s->AddRequest(Req(3, 13, 5)).ok());
  // Two decodes, then 6 of the 13 prompt tokens.
  const SchedulerOutput& out = s->Schedule();
  REQUIRE(out.scheduled.size() == 3);
  CHECK_FALSE(out.scheduled[0].is_prefill);
  CHECK(out.scheduled[2].is_prefill);
  CHECK(out.scheduled[2].num_tokens == 6);
  CHECK_FALSE(out.scheduled[2].samples);  // a middle chunk samples nothing
  CHECK(out.num_batched_tokens == 8);
  std::vector<TokenId> sampled = {1, 1, kvpool::kNoToken};
  REQUIRE(s->UpdateFromOutput(sampled, nullptr).ok());
  CHECK(s->Find(RequestId{3})->num_computed_tokens() == 6);
  CHECK(s->Find(RequestId{3})->num_output_tokens() == 0);
  // The chunked prefill continues as a running request.
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}, {2, 1}, {3, 6}});
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}, {2, 1}, {3, 1}});
  CHECK(s->Find(RequestId{3})->num_output_tokens() == 1);
}

TEST_CASE("max_num_seqs caps the running requests", "[scheduler]") {
  auto s = Make(Config(64, 2, 64, true));
  for (uint64_t id = 1; id <= 3; ++id) REQUIRE(s->AddRequest(Req(id, 2, 5)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 2}, {2, 2}});
  CHECK(s->num_running() == 2);
  CHECK(s->num_waiting() == 1);
}

TEST_CASE("admission is FIFO: it stops at the first request that does not fit the budget",
          "[scheduler]") {
  auto s = Make(Config(10, 8, 64, /*chunked=*/false));
  REQUIRE(s->AddRequest(Req(1, 6, 5)).ok());
  REQUIRE(s->AddRequest(Req(2, 8, 5)).ok());
  REQUIRE(s->AddRequest(Req(3, 2, 5)).ok());  // would fit, but must not overtake 2
  CHECK(RunStep(*s).scheduled == Entries{{1, 6}});
  // Next step: 1 decode + 8 for request 2 = 9; request 3 (2 tokens) does not fit.
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}, {2, 8}});
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}, {2, 1}, {3, 2}});
}

TEST_CASE("the prefill token budget caps prefill per step while decodes continue", "[scheduler]") {
  SchedulerConfig c = Config(64, 8, 64, /*chunked=*/false);
  c.max_prefill_tokens = 6;
  auto s = Make(c);
  REQUIRE(s->AddRequest(Req(1, 2, 10)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 2}});
  REQUIRE(s->AddRequest(Req(2, 4, 5)).ok());
  REQUIRE(s->AddRequest(Req(3, 4, 5)).ok());
  REQUIRE(s->AddRequest(Req(4, 1, 5)).ok());  // fits, but keeps order behind 3
  Step step = RunStep(*s);
  CHECK(step.scheduled == Entries{{1, 1}, {2, 4}});
  CHECK(step.num_prefill_tokens == 4);
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}, {2, 1}, {3, 4}, {4, 1}});
}

TEST_CASE("with chunking on, the prefill budget splits prompts into chunks", "[scheduler]") {
  SchedulerConfig c = Config(64, 8, 64, /*chunked=*/true);
  c.max_prefill_tokens = 5;
  auto s = Make(c);
  REQUIRE(s->AddRequest(Req(1, 12, 2)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 5}});
  CHECK(RunStep(*s).scheduled == Entries{{1, 5}});
  CHECK(RunStep(*s).scheduled == Entries{{1, 2}});
  CHECK(s->Find(RequestId{1})->num_output_tokens() == 1);
}

TEST_CASE("a lone prompt larger than the budget is admitted alone when chunking is off",
          "[scheduler]") {
  auto s = Make(Config(8, 8, 64, /*chunked=*/false));
  REQUIRE(s->AddRequest(Req(1, 20, 2)).ok());
  REQUIRE(s->AddRequest(Req(2, 2, 2)).ok());
  Step step = RunStep(*s);
  CHECK(step.scheduled == Entries{{1, 20}});
  CHECK(step.lone_oversize);
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}, {2, 2}});
}

TEST_CASE("an oversize prompt waits while anything else is scheduled when chunking is off",
          "[scheduler]") {
  auto s = Make(Config(8, 8, 64, /*chunked=*/false));
  REQUIRE(s->AddRequest(Req(1, 2, 2)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 2}});
  REQUIRE(s->AddRequest(Req(2, 20, 2)).ok());
  REQUIRE(s->AddRequest(Req(3, 1, 2)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}});  // 2 waits, 3 stays behind it
  CHECK(s->num_waiting() == 2);
  Step alone = RunStep(*s);  // request 1 finished: the step is empty but for 2
  CHECK(alone.scheduled == Entries{{2, 20}});
  CHECK(alone.lone_oversize);
}

TEST_CASE(
    "a prompt larger than the prefill budget is the step's only prefill when chunking "
    "is off",
    "[scheduler]") {
  SchedulerConfig c = Config(64, 8, 64, /*chunked=*/false);
  c.max_prefill_tokens = 4;
  auto s = Make(c);
  REQUIRE(s->AddRequest(Req(1, 2, 10)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 2}});
  REQUIRE(s->AddRequest(Req(2, 10, 2)).ok());
  REQUIRE(s->AddRequest(Req(3, 1, 2)).ok());
  Step step = RunStep(*s);
  CHECK(step.scheduled == Entries{{1, 1}, {2, 10}});  // decode goes on beside it
  CHECK(step.lone_oversize);
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}, {2, 1}, {3, 1}});
}

TEST_CASE("when the pool runs out the newest running request is preempted and readmitted first",
          "[scheduler]") {
  // 6 blocks of 4 tokens. Three requests of 8 tokens take 2 blocks each.
  auto s = Make(Config(64, 8, 6, true));
  for (uint64_t id = 1; id <= 3; ++id) REQUIRE(s->AddRequest(Req(id, 8, 6)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 8}, {2, 8}, {3, 8}});
  REQUIRE(s->AddRequest(Req(4, 1, 3)).ok());
  // Position 8 needs a third block for request 1: request 3 is preempted.
  Step step = RunStep(*s);
  CHECK(step.preempted == std::vector<uint64_t>{3});
  CHECK(step.scheduled == Entries{{1, 1}, {2, 1}});  // no admission after a preemption
  const Request* r3 = s->Find(RequestId{3});
  CHECK(r3->status() == RequestStatus::kPreempted);
  CHECK(r3->num_computed_tokens() == 0);
  CHECK(r3->num_output_tokens() == 1);
  CHECK(s->num_preemptions() == 1);
  // Request 3 is ahead of the newer request 4 in the queue, and recomputes
  // its prompt and its output token (less whatever is still cached).
  while (s->Find(RequestId{3})->status() != RequestStatus::kRunning) {
    Step next = RunStep(*s);
    int pos3 = -1, pos4 = -1;
    for (int i = 0; i < static_cast<int>(next.scheduled.size()); ++i) {
      if (next.scheduled[i].first == 3) {
        pos3 = i;
        CHECK(next.scheduled[i].second + s->Find(RequestId{3})->num_cached_tokens() == 9);
      }
      if (next.scheduled[i].first == 4) pos4 = i;
    }
    if (pos4 >= 0) CHECK((pos3 >= 0 && pos3 < pos4));
  }
}

TEST_CASE("a request that is itself the newest preempts itself and the step goes on",
          "[scheduler]") {
  // 4 blocks: request 1 takes 2, request 2 takes 1.
  auto s = Make(Config(64, 8, 4, true));
  REQUIRE(s->AddRequest(Req(1, 8, 5)).ok());
  REQUIRE(s->AddRequest(Req(2, 3, 10)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 8}, {2, 3}});
  // Request 2 is at 4 tokens (fits its block); request 1 needs a 3rd block.
  Step step = RunStep(*s);
  CHECK(step.scheduled == Entries{{1, 1}, {2, 1}});
  // Now request 2 needs a second block while request 1 holds 3: 2 is the
  // newest and preempts itself.
  Step self = RunStep(*s);
  CHECK(self.preempted == std::vector<uint64_t>{2});
  CHECK(self.scheduled == Entries{{1, 1}});
}

RequestParams Prio(uint64_t id, int len, int max_tokens, int priority) {
  RequestParams p = Req(id, len, max_tokens);
  p.priority = priority;
  return p;
}

TEST_CASE("a full batch admits waiting requests by priority, lower first, FIFO within one",
          "[scheduler][priority]") {
  auto s = Make(Config(64, 2, 64, true));
  REQUIRE(s->AddRequest(Prio(1, 2, 3, 5)).ok());
  REQUIRE(s->AddRequest(Prio(2, 2, 3, 5)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 2}, {2, 2}});  // the batch is full
  REQUIRE(s->AddRequest(Prio(3, 2, 3, 5)).ok());
  REQUIRE(s->AddRequest(Prio(4, 2, 3, 0)).ok());
  REQUIRE(s->AddRequest(Prio(5, 2, 3, -1)).ok());
  REQUIRE(s->AddRequest(Prio(6, 2, 3, 0)).ok());
  // Requests 1 and 2 finish after 3 tokens; their places go to 5 (priority
  // -1), then 4 and 6 (priority 0, in arrival order), then 3.
  std::vector<uint64_t> admitted;
  for (int i = 0; i < 20 && s->has_unfinished(); ++i) {
    for (const auto& [id, n] : RunStep(*s).scheduled) {
      if (id > 2 && n == 2) admitted.push_back(id);
    }
  }
  CHECK(admitted == std::vector<uint64_t>{5, 4, 6, 3});
}

TEST_CASE("equal priorities keep FIFO admission, whatever the priority", "[scheduler][priority]") {
  auto s = Make(Config(10, 8, 64, /*chunked=*/false));
  REQUIRE(s->AddRequest(Prio(1, 6, 5, 3)).ok());
  REQUIRE(s->AddRequest(Prio(2, 8, 5, 3)).ok());
  REQUIRE(s->AddRequest(Prio(3, 2, 5, 3)).ok());  // would fit, but must not overtake 2
  CHECK(RunStep(*s).scheduled == Entries{{1, 6}});
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}, {2, 8}});
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}, {2, 1}, {3, 2}});
}

TEST_CASE("aging bounds the wait: a low priority request ranks with the best after its steps",
          "[scheduler][priority]") {
  SchedulerConfig c = Config(64, 1, 64, true);
  c.priority_aging_steps = 4;
  auto s = Make(c);
  // One long request holds the only place; a priority-2 request waits while
  // priority-0 requests keep arriving, one per step.
  REQUIRE(s->AddRequest(Prio(1, 2, 3, 0)).ok());
  REQUIRE(s->AddRequest(Prio(2, 2, 3, 2)).ok());
  uint64_t next_id = 3;
  std::vector<uint64_t> admitted;
  for (int step = 0; step < 40 && admitted.size() < 6; ++step) {
    REQUIRE(s->AddRequest(Prio(next_id++, 2, 3, 0)).ok());
    for (const auto& [id, n] : RunStep(*s).scheduled) {
      if (n == 2) admitted.push_back(id);
    }
  }
  // Without aging request 2 would never run: a priority-0 request always
  // waits. Each request holds the place 3 steps (1 from steps 1-3, 3 from
  // 4-6, 4 from 7-9). At steps 4 and 7 request 2 has waited less than
  // (2 - 0) * 4 = 8 steps; at step 10 it ranks with the priority-0 class,
  // where it arrived first: it goes before every later arrival.
  CHECK(admitted == std::vector<uint64_t>{1, 3, 4, 2, 5, 6});
}

TEST_CASE("the pool runs out: the worst priority running request is preempted, not the newest",
          "[scheduler][priority]") {
  // 6 blocks of 4 tokens; a 7-token prompt and its first output fit 2.
  auto s = Make(Config(64, 8, 6, true));
  REQUIRE(s->AddRequest(Prio(1, 7, 6, 0)).ok());
  REQUIRE(s->AddRequest(Prio(2, 7, 6, 9)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 7}, {2, 7}});
  REQUIRE(s->AddRequest(Prio(3, 7, 6, 0)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}, {2, 1}, {3, 7}});
  // Position 8 needs a third block for request 1: request 2 (priority 9)
  // goes, though request 3 is newer.
  Step step = RunStep(*s);
  CHECK(step.preempted == std::vector<uint64_t>{2});
  CHECK(step.scheduled == Entries{{1, 1}, {3, 1}});
  CHECK(s->Find(RequestId{2})->status() == RequestStatus::kPreempted);
}

TEST_CASE("priority_aging_steps must be positive", "[scheduler][priority]") {
  SchedulerConfig c = Config(64, 2, 64, true);
  c.priority_aging_steps = 0;
  CHECK(Scheduler::Create(c).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("abort in any state frees everything the request holds", "[scheduler]") {
  // 5 blocks of 4 tokens.
  auto s = Make(Config(16, 8, 5, true));
  REQUIRE(s->AddRequest(Req(1, 8, 8)).ok());
  REQUIRE(s->AddRequest(Req(2, 7, 8)).ok());
  CHECK(RunStep(*s).scheduled == Entries{{1, 8}, {2, 7}});  // 4 blocks used
  RequestParams img = Req(3, 4, 2);
  img.mm_spans = {{0, 4, HashBytes("img")}};
  REQUIRE(s->AddRequest(img).ok());
  REQUIRE(s->AddRequest(Req(4, 4, 2)).ok());
  // Request 1 takes the last block; 3 and 4 cannot get one and wait.
  CHECK(RunStep(*s).scheduled == Entries{{1, 1}, {2, 1}});
  // Request 2 needs a third block: it is the newest and preempts itself.
  Step step = RunStep(*s);
  CHECK(step.preempted == std::vector<uint64_t>{2});
  CHECK(s->Find(RequestId{2})->status() == RequestStatus::kPreempted);
  CHECK(s->Find(RequestId{3})->status() == RequestStatus::kWaiting);
  REQUIRE(s->AddRequest(Req(5, 4, 2)).ok());

  CHECK(s->Abort(RequestId{2}).ok());  // preempted
  CHECK(s->Abort(RequestId{3}).ok());  // waiting, with an image
  CHECK(s->Abort(RequestId{5}).ok());  // waiting
  CHECK(s->CheckInvariants().ok());
  // Abort running requests while their step is pending.
  const SchedulerOutput& out = s->Schedule();
  REQUIRE(out.scheduled.size() == 2);  // 1 decodes, 4 is admitted
  CHECK(s->Abort(RequestId{1}).ok());
  CHECK(s->Abort(RequestId{4}).ok());
  std::vector<std::unique_ptr<Request>> finished;
  REQUIRE(s->UpdateFromOutput(std::vector<TokenId>{1, 1}, &finished).ok());
  CHECK(finished.empty());
  CHECK(s->Abort(RequestId{1}).code() == absl::StatusCode::kNotFound);
  CHECK_FALSE(s->has_unfinished());
  CHECK(s->kv_cache().stats().num_used_blocks == 0);
  CHECK(s->kv_cache().num_tables() == 0);
  CHECK(s->CheckInvariants().ok());
}

TEST_CASE("a prefix cache hit at admission skips the cached full blocks", "[scheduler]") {
  auto s = Make(Config(64, 8, 64, true));
  REQUIRE(s->AddRequest(Req(1, 10, 1)).ok());
  CHECK(RunStep(*s).finished.size() == 1);
  RequestParams same = Req(1, 10, 3);
  same.id = RequestId{2};
  REQUIRE(s->AddRequest(same).ok());
  Step step = RunStep(*s);
  CHECK(step.scheduled == Entries{{2, 2}});  // 8 of 10 tokens were cached
  CHECK(s->Find(RequestId{2})->num_cached_tokens() == 8);
  CHECK(s->kv_cache().stats().prefix_hit_tokens == 8);
  // A prompt that is entirely cached still computes its last token.
  RequestParams exact = Req(1, 8, 3);
  exact.id = RequestId{3};
  REQUIRE(s->AddRequest(exact).ok());
  CHECK(RunStep(*s).scheduled == Entries{{2, 1}, {3, 4}});
}

TEST_CASE("equal placeholder tokens with a different image get no prefix hit", "[scheduler]") {
  auto s = Make(Config(64, 8, 64, true));
  RequestParams cat = Req(1, 10, 1);
  cat.mm_spans = {{0, 8, HashBytes("cat.png")}};
  REQUIRE(s->AddRequest(cat).ok());
  RunStep(*s);
  RequestParams dog = Req(1, 10, 1);
  dog.id = RequestId{2};
  dog.mm_spans = {{0, 8, HashBytes("dog.png")}};
  REQUIRE(s->AddRequest(dog).ok());
  CHECK(RunStep(*s).scheduled == Entries{{2, 10}});
}

TEST_CASE("UpdateFromOutput rejects a mismatched answer and keeps the step pending",
          "[scheduler]") {
  auto s = Make(Config(64, 8, 64, true));
  REQUIRE(s->AddRequest(Req(1, 4, 3)).ok());
  CHECK(s->UpdateFromOutput(std::vector<TokenId>{1}, nullptr).code() ==
        absl::StatusCode::kFailedPrecondition);
  const SchedulerOutput& out = s->Schedule();
  REQUIRE(out.scheduled.size() == 1);
  CHECK(s->UpdateFromOutput(std::vector<TokenId>{1, 2}, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(s->UpdateFromOutput(std::vector<TokenId>{kvpool::kNoToken}, nullptr).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(s->Find(RequestId{1})->num_computed_tokens() == 0);
  CHECK(s->UpdateFromOutput(std::vector<TokenId>{5}, nullptr).ok());
  CHECK(s->Find(RequestId{1})->num_computed_tokens() == 4);
}

}  // namespace
}  // namespace scheduler
}  // namespace mmserve
