#include "model/chat_template.h"

#include "absl/strings/str_cat.h"

namespace mmserve::model {

absl::StatusOr<std::string> RenderQwen2VlChat(const std::vector<ChatMessage>& messages,
                                              const ChatOptions& options) {
  if (messages.empty()) return absl::InvalidArgumentError("chat has no messages");
  std::string out;
  int image_count = 0, video_count = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, " has role \"", m.role, "\" (system, user or assistant)"));
    }
    if (m.role == "system" && i != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, ": a system message may only come first"));
    }
    if (i == 0 && m.role != "system") {
      absl::StrAppend(&out, "<|im_start|>system\n", options.default_system_prompt, "<|im_end|>\n");
    }
    absl::StrAppend(&out, "<|im_start|>", m.role, "\n");
    for (const ChatPart& part : m.parts) {
      if (part.kind == ChatPart::Kind::kText) {
        out += part.text;
        continue;
      }
      if (m.role != "user") {
        return absl::InvalidArgumentError(
            absl::StrCat("message ", i, ": only user messages may hold ",
                         part.kind == ChatPart::Kind::kVideo ? "videos" : "images"));
      }
      if (part.kind == ChatPart::Kind::kVideo) {
        ++video_count;
        if (options.add_vision_id) absl::StrAppend(&out, "Video ", video_count, ": ");
        out += kQwen2VlVideoPlaceholder;
        continue;
      }
      ++image_count;
      if (options.add_vision_id) absl::StrAppend(&out, "Picture ", image_count, ": ");
      out += kQwen2VlImagePlaceholder;
    }
    out += "<|im_end|>\n";
  }
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace mmserve::model
