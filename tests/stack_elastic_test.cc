// Role elastic through the whole stack: router + encoder +
// `--role=elastic` language processes. One instance under a router without
// --elastic serves requests as role both. Two with pools of about 2k tokens
// (--kv_cache_mb=3) under `router --elastic` (the elastic manager), one stack
// per transport (shm and tcp), serve the demo evaluation's image questions
// (each fits one instance: degree 1), a 3k-token text prompt and a 3k-token
// prompt with an image whose rows the group's members split (degree 2):
// every answer is the in-process engine's, and nothing leaks. A role-both
// instance of such a pool refuses the 3k-token prompt. Over shm and tcp, a
// member killed mid-prefill, or the master or the span holder killed
// mid-decode, ends the call UNAVAILABLE within 2 s and leaves nothing on
// the survivor. A 2k-token prompt whose decode does not fit the first
// master's pool moves its master once, with the engine's tokens; killing
// the next master before the move, or the old one after it, ends the call
// UNAVAILABLE within 2 s with nothing left. The KV bytes the instances
// moved (their /metrics) are 0 at degree 1 and what the geometry gives for
// a group.
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "model/image_decode.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "tests/public_errors.h"
#include "tests/stack_harness.h"
#include "worker/engine.h"

namespace mmserve::testing {
namespace {

// Asks the first `n` demo questions, 8 at a time: each answer must be the
// in-process engine's (ids and text).
void AskDemoQuestions(launcher::LocalStack& stack, int n) {
  const DemoSet& set = Demo();
  const Reference& ref = InProcess(set, n);
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

// The demo model's tokenizer.
const model::Tokenizer& DemoTokenizer() {
  static const model::Tokenizer* tok =
      model::Tokenizer::FromFile(DemoModelDir() + "/tokenizer.json").value().release();
  return *tok;
}

int64_t CountTokens(const std::string& text) {
  auto ids = DemoTokenizer().Encode(text);
  REQUIRE(ids.ok());
  return static_cast<int64_t>(ids->size());
}

// A raw prompt of at least `tokens` tokens of the demo model.
std::string LongPrompt(int tokens) {
  std::string text;
  for (int i = 0;; ++i) {
    if (CountTokens(text) >= tokens) return text;
    absl::StrAppend(&text, "Shape ", i, " is a ", i % 3 == 0 ? "red circle" : "blue square",
                    " next to shape ", i + 1, ". ");
  }
}

// A raw prompt, with one image when `png` holds its bytes.
mmserve::v1::GenerateRequest RawRequest(const std::string& text, int max_tokens,
                                        const std::string& png = "") {
  mmserve::v1::GenerateRequest r;
  r.mutable_raw()->set_text(text);
  if (!png.empty()) r.mutable_raw()->add_images()->set_data(png);
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

// What the in-process engine gives a raw prompt (a pool that holds it).
struct Served {
  std::vector<int32_t> ids;
  int64_t prompt_tokens = 0;  // image rows included
};

Served InProcessGreedy(const std::string& text, int max_tokens, const std::string& png = "") {
  worker::EngineOptions options;
  options.model_dir = DemoModelDir();
  options.kv_cache_bytes = int64_t{16} << 20;  // the whole prompt fits
  absl::StatusOr<std::unique_ptr<worker::LlmEngine>> engine = worker::LlmEngine::Create(options);
  REQUIRE(engine.ok());
  worker::EngineRequest request;
  request.id = "reference";
  request.prompt = text;
  if (!png.empty()) request.images.push_back(*model::DecodeImage(png, model::DecodeLimits()));
  request.sampling = Greedy(max_tokens);
  Served out;
  auto collect = [&out](const worker::StreamEvent& e) {
    out.ids.insert(out.ids.end(), e.token_ids.begin(), e.token_ids.end());
    if (e.finish_reason != worker::FinishReason::kNone) out.prompt_tokens = e.prompt_tokens;
  };
  REQUIRE((*engine)->AddRequest(std::move(request), collect).ok());
  do {
    REQUIRE((*engine)->Step().ok());
  } while ((*engine)->has_unfinished());
  return out;
}

constexpr char kImage[] = "<|vision_start|><|image_pad|><|vision_end|>";

// A raw prompt of text, one image, text, whose image rows straddle the
// middle row: a degree-2 group's plan splits the rows there
// (router/elastic_group_plan.h: member m of n computes [len m / n,
// len (m + 1) / n)), so each member embeds part of the image and attends
// the other part over the exchange.
struct ImagePrompt {
  std::string text;
  int64_t first_image_row = 0;
  int64_t rows = 0;  // the prompt's, image rows included
};

ImagePrompt StraddlingImagePrompt(int tokens, int64_t image_rows) {
  ImagePrompt p;
  const std::string head = LongPrompt(tokens / 2);
  p.first_image_row = CountTokens(head + "<|vision_start|>");
  std::string tail = LongPrompt(tokens / 2 - 40);
  for (;;) {
    p.text = head + kImage + tail;
    // The placeholder's one token stands for image_rows rows.
    p.rows = CountTokens(p.text) - 1 + image_rows;
    if (p.rows / 2 > p.first_image_row) return p;
    tail += " again";
  }
}

// Pools of about 2048 tokens (the demo model's KV is 1.5 KiB a token).
constexpr char kSmallPool[] = "--kv_cache_mb=3";
constexpr int kLongPrompt = 3000;
const char* const kProfiles[] = {"shm", "tcp"};
const char* const kTcpOnly[] = {"tcp"};  // master moves: the kills over shm are covered above

// Two elastic instances of small pools under router --elastic over `profile`;
// `args` go to both. Under sanitizers a layer of a 3k-token group prefill
// took over the default 2 s layer timeout here (ASan, load 12 on 2 cores):
// they get 10 s (kills are seen by the peers' liveness, not by timeouts).
absl::StatusOr<std::unique_ptr<launcher::LocalStack>> SmallElasticStack(
    const std::string& profile, const std::vector<std::string>& args) {
  launcher::StackOptions o = TestStackOptions(1, profile);
  o.language_args.push_back(kSmallPool);
  UseElasticPair(o);
  o.language_args.insert(o.language_args.end(), args.begin(), args.end());
  return launcher::LocalStack::Start(o);
}

TEST_CASE("a 3k-token prompt beyond one 2k pool: role both refuses it") {
  launcher::StackOptions o = TestStackOptions(1, "tcp");
  o.language_args.push_back(kSmallPool);
  auto both = launcher::LocalStack::Start(o);
  REQUIRE(both.ok());
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*both)->router_address()));
  const Answer a = AskGrpc(*stub, RawRequest(LongPrompt(kLongPrompt), 8), {});
  // Refused: the instance sizes its context to its pool (INVALID_ARGUMENT)
  // or its scheduler finds the pool too small (RESOURCE_EXHAUSTED).
  INFO(a.status);
  CHECK((absl::IsInvalidArgument(a.status) || absl::IsResourceExhausted(a.status)));
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
    CHECK(BytesMoved(stack, "elastic_prefill", dir) == prefill);
    CHECK(BytesMoved(stack, "elastic_decode", dir) == decode);
    CHECK(BytesMoved(stack, "handoff", dir) == 0);
  }
}

