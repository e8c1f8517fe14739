// The chat template's options in an OpenAI request: vLLM's
// chat_template_kwargs (enable_thinking) and an assistant turn's
// reasoning_content, mapped onto the public Chat.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "router/openai.h"

namespace mmserve::router {
namespace {

using json = nlohmann::json;

OpenAiLimits Limits() {
  OpenAiLimits limits;
  limits.max_body_bytes = 1 << 20;
  return limits;
}

json Chat(json messages) { return {{"model", "m"}, {"messages", std::move(messages)}}; }

json Hi() { return json::array({{{"role", "user"}, {"content", "hi"}}}); }

absl::StatusOr<OpenAiChatRequest> Parse(const json& body) {
  return ParseChatCompletionRequest(body.dump(), Limits());
}

TEST_CASE("chat_template_kwargs.enable_thinking reaches the chat; unset leaves it unset",
          "[openai][chat_options]") {
  json body = Chat(Hi());
  auto plain = Parse(body);
  REQUIRE(plain.ok());
  CHECK_FALSE(plain->request.chat().has_enable_thinking());
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  auto off = Parse(body);
  REQUIRE(off.ok());
  REQUIRE(off->request.chat().has_enable_thinking());
  CHECK_FALSE(off->request.chat().enable_thinking());
  body["chat_template_kwargs"] = nullptr;
  CHECK_FALSE(Parse(body)->request.chat().has_enable_thinking());
}

TEST_CASE("chat_template_kwargs that mmserve's formats do not have are refused by name",
          "[openai][chat_options]") {
  json body = Chat(Hi());
  body["chat_template_kwargs"] = {{"enable_thinking", "no"}};
  CHECK(Parse(body).status().message() ==
        "chat_template_kwargs.enable_thinking: must be a boolean");
  body["chat_template_kwargs"] = {{"add_vision_id", true}};
  auto unknown = Parse(body).status();
  CHECK(unknown.code() == absl::StatusCode::kInvalidArgument);
  CHECK(unknown.message() ==
        "chat_template_kwargs.add_vision_id: is not supported (enable_thinking)");
  body["chat_template_kwargs"] = json::array();
  CHECK(Parse(body).status().message() == "chat_template_kwargs: must be an object");
}

TEST_CASE("an assistant turn's reasoning_content is kept; other roles may not carry it",
          "[openai][chat_options]") {
  json messages = Hi();
  messages.push_back({{"role", "assistant"}, {"content", "4"}, {"reasoning_content", "2+2"}});
  messages.push_back({{"role", "user"}, {"content", "and 3+3?"}});
  auto r = Parse(Chat(messages));
  REQUIRE(r.ok());
  const mmserve::v1::ChatMessage& a = r->request.chat().messages(1);
  REQUIRE(a.has_reasoning_content());
  CHECK(a.reasoning_content() == "2+2");
  CHECK_FALSE(r->request.chat().messages(0).has_reasoning_content());
  messages[2]["reasoning_content"] = "x";
  CHECK(Parse(Chat(messages)).status().message() ==
        "messages[2].reasoning_content: only assistant messages carry it");
  messages[2].erase("reasoning_content");
  messages[1]["reasoning_content"] = 7;
  CHECK(Parse(Chat(messages)).status().message() ==
        "messages[1].reasoning_content: must be a string");
}

}  // namespace
}  // namespace mmserve::router
