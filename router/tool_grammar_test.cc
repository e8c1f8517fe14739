#include "router/tool_grammar.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace mmserve::router {
namespace {

constexpr char kShapes[] =
    R"({"type": "object", "properties": {"shape": {"type": "string", "enum": ["circle", )"
    R"("square"]}, "count": {"type": "integer"}}, "required": ["shape", "count"], )"
    R"("additionalProperties": false})";

mmserve::v1::Chat ToolChat() {
  mmserve::v1::Chat chat;
  chat.add_messages()->set_role("user");
  mmserve::v1::FunctionDefinition* shapes = chat.add_tools()->mutable_function();
  shapes->set_name("count_shapes");
  shapes->set_parameters(kShapes);
  chat.add_tools()->mutable_function()->set_name("get_time");  // no parameters
  return chat;
}

// A vocabulary of the printable ASCII characters and "\n" (one token each),
// two multi-byte tokens, and eos last.
std::shared_ptr<const grammar::Vocabulary> CharVocabulary() {
  std::vector<std::string> tokens = {"\n"};
  for (char c = ' '; c <= '~'; ++c) tokens.push_back(std::string(1, c));
  tokens.push_back("<tool_call>");
  tokens.push_back("\"circle\"");
  tokens.push_back("");  // eos
  const int32_t eos = static_cast<int32_t>(tokens.size()) - 1;
  return std::make_shared<const grammar::Vocabulary>(tokens, std::vector<bool>(tokens.size()),
                                                     std::vector<int32_t>{eos});
}

// Whether the grammar accepts `output` whole.
bool Accepts(const std::string& ebnf, const std::string& output) {
  auto compiled = grammar::Compile({grammar::ConstraintSpec::Kind::kEbnf, ebnf}, CharVocabulary());
  INFO(compiled.status());
  REQUIRE(compiled.ok());
  grammar::Matcher m(*compiled);
  return m.AcceptBytes(output) && m.CanTerminate();
}

std::string Call(const std::string& name, const std::string& args) {
  return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>";
}

const std::string kGood = Call("count_shapes", R"({"shape": "circle", "count": 3})");
const std::string kTime = Call("get_time", "{}");

TEST_CASE("a named function's grammar takes exactly one well-formed call of it", "[tool_grammar]") {
  mmserve::v1::Chat chat = ToolChat();
  chat.mutable_tool_choice()->set_function_name("count_shapes");
  auto ebnf = ToolChoiceGrammar(chat);
  INFO(ebnf.status());
  REQUIRE(ebnf.ok());
  INFO(*ebnf);
  CHECK(grammar::Validate({grammar::ConstraintSpec::Kind::kEbnf, *ebnf}).ok());
  CHECK(Accepts(*ebnf, kGood));
  CHECK(Accepts(*ebnf, Call("count_shapes", R"({"shape": "square", "count": -10})")));
  // Properties come in the schema's order (as with vLLM's grammar backends).
  CHECK_FALSE(Accepts(*ebnf, Call("count_shapes", R"({"count": 10, "shape": "square"})")));
  CHECK_FALSE(Accepts(*ebnf, kTime));                 // another tool
  CHECK_FALSE(Accepts(*ebnf, kGood + "\n" + kGood));  // a second call
  CHECK_FALSE(Accepts(*ebnf, Call("count_shapes", R"({"shape": "star", "count": 3})")));
  CHECK_FALSE(Accepts(*ebnf, Call("count_shapes", R"({"shape": "circle"})")));
  CHECK_FALSE(Accepts(*ebnf, Call("count_shapes", R"({"shape":"circle","count":3})")));
  CHECK_FALSE(Accepts(*ebnf, "Sure! " + kGood));
  CHECK_FALSE(Accepts(*ebnf, kGood.substr(0, kGood.size() - 1)));  // unfinished
}

TEST_CASE("a required choice takes calls of any tool, several only when parallel",
          "[tool_grammar]") {
  mmserve::v1::Chat chat = ToolChat();
  chat.mutable_tool_choice()->set_mode(mmserve::v1::ToolChoice::MODE_REQUIRED);
  auto parallel = ToolChoiceGrammar(chat);
  REQUIRE(parallel.ok());
  CHECK(Accepts(*parallel, kGood));
  CHECK(Accepts(*parallel, kTime));
  CHECK(Accepts(*parallel, kTime + "\n" + kGood + "\n" + kTime));
  CHECK(Accepts(*parallel, Call("get_time", R"({"tz": "UTC"})")));  // any object
  CHECK_FALSE(Accepts(*parallel, Call("get_time", "[]")));
  CHECK_FALSE(Accepts(*parallel, Call("other", "{}")));
  CHECK_FALSE(Accepts(*parallel, ""));
  chat.set_parallel_tool_calls(false);
  auto one = ToolChoiceGrammar(chat);
  REQUIRE(one.ok());
  CHECK(Accepts(*one, kTime));
  CHECK_FALSE(Accepts(*one, kTime + "\n" + kGood));
}

TEST_CASE("token by token, the mask lets only the call through", "[tool_grammar]") {
  mmserve::v1::Chat chat = ToolChat();
  chat.mutable_tool_choice()->set_function_name("count_shapes");
  auto ebnf = ToolChoiceGrammar(chat);
  REQUIRE(ebnf.ok());
  auto vocab = CharVocabulary();
  auto compiled = grammar::Compile({grammar::ConstraintSpec::Kind::kEbnf, *ebnf}, vocab);
  REQUIRE(compiled.ok());
  grammar::Matcher m(*compiled);
  std::vector<uint32_t> words(static_cast<size_t>(vocab->mask_words()));
  auto allowed = [&](int32_t t) { return ((words[t / 32] >> (t % 32)) & 1) != 0; };
  m.FillNextTokenBitmask(absl::MakeSpan(words));
  const int32_t lt = 1 + ('<' - ' '), a = 1 + ('a' - ' '), tag = vocab->size() - 3;
  const int32_t eos = vocab->size() - 1;
  CHECK(allowed(lt));
  CHECK(allowed(tag));
  CHECK_FALSE(allowed(a));
  CHECK_FALSE(allowed(eos));
  REQUIRE(m.AcceptToken(tag));
  REQUIRE(m.AcceptBytes("\n{\"name\": \"count_shapes\", \"arguments\": {\"shape\": "));
  m.FillNextTokenBitmask(absl::MakeSpan(words));
  CHECK(allowed(vocab->size() - 2));  // "\"circle\""
  REQUIRE(m.AcceptToken(vocab->size() - 2));
  REQUIRE(m.AcceptBytes(", \"count\": 12}}\n</tool_call>"));
  CHECK(m.CanTerminate());
  m.FillNextTokenBitmask(absl::MakeSpan(words));
  CHECK(allowed(eos));
  CHECK_FALSE(allowed(0));  // "\n": a named choice makes one call
}

TEST_CASE("ApplyToolChoice sets the grammar for required and named choices only",
          "[tool_grammar]") {
  mmserve::v1::GenerateRequest request;
  *request.mutable_chat() = ToolChat();
  REQUIRE(ApplyToolChoice(&request).ok());  // auto: unconstrained
  CHECK_FALSE(request.sampling().has_constraint());
  request.mutable_chat()->mutable_tool_choice()->set_mode(mmserve::v1::ToolChoice::MODE_REQUIRED);
  REQUIRE(ApplyToolChoice(&request).ok());
  CHECK(request.sampling().constraint().grammar() == *ToolChoiceGrammar(request.chat()));
  // A second constraint (response_format) is refused.
  mmserve::v1::GenerateRequest both;
  *both.mutable_chat() = ToolChat();
  both.mutable_chat()->mutable_tool_choice()->set_function_name("get_time");
  both.mutable_sampling()->mutable_constraint()->set_json_object(true);
  const absl::Status s = ApplyToolChoice(&both);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().rfind("tool_choice: \"required\" or a named function constrains", 0) == 0);
  // A schema the converter cannot enforce is refused naming the tool.
  mmserve::v1::GenerateRequest bad;
  *bad.mutable_chat() = ToolChat();
  bad.mutable_chat()->mutable_tool_choice()->set_mode(mmserve::v1::ToolChoice::MODE_REQUIRED);
  bad.mutable_chat()->mutable_tools(0)->mutable_function()->set_parameters(
      R"({"type": "object", "patternProperties": {"^a": {}}})");
  const absl::Status unsupported = ApplyToolChoice(&bad);
  INFO(unsupported);
  CHECK(unsupported.code() == absl::StatusCode::kInvalidArgument);
  CHECK(unsupported.message().rfind("tools[0].function.parameters: ", 0) == 0);
}

}  // namespace
}  // namespace mmserve::router
