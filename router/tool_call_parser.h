// Hermes-style tool calls parsed out of one choice's generated text as it
// streams (vLLM's hermes parser, used for Qwen2.5): each
// <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> block naming one
// of the request's tools becomes a call; a block that does not parse, names
// an unknown tool or never closes stays in the text, as written.
//
//   ToolCallParser parser({.tool_names = ToolNames(chat)});
//   ToolCallParser::Output out = parser.Add(response.text());   // each step
//   ToolCallParser::Output last = parser.Finish();              // at the end
//
// Text that may still begin a block ("<tool" ...) and a block until its
// closing tag are held back, so nothing sent is ever taken back: text fed
// in any pieces gives the same output as fed whole. Whitespace next to a
// call (before it, between calls, after the last one at the end) is not
// text. A call comes out as two deltas: {index, id, name, arguments ""},
// then {index, arguments} with the arguments re-serialised as Python's
// json.dumps writes them (vLLM's). Not thread-safe: one per choice.
#ifndef MMSERVE_ROUTER_TOOL_CALL_PARSER_H_
#define MMSERVE_ROUTER_TOOL_CALL_PARSER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/inference.pb.h"

namespace mmserve::router {

inline constexpr char kToolCallStart[] = "<tool_call>";
inline constexpr char kToolCallEnd[] = "</tool_call>";

// "call_" and 24 random letters and digits.
std::string NewToolCallId();

class ToolCallParser {
 public:
  struct Options {
    std::vector<std::string> tool_names;
    // false: calls after the first are dropped.
    bool parallel = true;
    // Each call's id; NewToolCallId when unset.
    std::function<std::string()> new_id;
  };
  // What can be said after some input: text, and call deltas after it.
  struct Output {
    std::string text;
    std::vector<mmserve::v1::ToolCallDelta> calls;
  };

  explicit ToolCallParser(Options options);

  // The next generated text.
  Output Add(absl::string_view text);
  // The end of the output: what was held back.
  Output Finish();
  // Calls made so far.
  int calls() const { return calls_; }

 private:
  void Drain(bool final, Output* out);
  // Content text: whitespace is held until text or a call follows.
  void EmitText(absl::string_view text, Output* out);
  // A closed block's body: a call, dropped, or text.
  void EndBlock(absl::string_view body, Output* out);

  const Options options_;
  std::string pending_;       // undecided input
  bool in_block_ = false;     // pending_ is inside a <tool_call> block
  std::string held_space_;    // content whitespace not yet sent
  std::string space_before_;  // held_space_ when the current block began
  int calls_ = 0;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_TOOL_CALL_PARSER_H_
