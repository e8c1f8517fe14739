// Arbitrary message lists through every family's chat renderer. Properties:
// the renderer accepts exactly the chats the documented rules allow (roles
// system/user/assistant/tool, system only first, a run of tool messages one
// user turn of tool responses, images and videos only in user messages and
// only for a vision family, at least one message); an accepted chat renders
// to the text an independent reading of the family's template gives; with
// add_vision_id the pictures are numbered 1..N in order, and the videos
// apart from them; Qwen3 keeps the thinking of assistant turns after the
// last user query only, and enable_thinking=false closes an empty think
// block. The family is read last, so inputs written before it existed stay
// Qwen2-VL chats.
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

// Text parts now and then are the markers the Qwen3 template looks for.
std::string Text(fuzz::FuzzInput& in, uint8_t kind) {
  static const char* const kMarkers[] = {"<think>", "</think>", "\n", "<tool_response>",
                                         "</tool_response>"};
  if ((kind & 4) != 0) return kMarkers[(kind >> 3) % 5];
  return in.String(64);
}

// Python's str.split(sep).
std::vector<std::string> Split(const std::string& s, const std::string& sep) {
  std::vector<std::string> pieces;
  size_t at = 0;
  for (size_t next; (next = s.find(sep, at)) != std::string::npos; at = next + sep.size()) {
    pieces.push_back(s.substr(at, next - at));
  }
  pieces.push_back(s.substr(at));
  return pieces;
}

// Python's str.lstrip('\n') / rstrip('\n').
std::string LStrip(std::string s) {
  const size_t first = s.find_first_not_of('\n');
  return first == std::string::npos ? std::string() : s.substr(first);
}
std::string RStrip(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

std::string Joined(const ChatMessage& m) {
  std::string text;
  for (const ChatPart& p : m.parts) text += p.text;
  return text;
}

// The Qwen3 assistant turn at i, as the template writes it.
std::string Qwen3Assistant(const ChatMessage& m, bool after_last_query, bool last) {
  std::string content = Joined(m), reasoning;
  if (m.reasoning_content) {
    reasoning = *m.reasoning_content;
  } else if (content.find("</think>") != std::string::npos) {
    reasoning = LStrip(Split(RStrip(Split(content, "</think>").front()), "<think>").back());
    content = LStrip(Split(content, "</think>").back());
  }
  if (after_last_query && (last || !reasoning.empty())) {
    return "<|im_start|>assistant\n<think>\n" + RStrip(LStrip(reasoning)) + "\n</think>\n\n" +
           LStrip(content) + "<|im_end|>\n";
  }
  return "<|im_start|>assistant\n" + content + "<|im_end|>\n";
}

// The template read independently: false when rejected.
bool Reference(ChatFamily family, const std::vector<ChatMessage>& messages,
               const ChatOptions& options, std::string* out) {
  if (messages.empty()) return false;
  const bool vision = family == ChatFamily::kQwen2Vl || family == ChatFamily::kQwen3Vl;
  const bool qwen3 = family == ChatFamily::kQwen3 || family == ChatFamily::kQwen3Vl;
  const std::string default_system = options.default_system_prompt.value_or(
      family == ChatFamily::kQwen25 ? "You are Qwen, created by Alibaba Cloud. You are a helpful "
                                      "assistant."
                                    : "You are a helpful assistant.");
  size_t last_query = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string t = Joined(messages[i]);
    const bool response_shaped = t.rfind("<tool_response>", 0) == 0 && t.size() >= 16 &&
                                 t.compare(t.size() - 16, 16, "</tool_response>") == 0;
    if (messages[i].role == "user" && !response_shaped) {
      last_query = i;
      break;
    }
  }
  int images = 0, videos = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool known =
        m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool";
    if (!known || (m.role == "system" && i > 0)) return false;
    if (i == 0 && m.role != "system" && !qwen3) {
      *out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
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
    for (const ChatPart& p : m.parts) {
      if (p.kind != ChatPart::Kind::kText && (!vision || m.role != "user")) return false;
    }
    if (m.role == "assistant" && family == ChatFamily::kQwen3) {
      *out += Qwen3Assistant(m, i > last_query, i + 1 == messages.size());
      continue;
    }
    *out += "<|im_start|>" + m.role + "\n";
    for (const ChatPart& p : m.parts) {
      if (p.kind == ChatPart::Kind::kText) {
        *out += p.text;
        continue;
      }
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
  if (options.add_generation_prompt && family == ChatFamily::kQwen3 && !options.enable_thinking) {
    *out += "<think>\n\n</think>\n\n";
  }
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
      // odd: media (bit 1: a video); even: text (bit 2: a marker)
      const uint8_t kind = in.Byte();
      p.kind = (kind & 1) == 0   ? ChatPart::Kind::kText
               : (kind & 2) != 0 ? ChatPart::Kind::kVideo
                                 : ChatPart::Kind::kImage;
      if (p.kind == ChatPart::Kind::kText) p.text = Text(in, kind);
    }
  }
  const uint8_t family_byte = in.Byte();
  const ChatFamily family = static_cast<ChatFamily>(family_byte % 4);
  options.enable_thinking = (family_byte & 4) == 0;
  if ((family_byte & 8) != 0) {
    for (ChatMessage& m : messages) {
      if (m.role == "assistant") m.reasoning_content = in.String(16);
    }
  }
  std::string want;
  const bool accept = Reference(family, messages, options, &want);
  absl::StatusOr<std::string> got = RenderChat(family, messages, options);
  FUZZ_CHECK(got.ok() == accept) << got.status();
  if (!got.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(got.status())) << got.status();
    return 0;
  }
  FUZZ_CHECK(*got == want) << "rendered:\n" << *got << "\nwant:\n" << want;
  return 0;
}
