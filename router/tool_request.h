// Tool use in a chat request (OpenAI's tools, tool_choice,
// parallel_tool_calls, tool messages and assistant tool calls), checked the
// same way for both front ends. Pure functions, thread-safe.
//
//   RETURN_IF_ERROR(ValidateToolUse(request.chat(), ToolFieldNames::kProto));
//   if (ToolCallsParsed(request)) ...   // the output is parsed for calls
//
// Every refusal is INVALID_ARGUMENT "<field>: <reason>", the field named as
// the front end spells it ("tools[1].function.name" over HTTP,
// "chat.tools[1].function.name" over gRPC).
#ifndef MMSERVE_ROUTER_TOOL_REQUEST_H_
#define MMSERVE_ROUTER_TOOL_REQUEST_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/inference.pb.h"

namespace mmserve::router {

inline constexpr int kMaxTools = 128;

// How refusals name fields: the OpenAI JSON body's names or the proto's.
enum class ToolFieldNames { kOpenAi, kProto };

// Whether `name` is a valid function name: 1 to 64 of [a-zA-Z0-9_-].
bool IsToolName(absl::string_view name);

// The tools (names valid and unique, parameters a JSON object, at most
// kMaxTools), the tool choice (required needs tools; a named function must be
// one of them), and the messages' tool use: assistant calls with an id
// unique in the chat, a name and JSON-object arguments; tool messages with
// the id of an earlier call and text only; tool_call_id on tool messages
// only.
[[nodiscard]] absl::Status ValidateToolUse(const mmserve::v1::Chat& chat, ToolFieldNames names);

// The effective mode: MODE_UNSPECIFIED becomes MODE_AUTO with tools and
// MODE_NONE without; a named function is reported as MODE_REQUIRED.
mmserve::v1::ToolChoice::Mode EffectiveToolMode(const mmserve::v1::Chat& chat);

// Whether the request's output is parsed for tool calls: a chat with tools
// and a mode other than none.
bool ToolCallsParsed(const mmserve::v1::GenerateRequest& request);

// The names of the chat's tools, in order.
std::vector<std::string> ToolNames(const mmserve::v1::Chat& chat);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_TOOL_REQUEST_H_
