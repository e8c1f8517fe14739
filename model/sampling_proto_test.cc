#include "model/sampling_proto.h"

#include <catch2/catch.hpp>

namespace mmserve::model {
namespace {

ModelConfig Config() {
  ModelConfig c;
  c.text.vocab_size = 100;
  c.generation.temperature = 0.5f;
  c.generation.top_k = 7;
  return c;
}

void AddBias(mmserve::v1::SamplingParams& in, uint32_t token, float bias) {
  mmserve::v1::LogitBias* b = in.add_logit_bias();
  b->set_token_id(token);
  b->set_bias(bias);
}

TEST_CASE("unset fields take generation_config defaults, then the documented ones") {
  bool to_context = false;
  auto p = SamplingFromProto(mmserve::v1::SamplingParams(), Config(), 64, &to_context);
  REQUIRE(p.ok());
  CHECK(p->temperature == 0.5f);
  CHECK(p->top_k == 7);
  CHECK(p->top_p == 1.0f);
  CHECK(p->min_p == 0.0f);
  CHECK(p->logprobs == -1);
  CHECK(p->skip_special_tokens);
  CHECK(to_context);
  CHECK(p->max_tokens == 64);
}

TEST_CASE("set fields are kept, including zero temperature and an explicit seed") {
  mmserve::v1::SamplingParams in;
  in.set_temperature(0);
  in.set_seed(42);
  in.set_max_tokens(8);
  in.add_stop("\n");
  in.add_stop_token_ids(5);
  in.set_logprobs(3);
  in.set_skip_special_tokens(false);
  bool to_context = true;
  auto p = SamplingFromProto(in, Config(), 64, &to_context);
  REQUIRE(p.ok());
  CHECK(p->greedy());
  CHECK(p->seed == 42);
  CHECK(p->max_tokens == 8);
  CHECK_FALSE(to_context);
  CHECK(p->stop == std::vector<std::string>{"\n"});
  CHECK(p->stop_token_ids == std::vector<int32_t>{5});
  CHECK(p->logprobs == 3);
  CHECK_FALSE(p->skip_special_tokens);
}

TEST_CASE("out-of-range values are refused with the field's name, never clamped") {
  auto refuse = [](auto set, const char* field) {
    mmserve::v1::SamplingParams in;
    set(in);
    bool to_context = false;
    auto p = SamplingFromProto(in, Config(), 64, &to_context);
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(p.status().message().find(field) != absl::string_view::npos);
  };
  refuse([](auto& in) { in.set_temperature(-1); }, "temperature");
  refuse([](auto& in) { in.set_temperature(std::numeric_limits<float>::quiet_NaN()); },
         "temperature");
  refuse([](auto& in) { in.set_top_p(0); }, "top_p");
  refuse([](auto& in) { in.set_top_p(1.5f); }, "top_p");
  refuse([](auto& in) { in.set_top_k(-2); }, "top_k");
  refuse([](auto& in) { in.set_min_p(2); }, "min_p");
  refuse([](auto& in) { in.set_max_tokens(0); }, "max_tokens");
  refuse([](auto& in) { in.set_max_tokens(65); }, "max_tokens");
  refuse([](auto& in) { in.set_logprobs(21); }, "logprobs");
  refuse([](auto& in) { in.add_stop_token_ids(100); }, "stop_token_ids");
  refuse([](auto& in) { in.add_stop(""); }, "stop");
  refuse([](auto& in) { in.set_presence_penalty(-2.5f); }, "presence_penalty");
  refuse([](auto& in) { in.set_frequency_penalty(3); }, "frequency_penalty");
  refuse([](auto& in) { in.set_repetition_penalty(0); }, "repetition_penalty");
  refuse([](auto& in) { in.set_repetition_penalty(-1); }, "repetition_penalty");
  refuse([](auto& in) { AddBias(in, 100, 1); }, "logit_bias: token 100");
  refuse([](auto& in) { AddBias(in, 3, -100.5f); }, "logit_bias");
  refuse(
      [](auto& in) {
        AddBias(in, 3, 1);
        AddBias(in, 3, 2);
      },
      "logit_bias: token 3 appears more than once");
  refuse(
      [](auto& in) {
        in.set_max_tokens(4);
        in.set_min_tokens(5);
      },
      "min_tokens");
}

TEST_CASE("penalties and logit_bias reach the sampler, the bias sorted by token") {
  mmserve::v1::SamplingParams in;
  in.set_presence_penalty(0.5f);
  in.set_frequency_penalty(-1.0f);
  in.set_repetition_penalty(1.2f);
  AddBias(in, 42, -100);
  AddBias(in, 7, 3.5f);
  AddBias(in, 99, 100);
  bool to_context = false;
  auto p = SamplingFromProto(in, Config(), 64, &to_context);
  REQUIRE(p.ok());
  CHECK(p->presence_penalty == 0.5f);
  CHECK(p->frequency_penalty == -1.0f);
  CHECK(p->repetition_penalty == 1.2f);
  REQUIRE(p->logit_bias.size() == 3);
  CHECK(p->logit_bias[0].token == 7);
  CHECK(p->logit_bias[0].bias == 3.5f);
  CHECK(p->logit_bias[1].token == 42);
  CHECK(p->logit_bias[2].token == 99);
  CHECK(p->processes_logits());
}

TEST_CASE("generation_config's repetition_penalty is not a default") {
  ModelConfig c = Config();
  c.generation.repetition_penalty = 1.05f;
  bool to_context = false;
  auto p = SamplingFromProto(mmserve::v1::SamplingParams(), c, 64, &to_context);
  REQUIRE(p.ok());
  CHECK(p->repetition_penalty == 1.0f);
  CHECK_FALSE(p->processes_logits());
}

TEST_CASE("a constraint is carried as a grammar spec and parsed, not compiled") {
  using Kind = grammar::ConstraintSpec::Kind;
  auto convert = [](const mmserve::v1::OutputConstraint& c) {
    mmserve::v1::SamplingParams in;
    *in.mutable_constraint() = c;
    bool to_context = false;
    return SamplingFromProto(in, Config(), 64, &to_context);
  };
  mmserve::v1::OutputConstraint c;
  c.set_json_schema(R"({"type": "object", "properties": {"a": {"type": "integer"}}})");
  c.set_strict(true);
  auto p = convert(c);
  REQUIRE(p.ok());
  REQUIRE(p->constraint.has_value());
  CHECK(p->constraint->kind == Kind::kJsonSchema);
  CHECK(p->constraint->text == c.json_schema());
  CHECK(p->constraint->strict);
  c.Clear();
  c.set_json_object(true);
  REQUIRE(convert(c).ok());
  CHECK(convert(c)->constraint->kind == Kind::kJsonObject);
  c.set_regex("[0-9]+");
  CHECK(convert(c)->constraint->kind == Kind::kRegex);
  c.set_grammar("root ::= \"yes\" | \"no\"");
  CHECK(convert(c)->constraint->kind == Kind::kEbnf);
  bool to_context = false;
  CHECK_FALSE(SamplingFromProto({}, Config(), 64, &to_context)->constraint.has_value());

  auto refused = [&](const mmserve::v1::OutputConstraint& bad, const std::string& reason) {
    auto r = convert(bad);
    INFO(r.status().ToString());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(r.status().message().find(reason) == 0);
  };
  mmserve::v1::OutputConstraint bad;
  refused(bad, "constraint: set one of");
  bad.set_json_object(false);
  refused(bad, "constraint.json_object must be true");
  bad.set_regex("(ab");
  refused(bad, "constraint.regex: ");
  bad.set_strict(true);
  refused(bad, "constraint.strict applies to json_schema only");
  bad.Clear();
  bad.set_json_schema(R"({"type": "object", "patternProperties": {}})");
  refused(bad, "constraint.json_schema: ");
  bad.set_grammar("root ::= undefined_rule");
  refused(bad, "constraint.grammar: ");

  mmserve::v1::SamplingParams in;
  in.mutable_constraint()->set_json_object(true);
  in.set_ignore_eos(true);
  auto r = SamplingFromProto(in, Config(), 64, &to_context);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("ignore_eos cannot be combined with a constraint") == 0);
}

}  // namespace
}  // namespace mmserve::model
