#include "router/tool_request.h"

#include <nlohmann/json.hpp>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace mmserve::router {
namespace {

using mmserve::v1::Chat;
using mmserve::v1::ToolChoice;

absl::Status FieldError(absl::string_view field, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", reason));
}

// Field names as the front end spells them.
struct Names {
  ToolFieldNames style;
  std::string Chat(absl::string_view field) const {
    return style == ToolFieldNames::kProto ? absl::StrCat("chat.", field) : std::string(field);
  }
  std::string Tool(int t, absl::string_view field) const {
    return Chat(absl::StrCat("tools[", t, "].function.", field));
  }
  std::string Message(int i, absl::string_view field) const {
    return Chat(absl::StrCat("messages[", i, "].", field));
  }
  std::string Call(int i, int c, absl::string_view field) const {
    return Message(i, absl::StrCat("tool_calls[", c, "].",
                                   style == ToolFieldNames::kOpenAi ? "function." : "", field));
  }
  std::string Choice() const {
    return Chat(style == ToolFieldNames::kOpenAi ? "tool_choice" : "tool_choice.function_name");
  }
};

bool IsJsonObject(const std::string& text) {
  auto v = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return !v.is_discarded() && v.is_object();
}

absl::Status ValidateTools(const Chat& chat, const Names& names) {
  if (chat.tools_size() > kMaxTools) {
    return FieldError(names.Chat("tools"), absl::StrCat("at most ", kMaxTools, " tools"));
  }
  absl::flat_hash_set<std::string> seen;
  for (int t = 0; t < chat.tools_size(); ++t) {
    const mmserve::v1::FunctionDefinition& f = chat.tools(t).function();
    if (!IsToolName(f.name())) {
      return FieldError(
          names.Tool(t, "name"),
          absl::StrCat("\"", f.name(), "\" is not 1 to 64 of a-z, A-Z, 0-9, _ and -"));
    }
    if (!seen.insert(f.name()).second) {
      return FieldError(names.Tool(t, "name"), absl::StrCat("\"", f.name(), "\" is given twice"));
    }
    if (!f.parameters().empty() && !IsJsonObject(f.parameters())) {
      return FieldError(names.Tool(t, "parameters"), "must be a JSON schema object");
    }
  }
  const ToolChoice& choice = chat.tool_choice();
  if (choice.has_function_name()) {
    if (seen.count(choice.function_name()) == 0) {
      return FieldError(names.Choice(),
                        absl::StrCat("\"", choice.function_name(), "\" is not one of the tools"));
    }
  } else if (choice.mode() == ToolChoice::MODE_REQUIRED && chat.tools_size() == 0) {
    return FieldError(names.Chat("tool_choice"), "\"required\" needs tools");
  } else if (!ToolChoice::Mode_IsValid(choice.mode())) {
    return FieldError(names.Chat("tool_choice"), "unknown mode");
  }
  return absl::OkStatus();
}

absl::Status ValidateMessages(const Chat& chat, const Names& names) {
  absl::flat_hash_set<std::string> call_ids;
  for (int i = 0; i < chat.messages_size(); ++i) {
    const mmserve::v1::ChatMessage& m = chat.messages(i);
    if (m.tool_calls_size() > 0 && m.role() != "assistant") {
      return FieldError(names.Message(i, "tool_calls"), "only assistant messages make tool calls");
    }
    for (int c = 0; c < m.tool_calls_size(); ++c) {
      const mmserve::v1::ToolCall& call = m.tool_calls(c);
      if (call.id().empty())
        return FieldError(names.Message(i, absl::StrCat("tool_calls[", c, "].id")), "missing");
      if (!call_ids.insert(call.id()).second) {
        return FieldError(names.Message(i, absl::StrCat("tool_calls[", c, "].id")),
                          absl::StrCat("\"", call.id(), "\" is used by an earlier call"));
      }
      if (call.name().empty()) return FieldError(names.Call(i, c, "name"), "missing");
      if (!IsJsonObject(call.arguments())) {
        return FieldError(names.Call(i, c, "arguments"), "must be the JSON text of an object");
      }
    }
    if (m.role() != "tool") {
      if (!m.tool_call_id().empty()) {
        return FieldError(names.Message(i, "tool_call_id"), "only tool messages answer a call");
      }
      continue;
    }
    if (m.tool_call_id().empty()) return FieldError(names.Message(i, "tool_call_id"), "missing");
    if (call_ids.count(m.tool_call_id()) == 0) {
      return FieldError(names.Message(i, "tool_call_id"),
                        absl::StrCat("\"", m.tool_call_id(),
                                     "\" is not the id of an earlier assistant tool call"));
    }
    for (const mmserve::v1::ContentPart& p : m.content()) {
      if (!p.has_text())
        return FieldError(names.Message(i, "content"), "a tool result is text only");
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsToolName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-') return false;
  }
  return true;
}

absl::Status ValidateToolUse(const Chat& chat, ToolFieldNames style) {
  const Names names{style};
  if (absl::Status s = ValidateTools(chat, names); !s.ok()) return s;
  return ValidateMessages(chat, names);
}

ToolChoice::Mode EffectiveToolMode(const Chat& chat) {
  if (chat.tool_choice().has_function_name()) return ToolChoice::MODE_REQUIRED;
  const ToolChoice::Mode mode = chat.tool_choice().mode();
  if (mode != ToolChoice::MODE_UNSPECIFIED) return mode;
  return chat.tools_size() > 0 ? ToolChoice::MODE_AUTO : ToolChoice::MODE_NONE;
}

bool ToolCallsParsed(const mmserve::v1::GenerateRequest& request) {
  return request.has_chat() && request.chat().tools_size() > 0 &&
         EffectiveToolMode(request.chat()) != ToolChoice::MODE_NONE;
}

std::vector<std::string> ToolNames(const Chat& chat) {
  std::vector<std::string> names;
  for (const mmserve::v1::Tool& t : chat.tools()) names.push_back(t.function().name());
  return names;
}

}  // namespace mmserve::router
