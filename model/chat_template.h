// The Qwen2-VL chat format, rendered in C++ to exactly the text its Jinja
// chat_template produces (the template itself is not interpreted):
//
//   <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n   (when the
//                                          first message is not a system one)
//   <|im_start|>{role}\n{parts}<|im_end|>\n     for every message, where an
//       image part is <|vision_start|><|image_pad|><|vision_end|> and a
//       video part <|vision_start|><|video_pad|><|vision_end|>
//   <|im_start|>assistant\n                     with add_generation_prompt
//
//   ChatOptions opts;
//   ASSIGN_OR_RETURN(std::string prompt, RenderQwen2VlChat(messages, opts));
//
// Each <|image_pad|> (<|video_pad|>) is later expanded to the image's
// (video's) token count. Roles are system, user, assistant and tool; a
// system message may only come first and holds no images or videos, nor may
// an assistant or tool message.
//
// Tools follow Qwen2.5's (Hermes-style) template: with options.tools the
// system turn (the first message's text, else the default prompt) gets the
// "# Tools" block listing each tool as JSON in <tools></tools>; an assistant
// turn's tool_calls follow its text as
// "\n<tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call>"; a run
// of tool messages is one user turn of
// "\n<tool_response>\n{text}\n</tool_response>" parts. JSON is written as the
// template's tojson does (model/py_json.h). Thread-safe (pure function).
#ifndef MMSERVE_MODEL_CHAT_TEMPLATE_H_
#define MMSERVE_MODEL_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mmserve::model {

struct ChatPart {
  enum class Kind { kText, kImage, kVideo };
  Kind kind = Kind::kText;
  std::string text;  // for kText
};

// A call an assistant turn made.
struct ChatToolCall {
  std::string name;
  std::string arguments;  // the JSON text of an object
};

struct ChatMessage {
  std::string role;
  std::vector<ChatPart> parts;
  std::vector<ChatToolCall> tool_calls;  // assistant turns only
};

// A function the model may call, rendered as
// {"type": "function", "function": {"name", "description", "parameters"}}
// (description and parameters only when given).
struct ChatTool {
  std::string name;
  std::optional<std::string> description;
  std::string parameters;  // the JSON text of the schema; empty: none
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // Prefix each image with "Picture N: " and each video with "Video N: "
  // (the template's add_vision_id; images and videos counted apart).
  bool add_vision_id = false;
  std::string default_system_prompt = "You are a helpful assistant.";
  // The tools described in the system turn (none: no "# Tools" block).
  std::vector<ChatTool> tools;
};

// InvalidArgument for an empty chat, an unknown role, a misplaced system
// message, an image or video outside a user message, tool calls outside an
// assistant message, or tool parameters or call arguments that are not JSON.
[[nodiscard]] absl::StatusOr<std::string> RenderQwen2VlChat(
    const std::vector<ChatMessage>& messages, const ChatOptions& options);

// The placeholder text one image occupies in a rendered prompt.
inline constexpr char kQwen2VlImagePlaceholder[] = "<|vision_start|><|image_pad|><|vision_end|>";
// The placeholder text one video occupies in a rendered prompt.
inline constexpr char kQwen2VlVideoPlaceholder[] = "<|vision_start|><|video_pad|><|vision_end|>";

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_CHAT_TEMPLATE_H_
