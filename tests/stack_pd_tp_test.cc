// Tensor-parallel prefill instances through the whole stack: a
// `--role=prefill --tp=2` instance hands each rank's KV heads to the decode
// rank(s) holding them. With a TP=2 decode instance (rank r -> rank r) and a
// TP=1 one (both prefill ranks into the one decode rank, at their heads'
// offsets, every prompt layer-wise) the token ids and text are role both's,
// for text prompts and prompts with an image; every write copies into the
// decode cache the prefill process maps; nothing leaks. Over UCX tcp (2 ->
// 2) the same tokens, each write by rendezvous, the writes of a hand-off
// waited for together. SIGKILL of the prefill instance's rank 1
// mid-hand-off ends the requests UNAVAILABLE within bounds and the decode
// instance frees their reservations.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "tests/stack_harness.h"

namespace mmserve::testing {
namespace {

using mmserve::v1::GenerateRequest;

constexpr int kText = 12;
constexpr int kImages = 12;

struct Answers {
  std::vector<Answer> text, images;
};

// kText demo questions as text (12 tokens) and kImages with their image
// (16 tokens), EOS ignored, so decode runs past the hand-off.
Answers AskAll(launcher::LocalStack& stack) {
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  AskOptions text;
  text.max_tokens = 12;
  text.ignore_eos = true;
  AskOptions image;
  image.max_tokens = 16;
  image.ignore_eos = true;
  Answers out;
  out.text.resize(kText);
  out.images.resize(kImages);
  ParallelFor(kText, 4, [&](int i) {
    out.text[i] = AskGrpc(*stub, DemoTextRequest(set.items[i], text), text);
  });
  ParallelFor(kImages, 4, [&](int i) {
    out.images[i] = AskGrpc(*stub, DemoRequest(set, set.items[i], image), image);
  });
  return out;
}

void CheckSame(const Answers& want, const Answers& got) {
  for (int i = 0; i < kText; ++i) {
    INFO("question " << i << ": " << want.text[i].status << " / " << got.text[i].status);
    REQUIRE(want.text[i].status.ok());
    REQUIRE(got.text[i].status.ok());
    CHECK(want.text[i].token_ids.size() == 12);
    CHECK(got.text[i].token_ids == want.text[i].token_ids);
    CHECK(got.text[i].text == want.text[i].text);
  }
  for (int i = 0; i < kImages; ++i) {
    INFO("image question " << i << ": " << want.images[i].status << " / " << got.images[i].status);
    REQUIRE(want.images[i].status.ok());
    REQUIRE(got.images[i].status.ok());
    CHECK(want.images[i].token_ids.size() == 16);
    CHECK(got.images[i].token_ids == want.images[i].token_ids);
    CHECK(got.images[i].text == want.images[i].text);
  }
}

launcher::StackOptions TpPrefillOptions(int decode_tp, const char* profile = "shm") {
  launcher::StackOptions o = TestStackOptions(1, profile);
  o.prefill = 1;
  o.decode = 1;
  o.prefill_args = {"--tp=2"};
  if (decode_tp > 1) o.decode_args = {absl::StrCat("--tp=", decode_tp)};
  return o;
}

// Every write of every hand-off (one per prefill rank: 2 -> 2 rank by rank,
// 2 -> 1 both into the one rank) copied into a decode cache the prefill
// process maps: AllocateKv and CommitKv were the only round trips.
void CheckMappedWrites(launcher::LocalStack& stack) {
  const int pp = stack.prefill(0).metrics_port();
  const double handoffs = ScrapeMetric(pp, "mmserve_language_kv_handoff_round_trips_count");
  CHECK(handoffs == kText + kImages);
  const char* total = "mmserve_language_kv_handoff_total";
  CHECK(ScrapeMetric(pp, total, "path=\"mapped\"") == 2 * handoffs);
  CHECK(ScrapeMetric(pp, total, "path=\"rendezvous\"") == 0);
  CHECK(ScrapeMetric(pp, total, "path=\"put\"") == 0);
  CHECK(ScrapeMetric(pp, "mmserve_language_kv_handoff_round_trips_sum") == 2 * handoffs);
}

// Over tcp nothing is mapped: each write (rank r -> decode rank r, whole
// heads) lands by rendezvous, and the two are waited for together, so a
// hand-off waits for three round trips (AllocateKv, the landed replies,
// CommitKv), not one per write.
void CheckTcpWrites(launcher::LocalStack& stack) {
  const int pp = stack.prefill(0).metrics_port();
  const double handoffs = ScrapeMetric(pp, "mmserve_language_kv_handoff_round_trips_count");
  CHECK(handoffs == kText + kImages);
  const char* total = "mmserve_language_kv_handoff_total";
  CHECK(ScrapeMetric(pp, total, "path=\"rendezvous\"") == 2 * handoffs);
  CHECK(ScrapeMetric(pp, total, "path=\"mapped\"") == 0);
  CHECK(ScrapeMetric(pp, "mmserve_language_kv_handoff_round_trips_sum") == 3 * handoffs);
}

TEST_CASE(
    "a TP=2 prefill instance gives role both's token ids into a TP=2 and a TP=1 decode "
    "instance, over shm and tcp, text and image prompts; nothing leaks") {
  Answers want;
  {
    auto both = launcher::LocalStack::Start(TestStackOptions(1, "shm"));
    REQUIRE(both.ok());
    want = AskAll(**both);
  }
  {
    INFO("2 -> 2: rank r writes decode rank r");
    auto stack = launcher::LocalStack::Start(TpPrefillOptions(2));
    INFO(stack.status());
    REQUIRE(stack.ok());
    CheckSame(want, AskAll(**stack));
    CheckMappedWrites(**stack);
    const Leaks l = WaitForNoLeaks(**stack, absl::Seconds(10));
    INFO(l.ToString());
    CHECK(l.zero());
  }
  {
    INFO("2 -> 2 over UCX tcp: each rank's write lands by rendezvous");
    auto stack = launcher::LocalStack::Start(TpPrefillOptions(2, "tcp"));
    INFO(stack.status());
    REQUIRE(stack.ok());
    CheckSame(want, AskAll(**stack));
    CheckTcpWrites(**stack);
    const Leaks l = WaitForNoLeaks(**stack, absl::Seconds(10));
    INFO(l.ToString());
    CHECK(l.zero());
  }
  {
    INFO("2 -> 1: both ranks write the one decode rank, every prompt layer-wise");
    launcher::StackOptions o = TpPrefillOptions(1);
    o.prefill_args.push_back("--handoff_layerwise_min_tokens=1");
    o.prefill_args.push_back("--handoff_layer_group=1");
    auto stack = launcher::LocalStack::Start(o);
    INFO(stack.status());
    REQUIRE(stack.ok());
    CheckSame(want, AskAll(**stack));
    CheckMappedWrites(**stack);
    // Every layer of every prompt was its own group, from each rank.
    const double layers = ScrapeMetric((*stack)->prefill(0).metrics_port(),
                                       "mmserve_language_kv_handoff_layer_groups_total");
    CHECK(layers >= 2 * 2 * (kText + kImages));
    CHECK(static_cast<int64_t>(layers) % (2 * (kText + kImages)) == 0);
    const Leaks l = WaitForNoLeaks(**stack, absl::Seconds(10));
    INFO(l.ToString());
    CHECK(l.zero());
  }
}

TEST_CASE(
    "SIGKILL of a TP=2 prefill instance's rank 1 mid-hand-off: a bounded UNAVAILABLE, the "
    "decode instance frees the reservations") {
  launcher::StackOptions o = TpPrefillOptions(1);
  // The prefill instance waits 3 s after AllocateKv (or after a prompt's
  // first layer group); the decode side's commit deadline (2 s) ends inside.
  o.language_args.push_back("--test_kv_handoff_delay_ms=3000");
  o.language_args.push_back("--kv_commit_timeout_ms=2000");
  auto stack = launcher::LocalStack::Start(o);
  INFO(stack.status());
  REQUIRE(stack.ok());
  const std::vector<pid_t> shards = ChildrenOf((*stack)->prefill(0).process->pid());
  REQUIRE(shards.size() == 1);
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  constexpr int kCalls = 2;
  std::vector<Answer> answers(kCalls);
  std::vector<double> seconds(kCalls);
  std::vector<std::thread> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.emplace_back([&, i] {
      AskOptions a;
      a.max_tokens = 16;
      a.ignore_eos = true;
      a.deadline = absl::Seconds(60);
      Stopwatch clock;
      answers[i] = AskGrpc(*stub, DemoRequest(Demo(), Demo().items[i], a), a);
      seconds[i] = clock.ElapsedSeconds();
    });
  }
  // Mid-hand-off: the decode instance holds a reservation.
  const int dp = (*stack)->decode(0).metrics_port();
  const Deadline reserved = Deadline::After(absl::Seconds(60));
  while (ScrapeMetric(dp, "mmserve_language_kv_blocks_used") <= 0 && !reserved.Expired()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  REQUIRE(ScrapeMetric(dp, "mmserve_language_kv_blocks_used") > 0);
  REQUIRE(kill(shards[0], SIGKILL) == 0);
  for (std::thread& t : calls) t.join();
  for (int i = 0; i < kCalls; ++i) {
    INFO(i << ": " << answers[i].status << " after " << answers[i].token_ids.size() << " tokens, "
           << seconds[i] << " s");
    CHECK(answers[i].status.code() == absl::StatusCode::kUnavailable);
    CHECK(answers[i].token_ids.empty());  // the first token travels with the hand-off
    CHECK(seconds[i] < 30);
  }
  // The decode instance holds nothing: the reservations ended at their
  // commit deadline (no CommitKv came) or when the router cancelled them.
  const Deadline settled = Deadline::After(absl::Seconds(15));
  double kv = -1, live = -1;
  while (!settled.Expired()) {
    kv = ScrapeMetric(dp, "mmserve_language_kv_blocks_used");
    live = ScrapeMetric(dp, "mmserve_language_requests_live");
    if (kv == 0 && live == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(kv == 0);
  CHECK(live == 0);
  CHECK(ScrapeMetric((*stack)->router().metrics_port(), "mmserve_router_calls_live") == 0);
}

}  // namespace
}  // namespace mmserve::testing
