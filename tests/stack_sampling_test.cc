// Penalties and logit_bias through the whole stack: the router validates
// them (INVALID_ARGUMENT over gRPC, 400 over HTTP, the field named), and the
// language processes apply them in their one sampler, so a role-both stack,
// E + P + D with a TP=2 decode instance and elastic instances under
// `router --elastic` (alone, and as a group of two for a prompt beyond one
// pool) all give the in-process engine's tokens for the same seeded or
// greedy parameters; the HTTP API (/v1/chat/completions, and
// /v1/completions with and without echo) gives the gRPC API's text. A
// request with n choices gives, as choice i, the one-choice request under
// seed + i, and its later choices take the prompt from the prefix cache.
// Tool calls run on the role-both stack too (tests/stack_tools.h: tool_choice
// named and required are enforced by the output grammar), and structured
// output gives the same tokens on each topology (stack_constrained.h).
#include <httplib.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "model/tokenizer.h"
#include "tests/stack_constrained.h"
#include "tests/stack_harness.h"
#include "tests/stack_tools.h"
#include "worker/engine.h"

namespace mmserve::testing {
namespace {

constexpr int kTokens = 16;
constexpr int kPrompts = 6;

// Greedy with a repetition penalty and a ban, or seeded sampling with every
// penalty; `banned` is the plain greedy answer's first token of prompt 0.
struct Params {
  const char* name;
  float temperature = 0;
  uint64_t seed = 0;
  int top_k = 0;
  float presence = 0, frequency = 0, repetition = 1;
  std::vector<std::pair<int32_t, float>> bias;
};

std::vector<Params> Cases(int32_t banned) {
  Params greedy{"greedy, repetition 1.3, first token banned"};
  greedy.repetition = 1.3f;
  greedy.bias = {{banned, -100.0f}};
  Params sampled{"seed 7, temperature 0.8, top_k 40, every penalty"};
  sampled.temperature = 0.8f;
  sampled.seed = 7;
  sampled.top_k = 40;
  sampled.presence = 0.4f;
  sampled.frequency = 0.8f;
  sampled.repetition = 1.1f;
  sampled.bias = {{banned, 5.0f}};
  return {greedy, sampled};
}

model::SamplingParams ToEngine(const Params& p) {
  model::SamplingParams s;
  s.temperature = p.temperature;
  s.seed = p.seed;
  s.top_k = p.top_k;
  s.max_tokens = kTokens;
  s.ignore_eos = true;
  s.presence_penalty = p.presence;
  s.frequency_penalty = p.frequency;
  s.repetition_penalty = p.repetition;
  for (const auto& [token, bias] : p.bias) s.logit_bias.push_back({token, bias});
  return s;
}

void SetProto(const Params& p, mmserve::v1::SamplingParams* s) {
  s->set_temperature(p.temperature);
  s->set_seed(p.seed);
  if (p.top_k > 0) s->set_top_k(p.top_k);
  s->set_max_tokens(kTokens);
  s->set_ignore_eos(true);
  s->set_presence_penalty(p.presence);
  s->set_frequency_penalty(p.frequency);
  s->set_repetition_penalty(p.repetition);
  for (const auto& [token, bias] : p.bias) {
    mmserve::v1::LogitBias* b = s->add_logit_bias();
    b->set_token_id(static_cast<uint32_t>(token));
    b->set_bias(bias);
  }
}

std::string PromptText(int i) {
  return absl::StrCat("Question: ", Demo().items[i].question, "\nAnswer:");
}

mmserve::v1::GenerateRequest RawRequest(int i, const Params& p) {
  mmserve::v1::GenerateRequest r;
  r.mutable_raw()->set_text(PromptText(i));
  SetProto(p, r.mutable_sampling());
  r.mutable_stream()->set_include_token_ids(true);
  return r;
}

// The in-process engine's tokens for `text` under `s`.
std::vector<int32_t> InProcessText(const std::string& text, const model::SamplingParams& s) {
  worker::EngineOptions options;
  options.model_dir = DemoModelDir();
  options.kv_cache_bytes = int64_t{16} << 20;  // a whole 3k-token prompt fits
  auto engine = worker::LlmEngine::Create(options);
  REQUIRE(engine.ok());
  worker::EngineRequest r;
  r.id = "reference";
  r.prompt = text;
  r.sampling = s;
  std::vector<int32_t> ids;
  REQUIRE((*engine)
              ->AddRequest(std::move(r),
                           [&ids](const worker::StreamEvent& e) {
                             ids.insert(ids.end(), e.token_ids.begin(), e.token_ids.end());
                           })
              .ok());
  while ((*engine)->has_unfinished()) REQUIRE((*engine)->Step().ok());
  return ids;
}

// The in-process engine's tokens for every prompt under `s`.
std::vector<std::vector<int32_t>> InProcess(const model::SamplingParams& s) {
  worker::EngineOptions options;
  options.model_dir = DemoModelDir();
  options.kv_cache_bytes = int64_t{16} << 20;
  auto engine = worker::LlmEngine::Create(options);
  REQUIRE(engine.ok());
  std::vector<std::vector<int32_t>> out(kPrompts);
  for (int i = 0; i < kPrompts; ++i) {
    worker::EngineRequest r;
    r.id = absl::StrCat(i);
    r.prompt = PromptText(i);
    r.sampling = s;
    std::vector<int32_t>* ids = &out[i];
    REQUIRE((*engine)
                ->AddRequest(std::move(r),
                             [ids](const worker::StreamEvent& e) {
                               ids->insert(ids->end(), e.token_ids.begin(), e.token_ids.end());
                             })
                .ok());
  }
  while ((*engine)->has_unfinished()) REQUIRE((*engine)->Step().ok());
  return out;
}

struct Expected {
  std::vector<Params> cases;
  std::vector<std::vector<std::vector<int32_t>>> ids;  // [case][prompt]
};

const Expected& Reference() {
  static const Expected* e = [] {
    auto* out = new Expected;
    Params plain{"plain greedy"};
    const std::vector<std::vector<int32_t>> base = InProcess(ToEngine(plain));
    REQUIRE(base[0].size() == kTokens);
    out->cases = Cases(base[0][0]);
    for (const Params& p : out->cases) {
      out->ids.push_back(InProcess(ToEngine(p)));
      // The parameters change the answer (else equality proves nothing).
      CHECK(out->ids.back()[0] != base[0]);
    }
    return out;
  }();
  return *e;
}

// One request with n choices over gRPC: per choice, its tokens and its
// final response's usage.
struct Choices {
  absl::Status status;
  std::vector<std::vector<int32_t>> ids;
  std::vector<mmserve::v1::Usage> usage;
  std::set<std::string> request_ids;
};

Choices AskChoices(mmserve::v1::Inference::Stub& stub, const mmserve::v1::GenerateRequest& r) {
  Choices out;
  out.ids.resize(r.n());
  out.usage.resize(r.n());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub.Generate(&ctx, r);
  mmserve::v1::GenerateResponse response;
  while (reader->Read(&response)) {
    REQUIRE(response.index() < r.n());
    out.request_ids.insert(response.request_id());
    for (uint32_t t : response.token_ids()) {
      out.ids[response.index()].push_back(static_cast<int32_t>(t));
    }
    if (response.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED) {
      out.usage[response.index()] = response.usage();
    }
  }
  out.status = FromGrpcStatus(reader->Finish());
  return out;
}

// n = 3 under the sampled case's seed s: choice i is the one-choice request
// under seed s + i, and choices 1 and 2 took the prompt from the prefix
// cache (`shared`: they were placed where choice 0 ran).
void CheckChoices(launcher::LocalStack& stack, bool shared) {
  const Params& p = Reference().cases[1];
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  // A prompt of several KV blocks (16 tokens each), so that there is a
  // prefix to share.
  std::string text;
  for (int i = 0; i < kPrompts; ++i) text += PromptText(i) + " ";
  mmserve::v1::GenerateRequest r = RawRequest(0, p);
  r.mutable_raw()->set_text(text);
  r.set_n(3);
  const Choices got = AskChoices(*stub, r);
  INFO(got.status);
  REQUIRE(got.status.ok());
  CHECK(got.request_ids.size() == 1);
  for (uint32_t i = 0; i < 3; ++i) {
    INFO("choice " << i);
    mmserve::v1::GenerateRequest one = RawRequest(0, p);
    one.mutable_raw()->set_text(text);
    one.mutable_sampling()->set_seed(p.seed + i);
    const Answer a = AskGrpc(*stub, one, {});
    REQUIRE(a.status.ok());
    CHECK(got.ids[i] == a.token_ids);
    CHECK(got.usage[i].completion_tokens() == kTokens);
    CHECK(got.usage[i].prompt_tokens() > 48);
    if (shared && i > 0) {
      CHECK(got.usage[i].cached_prompt_tokens() >= got.usage[i].prompt_tokens() - 16);
    }
  }
  CHECK(got.ids[1] != got.ids[0]);
}

// Every case's raw prompts through the router: the in-process tokens.
void CheckStack(launcher::LocalStack& stack) {
  const Expected& want = Reference();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  for (size_t c = 0; c < want.cases.size(); ++c) {
    std::vector<Answer> got(kPrompts);
    ParallelFor(kPrompts, kPrompts,
                [&](int i) { got[i] = AskGrpc(*stub, RawRequest(i, want.cases[c]), {}); });
    for (int i = 0; i < kPrompts; ++i) {
      INFO(want.cases[c].name << ", prompt " << i << ": " << got[i].status);
      REQUIRE(got[i].status.ok());
      CHECK(got[i].token_ids == want.ids[c][i]);
    }
  }
}

// POST `path`: the status and the reply.
std::pair<int, nlohmann::json> Post(int port, const std::string& path, const nlohmann::json& body) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  auto res = cli.Post(path.c_str(), body.dump(), "application/json");
  REQUIRE(res);
  return {res->status, nlohmann::json::parse(res->body, nullptr, false)};
}

std::pair<int, nlohmann::json> PostChat(int port, const nlohmann::json& body) {
  return Post(port, "/v1/chat/completions", body);
}

nlohmann::json HttpBody(int i, const Params& p) {
  nlohmann::json body;
  body["messages"] = {{{"role", "user"}, {"content", Demo().items[i].question}}};
  body["temperature"] = p.temperature;
  body["seed"] = p.seed;
  if (p.top_k > 0) body["top_k"] = p.top_k;
  body["max_completion_tokens"] = kTokens;
  body["ignore_eos"] = true;
  body["presence_penalty"] = p.presence;
  body["frequency_penalty"] = p.frequency;
  body["repetition_penalty"] = p.repetition;
  body["logit_bias"] = nlohmann::json::object();
  for (const auto& [token, bias] : p.bias) body["logit_bias"][std::to_string(token)] = bias;
  return body;
}

TEST_CASE(
    "role both: penalties and logit_bias give the in-process engine's tokens over gRPC, the "
    "same text over HTTP, out-of-range values are refused naming the field, and tools reach the "
    "prompt with the output parsed for calls") {
  auto stack = launcher::LocalStack::Start(TestStackOptions(1, "shm"));
  INFO(stack.status());
  REQUIRE(stack.ok());
  CheckStack(**stack);
  CheckChoices(**stack, /*shared=*/true);
  CheckToolCalls(**stack);
  CheckConstrainedOutput(**stack, /*refusals=*/true);
  CheckToolChoiceEnforced(**stack);

  // A chat over HTTP and over gRPC: one text.
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  for (const Params& p : Reference().cases) {
    for (int i = 0; i < 2; ++i) {
      AskOptions o;
      mmserve::v1::GenerateRequest chat = DemoTextRequest(Demo().items[i], o);
      chat.clear_sampling();
      SetProto(p, chat.mutable_sampling());
      const Answer grpc = AskGrpc(*stub, chat, o);
      REQUIRE(grpc.status.ok());
      REQUIRE(grpc.token_ids.size() == kTokens);
      const auto [status, reply] = PostChat((*stack)->http_port(), HttpBody(i, p));
      INFO(p.name << ", question " << i << ": " << reply.dump());
      REQUIRE(status == 200);
      CHECK(reply["choices"][0]["message"]["content"] == grpc.text);
      CHECK(reply["usage"]["completion_tokens"] == kTokens);
    }
  }

  // n over HTTP: choices[i] is the one-choice request under seed + i.
  {
    const Params& p = Reference().cases[1];
    nlohmann::json body = HttpBody(0, p);
    body["n"] = 2;
    const auto [status, reply] = PostChat((*stack)->http_port(), body);
    INFO(reply.dump());
    REQUIRE(status == 200);
    REQUIRE(reply["choices"].size() == 2);
    for (int i = 0; i < 2; ++i) {
      Params one = p;
      one.seed = p.seed + i;
      const auto [one_status, one_reply] = PostChat((*stack)->http_port(), HttpBody(0, one));
      REQUIRE(one_status == 200);
      CHECK(reply["choices"][i]["index"] == i);
      CHECK(reply["choices"][i]["message"]["content"] ==
            one_reply["choices"][0]["message"]["content"]);
    }
    CHECK(reply["usage"]["completion_tokens"] == 2 * kTokens);

    // Streamed: the chunks of each index reassemble to its choice.
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    httplib::Client cli("127.0.0.1", (*stack)->http_port());
    cli.set_read_timeout(60, 0);
    auto sse = cli.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(sse);
    REQUIRE(sse->status == 200);
    std::vector<std::string> events = absl::StrSplit(sse->body, "\n\n", absl::SkipEmpty());
    REQUIRE(events.size() >= 4);
    CHECK(events.back() == "data: [DONE]");
    std::vector<std::string> texts(2);
    for (size_t e = 0; e + 2 < events.size(); ++e) {
      const nlohmann::json chunk = nlohmann::json::parse(events[e].substr(6));
      const int index = chunk["choices"][0]["index"];
      REQUIRE(index < 2);
      if (chunk["choices"][0]["delta"].contains("content")) {
        texts[index] += chunk["choices"][0]["delta"]["content"].get<std::string>();
      }
    }
    for (int i = 0; i < 2; ++i) CHECK(texts[i] == reply["choices"][i]["message"]["content"]);
    const nlohmann::json usage = nlohmann::json::parse(events[events.size() - 2].substr(6));
    CHECK(usage["usage"]["completion_tokens"] == 2 * kTokens);

    nlohmann::json too_many = HttpBody(0, p);
    too_many["n"] = 17;
    const auto [refused_status, refused] = PostChat((*stack)->http_port(), too_many);
    CHECK(refused_status == 400);
    CHECK(refused["error"]["message"] == "n must be in [1, 16], got 17");
  }

  // /v1/completions on the raw prompt: the gRPC raw request's text, with
  // the prompt before it when echoed.
  for (const Params& p : Reference().cases) {
    const Answer grpc = AskGrpc(*stub, RawRequest(0, p), {});
    REQUIRE(grpc.status.ok());
    nlohmann::json body = HttpBody(0, p);
    body.erase("messages");
    body["prompt"] = PromptText(0);
    const auto [status, reply] = Post((*stack)->http_port(), "/v1/completions", body);
    INFO(p.name << ": " << reply.dump());
    REQUIRE(status == 200);
    CHECK(reply["object"] == "text_completion");
    CHECK(reply["choices"][0]["text"] == grpc.text);
    CHECK(reply["usage"]["completion_tokens"] == kTokens);
    body["echo"] = true;
    const auto [echo_status, echoed] = Post((*stack)->http_port(), "/v1/completions", body);
    REQUIRE(echo_status == 200);
    CHECK(echoed["choices"][0]["text"] == PromptText(0) + grpc.text);
  }
  nlohmann::json suffix = {{"prompt", "def f("}, {"suffix", "return x"}};
  const auto [suffix_status, refused] = Post((*stack)->http_port(), "/v1/completions", suffix);
  CHECK(suffix_status == 400);
  CHECK(refused["error"]["message"].get<std::string>().rfind("suffix: is not supported", 0) == 0);

  // Refusals: gRPC INVALID_ARGUMENT and HTTP 400, the field named.
  Params bad_bias{"bias outside the vocabulary"};
  bad_bias.bias = {{1 << 24, 1.0f}};
  Params bad_presence{"presence 2.5"};
  bad_presence.presence = 2.5f;
  Params bad_repetition{"repetition 0"};
  bad_repetition.repetition = 0;
  Params bad_bias_value{"bias 150"};
  bad_bias_value.bias = {{5, 150.0f}};
  for (const auto& [p, field] : std::vector<std::pair<Params, std::string>>{
           {bad_bias, "logit_bias: token 16777216 is outside the vocabulary"},
           {bad_presence, "presence_penalty must be in [-2, 2]"},
           {bad_repetition, "repetition_penalty must be > 0"},
           {bad_bias_value, "logit_bias: the bias of token 5 must be in [-100, 100]"}}) {
    INFO(p.name);
    const Answer a = AskGrpc(*stub, RawRequest(0, p), {});
    CHECK(a.status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(a.status.message().find(field) != absl::string_view::npos);
    const auto [status, reply] = PostChat((*stack)->http_port(), HttpBody(0, p));
    INFO(reply.dump());
    CHECK(status == 400);
    CHECK(reply["error"]["message"].get<std::string>().find(field) != std::string::npos);
  }
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

TEST_CASE("E + P + D with a TP=2 decode instance: the in-process engine's penalised tokens") {
  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.prefill = 1;
  o.decode = 1;
  o.decode_args.push_back("--tp=2");
  auto stack = launcher::LocalStack::Start(o);
  INFO(stack.status());
  REQUIRE(stack.ok());
  CheckStack(**stack);
  CheckChoices(**stack, /*shared=*/true);
  CheckConstrainedOutput(**stack, /*refusals=*/false);
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

TEST_CASE("elastic instances under router --elastic: the in-process engine's penalised tokens") {
  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.elastic = 2;
  auto stack = launcher::LocalStack::Start(o);
  INFO(stack.status());
  REQUIRE(stack.ok());
  CheckStack(**stack);
  // The group path served them (degree 1: one member samples and decodes).
  CHECK(ScrapeMetric((*stack)->router().metrics_port(), "mmserve_router_elastic_requests_total") ==
        kPrompts * static_cast<int>(Reference().cases.size()));
  CheckChoices(**stack, /*shared=*/false);
  CheckConstrainedOutput(**stack, /*refusals=*/false);
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

// A raw prompt of at least `tokens` tokens of the demo model.
std::string LongPrompt(int tokens) {
  static const model::Tokenizer* tok =
      model::Tokenizer::FromFile(DemoModelDir() + "/tokenizer.json").value().release();
  std::string text;
  for (int i = 0;; ++i) {
    auto ids = tok->Encode(text);
    REQUIRE(ids.ok());
    if (static_cast<int>(ids->size()) >= tokens) return text;
    absl::StrAppend(&text, "Shape ", i, " is a ", i % 3 == 0 ? "red circle" : "blue square",
                    " next to shape ", i + 1, ". ");
  }
}

TEST_CASE(
    "an elastic group of two (a 3k-token prompt beyond one 2k pool): the in-process engine's "
    "penalised tokens, the first sampled by one member and the rest by the master") {
  const std::string text = LongPrompt(3000);
  std::vector<std::vector<int32_t>> want;
  for (const Params& p : Reference().cases) want.push_back(InProcessText(text, ToEngine(p)));
  launcher::StackOptions o = TestStackOptions(1, "tcp");
  o.language_args.push_back("--kv_cache_mb=3");  // about 2k tokens each
  UseElasticPair(o);
  auto stack = launcher::LocalStack::Start(o);
  INFO(stack.status());
  REQUIRE(stack.ok());
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  for (size_t c = 0; c < want.size(); ++c) {
    INFO(Reference().cases[c].name);
    REQUIRE(want[c].size() == kTokens);
    mmserve::v1::GenerateRequest r = RawRequest(0, Reference().cases[c]);
    r.mutable_raw()->set_text(text);
    const Answer a = AskGrpc(*stub, r, {});
    INFO(a.status);
    REQUIRE(a.status.ok());
    CHECK(a.token_ids == want[c]);
  }
  CHECK(ScrapeMetric((*stack)->router().metrics_port(), "mmserve_router_elastic_requests_total",
                     "degree=\"2\"") == static_cast<double>(want.size()));
  CheckConstrainedPrompt(**stack, text);
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

}  // namespace
}  // namespace mmserve::testing
