// Tool use in requests: the HTTP body read into the proto, and the checks
// both front ends share (router/tool_request.h).
#include "router/tool_request.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "router/openai.h"

namespace mmserve::router {
namespace {

using nlohmann::json;

const char kWeather[] =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather.",
        "parameters": {"type": "object", "properties": {"zeta": {"type": "string"},
                                                        "alpha": {"type": "integer"}}}}})";

absl::StatusOr<OpenAiChatRequest> Parse(const std::string& body) {
  return ParseChatCompletionRequest(body, OpenAiLimits());
}

// The refusal of a body whose other fields are a minimal valid request.
std::string Refusal(const std::string& fields) {
  auto r = Parse(R"({"messages": [{"role": "user", "content": "hi"}], )" + fields + "}");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST_CASE("tools, tool choice, calls and results are read into the chat", "[tool_request]") {
  auto r = Parse(std::string(R"({"messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"zeta\": \"x\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
    "tools": [)") +
                 kWeather + R"(],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "parallel_tool_calls": false})");
  INFO(r.status());
  REQUIRE(r.ok());
  const mmserve::v1::Chat& chat = r->request.chat();
  REQUIRE(chat.tools_size() == 1);
  CHECK(chat.tools(0).function().name() == "get_weather");
  CHECK(chat.tools(0).function().description() == "Weather.");
  // The client's key order is kept (zeta before alpha).
  CHECK(chat.tools(0).function().parameters() ==
        R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}})");
  CHECK(chat.tool_choice().function_name() == "get_weather");
  CHECK_FALSE(chat.parallel_tool_calls());
  REQUIRE(chat.messages(1).tool_calls_size() == 1);
  CHECK(chat.messages(1).tool_calls(0).id() == "call_1");
  CHECK(chat.messages(1).tool_calls(0).arguments() == R"({"zeta": "x"})");
  CHECK(chat.messages(1).content_size() == 0);
  CHECK(chat.messages(2).role() == "tool");
  CHECK(chat.messages(2).tool_call_id() == "call_1");
  CHECK(EffectiveToolMode(chat) == mmserve::v1::ToolChoice::MODE_REQUIRED);
  CHECK(ToolCallsParsed(r->request));
}

TEST_CASE("tool choice modes: auto with tools, none without, none turns parsing off",
          "[tool_request]") {
  const std::string base = R"({"messages": [{"role": "user", "content": "hi"}], "tools": [)" +
                           std::string(kWeather) + "]";
  auto with = Parse(base + "}");
  REQUIRE(with.ok());
  CHECK(EffectiveToolMode(with->request.chat()) == mmserve::v1::ToolChoice::MODE_AUTO);
  CHECK(ToolCallsParsed(with->request));
  auto none = Parse(base + R"(, "tool_choice": "none"})");
  REQUIRE(none.ok());
  CHECK_FALSE(ToolCallsParsed(none->request));
  auto required = Parse(base + R"(, "tool_choice": "required"})");
  REQUIRE(required.ok());
  CHECK(EffectiveToolMode(required->request.chat()) == mmserve::v1::ToolChoice::MODE_REQUIRED);
  auto without = Parse(R"({"messages": [{"role": "user", "content": "hi"}], "tools": []})");
  REQUIRE(without.ok());
  CHECK(EffectiveToolMode(without->request.chat()) == mmserve::v1::ToolChoice::MODE_NONE);
}

TEST_CASE("bad tool use is refused naming the field and the reason", "[tool_request]") {
  const std::string tools = std::string(R"("tools": [)") + kWeather + "]";
  CHECK(Refusal(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})") ==
        "tool_choice: \"nope\" is not one of the tools");
  CHECK(Refusal(R"("tool_choice": "required")") == "tool_choice: \"required\" needs tools");
  CHECK(Refusal(R"("tool_choice": "always")") ==
        "tool_choice: \"always\" is not none, auto, required or a function");
  CHECK(Refusal(R"("tools": {})") == "tools: must be an array");
  CHECK(Refusal(std::string(R"("tools": [)") + kWeather + "," + kWeather + "]") ==
        "tools[1].function.name: \"get_weather\" is given twice");
  CHECK(Refusal(R"("tools": [{"type": "function", "function": {"name": "a b"}}])") ==
        "tools[0].function.name: \"a b\" is not 1 to 64 of a-z, A-Z, 0-9, _ and -");
  CHECK(Refusal(R"("tools": [{"type": "function", "function": {"name": ")" + std::string(65, 'x') +
                R"("}}])")
            .find("is not 1 to 64") != std::string::npos);
  CHECK(Refusal(R"("tools": [{"type": "retrieval", "function": {"name": "a"}}])") ==
        "tools[0].type: \"retrieval\" is not supported (function)");
  CHECK(Refusal(R"("tools": [{"type": "function"}])") == "tools[0].function: missing");
  CHECK(Refusal(R"("tools": [{"type": "function", "function": {"name": "a", "parameters": 3}}])") ==
        "tools[0].function.parameters: must be an object");
  CHECK(Refusal(R"("parallel_tool_calls": "yes")") == "parallel_tool_calls: must be a boolean");
  CHECK(Refusal(R"("functions": [{"name": "a"}])") == "functions: is not supported; use \"tools\"");
}

