#include "model/chat_proto.h"

namespace mmserve::model {

void ChatFromProto(const mmserve::v1::Chat& chat, std::vector<ChatMessage>* messages,
                   ChatOptions* options) {
  messages->clear();
  messages->reserve(static_cast<size_t>(chat.messages_size()));
  for (const mmserve::v1::ChatMessage& m : chat.messages()) {
    ChatMessage& cm = messages->emplace_back();
    cm.role = m.role();
    for (const mmserve::v1::ContentPart& p : m.content()) {
      if (p.has_image()) {
        cm.parts.push_back({ChatPart::Kind::kImage, ""});
      } else if (p.has_video()) {
        cm.parts.push_back({ChatPart::Kind::kVideo, ""});
      } else {
        cm.parts.push_back({ChatPart::Kind::kText, p.text()});
      }
    }
    for (const mmserve::v1::ToolCall& call : m.tool_calls()) {
      cm.tool_calls.push_back({call.name(), call.arguments()});
    }
    if (m.has_reasoning_content()) cm.reasoning_content = m.reasoning_content();
  }
  options->add_generation_prompt =
      !chat.has_add_generation_prompt() || chat.add_generation_prompt();
  options->enable_thinking = !chat.has_enable_thinking() || chat.enable_thinking();
  options->tools.clear();
  for (const mmserve::v1::Tool& t : chat.tools()) {
    ChatTool& tool = options->tools.emplace_back();
    tool.name = t.function().name();
    if (t.function().has_description()) tool.description = t.function().description();
    tool.parameters = t.function().parameters();
  }
}

}  // namespace mmserve::model