// The demo questions (images) fit one instance each: degree 1. The 3k-token
// prompts need both pools: degree 2.
TEST_CASE(
    "elastic instances equal role both: demo evaluation, 3k text and image groups, no leaks") {
  const std::string text = LongPrompt(kLongPrompt);
  const Served text_ref = InProcessGreedy(text, 8);
  REQUIRE(text_ref.ids.size() == 8);
  const std::string& png = Demo().images.at(Demo().items[0].image_file);
  // The placeholder's three tokens: vision start, the image's rows, end.
  const int64_t image_rows = InProcessGreedy(kImage, 1, png).prompt_tokens - 2;
  REQUIRE(CountTokens(kImage) == 3);
  REQUIRE(image_rows > 1);
  const ImagePrompt image = StraddlingImagePrompt(kLongPrompt, image_rows);
  const Served image_ref = InProcessGreedy(image.text, 8, png);
  REQUIRE(image_ref.ids.size() == 8);
  REQUIRE(image_ref.prompt_tokens == image.rows);
  // The middle row, where member 1's rows begin, is inside the image.
  REQUIRE(image.first_image_row < image.rows / 2);
  REQUIRE(image.rows / 2 < image.first_image_row + image_rows);
  constexpr int kQuestions = 60;
  for (const std::string profile : kProfiles) {
    INFO(profile);
    auto stack = SmallElasticStack(profile, {});
    REQUIRE(stack.ok());
    AskDemoQuestions(**stack, kQuestions);
    // Degree 1 moves no KV between instances.
    for (const std::string kind : {"elastic_prefill", "elastic_decode", "handoff"}) {
      for (const std::string dir : {"sent", "received"}) {
        INFO(kind << " " << dir);
        CHECK(BytesMoved(**stack, kind, dir) == 0);
      }
    }
    auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
    const Answer t = AskGrpc(*stub, RawRequest(text, 8), {});
    INFO("text: " << t.status);
    REQUIRE(t.status.ok());
    CHECK(t.token_ids == text_ref.ids);
    CheckGroupBytesMoved(**stack, text, /*rounds=*/1, /*decode_steps=*/7);
    const Answer i = AskGrpc(*stub, RawRequest(image.text, 8, png), {});
    INFO("image: " << i.status);
    REQUIRE(i.status.ok());
    CHECK(i.token_ids == image_ref.ids);
    const int router_metrics = (*stack)->router().metrics_port();
    CHECK(ScrapeMetric(router_metrics, "mmserve_router_elastic_requests_total", "degree=\"1\"") ==
          kQuestions);
    CHECK(ScrapeMetric(router_metrics, "mmserve_router_elastic_requests_total", "degree=\"2\"") ==
          2);
    const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
    INFO(leaks.ToString());
    CHECK(leaks.zero());
    CHECK(ScrapeMetric(router_metrics, "mmserve_router_elastic_promised_slots") == 0);
  }
}

