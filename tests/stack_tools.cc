#include "tests/stack_tools.h"

#include <httplib.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "common/grpc_server.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "tests/stack_harness.h"

namespace mmserve::testing {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;  // request bodies keep their key order

constexpr char kShapesSchema[] =
    R"({"type": "object", "properties": {"shape": {"type": "string", "enum": ["circle", "square",)"
    R"( "triangle"]}, "count": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": )"
    R"(["shape", "count"], "additionalProperties": false})";
constexpr char kNoArgsSchema[] =
    R"({"type": "object", "properties": {}, "additionalProperties": false})";

ojson Tools() {
  return ojson::array({{{"type", "function"},
                        {"function",
                         {{"name", "count_shapes"},
                          {"description", "Counts the shapes of one kind in the picture."},
                          {"parameters", ojson::parse(kShapesSchema)}}}},
                       {{"type", "function"},
                        {"function",
                         {{"name", "get_time"},
                          {"description", "The current time."},
                          {"parameters", ojson::parse(kNoArgsSchema)}}}}});
}

std::vector<model::ChatTool> RendererTools() {
  return {{"count_shapes", "Counts the shapes of one kind in the picture.", kShapesSchema},
          {"get_time", "The current time.", kNoArgsSchema}};
}

ojson Body(ojson messages, int max_tokens) {
  ojson body;
  body["messages"] = std::move(messages);
  body["tools"] = Tools();
  body["temperature"] = 0;
  body["max_tokens"] = max_tokens;
  return body;
}

std::pair<int, json> PostChat(int port, const ojson& body) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  auto res = cli.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(res);
  return {res->status, json::parse(res->body, nullptr, false)};
}

// A streamed reply reassembled as the openai SDK does: content, tool_calls
// by index (id, type and name from a call's first delta, arguments
// concatenated), the finish reason.
struct Streamed {
  json content = nullptr;
  json tool_calls = json::array();
  std::string finish;
};

Streamed PostStream(int port, ojson body) {
  body["stream"] = true;
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  auto res = cli.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  Streamed s;
  for (absl::string_view event : absl::StrSplit(res->body, "\n\n", absl::SkipEmpty())) {
    REQUIRE(absl::ConsumePrefix(&event, "data: "));
    if (event == "[DONE]") break;
    const json chunk = json::parse(event);
    const json& choice = chunk["choices"][0];
    const json& delta = choice["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      s.content = (s.content.is_null() ? "" : s.content.get<std::string>()) +
                  delta["content"].get<std::string>();
    }
    if (delta.contains("tool_calls")) {
      for (const json& d : delta["tool_calls"]) {
        const size_t i = d["index"];
        if (i == s.tool_calls.size()) {
          REQUIRE(d.contains("id"));
          s.tool_calls.push_back(
              {{"id", d["id"]},
               {"type", d["type"]},
               {"function", {{"name", d["function"]["name"]}, {"arguments", ""}}}});
        }
        REQUIRE(i < s.tool_calls.size());
        json& args = s.tool_calls[i]["function"]["arguments"];
        args = args.get<std::string>() + d["function"]["arguments"].get<std::string>();
      }
    }
    if (choice["finish_reason"].is_string()) s.finish = choice["finish_reason"];
  }
  return s;
}

// The rendered prompt's token count, as the language side tokenizes it.
int RenderedTokens(const std::vector<model::ChatMessage>& messages) {
  model::ChatOptions options;
  options.tools = RendererTools();
  auto text = model::RenderQwen2VlChat(messages, options);
  REQUIRE(text.ok());
  auto tokenizer = model::Tokenizer::FromFile(DemoModelDir() + "/tokenizer.json");
  REQUIRE(tokenizer.ok());
  auto ids = (*tokenizer)->Encode(*text);
  REQUIRE(ids.ok());
  return static_cast<int>(ids->size());
}

// A call of one of Tools() whose arguments follow its schema.
void CheckCall(const json& call) {
  INFO(call.dump());
  CHECK(call["type"] == "function");
  CHECK(call["id"].get<std::string>().rfind("call_", 0) == 0);
  const json args = json::parse(call["function"]["arguments"].get<std::string>());
  REQUIRE(args.is_object());
  if (call["function"]["name"] == "get_time") {
    CHECK(args.empty());
    return;
  }
  REQUIRE(call["function"]["name"] == "count_shapes");
  CHECK(args.size() == 2);
  const std::string shape = args.at("shape");
  CHECK((shape == "circle" || shape == "square" || shape == "triangle"));
  REQUIRE(args.at("count").is_number_integer());
  CHECK(args["count"].get<int>() >= 0);
  CHECK(args["count"].get<int>() <= 9);
}

}  // namespace

