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
// (video's) token count. Roles are system, user, assistant; a system message
// may only come first and holds no images or videos, nor may an assistant
// message. Thread-safe (pure function).
#ifndef MMSERVE_MODEL_CHAT_TEMPLATE_H_
#define MMSERVE_MODEL_CHAT_TEMPLATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mmserve::model {

struct ChatPart {
  enum class Kind { kText, kImage, kVideo };
  Kind kind = Kind::kText;
  std::string text;  // for kText
};

struct ChatMessage {
  std::string role;
  std::vector<ChatPart> parts;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // Prefix each image with "Picture N: " and each video with "Video N: "
  // (the template's add_vision_id; images and videos counted apart).
  bool add_vision_id = false;
  std::string default_system_prompt = "You are a helpful assistant.";
};

// InvalidArgument for an empty chat, an unknown role, a misplaced system
// message or an image or video outside a user message.
[[nodiscard]] absl::StatusOr<std::string> RenderQwen2VlChat(
    const std::vector<ChatMessage>& messages, const ChatOptions& options);

// The placeholder text one image occupies in a rendered prompt.
inline constexpr char kQwen2VlImagePlaceholder[] = "<|vision_start|><|image_pad|><|vision_end|>";
// The placeholder text one video occupies in a rendered prompt.
inline constexpr char kQwen2VlVideoPlaceholder[] = "<|vision_start|><|video_pad|><|vision_end|>";

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_CHAT_TEMPLATE_H_