// Whether elastic instance `i` holds KV blocks (it joined a group).
bool HoldsBlocks(launcher::LocalStack& stack, int i) {
  return ScrapeMetric(stack.elastic(i).metrics_port(), "mmserve_language_kv_blocks_used") > 0;
}

// Within 2 s of a kill (over shm too: the boards check their peers'
// processes, transfer/ucx_notice_board.h).
const absl::Duration kWithin = absl::Seconds(2 * kSanitizerSlowdown);

TEST_CASE("a member killed mid-prefill ends the call UNAVAILABLE within 2 s, survivor idle") {
  const std::string text = LongPrompt(kLongPrompt);
  for (const std::string profile : kProfiles) {
    INFO(profile);
    // Each layer of a group prefill waits 400 ms: the kill lands mid-exchange.
    auto stack = SmallElasticStack(profile, {"--test_elastic_step_delay_ms=400"});
    REQUIRE(stack.ok());
    auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
    const std::vector<std::string> internals = StackInternals(**stack);
    Answer answer;
    std::atomic<int64_t> ended_ns{0};
    std::thread call([&] {
      answer = AskGrpc(*stub, RawRequest(text, 8), {});
      ended_ns = MonotonicNanos();
    });
    // The retention plan fills elastic-0 first: it holds the prompt's head.
    const Deadline joined = Deadline::After(absl::Seconds(30));
    while (!HoldsBlocks(**stack, 0) && ended_ns == 0 && !joined.Expired()) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    const bool early = ended_ns != 0;
    const int64_t killed_ns = MonotonicNanos();
    (*stack)->elastic(0).process->Signal(SIGKILL);
    call.join();
    REQUIRE(!early);
    INFO(answer.status);
    CHECK(answer.status.code() == absl::StatusCode::kUnavailable);
    CHECK(absl::Nanoseconds(ended_ns - killed_ns) < kWithin);
    const absl::Status shown = CheckPublicError(answer.status, answer.request_id, internals);
    INFO(shown);
    CHECK(shown.ok());
    CHECK(answer.retry_after == "1");
    const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
    INFO(leaks.ToString());
    CHECK(leaks.zero());
  }
}

