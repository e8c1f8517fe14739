// Test helpers for the OpenAI translation: the limits the tests parse under,
// a body that must parse, and a one-message chat.
#ifndef MMSERVE_ROUTER_OPENAI_TESTING_H_
#define MMSERVE_ROUTER_OPENAI_TESTING_H_

#include <nlohmann/json.hpp>
#include <string>

#include "router/openai.h"

namespace mmserve::router {

// 1 MiB bodies, 1000-byte images, 2 images a request.
OpenAiLimits TestLimits();
// The parsed request; REQUIREs that `body` parses under TestLimits().
OpenAiChatRequest MustParse(const nlohmann::json& body);
// {"model": "shapes-demo", "messages": [{"role": "user", "content": text}]}.
nlohmann::json UserSays(const std::string& text);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_OPENAI_TESTING_H_
