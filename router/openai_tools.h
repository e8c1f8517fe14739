// The tool fields of a chat completions body (OpenAI's shape) read into the
// public proto's Chat: tools, tool_choice, parallel_tool_calls, and on a
// message, tool_calls (assistant) and tool_call_id (tool). Only shapes and
// types are checked here; router/tool_request.h checks the meaning. Private
// to the :openai library. Thread-safe (pure functions).
#ifndef MMSERVE_ROUTER_OPENAI_TOOLS_H_
#define MMSERVE_ROUTER_OPENAI_TOOLS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/inference.pb.h"
#include "router/openai_fields.h"

namespace mmserve::router::openai_tools {

// tools ([{"type": "function", "function": {"name", "description",
// "parameters"}}]), tool_choice ("none", "auto", "required" or {"type":
// "function", "function": {"name"}}) and parallel_tool_calls. `body_text`
// is the body `body` was parsed from (the schemas keep its key order).
absl::Status ParseTools(const openai_fields::json& body, absl::string_view body_text,
                        mmserve::v1::Chat* chat);

// messages[i] (`field`) of role `role`: an assistant's tool_calls
// ([{"id", "type": "function", "function": {"name", "arguments"}}], arguments
// a JSON string) and a tool message's tool_call_id.
absl::Status ParseMessageToolFields(const openai_fields::json& m, const std::string& field,
                                    const std::string& role, mmserve::v1::ChatMessage* out);

}  // namespace mmserve::router::openai_tools

#endif  // MMSERVE_ROUTER_OPENAI_TOOLS_H_
