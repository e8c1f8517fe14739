// Structured output in the engine, on the demo model (a 1038-token
// byte-level vocabulary whose answers to these prompts are arbitrary, so
// the grammar decides the shape): every output of a schema corpus parses
// and validates (greedy and sampled); a complete output ends with finish
// reason stop; the tokens are the same alone, in a batch of 16 others and
// after preemption; the mask wins over logit_bias; bad constraints and
// ignore_eos are refused.
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grammar/grammar.h"
#include "worker/engine.h"
#include "worker/request_grammar.h"

namespace mmserve::worker {
namespace {

using json = nlohmann::json;
using Kind = grammar::ConstraintSpec::Kind;

constexpr char kDemo[] = "models/shapes-demo";

std::unique_ptr<LlmEngine> MakeEngine(int64_t kv_bytes = 8 << 20, int max_seqs = 32) {
  EngineOptions o;
  o.model_dir = kDemo;
  o.block_size = 4;
  o.max_num_batched_tokens = 256;
  o.max_num_seqs = max_seqs;
  o.kv_cache_bytes = kv_bytes;
  o.num_threads = 1;
  auto e = LlmEngine::Create(o);
  INFO(e.status().ToString());
  REQUIRE(e.ok());
  return std::move(*e);
}

std::string Chat(const std::string& user) {
  return "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" + user +
         "<|im_end|>\n<|im_start|>assistant\n";
}

// Schemas whose every valid output is short (enums, bounded strings and
// arrays), so max_tokens never cuts one.
const std::vector<std::string>& BoundedSchemas() {
  static const std::vector<std::string> schemas = {
      R"({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
          "count": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["color", "count"], "additionalProperties": false})",
      R"({"type": "object", "properties": {
          "shape": {"type": "object", "properties": {"kind": {"enum": ["circle", "square"]},
                    "size": {"enum": ["small", "large"]}},
                    "required": ["kind", "size"], "additionalProperties": false},
          "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                   "maxItems": 3}},
          "required": ["shape", "tags"], "additionalProperties": false})",
      R"({"type": "object", "properties": {"code": {"type": "string",
          "pattern": "^[A-Z]{2}[0-9]{3}$"}}, "required": ["code"],
          "additionalProperties": false})",
      R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "none": {"type": "null"},
          "n": {"type": "integer", "minimum": -5, "maximum": 5}},
          "required": ["ok", "none", "n"], "additionalProperties": false})",
      R"({"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 1, "maxItems": 4})",
  };
  return schemas;
}

// A validator for the keywords the corpus uses (written here, independent
// of the grammar library): type, properties, required,
// additionalProperties false, enum, items, min/maxItems, maxLength,
// pattern, minimum/maximum.
bool Validates(const json& v, const json& s) {
  if (s.contains("enum")) {
    for (const json& e : s["enum"]) {
      if (e == v) return true;
    }
    return false;
  }
  const std::string type = s.value("type", "");
  if (type == "object") {
    if (!v.is_object()) return false;
    for (const json& r : s.value("required", json::array())) {
      if (!v.contains(r.get<std::string>())) return false;
    }
    const json props = s.value("properties", json::object());
    for (const auto& [key, value] : v.items()) {
      if (!props.contains(key)) {
        if (s.value("additionalProperties", true) == false) return false;
        continue;
      }
      if (!Validates(value, props[key])) return false;
    }
    return true;
  }
  if (type == "array") {
    if (!v.is_array()) return false;
    if (v.size() < s.value("minItems", 0u) || v.size() > s.value("maxItems", 1u << 30)) {
      return false;
    }
    for (const json& item : v) {
      if (s.contains("items") && !Validates(item, s["items"])) return false;
    }
    return true;
  }
  if (type == "string") {
    if (!v.is_string()) return false;
    const std::string str = v.get<std::string>();
    if (s.contains("maxLength") && str.size() > s["maxLength"].get<size_t>()) return false;
    if (s.contains("pattern")) {
      std::string p = s["pattern"].get<std::string>();
      if (!p.empty() && p.front() == '^') p.erase(0, 1);
      if (!p.empty() && p.back() == '$') p.pop_back();
      if (!std::regex_match(str, std::regex(p))) return false;
    }
    return true;
  }
  if (type == "integer") {
    if (!v.is_number_integer()) return false;
    const int64_t n = v.get<int64_t>();
    return n >= s.value("minimum", INT64_MIN) && n <= s.value("maximum", INT64_MAX);
  }
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "number") return v.is_number();
  return true;
}

struct Output {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  absl::Status error;
};

StreamCallback Collect(Output* out) {
  return [out](const StreamEvent& e) {
    out->tokens.insert(out->tokens.end(), e.token_ids.begin(), e.token_ids.end());
    out->text += e.text;
    if (e.finish_reason != FinishReason::kNone) {
      out->finish = e.finish_reason;
      out->error = e.error;
    }
  };
}

