#include "tests/stack_constrained.h"

#include <httplib.h>

#include <catch2/catch.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_server.h"
#include "tests/stack_harness.h"
#include "worker/engine.h"

namespace mmserve::testing {
namespace {

using json = nlohmann::json;

constexpr int kMaxTokens = 64;
constexpr int kPrompts = 3;

// Outputs of at most a few dozen tokens, so max_tokens never cuts one.
const char kColorSchema[] =
    R"({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
    "count": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["color", "count"], "additionalProperties": false})";
const char kShapeSchema[] =
    R"({"type": "object", "properties": {"shapes": {"type": "array", "maxItems": 3,
    "items": {"enum": ["circle", "square", "star"]}}, "big": {"type": "boolean"}},
    "required": ["shapes", "big"], "additionalProperties": false})";

bool Valid(const json& v, const std::string& schema) {
  if (!v.is_object()) return false;
  if (schema == kColorSchema) {
    return v.size() == 2 && v.contains("color") && v["color"].is_string() &&
           (v["color"] == "red" || v["color"] == "green" || v["color"] == "blue") &&
           v.contains("count") && v["count"].is_number_integer() && v["count"] >= 0 &&
           v["count"] <= 9;
  }
  if (!(v.size() == 2 && v.contains("shapes") && v["shapes"].is_array() &&
        v["shapes"].size() <= 3 && v.contains("big") && v["big"].is_boolean())) {
    return false;
  }
  for (const json& s : v["shapes"]) {
    if (s != "circle" && s != "square" && s != "star") return false;
  }
  return true;
}

struct Case {
  const char* name;
  const char* schema;
  float temperature;
  uint64_t seed;
};

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {"greedy, colour schema", kColorSchema, 0, 0},
      {"seed 7, temperature 0.9, shape schema", kShapeSchema, 0.9f, 7}};
  return cases;
}

std::string PromptText(int i) {
  return absl::StrCat("Question: ", Demo().items[i].question, "\nAnswer:");
}

void SetProto(const Case& c, mmserve::v1::SamplingParams* s) {
  s->set_temperature(c.temperature);
  s->set_seed(c.seed);
  s->set_max_tokens(kMaxTokens);
  s->mutable_constraint()->set_json_schema(c.schema);
}

mmserve::v1::GenerateRequest RawRequest(const std::string& text, const Case& c) {
  mmserve::v1::GenerateRequest r;
  r.mutable_raw()->set_text(text);
  SetProto(c, r.mutable_sampling());
  r.mutable_stream()->set_include_token_ids(true);
  return r;
}

// The in-process engine's tokens for each of `texts` under `c`.
std::vector<std::vector<int32_t>> InProcess(const std::vector<std::string>& texts, const Case& c) {
  worker::EngineOptions options;
  options.model_dir = DemoModelDir();
  options.kv_cache_bytes = int64_t{16} << 20;  // a whole 3k-token prompt fits
  auto engine = worker::LlmEngine::Create(options);
  REQUIRE(engine.ok());
  std::vector<std::vector<int32_t>> out(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    worker::EngineRequest r;
    r.id = absl::StrCat(i);
    r.prompt = texts[i];
    r.sampling.temperature = c.temperature;
    r.sampling.seed = c.seed;
    r.sampling.max_tokens = kMaxTokens;
    r.sampling.constraint =
        grammar::ConstraintSpec{grammar::ConstraintSpec::Kind::kJsonSchema, c.schema};
    std::vector<int32_t>* ids = &out[i];
    REQUIRE((*engine)
                ->AddRequest(std::move(r),
                             [ids](const worker::StreamEvent& e) {
                               REQUIRE(e.error.ok());
                               ids->insert(ids->end(), e.token_ids.begin(), e.token_ids.end());
                             })
                .ok());
  }
  while ((*engine)->has_unfinished()) REQUIRE((*engine)->Step().ok());
  return out;
}

// [case][prompt], computed once.
const std::vector<std::vector<std::vector<int32_t>>>& ConstrainedReference() {
  static const auto* ids = [] {
    auto* out = new std::vector<std::vector<std::vector<int32_t>>>;
    std::vector<std::string> texts;
    for (int i = 0; i < kPrompts; ++i) texts.push_back(PromptText(i));
    for (const Case& c : Cases()) out->push_back(InProcess(texts, c));
    return out;
  }();
  return *ids;
}

