// A public mmserve.v1.Chat as RenderQwen2VlChat takes it: the messages (text,
// image and video parts, tool calls, reasoning) and the options the chat sets
// (add_generation_prompt, tools, enable_thinking). The router and the language service both
// render from it, so they render the same text.
//
//   ChatFromProto(request.chat(), &messages, &options);
//   ASSIGN_OR_RETURN(std::string prompt, RenderQwen2VlChat(messages, options));
//
// Thread-safe (pure function).
#ifndef MMSERVE_MODEL_CHAT_PROTO_H_
#define MMSERVE_MODEL_CHAT_PROTO_H_

#include <vector>

#include "model/chat_template.h"
#include "proto/inference.pb.h"

namespace mmserve::model {

// Replaces *messages and sets options->add_generation_prompt (default true),
// options->tools and options->enable_thinking (default true); other options
// are left as they are.
void ChatFromProto(const mmserve::v1::Chat& chat, std::vector<ChatMessage>* messages,
                   ChatOptions* options);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_CHAT_PROTO_H_
