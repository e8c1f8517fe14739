// Tools in the chat format against the Jinja template's own rendering
// (model/testdata/tool_template_goldens.json, written by
// tools/gen_tool_template_goldens.py), byte for byte.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file.h"
#include "model/chat_template.h"
#include "model/py_json.h"

namespace mmserve::model {
namespace {

using json = nlohmann::ordered_json;

// A golden case's OpenAI-shaped messages as ChatMessages.
std::vector<ChatMessage> ToChat(const json& messages) {
  std::vector<ChatMessage> out;
  for (const json& m : messages) {
    ChatMessage& msg = out.emplace_back();
    msg.role = m["role"];
    const json& content = m["content"];
    if (content.is_string()) {
      msg.parts.push_back({ChatPart::Kind::kText, content});
    } else if (content.is_array()) {
      for (const json& part : content) {
        if (part["type"] == "image") {
          msg.parts.push_back({ChatPart::Kind::kImage, ""});
        } else {
          msg.parts.push_back({ChatPart::Kind::kText, part["text"]});
        }
      }
    }
    if (m.contains("tool_calls")) {
      for (const json& call : m["tool_calls"]) {
        msg.tool_calls.push_back({call["function"]["name"], call["function"]["arguments"]});
      }
    }
  }
  return out;
}

std::vector<ChatTool> ToTools(const json& tools) {
  std::vector<ChatTool> out;
  for (const json& t : tools) {
    const json& f = t["function"];
    ChatTool& tool = out.emplace_back();
    tool.name = f["name"];
    if (f.contains("description")) tool.description = f["description"].get<std::string>();
    if (f.contains("parameters")) tool.parameters = f["parameters"].dump();  // compact
  }
  return out;
}

TEST_CASE("chats with tools render as the Jinja template does, byte for byte", "[chat][tools]") {
  auto text = ReadFileToString("model/testdata/tool_template_goldens.json");
  REQUIRE(text.ok());
  int cases = 0;
  for (const json& c : json::parse(*text)) {
    INFO("case " << c["name"].get<std::string>());
    ChatOptions opts;
    opts.add_generation_prompt = c["add_generation_prompt"];
    opts.tools = ToTools(c["tools"]);
    auto got = RenderQwen2VlChat(ToChat(c["messages"]), opts);
    REQUIRE(got.ok());
    CHECK(*got == c["text"].get<std::string>());
    ++cases;
  }
  CHECK(cases == 5);
}

TEST_CASE("tool JSON is written as Python's json.dumps writes it", "[chat][tools]") {
  CHECK(*PyJsonReformat(R"({"b":1,"a":[1.5,-0.0,1e100,1E-7,"é\u0001\"\\",{}],"c":null})") ==
        "{\"b\": 1, \"a\": [1.5, -0.0, 1e+100, 1e-07, \"é\\u0001\\\"\\\\\", {}], \"c\": null}");
  CHECK(*PyJsonReformat("[]") == "[]");
  CHECK(*PyJsonReformat("\"\\u2028\\n\"") == "\"\u2028\\n\"");
  CHECK(PyJsonReformat("{\"a\":").status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("tool messages and calls are refused where the format has no place for them",
          "[chat][tools]") {
  ChatOptions opts;
  auto bad_args = RenderQwen2VlChat(
      {{"user", {{ChatPart::Kind::kText, "x"}}, {}}, {"assistant", {}, {{"f", "{oops"}}}}, opts);
  CHECK(bad_args.status().message() == "message 1: tool call 0 arguments is not valid JSON");
  auto user_calls =
      RenderQwen2VlChat({{"user", {{ChatPart::Kind::kText, "x"}}, {{"f", "{}"}}}}, opts);
  CHECK(user_calls.status().message() == "message 0: only assistant messages make tool calls");
  auto tool_image = RenderQwen2VlChat({{"tool", {{ChatPart::Kind::kImage, ""}}, {}}}, opts);
  CHECK(tool_image.status().message() == "message 0: only user messages may hold images");
  opts.tools = {{"f", std::nullopt, "{\"type\": "}};
  auto bad_schema = RenderQwen2VlChat({{"user", {{ChatPart::Kind::kText, "x"}}, {}}}, opts);
  CHECK(bad_schema.status().message() == "tool 0 parameters is not valid JSON");
}

}  // namespace
}  // namespace mmserve::model