EngineRequest Constrained(const std::string& id, const std::string& question, Kind kind,
                          const std::string& text, float temperature, uint64_t seed) {
  EngineRequest r;
  r.id = id;
  r.prompt = Chat(question);
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.sampling.max_tokens = 96;
  r.sampling.constraint = grammar::ConstraintSpec{kind, text};
  return r;
}

void RunToEnd(LlmEngine& e) {
  for (int i = 0; e.has_unfinished() && i < 10000; ++i) REQUIRE(e.Step().ok());
  REQUIRE(!e.has_unfinished());
}

// A fresh matcher over the engine's vocabulary accepts every generated
// token (the end token aside, which may come once the output is complete,
// and last) and is finished where the engine stopped without it.
void CheckTokensMatch(const LlmEngine& e, const grammar::ConstraintSpec& spec, const Output& out) {
  static std::shared_ptr<const grammar::Vocabulary> vocab;
  if (vocab == nullptr) {
    vocab = GrammarVocabulary(e.tokenizer(), e.config().text.vocab_size, {});
  }
  auto compiled = grammar::Compile(spec, vocab);
  REQUIRE(compiled.ok());
  grammar::Matcher m(*compiled);
  bool ended = false;  // by the end token
  for (int32_t t : out.tokens) {
    REQUIRE(!ended);
    if (e.tokenizer().IsSpecial(t)) {  // the end: allowed once complete
      CHECK(m.CanTerminate());
      ended = true;
      continue;
    }
    REQUIRE(m.AcceptToken(t));
  }
  if (out.finish == FinishReason::kStop && !ended) CHECK(m.IsFinished());
}

TEST_CASE("every constrained output of the schema corpus parses and validates",
          "[engine][grammar]") {
  auto e = MakeEngine();
  const std::vector<std::string>& schemas = BoundedSchemas();
  std::map<std::string, Output> outs;
  std::map<std::string, size_t> schema_of;
  const char* questions[] = {"What color is the star?", "How many shapes are there?",
                             "Describe the picture."};
  for (size_t k = 0; k < schemas.size(); ++k) {
    for (int q = 0; q < 3; ++q) {
      for (const float temperature : {0.0f, 1.0f}) {
        const std::string id = absl::StrCat("s", k, "q", q, "t", temperature);
        schema_of[id] = k;
        REQUIRE(e->AddRequest(Constrained(id, questions[q], Kind::kJsonSchema, schemas[k],
                                          temperature, 100 + q),
                              Collect(&outs[id]))
                    .ok());
      }
    }
  }
  RunToEnd(*e);
  for (const auto& [id, out] : outs) {
    INFO(id << ": " << out.text);
    REQUIRE(out.error.ok());
    CHECK(out.finish == FinishReason::kStop);
    const json v = json::parse(out.text, nullptr, /*allow_exceptions=*/false);
    REQUIRE(!v.is_discarded());
    CHECK(Validates(v, json::parse(schemas[schema_of[id]])));
    CheckTokensMatch(*e, {Kind::kJsonSchema, schemas[schema_of[id]]}, out);
  }
}

TEST_CASE("unbounded constraints: a stop output is complete, a length one a valid prefix",
          "[engine][grammar]") {
  auto e = MakeEngine();
  const std::vector<std::pair<Kind, std::string>> specs = {
      {Kind::kJsonObject, ""},
      {Kind::kJsonSchema,
       R"({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})"},
      {Kind::kRegex, "(yes|no), [a-z ]+\\."},
      {Kind::kEbnf, "root ::= \"answer: \" word (\" \" word)*\nword ::= [a-z]+"},
  };
  std::vector<Output> outs(specs.size() * 2);
  for (size_t k = 0; k < specs.size(); ++k) {
    for (int t = 0; t < 2; ++t) {
      EngineRequest r = Constrained(absl::StrCat("u", k, "_", t), "What color is the star?",
                                    specs[k].first, specs[k].second, t, 7);
      r.sampling.max_tokens = 24;
      REQUIRE(e->AddRequest(std::move(r), Collect(&outs[k * 2 + t])).ok());
    }
  }
  RunToEnd(*e);
  for (size_t i = 0; i < outs.size(); ++i) {
    const Output& out = outs[i];
    const auto& [kind, text] = specs[i / 2];
    INFO(i << ": " << out.text);
    REQUIRE(out.error.ok());
    REQUIRE((out.finish == FinishReason::kStop || out.finish == FinishReason::kLength));
    CheckTokensMatch(*e, {kind, text}, out);
    if (out.finish == FinishReason::kStop && kind != Kind::kRegex && kind != Kind::kEbnf) {
      CHECK(json::parse(out.text, nullptr, false).is_object());
    }
  }
}

