// Role elastic through the whole stack (issue 26): router + encoder +
// `--role=elastic` language processes. One instance under a router without
// --esp serves requests as role both; two under `router --esp` (the
// elastic manager) serve demo questions, each of which fits one instance,
// at degree 1. Both give the in-process engine's token ids and text, and
// nothing leaks. With pools of about 2k tokens (--kv_cache_mb=3), a
// 3k-token prompt is refused by a role-both instance and served by the two
// elastic instances as a group with the in-process engine's tokens; a
// member killed mid-prefill, or the master or the span holder killed
// mid-decode, ends the call UNAVAILABLE within 2 s and leaves nothing on
// the survivor. The KV bytes the instances moved (their /metrics) are 0 at
// degree 1 and what the geometry gives for the group.
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "tests/stack_harness.h"
#include "worker/engine.h"

namespace mmserve::testing {
namespace {

// Asks the first `n` demo questions, 8 at a time: each answer must be the
// in-process engine's (ids and text).
void AskDemoQuestions(launcher::LocalStack& stack, int n) {
  const DemoSet& set = Demo();
  const Reference& ref = InProcess(set);
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  std::vector<Answer> answers(n);
  ParallelFor(n, 8,
              [&](int i) { answers[i] = AskGrpc(*stub, DemoRequest(set, set.items[i], {}), {}); });
  for (int i = 0; i < n; ++i) {
    INFO("question " << i << ": " << answers[i].status);
    REQUIRE(answers[i].status.ok());
    CHECK(answers[i].token_ids == ref.ids[i]);
    CHECK(answers[i].text == ref.text[i]);
  }
}

// mmserve_language_kv_bytes_moved_total of one kind and direction, summed
// over the elastic instances (-1 from an instance that does not show it).
double BytesMoved(launcher::LocalStack& stack, const std::string& kind, const std::string& dir) {
  double total = 0;
  for (int i = 0; i < stack.num_elastic(); ++i) {
    total += ScrapeMetric(stack.elastic(i).metrics_port(), "mmserve_language_kv_bytes_moved_total",
                          absl::StrCat("dir=\"", dir, "\",kind=\"", kind, "\""));
  }
  return total;
}

TEST_CASE("an elastic language instance answers demo questions as role both") {
  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.language_args.push_back("--role=elastic");
  auto stack = launcher::LocalStack::Start(o);
  REQUIRE(stack.ok());
  AskDemoQuestions(**stack, 100);
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(5));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

// The demo questions through the router's elastic manager: each fits one
// instance, so each runs at degree 1 on one of the two.
TEST_CASE("the elastic manager answers demo questions as role both, no leaks") {
  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.elastic = 2;
  auto stack = launcher::LocalStack::Start(o);
  REQUIRE(stack.ok());
  constexpr int kQuestions = 60;
  AskDemoQuestions(**stack, kQuestions);
  const int router_metrics = (*stack)->router().metrics_port();
  CHECK(ScrapeMetric(router_metrics, "mmserve_router_esp_requests_total", "degree=\"1\"") ==
        kQuestions);
  // Degree 1 moves no KV between instances.
  for (const std::string kind : {"esp_prefill", "esp_decode", "handoff"}) {
    for (const std::string dir : {"sent", "received"}) {
      INFO(kind << " " << dir);
      CHECK(BytesMoved(**stack, kind, dir) == 0);
    }
  }
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(5));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
  CHECK(ScrapeMetric(router_metrics, "mmserve_router_esp_promised_slots") == 0);
}

// A raw prompt of at least `tokens` tokens of the demo model.
std::string LongPrompt(int tokens) {
  auto tok = model::Tokenizer::FromFile(DemoModelDir() + "/tokenizer.json");
  REQUIRE(tok.ok());
  std::string text;
  for (int i = 0;; ++i) {
    auto ids = (*tok)->Encode(text);
    REQUIRE(ids.ok());
    if (static_cast<int>(ids->size()) >= tokens) return text;
    absl::StrAppend(&text, "Shape ", i, " is a ", i % 3 == 0 ? "red circle" : "blue square",
                    " next to shape ", i + 1, ". ");
  }
}

mmserve::v1::GenerateRequest RawRequest(const std::string& text, int max_tokens) {
  mmserve::v1::GenerateRequest r;
  r.mutable_raw()->set_text(text);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(static_cast<uint32_t>(max_tokens));
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_stream()->set_include_token_ids(true);
  return r;
}

// Greedy, exactly max_tokens tokens.
model::SamplingParams Greedy(int max_tokens) {
  model::SamplingParams s;
  s.temperature = 0;
  s.max_tokens = max_tokens;
  s.ignore_eos = true;
  return s;
}

// The in-process engine's greedy tokens for `text` (a pool that holds it).
std::vector<int32_t> Reference(const std::string& text, int max_tokens) {
  worker::EngineOptions options;
  options.model_dir = DemoModelDir();
  options.kv_cache_bytes = int64_t{16} << 20;  // the whole prompt fits
  absl::StatusOr<std::unique_ptr<worker::LlmEngine>> engine = worker::LlmEngine::Create(options);
  REQUIRE(engine.ok());
  worker::EngineRequest request;
  request.id = "reference";
  request.prompt = text;
  request.sampling = Greedy(max_tokens);
  std::vector<int32_t> ids;
  auto collect = [&ids](const worker::StreamEvent& e) {
    ids.insert(ids.end(), e.token_ids.begin(), e.token_ids.end());
  };
  REQUIRE((*engine)->AddRequest(std::move(request), collect).ok());
  do {
    REQUIRE((*engine)->Step().ok());
  } while ((*engine)->has_unfinished());
  return ids;
}

// Pools of about 2048 tokens (the demo model's KV is 1.5 KiB a token).
constexpr char kSmallPool[] = "--kv_cache_mb=3";
constexpr int kLongPrompt = 3000;

// Two elastic instances of small pools under router --esp, over tcp (a
// killed peer is seen at once); `args` go to both.
absl::StatusOr<std::unique_ptr<launcher::LocalStack>> SmallElasticStack(
    const std::vector<std::string>& args) {
  launcher::StackOptions o = TestStackOptions(1, "tcp");
  o.elastic = 2;
  o.language_args.push_back(kSmallPool);
  o.language_args.insert(o.language_args.end(), args.begin(), args.end());
  return launcher::LocalStack::Start(o);
}

// What `rounds` degree-2 groups of `text` moved between the two instances:
// every layer, each prompt row's K and V (fp32) went to the other member
// once; each decode step (the first token is the prefill's), one query per
// layer from the master to the holder (header, one tag slot, q) and its
// partial back (out and log-sum-exp).
void CheckGroupBytesMoved(launcher::LocalStack& stack, const std::string& text, int rounds,
                          int decode_steps) {
  auto config = model::LoadModelConfig(DemoModelDir());
  REQUIRE(config.ok());
  const model::TextConfig& cfg = config->text;
  auto tok = model::Tokenizer::FromFile(DemoModelDir() + "/tokenizer.json");
  REQUIRE(tok.ok());
  auto ids = (*tok)->Encode(text);
  REQUIRE(ids.ok());
  const double len = static_cast<double>(ids->size());
  const double layers = cfg.num_hidden_layers;
  const double kv_row = 2.0 * cfg.num_key_value_heads * cfg.head_dim() * sizeof(float);
  const double q_width = static_cast<double>(cfg.num_attention_heads * cfg.head_dim());
  const double query = 8 + 8 + q_width * sizeof(float);
  const double reply = (q_width + cfg.num_attention_heads) * sizeof(float);
  const double prefill = rounds * layers * len * kv_row;
  const double decode = rounds * decode_steps * layers * (query + reply);
  for (const std::string dir : {"sent", "received"}) {
    INFO(dir);
    CHECK(BytesMoved(stack, "esp_prefill", dir) == prefill);
    CHECK(BytesMoved(stack, "esp_decode", dir) == decode);
    CHECK(BytesMoved(stack, "handoff", dir) == 0);
  }
}

TEST_CASE("a 3k-token prompt beyond one 2k pool: role both refuses it, two elastic serve it") {
  const std::string text = LongPrompt(kLongPrompt);
  const std::vector<int32_t> ref = Reference(text, 8);
  REQUIRE(ref.size() == 8);
  {
    launcher::StackOptions o = TestStackOptions(1, "tcp");
    o.language_args.push_back(kSmallPool);
    auto both = launcher::LocalStack::Start(o);
    REQUIRE(both.ok());
    auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*both)->router_address()));
    const Answer a = AskGrpc(*stub, RawRequest(text, 8), {});
    // Refused: the instance sizes its context to its pool (INVALID_ARGUMENT)
    // or its scheduler finds the pool too small (RESOURCE_EXHAUSTED).
    INFO(a.status);
    CHECK((absl::IsInvalidArgument(a.status) || absl::IsResourceExhausted(a.status)));
  }
  auto stack = SmallElasticStack({});
  REQUIRE(stack.ok());
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  for (int round = 0; round < 2; ++round) {
    const Answer a = AskGrpc(*stub, RawRequest(text, 8), {});
    INFO("round " << round << ": " << a.status);
    REQUIRE(a.status.ok());
    CHECK(a.token_ids == ref);
  }
  const int router_metrics = (*stack)->router().metrics_port();
  CHECK(ScrapeMetric(router_metrics, "mmserve_router_esp_requests_total", "degree=\"2\"") == 2);
  CheckGroupBytesMoved(**stack, text, /*rounds=*/2, /*decode_steps=*/7);
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

