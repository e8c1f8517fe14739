#include "model/chat_template.h"

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/py_json.h"

namespace mmserve::model {
namespace {

constexpr char kToolsBlock[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr char kToolsOutro[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
constexpr char kQwen2VlDefaultSystem[] = "You are a helpful assistant.";
constexpr char kQwen25DefaultSystem[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

bool HasVision(ChatFamily family) {
  return family == ChatFamily::kQwen2Vl || family == ChatFamily::kQwen3Vl;
}

absl::StatusOr<nlohmann::ordered_json> ParseJson(const std::string& text, absl::string_view what) {
  auto v = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  return v;
}

// The system turn with the "# Tools" block after `lead` (the system text and
// its separator, as the family writes them).
absl::StatusOr<std::string> ToolsSystemTurn(const std::string& lead,
                                            const std::vector<ChatTool>& tools) {
  std::string out = absl::StrCat("<|im_start|>system\n", lead, kToolsBlock);
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

// <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call> for message i's
// call c.
absl::StatusOr<std::string> ToolCallBlock(const ChatMessage& m, size_t i, size_t c) {
  auto args = ParseJson(m.tool_calls[c].arguments,
                        absl::StrCat("message ", i, ": tool call ", c, " arguments"));
  if (!args.ok()) return args.status();
  return absl::StrCat("<tool_call>\n{\"name\": \"", m.tool_calls[c].name,
                      "\", \"arguments\": ", PyJsonDumps(*args), "}\n</tool_call>");
}

// Appends an assistant turn's tool calls, each on a line of its own (the
// first only with `break_first`).
absl::Status AppendToolCalls(const ChatMessage& m, size_t i, bool break_first, std::string* out) {
  for (size_t c = 0; c < m.tool_calls.size(); ++c) {
    auto block = ToolCallBlock(m, i, c);
    if (!block.ok()) return block.status();
    if (c > 0 || break_first) *out += "\n";
    *out += *block;
  }
  return absl::OkStatus();
}

absl::Status CheckMessage(ChatFamily family, const ChatMessage& m, size_t i) {
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
  if (m.reasoning_content && m.role != "assistant") {
    return absl::InvalidArgumentError(
        absl::StrCat("message ", i, ": only assistant messages carry reasoning_content"));
  }
  for (const ChatPart& part : m.parts) {
    if (part.kind == ChatPart::Kind::kText) continue;
    const char* what = part.kind == ChatPart::Kind::kVideo ? "videos" : "images";
    if (!HasVision(family)) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, ": this model does not accept ", what));
    }
    if (m.role != "user") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, ": only user messages may hold ", what));
    }
  }
  return absl::OkStatus();
}

// A user turn's parts with images and videos as their placeholders, counted
// across the chat for add_vision_id.
struct VisionCounter {
  int images = 0;
  int videos = 0;

  void Append(const ChatMessage& m, bool add_vision_id, std::string* out) {
    for (const ChatPart& part : m.parts) {
      if (part.kind == ChatPart::Kind::kText) {
        *out += part.text;
      } else if (part.kind == ChatPart::Kind::kVideo) {
        ++videos;
        if (add_vision_id) absl::StrAppend(out, "Video ", videos, ": ");
        *out += kQwen2VlVideoPlaceholder;
      } else {
        ++images;
        if (add_vision_id) absl::StrAppend(out, "Picture ", images, ": ");
        *out += kQwen2VlImagePlaceholder;
      }
    }
  }
};

// A run of tool results is one user turn.
void AppendToolResult(const std::vector<ChatMessage>& messages, size_t i, std::string* out) {
  if (i == 0 || messages[i - 1].role != "tool") *out += "<|im_start|>user";
  absl::StrAppend(out, "\n<tool_response>\n", TextOf(messages[i]), "\n</tool_response>");
  if (i + 1 == messages.size() || messages[i + 1].role != "tool") *out += "<|im_end|>\n";
}

// kQwen2Vl and kQwen25: a default system turn, "\n\n" before the tools.
absl::StatusOr<std::string> RenderQwen2(ChatFamily family, const std::vector<ChatMessage>& messages,
                                        const ChatOptions& options) {
  const std::string default_system = options.default_system_prompt.value_or(
      family == ChatFamily::kQwen25 ? kQwen25DefaultSystem : kQwen2VlDefaultSystem);
  const bool has_system = messages[0].role == "system";
  const std::string system = has_system ? TextOf(messages[0]) : default_system;
  std::string out;
  if (!options.tools.empty()) {
    auto turn = ToolsSystemTurn(system + "\n\n", options.tools);
    if (!turn.ok()) return turn.status();
    out = *std::move(turn);
  } else {
    absl::StrAppend(&out, "<|im_start|>system\n", system, "<|im_end|>\n");
  }
  VisionCounter vision;
  for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      AppendToolResult(messages, i, &out);
    } else if (!m.tool_calls.empty()) {
      out += "<|im_start|>assistant";
      const std::string text = TextOf(m);
      if (!text.empty()) absl::StrAppend(&out, "\n", text);
      if (absl::Status s = AppendToolCalls(m, i, /*break_first=*/true, &out); !s.ok()) return s;
      out += "<|im_end|>\n";
    } else {
      absl::StrAppend(&out, "<|im_start|>", m.role, "\n");
      vision.Append(m, options.add_vision_id, &out);
      out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string LStripNewlines(absl::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return std::string(s);
}

std::string RStripNewlines(absl::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return std::string(s);
}

// The index of the last user message that is a query (not text shaped like
// a tool response); the last message's index when there is none.
size_t LastQueryIndex(const std::vector<ChatMessage>& messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    if (messages[i].role != "user") continue;
    const std::string text = TextOf(messages[i]);
    if (!absl::StartsWith(text, "<tool_response>") || !absl::EndsWith(text, "</tool_response>")) {
      return i;
    }
  }
  return messages.size() - 1;
}

