// response_format and vLLM's guided_* fields as SamplingParams.constraint,
// on /v1/chat/completions and /v1/completions, and their refusals.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "router/openai.h"
#include "router/openai_completions.h"

namespace mmserve::router {
namespace {

using json = nlohmann::json;

OpenAiLimits Limits() {
  OpenAiLimits limits;
  limits.max_body_bytes = 1 << 20;
  return limits;
}

json Chat() { return {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}; }

absl::StatusOr<mmserve::v1::SamplingParams> Parse(const std::string& body) {
  auto r = ParseChatCompletionRequest(body, Limits());
  if (!r.ok()) return r.status();
  return r->request.sampling();
}

absl::StatusOr<mmserve::v1::SamplingParams> Parse(const json& body) { return Parse(body.dump()); }

std::string Refusal(const json& body) {
  auto r = Parse(body);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST_CASE("response_format json_schema keeps the schema's key order and strict") {
  // Keys deliberately not in sorted order: the output follows this order.
  const std::string schema =
      R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}},)"
      R"("required":["zeta","alpha"],"additionalProperties":false})";
  const std::string body =
      R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema",)"
      R"("json_schema":{"name":"pair","strict":true,"schema":)" +
      schema + "}}}";
  auto s = Parse(body);
  REQUIRE(s.ok());
  REQUIRE(s->has_constraint());
  CHECK(s->constraint().json_schema() == schema);
  CHECK(s->constraint().strict());
}

TEST_CASE("response_format text, json_object, and json_schema without a schema") {
  json body = Chat();
  body["response_format"] = {{"type", "text"}};
  CHECK_FALSE(Parse(body)->has_constraint());
  body["response_format"] = {{"type", "json_object"}};
  CHECK(Parse(body)->constraint().json_object());
  body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "any"}}}};
  CHECK(Parse(body)->constraint().json_object());
}

TEST_CASE("vLLM's guided_json (object or text), guided_regex and guided_grammar") {
  json body = Chat();
  body["guided_json"] = {{"type", "object"}};
  CHECK(Parse(body)->constraint().json_schema() == R"({"type":"object"})");
  body["guided_json"] = R"({"type": "array"})";
  CHECK(Parse(body)->constraint().json_schema() == R"({"type": "array"})");
  body = Chat();
  body["guided_regex"] = "[0-9]{3}";
  CHECK(Parse(body)->constraint().regex() == "[0-9]{3}");
  body = Chat();
  body["guided_grammar"] = "root ::= \"yes\" | \"no\"";
  CHECK(Parse(body)->constraint().grammar() == "root ::= \"yes\" | \"no\"");
}

TEST_CASE("bad constraints are refused naming the field and the reason") {
  auto with = [](const char* key, const json& value) {
    json body = Chat();
    body[key] = value;
    return body;
  };
  const json schema_with = {
      {"type", "json_schema"},
      {"json_schema",
       {{"name", "x"}, {"schema", {{"type", "object"}, {"patternProperties", {}}}}}}};
  CHECK(Refusal(with("response_format", schema_with))
            .rfind("response_format.json_schema.schema: ", 0) == 0);
  CHECK(Refusal(with("response_format", schema_with)).find("patternProperties") !=
        std::string::npos);
  CHECK(Refusal(with("response_format", "json")) == "response_format: must be an object");
  CHECK(Refusal(with("response_format", {{"type", "yaml"}})).rfind("response_format.type: ", 0) ==
        0);
  CHECK(Refusal(with("response_format", {{"type", "json_schema"}})) ==
        "response_format.json_schema: missing");
  CHECK(Refusal(with("response_format",
                     {{"type", "json_schema"}, {"json_schema", {{"schema", json::object()}}}})) ==
        "response_format.json_schema.name: missing");
  CHECK(Refusal(with("response_format",
                     {{"type", "json_schema"}, {"json_schema", {{"name", "has space"}}}}))
            .rfind("response_format.json_schema.name: must be", 0) == 0);
  CHECK(Refusal(with("response_format",
                     {{"type", "json_schema"},
                      {"json_schema",
                       {{"name", "x"}, {"schema", {{"type", "object"}}}, {"strict", "yes"}}}})) ==
        "response_format.json_schema.strict: must be a boolean");
  CHECK(Refusal(with("guided_regex", "(ab")).rfind("guided_regex: ", 0) == 0);
  CHECK(Refusal(with("guided_grammar", "root ::= nothing_here")).rfind("guided_grammar: ", 0) == 0);
  CHECK(Refusal(with("guided_json", 5)).rfind("guided_json: must be a JSON schema", 0) == 0);
  json two = with("guided_regex", "[a-z]+");
  two["response_format"] = {{"type", "json_object"}};
  CHECK(Refusal(two) == "guided_regex: give one output constraint; response_format is given too");
}

TEST_CASE("/v1/completions takes the same fields") {
  json body = {{"prompt", "Answer:"}, {"response_format", {{"type", "json_object"}}}};
  auto r = ParseCompletionRequest(body.dump(), Limits());
  REQUIRE(r.ok());
  CHECK(r->request.sampling().constraint().json_object());
  body["guided_regex"] = "x";
  CHECK(ParseCompletionRequest(body.dump(), Limits()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mmserve::router
