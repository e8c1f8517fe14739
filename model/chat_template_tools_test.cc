// The chat formats against the Jinja templates' own rendering, byte for
// byte: every family's template over one corpus
// (model/testdata/chat_template_goldens.json, written by
// tools/gen_chat_template_goldens.py) and Qwen2-VL's format with tools
// (model/testdata/tool_template_goldens.json, tools/gen_tool_template_goldens.py).
#include <catch2/catch.hpp>
#include <map>
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
        } else if (part["type"] == "video") {
          msg.parts.push_back({ChatPart::Kind::kVideo, ""});
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
    if (m.contains("reasoning_content")) msg.reasoning_content = m["reasoning_content"];
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

ChatFamily FamilyNamed(const std::string& name) {
  if (name == "qwen2_vl") return ChatFamily::kQwen2Vl;
  if (name == "qwen2_5") return ChatFamily::kQwen25;
  if (name == "qwen3") return ChatFamily::kQwen3;
  REQUIRE(name == "qwen3_vl");
  return ChatFamily::kQwen3Vl;
}

TEST_CASE("every family's chats render as its own Jinja template does, byte for byte",
          "[chat][family]") {
  auto text = ReadFileToString("model/testdata/chat_template_goldens.json");
  REQUIRE(text.ok());
  std::map<std::string, int> cases;
  for (const json& c : json::parse(*text)) {
    const std::string family = c["family"];
    INFO("family " << family << ", case " << c["name"].get<std::string>());
    const json& o = c["options"];
    ChatOptions opts;
    opts.add_generation_prompt = o.value("add_generation_prompt", true);
    opts.add_vision_id = o.value("add_vision_id", false);
    opts.enable_thinking = o.value("enable_thinking", true);
    opts.tools = ToTools(c["tools"]);
    auto got = RenderChat(FamilyNamed(family), ToChat(c["messages"]), opts);
    REQUIRE(got.ok());
    CHECK(*got == c["text"].get<std::string>());
    ++cases[family];
  }
  CHECK(cases == std::map<std::string, int>{
                     {"qwen2_vl", 7}, {"qwen2_5", 9}, {"qwen3", 19}, {"qwen3_vl", 13}});
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
