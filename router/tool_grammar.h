// A required or named tool choice enforced by constrained decoding: the
// grammar (EBNF, start rule root) of the output such a choice allows.
//
//   <tool_call>\n{"name": "<fn>", "arguments": <args>}\n</tool_call>
//
// where <args> follows the function's parameters schema (compact JSON as
// Python's json.dumps writes it: //grammar's JsonSchemaToEbnf), any JSON
// object when it has none. A named function: exactly one call of it.
// Required: one call of any tool, or with parallel tool calls (the default)
// one or more separated by "\n". Thread-safe (pure functions).
//
//   RETURN_IF_ERROR(ApplyToolChoice(&request));  // after ValidateToolUse
#ifndef MMSERVE_ROUTER_TOOL_GRAMMAR_H_
#define MMSERVE_ROUTER_TOOL_GRAMMAR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/inference.pb.h"

namespace mmserve::router {

// The grammar for the chat's tool choice (which must be required or named;
// the tools valid). InvalidArgument naming the tool when a parameters
// schema cannot be enforced.
[[nodiscard]] absl::StatusOr<std::string> ToolChoiceGrammar(const mmserve::v1::Chat& chat);

// For a chat whose effective tool choice is required or named: sets
// sampling.constraint.grammar to ToolChoiceGrammar; InvalidArgument when the
// request already has an output constraint (response_format). Other
// requests are left as they are.
[[nodiscard]] absl::Status ApplyToolChoice(mmserve::v1::GenerateRequest* request);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_TOOL_GRAMMAR_H_