// Whether elastic instance `i` holds KV blocks (it joined a group).
bool HoldsBlocks(launcher::LocalStack& stack, int i) {
  return ScrapeMetric(stack.elastic(i).metrics_port(), "mmserve_language_kv_blocks_used") > 0;
}

TEST_CASE("a member killed mid-prefill ends the call UNAVAILABLE within 2 s, survivor idle") {
  // Each layer of a group prefill waits 400 ms: the kill lands mid-exchange.
  auto stack = SmallElasticStack({"--test_esp_step_delay_ms=400"});
  REQUIRE(stack.ok());
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  Answer answer;
  std::atomic<int64_t> ended_ns{0};
  std::thread call([&] {
    answer = AskGrpc(*stub, RawRequest(LongPrompt(kLongPrompt), 8), {});
    ended_ns = MonotonicNanos();
  });
  // The retention plan fills elastic-0 first: it holds the prompt's head.
  const Deadline joined = Deadline::After(absl::Seconds(30));
  while (!HoldsBlocks(**stack, 0) && ended_ns == 0 && !joined.Expired()) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  REQUIRE(ended_ns == 0);
  const int64_t killed_ns = MonotonicNanos();
  (*stack)->elastic(0).process->Signal(SIGKILL);
  call.join();
  INFO(answer.status);
  CHECK(answer.status.code() == absl::StatusCode::kUnavailable);
  CHECK(ended_ns - killed_ns < int64_t{2'000'000'000});
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

// Streams a 3k-token prompt's 300 tokens through a group of the two
// instances, kills elastic instance `victim` once 3 tokens arrived: the
// call must end UNAVAILABLE within 2 s and the survivor hold nothing.
void KillMidDecode(int victim) {
  // Decode steps of 30 ms: 300 tokens take 9 s.
  auto stack = SmallElasticStack({"--test_esp_step_delay_ms=30"});
  REQUIRE(stack.ok());
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  const KilledStreams run =
      StreamAndKill(*stub, {RawRequest(LongPrompt(kLongPrompt), 300)},
                    [&] { (*stack)->elastic(victim).process->Signal(SIGKILL); },
                    {.streaming_tokens = 3, .deadline = absl::Seconds(60)});
  const absl::Status s = run.AllUnavailable(absl::Seconds(2));
  INFO(s);
  CHECK(s.ok());
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

// elastic-1 keeps the prompt's tail and decodes (the master); elastic-0
// holds the head's span and answers the master's span queries.
TEST_CASE("the master killed mid-decode ends the call UNAVAILABLE within 2 s, survivor idle") {
  KillMidDecode(1);
}

TEST_CASE("a span holder killed mid-decode ends the call UNAVAILABLE within 2 s, master idle") {
  KillMidDecode(0);
}

}  // namespace
}  // namespace mmserve::testing
