// Arbitrary message lists through the Qwen2-VL chat renderer. Properties:
// the renderer accepts exactly the chats the documented rules allow (roles
// system/user/assistant/tool, system only first, a run of tool messages one
// user turn of tool responses, images and videos only in user
// messages, at least one message); an accepted chat renders to the text an
// independent reading of the template gives; with add_vision_id the
// pictures are numbered 1..N in order, and the videos apart from them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "model/chat_template.h"

namespace mmserve::model {
namespace {

std::string Role(fuzz::FuzzInput& in) {
  switch (in.Byte() % 5) {
    case 0:
      return "system";
    case 1:
      return "user";
    case 2:
      return "assistant";
    case 3:
      return "tool";
    default:
      return in.String(12);  // mostly not a role; "user" now and then
  }
}

// The template read independently: nullopt-like empty `ok` when rejected.
bool Reference(const std::vector<ChatMessage>& messages, const ChatOptions& options,
               std::string* out) {
  if (messages.empty()) return false;
  int images = 0, videos = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool known =
        m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool";
    if (!known || (m.role == "system" && i > 0)) return false;
    if (i == 0 && m.role != "system") {
      *out += "<|im_start|>system\n" + options.default_system_prompt + "<|im_end|>\n";
    }
    if (m.role == "tool") {  // a run of tool results is one user turn
      if (i == 0 || messages[i - 1].role != "tool") *out += "<|im_start|>user";
      *out += "\n<tool_response>\n";
      for (const ChatPart& p : m.parts) {
        if (p.kind != ChatPart::Kind::kText) return false;
        *out += p.text;
      }
      *out += "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") *out += "<|im_end|>\n";
      continue;
    }
    *out += "<|im_start|>" + m.role + "\n";
    for (const ChatPart& p : m.parts) {
      if (p.kind == ChatPart::Kind::kText) {
        *out += p.text;
        continue;
      }
      if (m.role != "user") return false;
      if (p.kind == ChatPart::Kind::kVideo) {
        ++videos;
        if (options.add_vision_id) *out += absl::StrCat("Video ", videos, ": ");
        *out += "<|vision_start|><|video_pad|><|vision_end|>";
        continue;
      }
      ++images;
      if (options.add_vision_id) *out += absl::StrCat("Picture ", images, ": ");
      *out += "<|vision_start|><|image_pad|><|vision_end|>";
    }
    *out += "<|im_end|>\n";
  }
  if (options.add_generation_prompt) *out += "<|im_start|>assistant\n";
  return true;
}

}  // namespace
}  // namespace mmserve::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mmserve::model;
  mmserve::fuzz::FuzzInput in(data, size);
  ChatOptions options;
  options.add_generation_prompt = in.Bool();
  options.add_vision_id = in.Bool();
  if (in.Bool()) options.default_system_prompt = in.String(32);
  std::vector<ChatMessage> messages(in.Byte() % 9);
  for (ChatMessage& m : messages) {
    m.role = Role(in);
    m.parts.resize(in.Byte() % 5);
    for (ChatPart& p : m.parts) {
      const uint8_t kind = in.Byte();  // odd: media (bit 1: a video), even: text
      p.kind = (kind & 1) == 0   ? ChatPart::Kind::kText
               : (kind & 2) != 0 ? ChatPart::Kind::kVideo
                                 : ChatPart::Kind::kImage;
      if (p.kind == ChatPart::Kind::kText) p.text = in.String(64);
    }
  }
  std::string want;
  const bool accept = Reference(messages, options, &want);
  absl::StatusOr<std::string> got = RenderQwen2VlChat(messages, options);
  FUZZ_CHECK(got.ok() == accept) << got.status();
  if (!got.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(got.status())) << got.status();
    return 0;
  }
  FUZZ_CHECK(*got == want) << "rendered:\n" << *got << "\nwant:\n" << want;
  return 0;
}
