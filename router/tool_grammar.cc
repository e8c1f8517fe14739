#include "router/tool_grammar.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grammar/grammar.h"
#include "router/tool_request.h"

namespace mmserve::router {
namespace {

using mmserve::v1::Chat;

// `text` as an EBNF string literal.
std::string Literal(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Rules "call<t> ::= <tool_call>... " for tool t and its arguments' rules
// (prefixed "tool<t>_").
absl::StatusOr<std::string> CallRules(const Chat& chat, int t) {
  const mmserve::v1::FunctionDefinition& f = chat.tools(t).function();
  const std::string prefix = absl::StrCat("tool", t, "_");
  const std::string schema = f.parameters().empty() ? "{\"type\": \"object\"}" : f.parameters();
  absl::StatusOr<std::string> args =
      grammar::JsonSchemaToEbnf(schema, prefix, /*any_whitespace=*/false);
  if (!args.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tools[", t, "].function.parameters: ", args.status().message()));
  }
  return absl::StrCat(
      "call", t,
      " ::= ", Literal(absl::StrCat("<tool_call>\n{\"name\": \"", f.name(), "\", \"arguments\": ")),
      " ", prefix, "root ", Literal("}\n</tool_call>"), "\n", *args, "\n");
}

}  // namespace

absl::StatusOr<std::string> ToolChoiceGrammar(const Chat& chat) {
  std::vector<int> tools;
  for (int t = 0; t < chat.tools_size(); ++t) {
    if (!chat.tool_choice().has_function_name() ||
        chat.tools(t).function().name() == chat.tool_choice().function_name()) {
      tools.push_back(t);
    }
  }
  if (tools.empty()) return absl::InvalidArgumentError("tool_choice: no tool to call");
  std::string rules;
  std::vector<std::string> alternatives;
  for (int t : tools) {
    absl::StatusOr<std::string> call = CallRules(chat, t);
    if (!call.ok()) return call.status();
    rules += *call;
    alternatives.push_back(absl::StrCat("call", t));
  }
  const bool several = !chat.tool_choice().has_function_name() &&
                       (!chat.has_parallel_tool_calls() || chat.parallel_tool_calls());
  std::string root = absl::StrCat("call ::= ", absl::StrJoin(alternatives, " | "), "\n");
  absl::StrAppend(&root, several ? "root ::= call (\"\\n\" call)*\n" : "root ::= call\n");
  return root + rules;
}

absl::Status ApplyToolChoice(mmserve::v1::GenerateRequest* request) {
  if (!request->has_chat() || request->chat().tools_size() == 0 ||
      EffectiveToolMode(request->chat()) != mmserve::v1::ToolChoice::MODE_REQUIRED) {
    return absl::OkStatus();
  }
  if (request->sampling().has_constraint()) {
    return absl::InvalidArgumentError(
        "tool_choice: \"required\" or a named function constrains the output itself; it cannot "
        "be combined with response_format or another output constraint");
  }
  absl::StatusOr<std::string> grammar = ToolChoiceGrammar(request->chat());
  if (!grammar.ok()) return grammar.status();
  request->mutable_sampling()->mutable_constraint()->set_grammar(*std::move(grammar));
  return absl::OkStatus();
}

}  // namespace mmserve::router
