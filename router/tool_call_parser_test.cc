#include "router/tool_call_parser.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "router/openai.h"

namespace mmserve::router {
namespace {

using mmserve::v1::GenerateResponse;

// Ids "call_0", "call_1", ... so that outputs compare.
ToolCallParser::Options Tools(std::vector<std::string> names, bool parallel = true) {
  auto next = std::make_shared<int>(0);
  return {.tool_names = std::move(names), .parallel = parallel, .new_id = [next] {
            return "call_" + std::to_string((*next)++);
          }};
}

// Text and calls (id, name, arguments) assembled from outputs.
struct Assembled {
  std::string text;
  std::vector<std::vector<std::string>> calls;
  void Add(const ToolCallParser::Output& out) {
    text += out.text;
    for (const auto& d : out.calls) {
      if (d.index() >= calls.size()) calls.resize(d.index() + 1, {"", "", ""});
      if (!d.id().empty()) calls[d.index()][0] = d.id();
      if (!d.name().empty()) calls[d.index()][1] = d.name();
      calls[d.index()][2] += d.arguments();
    }
  }
};

// The output parsed from `pieces` fed one by one.
Assembled Parse(const std::vector<std::string>& pieces, ToolCallParser::Options options) {
  ToolCallParser parser(std::move(options));
  Assembled a;
  for (const std::string& p : pieces) a.Add(parser.Add(p));
  a.Add(parser.Finish());
  return a;
}

Assembled Whole(const std::string& text, ToolCallParser::Options options) {
  return Parse({text}, std::move(options));
}

const std::string kCall =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Köln\", \"days\": 2}}\n"
    "</tool_call>";

TEST_CASE("a call becomes a first delta (id, name, empty arguments) and its arguments",
          "[tool_calls]") {
  ToolCallParser parser(Tools({"get_weather"}));
  ToolCallParser::Output out = parser.Add(kCall);
  CHECK(out.text.empty());
  REQUIRE(out.calls.size() == 2);
  CHECK(out.calls[0].index() == 0);
  CHECK(out.calls[0].id() == "call_0");
  CHECK(out.calls[0].name() == "get_weather");
  CHECK(out.calls[0].arguments().empty());
  CHECK(out.calls[1].index() == 0);
  CHECK(out.calls[1].id().empty());
  CHECK(out.calls[1].arguments() == "{\"city\": \"Köln\", \"days\": 2}");
  CHECK(parser.calls() == 1);
  CHECK(parser.Finish().text.empty());
}

TEST_CASE("text before the calls is content; whitespace next to calls is not", "[tool_calls]") {
  Assembled a = Whole("Let me check.\n" + kCall + "\n" + kCall + "\n", Tools({"get_weather"}));
  CHECK(a.text == "Let me check.");
  REQUIRE(a.calls.size() == 2);
  CHECK(a.calls[1][0] == "call_1");
  Assembled after = Whole(kCall + "\n\nDone.", Tools({"get_weather"}));
  CHECK(after.text == "\n\nDone.");
  Assembled plain = Whole("  no calls here \n", Tools({"get_weather"}));
  CHECK(plain.text == "  no calls here \n");
  CHECK(plain.calls.empty());
}

TEST_CASE("arguments are re-serialised as json.dumps writes them; missing ones are {}",
          "[tool_calls]") {
  Assembled a = Whole(
      "<tool_call>{\"name\":\"f\",\"arguments\":{\"b\":[1,2.50],\"a\":\"x\"}}</tool_call>"
      "<tool_call>{\"name\": \"f\"}</tool_call>",
      Tools({"f"}));
  REQUIRE(a.calls.size() == 2);
  CHECK(a.calls[0][2] == "{\"b\": [1, 2.5], \"a\": \"x\"}");
  CHECK(a.calls[1][2] == "{}");
}

TEST_CASE("malformed blocks, unknown tools and unclosed blocks stay text as written",
          "[tool_calls]") {
  const std::string bad_json = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\n</tool_call>";
  CHECK(Whole(bad_json, Tools({"f"})).text == bad_json);
  CHECK(Whole(bad_json, Tools({"f"})).calls.empty());
  const std::string unknown = "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
  CHECK(Whole(unknown, Tools({"f"})).text == unknown);
  const std::string not_object =
      "<tool_call>\n{\"name\": \"f\", \"arguments\": \"x\"}\n</tool_call>";
  CHECK(Whole(not_object, Tools({"f"})).text == not_object);
  const std::string unclosed = "a <tool_call>\n{\"name\": \"f\"";
  CHECK(Whole(unclosed, Tools({"f"})).text == unclosed);
  // A good call after a bad one is still a call; the bad one stays text.
  Assembled mixed = Whole(unknown + "\n" + kCall, Tools({"get_weather"}));
  CHECK(mixed.text == unknown);
  CHECK(mixed.calls.size() == 1);
}

TEST_CASE("without parallel tool calls only the first call is kept", "[tool_calls]") {
  Assembled a = Whole(kCall + "\n" + kCall, Tools({"get_weather"}, /*parallel=*/false));
  CHECK(a.calls.size() == 1);
  CHECK(a.text.empty());
}

TEST_CASE("text that may begin a call is held back until decided", "[tool_calls]") {
  ToolCallParser parser(Tools({"f"}));
  CHECK(parser.Add("Hi <tool").text == "Hi");
  CHECK(parser.Add("box>").text == " <toolbox>");
  CHECK(parser.Add(" <tool_call>{\"name\": \"f\", ").text.empty());
  CHECK(parser.Add("\"arguments\": {}}").calls.empty());
  ToolCallParser::Output closed = parser.Add("</tool_call>");
  CHECK(closed.calls.size() == 2);
  CHECK(closed.text.empty());
  CHECK(parser.Add("<").text.empty());
  CHECK(parser.Finish().text == "<");
}

TEST_CASE("any split of the output parses as the whole does", "[tool_calls]") {
  const std::vector<std::string> outputs = {
      "Let me check.\n" + kCall + "\n" + kCall,
      "a <tool_call>\n{\"name\": \"nope\"}\n</tool_call> b\n" + kCall + "\n tail", "<tool_cal",
      "x\n\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>\n",
      "plain text with < and <tool and </tool_call> in it"};
  for (const std::string& text : outputs) {
    INFO(text);
    const Assembled whole = Whole(text, Tools({"get_weather"}));
    for (size_t step : {1, 2, 3, 5, 7}) {
      std::vector<std::string> pieces;
      for (size_t at = 0; at < text.size(); at += step) pieces.push_back(text.substr(at, step));
      const Assembled split = Parse(pieces, Tools({"get_weather"}));
      CHECK(split.text == whole.text);
      CHECK(split.calls == whole.calls);
    }
  }
}

TEST_CASE("streamed chunks reassemble to the whole chat.completion", "[tool_calls]") {
  const std::string text = "Checking.\n" + kCall + "\n" + kCall;
  CompletionContext ctx{"m", 1, false, false, 1, /*tool_calls=*/true};
  ChatCompletionBuilder whole(ctx);
  ChatCompletionStream stream(ctx);
  ToolCallParser whole_parser(Tools({"get_weather"})), stream_parser(Tools({"get_weather"}));
  auto response = [](const ToolCallParser::Output& out, bool final) {
    GenerateResponse r;
    r.set_request_id("r");
    r.set_text(out.text);
    for (const auto& d : out.calls) *r.add_tool_calls() = d;
    if (final) r.set_finish_reason(mmserve::v1::FINISH_REASON_STOP);
    return r;
  };
  // Whole: one response. Streamed: three characters at a time.
  ToolCallParser::Output all = whole_parser.Add(text);
  ToolCallParser::Output end = whole_parser.Finish();
  all.text += end.text;
  whole.Add(response(all, true));
  std::string sse;
  for (size_t at = 0; at < text.size(); at += 3) {
    const bool final = at + 3 >= text.size();
    ToolCallParser::Output out = stream_parser.Add(text.substr(at, 3));
    if (final) {
      ToolCallParser::Output last = stream_parser.Finish();
      out.text += last.text;
      for (auto& d : last.calls) out.calls.push_back(d);
    }
    sse += stream.OnResponse(response(out, final));
  }
  // Reassemble the deltas as the openai SDK does.
  nlohmann::json message = {{"content", ""}, {"tool_calls", nlohmann::json::array()}};
  std::string finish;
  int chunks_with_calls = 0;
  for (size_t at = sse.find("data: "); at != std::string::npos; at = sse.find("data: ", at + 1)) {
    const std::string data = sse.substr(at + 6, sse.find("\n\n", at) - at - 6);
    if (data == "[DONE]") break;
    const nlohmann::json chunk = nlohmann::json::parse(data);
    const nlohmann::json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      message["content"] =
          message["content"].get<std::string>() + delta["content"].get<std::string>();
    }
    if (delta.contains("tool_calls")) {
      ++chunks_with_calls;
      for (const auto& d : delta["tool_calls"]) {
        const size_t i = d["index"];
        auto& calls = message["tool_calls"];
        if (i >= calls.size())
          calls.push_back({{"id", d["id"]},
                           {"type", d["type"]},
                           {"function", {{"name", d["function"]["name"]}, {"arguments", ""}}}});
        calls[i]["function"]["arguments"] = calls[i]["function"]["arguments"].get<std::string>() +
                                            d["function"]["arguments"].get<std::string>();
      }
    }
    const nlohmann::json& f = chunk["choices"][0]["finish_reason"];
    if (f.is_string()) finish = f;
  }
  const nlohmann::json want = nlohmann::json::parse(whole.Json())["choices"][0];
  CHECK(finish == "tool_calls");
  CHECK(want["finish_reason"] == "tool_calls");
  CHECK(chunks_with_calls == 4);  // a call's name, then its arguments
  CHECK(message["content"] == want["message"]["content"]);
  CHECK(message["tool_calls"] == want["message"]["tool_calls"]);
  CHECK(want["message"]["tool_calls"].size() == 2);
  CHECK(want["message"]["tool_calls"][0]["function"]["arguments"] ==
        "{\"city\": \"Köln\", \"days\": 2}");
}

TEST_CASE("a choice that called tools and said nothing else has null content", "[tool_calls]") {
  CompletionContext ctx{"m", 1, false, false, 1};
  ChatCompletionBuilder reply(ctx);
  ToolCallParser parser(Tools({"get_weather"}));
  GenerateResponse r;
  for (const auto& d : parser.Add(kCall).calls) *r.add_tool_calls() = d;
  r.set_finish_reason(mmserve::v1::FINISH_REASON_STOP);
  reply.Add(r);
  const nlohmann::json j = nlohmann::json::parse(reply.Json())["choices"][0];
  CHECK(j["message"]["content"].is_null());
  CHECK(j["message"]["tool_calls"][0]["type"] == "function");
  CHECK(j["message"]["tool_calls"][0]["id"] == "call_0");
  CHECK(j["finish_reason"] == "tool_calls");
  // Cut by max_tokens: "length" stays.
  GenerateResponse cut = r;
  cut.set_finish_reason(mmserve::v1::FINISH_REASON_LENGTH);
  ChatCompletionBuilder cut_reply(ctx);
  cut_reply.Add(cut);
  CHECK(nlohmann::json::parse(cut_reply.Json())["choices"][0]["finish_reason"] == "length");
}

}  // namespace
}  // namespace mmserve::router