// The same constrained requests alone, then each among 16 others (free and
// constrained, other seeds), then in an engine small enough to preempt.
TEST_CASE("constrained tokens are the same alone, in a batch of 16 others and after preemption",
          "[engine][grammar]") {
  const std::string schema = BoundedSchemas()[1];
  std::vector<EngineRequest> probes;
  for (const float temperature : {0.0f, 0.8f}) {
    probes.push_back(Constrained(absl::StrCat("probe", temperature), "Describe the picture.",
                                 Kind::kJsonSchema, schema, temperature, 42));
  }
  std::vector<Output> alone(probes.size());
  for (size_t i = 0; i < probes.size(); ++i) {
    auto e = MakeEngine();
    REQUIRE(e->AddRequest(probes[i], Collect(&alone[i])).ok());
    RunToEnd(*e);
    REQUIRE(alone[i].finish == FinishReason::kStop);
  }
  auto add_others = [&](LlmEngine& e, std::vector<Output>& others) {
    for (int k = 0; k < 16; ++k) {
      EngineRequest r = Constrained(
          absl::StrCat("other", k), absl::StrCat("Question number ", k, "?"), Kind::kJsonSchema,
          BoundedSchemas()[k % BoundedSchemas().size()], k % 3 == 0 ? 0.0f : 1.0f, k);
      if (k % 4 == 3) r.sampling.constraint.reset();  // free text beside
      r.sampling.max_tokens = 40;
      REQUIRE(e.AddRequest(std::move(r), Collect(&others[k])).ok());
    }
  };
  SECTION("in a batch") {
    auto e = MakeEngine();
    std::vector<Output> others(16), batched(probes.size());
    add_others(*e, others);
    for (size_t i = 0; i < probes.size(); ++i) {
      REQUIRE(e->AddRequest(probes[i], Collect(&batched[i])).ok());
    }
    RunToEnd(*e);
    for (size_t i = 0; i < probes.size(); ++i) {
      CHECK(batched[i].tokens == alone[i].tokens);
      CHECK(batched[i].finish == FinishReason::kStop);
    }
  }
  SECTION("preempted and recomputed") {
    // 40 blocks of 4 tokens for 18 requests of ~30 prompt tokens each:
    // the scheduler preempts and recomputes; the matchers keep their place.
    auto probe = MakeEngine();
    const int64_t block_bytes =
        static_cast<int64_t>(probe->sizing().kv_bytes) / probe->sizing().num_kv_blocks;
    probe.reset();
    auto e = MakeEngine(40 * block_bytes);
    std::vector<Output> others(16), batched(probes.size());
    add_others(*e, others);
    for (size_t i = 0; i < probes.size(); ++i) {
      REQUIRE(e->AddRequest(probes[i], Collect(&batched[i])).ok());
    }
    RunToEnd(*e);
    CHECK(e->scheduler().num_preemptions() >= 1);
    for (size_t i = 0; i < probes.size(); ++i) {
      CHECK(batched[i].tokens == alone[i].tokens);
      CHECK(batched[i].finish == FinishReason::kStop);
    }
    for (const Output& o : others) CHECK(o.error.ok());
  }
}

TEST_CASE("the mask wins over logit_bias; min_tokens does not hold back a complete output",
          "[engine][grammar]") {
  auto e = MakeEngine();
  EngineRequest r = Constrained("biased", "What color is the star?", Kind::kJsonSchema,
                                BoundedSchemas()[0], 0.0f, 1);
  for (int32_t t = 0; t < 200; ++t) r.sampling.logit_bias.push_back({t, 100.0f});
  r.sampling.min_tokens = 90;
  Output out;
  REQUIRE(e->AddRequest(std::move(r), Collect(&out)).ok());
  RunToEnd(*e);
  INFO(out.text);
  CHECK(out.finish == FinishReason::kStop);
  CHECK(out.tokens.size() < 90);
  CHECK(Validates(json::parse(out.text), json::parse(BoundedSchemas()[0])));
}

TEST_CASE("bad constraints and ignore_eos with a constraint are refused", "[engine][grammar]") {
  auto e = MakeEngine();
  auto refused = [&](EngineRequest r, const std::string& reason) {
    Output out;
    const absl::Status s = e->AddRequest(std::move(r), Collect(&out));
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(reason) != std::string::npos);
  };
  refused(Constrained("a", "q", Kind::kJsonSchema, "{\"type\": \"object\"", 0, 0),
          "constraint.json_schema: ");
  refused(Constrained("b", "q", Kind::kRegex, "(ab", 0, 0), "constraint.regex: ");
  refused(Constrained("c", "q", Kind::kEbnf, "root ::= missing", 0, 0), "constraint.grammar: ");
  EngineRequest r = Constrained("d", "q", Kind::kJsonObject, "", 0, 0);
  r.sampling.ignore_eos = true;
  refused(std::move(r), "ignore_eos");
  CHECK(!e->has_unfinished());
}

}  // namespace
}  // namespace mmserve::worker