// Streams a prompt of `prompt` tokens and `max_tokens` new ones through a
// group of the two instances (over each transport of `profiles`), kills
// elastic instance `victim` once `tokens` arrived: the call must end
// UNAVAILABLE within 2 s with an error a client may see, and the survivor
// hold nothing. With `http_on_tcp`, the tcp stack's call is a streamed
// OpenAI chat completion of the same text instead.
void KillMidDecode(int victim, int prompt = kLongPrompt, int max_tokens = 300, int tokens = 3,
                   absl::Span<const char* const> profiles = kProfiles, bool http_on_tcp = true) {
  const std::string text = LongPrompt(prompt);
  for (const std::string profile : profiles) {
    INFO(profile);
    // Decode steps of 30 ms: 300 tokens take 9 s.
    auto stack = SmallElasticStack(profile, {"--test_elastic_step_delay_ms=30"});
    REQUIRE(stack.ok());
    auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
    const std::vector<std::string> internals = StackInternals(**stack);
    const bool http = http_on_tcp && profile == "tcp";
    const KilledStreams run =
        StreamAndKill(*stub, {RawRequest(text, max_tokens)},
                      [&] { (*stack)->elastic(victim).process->Signal(SIGKILL); },
                      {.streaming_tokens = tokens,
                       .deadline = absl::Seconds(60),
                       .http_port = http ? (*stack)->http_port() : 0,
                       .http_streams = http ? 1 : 0});
    const absl::Status s = run.AllUnavailable(kWithin);
    INFO(s);
    CHECK(s.ok());
    const absl::Status shown = run.AllPublic(internals);
    INFO(shown);
    CHECK(shown.ok());
    const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
    INFO(leaks.ToString());
    CHECK(leaks.zero());
  }
}

// elastic-1 keeps the prompt's tail and decodes (the master); elastic-0
// holds the head's span and answers the master's span queries.
TEST_CASE("the master killed mid-decode ends the call UNAVAILABLE within 2 s, survivor idle") {
  KillMidDecode(1);
}

TEST_CASE("a span holder killed mid-decode ends the call UNAVAILABLE within 2 s, master idle") {
  KillMidDecode(0);
}

// About 2000 prompt tokens and 80 new ones: more than one 2048-token pool,
// so the retention plan gives elastic-0 the prompt and the first decode
// slots up to 2048 (it masters first) and elastic-1 the rest (it masters
// after the move).
constexpr int kMovePrompt = 2000;

TEST_CASE("a decode tail past the first master's pool: the master moves, the engine's tokens") {
  const std::string text = LongPrompt(kMovePrompt);
  const std::vector<int32_t> ref = InProcessGreedy(text, 80).ids;
  REQUIRE(ref.size() == 80);
  auto stack = SmallElasticStack("tcp", {});
  REQUIRE(stack.ok());
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  const Answer a = AskGrpc(*stub, RawRequest(text, 80), {});
  INFO(a.status);
  REQUIRE(a.status.ok());
  CHECK(a.token_ids == ref);
  const int router_metrics = (*stack)->router().metrics_port();
  CHECK(ScrapeMetric(router_metrics, "mmserve_router_elastic_requests_total", "degree=\"2\"") == 1);
  CHECK(ScrapeMetric(router_metrics, "mmserve_router_elastic_master_moves_total") == 1);
  double moves = 0;
  for (int i = 0; i < 2; ++i) {
    moves += ScrapeMetric((*stack)->elastic(i).metrics_port(),
                          "mmserve_language_elastic_master_moves_total");
  }
  CHECK(moves == 1);
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

// The move prompt's 200 tokens: about 45 on elastic-0, then the rest on
// elastic-1.
TEST_CASE("the next master killed before the move ends the call UNAVAILABLE, survivor idle") {
  KillMidDecode(1, kMovePrompt, 200, 3, kTcpOnly, /*http_on_tcp=*/false);
}

TEST_CASE("the old master killed after the move ends the call UNAVAILABLE, new master idle") {
  KillMidDecode(0, kMovePrompt, 200, 70, kTcpOnly, /*http_on_tcp=*/false);
}

}  // namespace
}  // namespace mmserve::testing
