// Each served model family's chat format, rendered in C++ to exactly the
// text its Jinja chat_template produces (the templates themselves are not
// interpreted; tools/gen_chat_template_goldens.py keeps them verbatim and the
// tests compare byte for byte). The family comes from config.json's
// model_type (ChatFamilyFor):
//
//   kQwen2Vl  qwen2_vl, qwen2_5_vl. A default system turn "You are a helpful
//             assistant." when the first message is not a system one; image
//             and video parts as <|vision_start|><|image_pad|><|vision_end|>
//             (<|video_pad|>), "Picture N: " / "Video N: " with
//             add_vision_id. Tools: see below.
//   kQwen25   qwen2 (Qwen2.5 text): the same turns without vision, default
//             system "You are Qwen, created by Alibaba Cloud. You are a
//             helpful assistant.", tools as below.
//   kQwen3    qwen3, qwen3_moe: no default system turn; the "# Tools" block
//             follows the system text after a blank line (alone without
//             one); assistant turns after the last user query keep their
//             thinking as "<think>\n...\n</think>\n\n" (reasoning_content,
//             else the text up to </think>), earlier turns lose it; tool calls
//             follow the text on their own line; enable_thinking=false ends
//             the generation prompt with an empty think block.
//   kQwen3Vl  qwen3_vl, qwen3_vl_moe: Qwen3's system and tool layout, the
//             vision parts of kQwen2Vl, no thinking handling.
//
//   ASSIGN_OR_RETURN(ChatFamily family, ChatFamilyFor(config.model_type));
//   ASSIGN_OR_RETURN(std::string prompt, RenderChat(family, messages, options));
//
// Every turn is <|im_start|>{role}\n...<|im_end|>\n; add_generation_prompt
// appends <|im_start|>assistant\n. Each <|image_pad|> (<|video_pad|>) is
// later expanded to the image's (video's) token count. Roles are system,
// user, assistant and tool; a system message may only come first and holds
// no images or videos, nor may an assistant or tool message; text-only
// families take no images or videos at all.
//
// Tools follow Qwen2.5's (Hermes-style) template in every family (for
// kQwen2Vl, whose own template has no tools, this is mmserve's extension):
// with options.tools the system turn gets the "# Tools" block listing each
// tool as JSON in <tools></tools>; an assistant turn's tool_calls follow its
// text as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>; a
// run of tool messages is one user turn of
// "\n<tool_response>\n{text}\n</tool_response>" parts. JSON is written as
// the template's tojson does (model/py_json.h). Thread-safe (pure
// functions).
#ifndef MMSERVE_MODEL_CHAT_TEMPLATE_H_
#define MMSERVE_MODEL_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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
  // An assistant turn's thinking, apart from its text (kQwen3 renders it;
  // without it the text's own <think>...</think> is used).
  std::optional<std::string> reasoning_content;
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
  // Replaces the family's default system prompt (kQwen2Vl, kQwen25); the
  // Qwen3 families have none and ignore it.
  std::optional<std::string> default_system_prompt;
  // The tools described in the system turn (none: no "# Tools" block).
  std::vector<ChatTool> tools;
  // kQwen3 only: false asks the model to answer without thinking (the
  // generation prompt ends with "<think>\n\n</think>\n\n").
  bool enable_thinking = true;
};

// A model's chat format; see the top of this file.
enum class ChatFamily { kQwen2Vl, kQwen25, kQwen3, kQwen3Vl };

// The family of a config.json model_type; InvalidArgument for a type with no
// known chat format.
[[nodiscard]] absl::StatusOr<ChatFamily> ChatFamilyFor(absl::string_view model_type);

// InvalidArgument for an empty chat, an unknown role, a misplaced system
// message, an image or video outside a user message (or anywhere, for a
// text-only family), tool calls or reasoning_content outside an assistant
// message, or tool parameters or call arguments that are not JSON.
[[nodiscard]] absl::StatusOr<std::string> RenderChat(ChatFamily family,
                                                     const std::vector<ChatMessage>& messages,
                                                     const ChatOptions& options);

// RenderChat(ChatFamily::kQwen2Vl, ...).
[[nodiscard]] absl::StatusOr<std::string> RenderQwen2VlChat(
    const std::vector<ChatMessage>& messages, const ChatOptions& options);

// The placeholder text one image occupies in a rendered prompt.
inline constexpr char kQwen2VlImagePlaceholder[] = "<|vision_start|><|image_pad|><|vision_end|>";
// The placeholder text one video occupies in a rendered prompt.
inline constexpr char kQwen2VlVideoPlaceholder[] = "<|vision_start|><|video_pad|><|vision_end|>";

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_CHAT_TEMPLATE_H_