// A kQwen3 assistant turn's text and thinking: reasoning_content, else the
// text up to the first </think> (after its last <think>), the answer being
// what follows the last </think>.
void SplitThinking(const ChatMessage& m, std::string* content, std::string* reasoning) {
  *content = TextOf(m);
  reasoning->clear();
  if (m.reasoning_content) {
    *reasoning = *m.reasoning_content;
    return;
  }
  const std::string kEnd = "</think>", kStart = "<think>";
  const size_t first_end = content->find(kEnd);
  if (first_end == std::string::npos) return;
  std::string before = RStripNewlines(absl::string_view(*content).substr(0, first_end));
  const size_t start = before.rfind(kStart);
  if (start != std::string::npos) before = before.substr(start + kStart.size());
  *reasoning = LStripNewlines(before);
  *content = LStripNewlines(absl::string_view(*content).substr(content->rfind(kEnd) + kEnd.size()));
}

// kQwen3 and kQwen3Vl: no default system turn, the tools alone or after the
// system text and a blank line.
absl::StatusOr<std::string> RenderQwen3(ChatFamily family, const std::vector<ChatMessage>& messages,
                                        const ChatOptions& options) {
  const bool thinking = family == ChatFamily::kQwen3;
  const bool has_system = messages[0].role == "system";
  std::string out;
  if (!options.tools.empty()) {
    auto turn = ToolsSystemTurn(has_system ? TextOf(messages[0]) + "\n\n" : "", options.tools);
    if (!turn.ok()) return turn.status();
    out = *std::move(turn);
  } else if (has_system) {
    absl::StrAppend(&out, "<|im_start|>system\n", TextOf(messages[0]), "<|im_end|>\n");
  }
  const size_t last_query = LastQueryIndex(messages);
  VisionCounter vision;
  for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      AppendToolResult(messages, i, &out);
      continue;
    }
    if (m.role == "user") {
      out += "<|im_start|>user\n";
      vision.Append(m, options.add_vision_id, &out);
      out += "<|im_end|>\n";
      continue;
    }
    std::string content = TextOf(m), reasoning;
    if (thinking) SplitThinking(m, &content, &reasoning);
    out += "<|im_start|>assistant\n";
    if (thinking && i > last_query && (i + 1 == messages.size() || !reasoning.empty())) {
      absl::StrAppend(&out, "<think>\n", RStripNewlines(LStripNewlines(reasoning)),
                      "\n</think>\n\n", LStripNewlines(content));
    } else {
      out += content;
    }
    if (absl::Status s = AppendToolCalls(m, i, !content.empty(), &out); !s.ok()) return s;
    out += "<|im_end|>\n";
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (thinking && !options.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatFamily> ChatFamilyFor(absl::string_view model_type) {
  if (model_type == "qwen2_vl" || model_type == "qwen2_5_vl") return ChatFamily::kQwen2Vl;
  if (model_type == "qwen2") return ChatFamily::kQwen25;
  if (model_type == "qwen3" || model_type == "qwen3_moe") return ChatFamily::kQwen3;
  if (model_type == "qwen3_vl" || model_type == "qwen3_vl_moe") return ChatFamily::kQwen3Vl;
  return absl::InvalidArgumentError(
      absl::StrCat("model_type \"", model_type, "\" has no known chat format"));
}

absl::StatusOr<std::string> RenderChat(ChatFamily family, const std::vector<ChatMessage>& messages,
                                       const ChatOptions& options) {
  if (messages.empty()) return absl::InvalidArgumentError("chat has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (absl::Status s = CheckMessage(family, messages[i], i); !s.ok()) return s;
  }
  if (family == ChatFamily::kQwen2Vl || family == ChatFamily::kQwen25) {
    return RenderQwen2(family, messages, options);
  }
  return RenderQwen3(family, messages, options);
}

absl::StatusOr<std::string> RenderQwen2VlChat(const std::vector<ChatMessage>& messages,
                                              const ChatOptions& options) {
  return RenderChat(ChatFamily::kQwen2Vl, messages, options);
}

}  // namespace mmserve::model