std::pair<int, json> PostChat(int port, const nlohmann::ordered_json& body) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  auto res = cli.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(res);
  return {res->status, json::parse(res->body, nullptr, false)};
}

// Ordered: the schema's properties keep their order (the output's).
nlohmann::ordered_json HttpBody(int i, const Case& c) {
  nlohmann::ordered_json body;
  body["messages"] = {{{"role", "user"}, {"content", Demo().items[i].question}}};
  body["temperature"] = c.temperature;
  body["seed"] = c.seed;
  body["max_completion_tokens"] = kMaxTokens;
  body["response_format"] = {{"type", "json_schema"},
                             {"json_schema",
                              {{"name", "answer"},
                               {"schema", nlohmann::ordered_json::parse(c.schema)},
                               {"strict", true}}}};
  return body;
}

}  // namespace

void CheckConstrainedOutput(launcher::LocalStack& stack, bool refusals) {
  const auto& want = ConstrainedReference();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  for (size_t c = 0; c < Cases().size(); ++c) {
    const Case& k = Cases()[c];
    std::vector<Answer> got(kPrompts);
    ParallelFor(kPrompts, kPrompts,
                [&](int i) { got[i] = AskGrpc(*stub, RawRequest(PromptText(i), k), {}); });
    for (int i = 0; i < kPrompts; ++i) {
      INFO(k.name << ", raw prompt " << i << ": " << got[i].status << " " << got[i].text);
      REQUIRE(got[i].status.ok());
      CHECK(got[i].token_ids == want[c][i]);
      CHECK(Valid(json::parse(got[i].text, nullptr, false), k.schema));
    }
    // A chat over gRPC and over HTTP's response_format: one text.
    for (int i = 0; i < 2; ++i) {
      AskOptions o;
      mmserve::v1::GenerateRequest chat = DemoTextRequest(Demo().items[i], o);
      chat.clear_sampling();
      SetProto(k, chat.mutable_sampling());
      chat.mutable_sampling()->mutable_constraint()->set_strict(true);
      const Answer grpc = AskGrpc(*stub, chat, o);
      REQUIRE(grpc.status.ok());
      const auto [status, reply] = PostChat(stack.http_port(), HttpBody(i, k));
      INFO(k.name << ", chat " << i << ": " << reply.dump());
      REQUIRE(status == 200);
      CHECK(reply["choices"][0]["message"]["content"] == grpc.text);
      CHECK(reply["choices"][0]["finish_reason"] == "stop");
      CHECK(Valid(json::parse(grpc.text, nullptr, false), k.schema));
    }
  }
  if (!refusals) return;
  nlohmann::ordered_json bad = HttpBody(0, Cases()[0]);
  bad["response_format"]["json_schema"]["schema"] = {{"type", "object"},
                                                     {"patternProperties", {{"a", {}}}}};
  const auto [status, reply] = PostChat(stack.http_port(), bad);
  INFO(reply.dump());
  CHECK(status == 400);
  const std::string message = reply["error"]["message"].get<std::string>();
  CHECK(message.rfind("response_format.json_schema.schema: ", 0) == 0);
  CHECK(message.find("patternProperties") != std::string::npos);
  nlohmann::ordered_json two = HttpBody(0, Cases()[0]);
  two["guided_regex"] = "[a-z]+";
  const auto [two_status, two_reply] = PostChat(stack.http_port(), two);
  CHECK(two_status == 400);
  CHECK(two_reply["error"]["message"].get<std::string>().rfind("guided_regex: ", 0) == 0);
  mmserve::v1::GenerateRequest r = RawRequest(PromptText(0), Cases()[0]);
  r.mutable_sampling()->mutable_constraint()->set_json_schema("{\"type\": \"object\"");
  const Answer a = AskGrpc(*stub, r, {});
  CHECK(a.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(a.status.message().find("constraint.json_schema: ") != absl::string_view::npos);
}

void CheckConstrainedPrompt(launcher::LocalStack& stack, const std::string& text) {
  const Case& k = Cases()[0];
  const std::vector<int32_t> want = InProcess({text}, k)[0];
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  const Answer a = AskGrpc(*stub, RawRequest(text, k), {});
  INFO(a.status << " " << a.text);
  REQUIRE(a.status.ok());
  CHECK(a.token_ids == want);
  CHECK(Valid(json::parse(a.text, nullptr, false), k.schema));
}

}  // namespace mmserve::testing
