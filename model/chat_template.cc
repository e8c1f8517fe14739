#include "model/chat_template.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "model/py_json.h"

namespace mmserve::model {
namespace {

constexpr char kToolsIntro[] =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr char kToolsOutro[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

absl::StatusOr<nlohmann::ordered_json> ParseJson(const std::string& text, absl::string_view what) {
  auto v = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  return v;
}

// The system turn with the "# Tools" block: `system` is the first message's
// text or the default prompt.
absl::StatusOr<std::string> ToolsSystemTurn(const std::string& system,
                                            const std::vector<ChatTool>& tools) {
  std::string out = absl::StrCat("<|im_start|>system\n", system, kToolsIntro);
  for (size_t t = 0; t < tools.size(); ++t) {
    nlohmann::ordered_json function;
    function["name"] = tools[t].name;
    if (tools[t].description) function["description"] = *tools[t].description;
    if (!tools[t].parameters.empty()) {
      auto parameters = ParseJson(tools[t].parameters, absl::StrCat("tool ", t, " parameters"));
      if (!parameters.ok()) return parameters.status();
      function["parameters"] = *std::move(parameters);
    }
    nlohmann::ordered_json tool;
    tool["type"] = "function";
    tool["function"] = std::move(function);
    absl::StrAppend(&out, "\n", PyJsonDumps(tool));
  }
  absl::StrAppend(&out, kToolsOutro, "<|im_end|>\n");
  return out;
}

std::string TextOf(const ChatMessage& m) {
  std::string text;
  for (const ChatPart& part : m.parts) text += part.text;
  return text;
}

// An assistant turn with tool calls: its text (if any) on its own line, then
// one <tool_call> block per call.
absl::StatusOr<std::string> ToolCallTurn(const ChatMessage& m, size_t i) {
  std::string out = "<|im_start|>assistant";
  if (std::string text = TextOf(m); !text.empty()) absl::StrAppend(&out, "\n", text);
  for (size_t c = 0; c < m.tool_calls.size(); ++c) {
    auto args = ParseJson(m.tool_calls[c].arguments,
                          absl::StrCat("message ", i, ": tool call ", c, " arguments"));
    if (!args.ok()) return args.status();
    absl::StrAppend(&out, "\n<tool_call>\n{\"name\": \"", m.tool_calls[c].name,
                    "\", \"arguments\": ", PyJsonDumps(*args), "}\n</tool_call>");
  }
  out += "<|im_end|>\n";
  return out;
}

absl::Status CheckMessage(const ChatMessage& m, size_t i) {
  if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
    return absl::InvalidArgumentError(absl::StrCat("message ", i, " has role \"", m.role,
                                                   "\" (system, user, assistant or tool)"));
  }
  if (m.role == "system" && i != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("message ", i, ": a system message may only come first"));
  }
  if (!m.tool_calls.empty() && m.role != "assistant") {
    return absl::InvalidArgumentError(
        absl::StrCat("message ", i, ": only assistant messages make tool calls"));
  }
  for (const ChatPart& part : m.parts) {
    if (part.kind != ChatPart::Kind::kText && m.role != "user") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, ": only user messages may hold ",
                       part.kind == ChatPart::Kind::kVideo ? "videos" : "images"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> RenderQwen2VlChat(const std::vector<ChatMessage>& messages,
                                              const ChatOptions& options) {
  if (messages.empty()) return absl::InvalidArgumentError("chat has no messages");
  std::string out;
  int image_count = 0, video_count = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (absl::Status s = CheckMessage(m, i); !s.ok()) return s;
    if (i == 0 && !options.tools.empty()) {
      auto system = ToolsSystemTurn(m.role == "system" ? TextOf(m) : options.default_system_prompt,
                                    options.tools);
      if (!system.ok()) return system.status();
      out += *system;
      if (m.role == "system") continue;
    } else if (i == 0 && m.role != "system") {
      absl::StrAppend(&out, "<|im_start|>system\n", options.default_system_prompt, "<|im_end|>\n");
    }
    if (m.role == "tool") {
      // A run of tool results is one user turn.
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      absl::StrAppend(&out, "\n<tool_response>\n", TextOf(m), "\n</tool_response>");
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
      continue;
    }
    if (!m.tool_calls.empty()) {
      auto turn = ToolCallTurn(m, i);
      if (!turn.ok()) return turn.status();
      out += *turn;
      continue;
    }
    absl::StrAppend(&out, "<|im_start|>", m.role, "\n");
    for (const ChatPart& part : m.parts) {
      if (part.kind == ChatPart::Kind::kText) {
        out += part.text;
      } else if (part.kind == ChatPart::Kind::kVideo) {
        ++video_count;
        if (options.add_vision_id) absl::StrAppend(&out, "Video ", video_count, ": ");
        out += kQwen2VlVideoPlaceholder;
      } else {
        ++image_count;
        if (options.add_vision_id) absl::StrAppend(&out, "Picture ", image_count, ": ");
        out += kQwen2VlImagePlaceholder;
      }
    }
    out += "<|im_end|>\n";
  }
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace mmserve::model