void CheckToolCalls(launcher::LocalStack& stack) {
  const int port = stack.http_port();
  const std::string question = Demo().items[0].question;

  // Auto: the tools reach the prompt (its token count is the rendering's),
  // the output is parsed, and the demo model answers in text.
  const ojson ask = Body({{{"role", "user"}, {"content", question}}}, 16);
  const auto [status, reply] = PostChat(port, ask);
  INFO(reply.dump());
  REQUIRE(status == 200);
  const json& choice = reply["choices"][0];
  REQUIRE(choice["message"]["content"].is_string());
  CHECK(!choice["message"].contains("tool_calls"));
  CHECK((choice["finish_reason"] == "stop" || choice["finish_reason"] == "length"));
  CHECK(reply["usage"]["prompt_tokens"] ==
        RenderedTokens({{"user", {{model::ChatPart::Kind::kText, question}}, {}}}));

  // The same streamed: the chunks reassemble to the whole reply.
  const Streamed streamed = PostStream(port, ask);
  CHECK(streamed.content == choice["message"]["content"]);
  CHECK(streamed.tool_calls.empty());
  CHECK(streamed.finish == choice["finish_reason"]);

  // The same over gRPC: the same text.
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  AskOptions o;
  o.max_tokens = 16;
  mmserve::v1::GenerateRequest grpc = DemoTextRequest(Demo().items[0], o);
  for (const model::ChatTool& t : RendererTools()) {
    mmserve::v1::FunctionDefinition* f = grpc.mutable_chat()->add_tools()->mutable_function();
    f->set_name(t.name);
    f->set_description(*t.description);
    f->set_parameters(t.parameters);
  }
  const Answer a = AskGrpc(*stub, grpc, o);
  REQUIRE(a.status.ok());
  CHECK(a.text == choice["message"]["content"]);

  // A tool result in a multi-turn chat: rendered as the template does.
  ojson turns = {
      {{"role", "user"}, {"content", question}},
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "call_a"},
          {"type", "function"},
          {"function",
           {{"name", "count_shapes"}, {"arguments", R"({"shape":"circle","count":2})"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "call_a"}, {"content", "2"}}};
  const auto [turn_status, turn_reply] = PostChat(port, Body(turns, 8));
  INFO(turn_reply.dump());
  REQUIRE(turn_status == 200);
  CHECK(turn_reply["usage"]["prompt_tokens"] ==
        RenderedTokens({{"user", {{model::ChatPart::Kind::kText, question}}, {}},
                        {"assistant", {}, {{"count_shapes", R"({"shape":"circle","count":2})"}}},
                        {"tool", {{model::ChatPart::Kind::kText, "2"}}, {}}}));

  // An image with tools.
  const DemoItem& item = Demo().items[0];
  ojson image_turn = {{{"role", "user"},
                       {"content",
                        {{{"type", "image_url"},
                          {"image_url",
                           {{"url", "data:image/png;base64," +
                                        absl::Base64Escape(Demo().images.at(item.image_file))}}}},
                         {{"type", "text"}, {"text", item.question}}}}}};
  const auto [image_status, image_reply] = PostChat(port, Body(image_turn, 8));
  INFO(image_reply.dump().substr(0, 500));
  REQUIRE(image_status == 200);
  CHECK(image_reply["choices"][0]["message"]["content"].is_string());
  CHECK(image_reply["usage"]["prompt_tokens"] > reply["usage"]["prompt_tokens"]);

  // Refusals name the field, over HTTP and gRPC.
  ojson unknown = ask;
  unknown["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  const auto [unknown_status, unknown_reply] = PostChat(port, unknown);
  CHECK(unknown_status == 400);
  CHECK(unknown_reply["error"]["message"] == "tool_choice: \"nope\" is not one of the tools");
  mmserve::v1::GenerateRequest bad = grpc;
  bad.mutable_chat()->mutable_tool_choice()->set_function_name("nope");
  const Answer refused = AskGrpc(*stub, bad, o);
  CHECK(refused.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(refused.status.message() ==
        "chat.tool_choice.function_name: \"nope\" is not one of the tools");
  mmserve::v1::GenerateRequest orphan = grpc;
  mmserve::v1::ChatMessage* result = orphan.mutable_chat()->add_messages();
  result->set_role("tool");
  result->set_tool_call_id("call_x");
  result->add_content()->set_text("42");
  const Answer orphaned = AskGrpc(*stub, orphan, o);
  CHECK(orphaned.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(orphaned.status.message() ==
        "chat.messages[1].tool_call_id: \"call_x\" is not the id of an earlier assistant tool "
        "call");
  mmserve::v1::GenerateRequest both = grpc;
  both.mutable_chat()->mutable_tool_choice()->set_mode(mmserve::v1::ToolChoice::MODE_REQUIRED);
  both.mutable_sampling()->mutable_constraint()->set_json_object(true);
  const Answer conflict = AskGrpc(*stub, both, o);
  CHECK(conflict.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(conflict.status.message().find("tool_choice: \"required\" or a named function") == 0);
}

void CheckToolChoiceEnforced(launcher::LocalStack& stack) {
  const int port = stack.http_port();
  const ojson turn = {{{"role", "user"}, {"content", Demo().items[1].question}}};

  // Named: exactly one call of that function, arguments per its schema; the
  // stream reassembles to the same message.
  ojson named = Body(turn, 200);
  named["tool_choice"] = {{"type", "function"}, {"function", {{"name", "count_shapes"}}}};
  const auto [status, reply] = PostChat(port, named);
  INFO(reply.dump());
  REQUIRE(status == 200);
  const json& message = reply["choices"][0]["message"];
  CHECK(reply["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(message["content"].is_null());
  REQUIRE(message["tool_calls"].size() == 1);
  CHECK(message["tool_calls"][0]["function"]["name"] == "count_shapes");
  CheckCall(message["tool_calls"][0]);
  const Streamed streamed = PostStream(port, named);
  CHECK(streamed.finish == "tool_calls");
  CHECK(streamed.content.is_null());
  REQUIRE(streamed.tool_calls.size() == 1);
  CHECK(streamed.tool_calls[0]["function"] == message["tool_calls"][0]["function"]);
  CHECK(streamed.tool_calls[0]["id"] != message["tool_calls"][0]["id"]);  // each call its own

  // Required, one call: any tool, arguments per its schema; with n = 2
  // sampled, each choice calls.
  ojson required = Body(turn, 200);
  required["tool_choice"] = "required";
  required["parallel_tool_calls"] = false;
  required["n"] = 2;
  required["temperature"] = 0.9;
  required["seed"] = 5;
  const auto [required_status, required_reply] = PostChat(port, required);
  INFO(required_reply.dump());
  REQUIRE(required_status == 200);
  REQUIRE(required_reply["choices"].size() == 2);
  for (const json& c : required_reply["choices"]) {
    CHECK(c["finish_reason"] == "tool_calls");
    REQUIRE(c["message"]["tool_calls"].size() == 1);
    CheckCall(c["message"]["tool_calls"][0]);
  }

  // Over gRPC: the deltas assemble to one call and no text.
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  AskOptions o;
  o.max_tokens = 200;
  mmserve::v1::GenerateRequest grpc = DemoTextRequest(Demo().items[1], o);
  for (const model::ChatTool& t : RendererTools()) {
    mmserve::v1::FunctionDefinition* f = grpc.mutable_chat()->add_tools()->mutable_function();
    f->set_name(t.name);
    f->set_parameters(t.parameters);
  }
  grpc.mutable_chat()->mutable_tool_choice()->set_function_name("count_shapes");
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, grpc);
  mmserve::v1::GenerateResponse r;
  std::string text;
  json call = {{"type", "function"}, {"function", {{"arguments", ""}}}};
  while (reader->Read(&r)) {
    text += r.text();
    for (const mmserve::v1::ToolCallDelta& d : r.tool_calls()) {
      CHECK(d.index() == 0);
      if (!d.id().empty()) call["id"] = d.id();
      if (!d.name().empty()) call["function"]["name"] = d.name();
      call["function"]["arguments"] =
          call["function"]["arguments"].get<std::string>() + d.arguments();
    }
  }
  REQUIRE(reader->Finish().ok());
  CHECK(text.empty());
  CheckCall(call);
}

}  // namespace mmserve::testing