TEST_CASE("bad tool calls and results in the conversation are refused", "[tool_request]") {
  auto refusal = [](const std::string& messages) {
    auto r = Parse(R"({"messages": )" + messages + "}");
    REQUIRE_FALSE(r.ok());
    return std::string(r.status().message());
  };
  const std::string call =
      R"({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "f", "arguments": "{\"a\": 1}"}}]})";
  CHECK(refusal(R"([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": "}}]}])") ==
        "messages[1].tool_calls[0].function.arguments: must be the JSON text of an object");
  CHECK(refusal(R"([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}])") ==
        "messages[1].tool_calls[0].function.arguments: must be a string");
  CHECK(refusal(R"([{"role": "user", "content": "x"}, )" + call +
                R"(, {"role": "tool", "tool_call_id": "c2", "content": "r"}])") ==
        "messages[2].tool_call_id: \"c2\" is not the id of an earlier assistant tool call");
  CHECK(refusal(R"([{"role": "user", "content": "x"}, )" + call +
                R"(, {"role": "tool", "content": "r"}])") == "messages[2].tool_call_id: missing");
  CHECK(refusal(R"([{"role": "tool", "tool_call_id": "c1", "content": "r"}, )" + call + "]") ==
        "messages[0].tool_call_id: \"c1\" is not the id of an earlier assistant tool call");
  CHECK(refusal("[" + call + ", " + call + "]") ==
        "messages[1].tool_calls[0].id: \"c1\" is used by an earlier call");
  CHECK(refusal(R"([{"role": "user", "content": "x", "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "f", "arguments": "{}"}}]}])") ==
        "messages[0].tool_calls: only assistant messages make tool calls");
  CHECK(refusal(R"([{"role": "user", "content": "x", "tool_call_id": "c"}])") ==
        "messages[0].tool_call_id: only tool messages answer a call");
  CHECK(refusal(R"([{"role": "function", "content": "x"}])") ==
        "messages[0].role: role \"function\" is not supported; use \"tool\"");
}

TEST_CASE("gRPC requests are checked the same way, named as the proto names fields",
          "[tool_request]") {
  mmserve::v1::Chat chat;
  chat.add_messages()->set_role("user");
  chat.add_tools()->mutable_function()->set_name("f");
  chat.mutable_tool_choice()->set_function_name("g");
  CHECK(ValidateToolUse(chat, ToolFieldNames::kProto).message() ==
        "chat.tool_choice.function_name: \"g\" is not one of the tools");
  chat.mutable_tool_choice()->set_function_name("f");
  CHECK(ValidateToolUse(chat, ToolFieldNames::kProto).ok());
  chat.mutable_tools(0)->mutable_function()->set_parameters("[1]");
  CHECK(ValidateToolUse(chat, ToolFieldNames::kProto).message() ==
        "chat.tools[0].function.parameters: must be a JSON schema object");
  chat.mutable_tools(0)->mutable_function()->clear_parameters();
  mmserve::v1::ChatMessage* m = chat.add_messages();
  m->set_role("assistant");
  mmserve::v1::ToolCall* c = m->add_tool_calls();
  c->set_id("x");
  c->set_name("f");
  c->set_arguments("nope");
  CHECK(ValidateToolUse(chat, ToolFieldNames::kProto).message() ==
        "chat.messages[1].tool_calls[0].arguments: must be the JSON text of an object");
  c->set_arguments("{}");
  mmserve::v1::ChatMessage* result = chat.add_messages();
  result->set_role("tool");
  result->set_tool_call_id("x");
  result->add_content()->mutable_image()->set_data("png");
  CHECK(ValidateToolUse(chat, ToolFieldNames::kProto).message() ==
        "chat.messages[2].content: a tool result is text only");
}

}  // namespace
}  // namespace mmserve::router
