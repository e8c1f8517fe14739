// The OpenAI replies: a GenerateResponse stream turned into a chat
// completion, whole or as server-sent events.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "router/openai.h"
#include "router/openai_testing.h"

namespace mmserve::router {
namespace {

using json = nlohmann::json;
using mmserve::v1::GenerateResponse;

GenerateResponse Step(const std::string& text) {
  GenerateResponse r;
  r.set_request_id("r42");
  r.set_text(text);
  return r;
}

GenerateResponse Final(const std::string& text, mmserve::v1::FinishReason reason) {
  GenerateResponse r = Step(text);
  r.set_finish_reason(reason);
  r.mutable_usage()->set_prompt_tokens(30);
  r.mutable_usage()->set_completion_tokens(4);
  r.mutable_usage()->set_cached_prompt_tokens(16);
  return r;
}

void AddLogprob(GenerateResponse* r, uint32_t id, const std::string& text, float logprob) {
  mmserve::v1::PositionLogprobs* p = r->add_logprobs();
  p->mutable_sampled()->set_token_id(id);
  p->mutable_sampled()->set_text(text);
  p->mutable_sampled()->set_logprob(logprob);
  mmserve::v1::TokenLogprob* alt = p->add_top();
  alt->set_token_id(id);
  alt->set_text(text);
  alt->set_logprob(logprob);
  alt = p->add_top();
  alt->set_token_id(id + 1);
  alt->set_text("x");
  alt->set_logprob(-3.5f);
}

TEST_CASE("the non-streamed reply accumulates the whole stream", "[openai]") {
  ChatCompletionBuilder builder(CompletionContext{"shapes-demo", 1700000000, false, false});
  builder.Add(Step("top "));
  CHECK_FALSE(builder.finished());
  builder.Add(Step(""));
  GenerateResponse last = Final("left", mmserve::v1::FINISH_REASON_STOP_STRING);
  last.set_matched_stop("\n");
  builder.Add(last);
  CHECK(builder.finished());

  json j = json::parse(builder.Json());
  CHECK(j["id"] == "chatcmpl-r42");
  CHECK(j["object"] == "chat.completion");
  CHECK(j["created"] == 1700000000);
  CHECK(j["model"] == "shapes-demo");
  REQUIRE(j["choices"].size() == 1);
  const json& choice = j["choices"][0];
  CHECK(choice["index"] == 0);
  CHECK(choice["message"] == json{{"role", "assistant"}, {"content", "top left"}});
  CHECK(choice["finish_reason"] == "stop");
  CHECK(choice["stop_reason"] == "\n");
  CHECK(choice["logprobs"].is_null());
  CHECK(j["usage"] == json{{"prompt_tokens", 30},
                           {"completion_tokens", 4},
                           {"total_tokens", 34},
                           {"prompt_tokens_details", {{"cached_tokens", 16}}}});
  // Keys come in OpenAI's order, not sorted.
  CHECK(
      absl::StartsWith(builder.Json(), "{\"id\":\"chatcmpl-r42\",\"object\":\"chat.completion\""));
}

TEST_CASE("finish reasons map to OpenAI's words", "[openai]") {
  CHECK(OpenAiFinishReason(mmserve::v1::FINISH_REASON_STOP) == "stop");
  CHECK(OpenAiFinishReason(mmserve::v1::FINISH_REASON_STOP_STRING) == "stop");
  CHECK(OpenAiFinishReason(mmserve::v1::FINISH_REASON_LENGTH) == "length");
  CHECK(OpenAiFinishReason(mmserve::v1::FINISH_REASON_ABORT) == "abort");
  CHECK(OpenAiFinishReason(mmserve::v1::FINISH_REASON_UNSPECIFIED).empty());

  ChatCompletionBuilder builder(CompletionContext{"m", 1, false, false});
  builder.Add(Final("a b c d", mmserve::v1::FINISH_REASON_LENGTH));
  json j = json::parse(builder.Json());
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["choices"][0]["stop_reason"].is_null());

  // A stream that never finished reports null, not a made-up reason.
  ChatCompletionBuilder unfinished(CompletionContext{"m", 1, false, false});
  unfinished.Add(Step("a"));
  CHECK(json::parse(unfinished.Json())["choices"][0]["finish_reason"].is_null());
}

TEST_CASE("logprobs come back in OpenAI's shape when requested", "[openai]") {
  ChatCompletionBuilder builder(CompletionContext{"m", 1, true, false});
  GenerateResponse a = Step("Hi");
  AddLogprob(&a, 10, "Hi", -0.25f);
  GenerateResponse b = Final("\xc3\xa9", mmserve::v1::FINISH_REASON_STOP);
  AddLogprob(&b, 20, "\xc3\xa9", -std::numeric_limits<float>::infinity());
  builder.Add(a);
  builder.Add(b);
  json content = json::parse(builder.Json())["choices"][0]["logprobs"]["content"];
  REQUIRE(content.size() == 2);
  CHECK(content[0]["token"] == "Hi");
  CHECK(content[0]["logprob"] == -0.25);
  CHECK(content[0]["bytes"] == json{72, 105});
  REQUIRE(content[0]["top_logprobs"].size() == 2);
  CHECK(content[0]["top_logprobs"][1] == json{{"token", "x"}, {"logprob", -3.5}, {"bytes", {120}}});
  CHECK(content[1]["token"] == "\xc3\xa9");
  CHECK(content[1]["bytes"] == json{0xc3, 0xa9});
  CHECK(content[1]["logprob"] == -9999.0);  // -inf has no JSON form
}

// Splits an SSE body into its data payloads, checking the framing.
std::vector<std::string> SsePayloads(const std::string& sse) {
  std::vector<std::string> out;
  REQUIRE((sse.empty() || absl::EndsWith(sse, "\n\n")));
  for (absl::string_view event : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    REQUIRE(absl::StartsWith(event, "data: "));
    out.emplace_back(event.substr(6));
  }
  return out;
}

TEST_CASE("a stream opens with the role, sends deltas, ends with finish, usage and [DONE]",
          "[openai]") {
  CompletionContext ctx{"shapes-demo", 1700000000, false, true};
  ChatCompletionStream stream(ctx);
  std::vector<std::string> events;
  for (const GenerateResponse& r : {Step(""), Step("top"), Step(""), Step(" left"),
                                    Final("", mmserve::v1::FINISH_REASON_STOP)}) {
    for (std::string& e : SsePayloads(stream.OnResponse(r))) events.push_back(std::move(e));
  }
  CHECK(stream.done());
  // role, "top", " left", finish, usage, [DONE]: the empty step said nothing.
  REQUIRE(events.size() == 6);
  std::vector<json> chunks;
  for (size_t i = 0; i + 1 < events.size(); ++i) chunks.push_back(json::parse(events[i]));
  CHECK(events.back() == "[DONE]");

  for (size_t i = 0; i < 4; ++i) {
    INFO(i);
    CHECK(chunks[i]["id"] == "chatcmpl-r42");
    CHECK(chunks[i]["object"] == "chat.completion.chunk");
    CHECK(chunks[i]["created"] == 1700000000);
    CHECK(chunks[i]["model"] == "shapes-demo");
    CHECK(chunks[i]["usage"].is_null());
    CHECK(chunks[i].contains("usage"));  // null, present: include_usage was asked
    CHECK(chunks[i]["choices"][0]["index"] == 0);
  }
  CHECK(chunks[0]["choices"][0]["delta"] == json{{"role", "assistant"}, {"content", ""}});
  CHECK(chunks[0]["choices"][0]["finish_reason"].is_null());
  CHECK(chunks[1]["choices"][0]["delta"] == json{{"content", "top"}});
  CHECK(chunks[2]["choices"][0]["delta"] == json{{"content", " left"}});
  CHECK(chunks[3]["choices"][0]["delta"] == json::object());
  CHECK(chunks[3]["choices"][0]["finish_reason"] == "stop");
  CHECK(chunks[4]["choices"] == json::array());
  CHECK(chunks[4]["usage"]["total_tokens"] == 34);

  // Nothing after [DONE].
  CHECK(stream.OnResponse(Step("late")).empty());
  CHECK(stream.OnError(absl::UnavailableError("gone")).empty());
}

TEST_CASE("a stream without include_usage has no usage at all", "[openai]") {
  ChatCompletionStream stream(CompletionContext{"m", 1, false, false});
  std::string sse = stream.OnResponse(Step("Hello"));
  sse += stream.OnResponse(Final(" world", mmserve::v1::FINISH_REASON_LENGTH));
  std::vector<std::string> events = SsePayloads(sse);
  REQUIRE(events.size() == 3);
  json first = json::parse(events[0]);
  json last = json::parse(events[1]);
  CHECK(first["choices"][0]["delta"] == json{{"role", "assistant"}, {"content", "Hello"}});
  CHECK_FALSE(first.contains("usage"));
  CHECK(last["choices"][0]["delta"] == json{{"content", " world"}});
  CHECK(last["choices"][0]["finish_reason"] == "length");
  CHECK_FALSE(last.contains("usage"));
  CHECK(events[2] == "[DONE]");
}

TEST_CASE("stream chunks carry logprobs when requested", "[openai]") {
  CompletionContext ctx{"m", 1, true, false};
  GenerateResponse r = Step("A");
  AddLogprob(&r, 5, "A", -0.5f);
  json chunk = json::parse(ChatCompletionChunkJson(ctx, r, /*first=*/false));
  CHECK(chunk["choices"][0]["logprobs"]["content"][0]["token"] == "A");
  ctx.logprobs = false;
  chunk = json::parse(ChatCompletionChunkJson(ctx, r, /*first=*/false));
  CHECK(chunk["choices"][0]["logprobs"].is_null());
}

TEST_CASE("an error mid-stream becomes an error event, then [DONE]", "[openai]") {
  ChatCompletionStream stream(CompletionContext{"m", 1, false, false});
  CHECK(SsePayloads(stream.OnResponse(Step("par"))).size() == 1);
  std::vector<std::string> events =
      SsePayloads(stream.OnError(absl::UnavailableError("language instance lost")));
  REQUIRE(events.size() == 2);
  json error = json::parse(events[0]);
  CHECK(error["error"]["message"] == "language instance lost");
  CHECK(error["error"]["code"] == "unavailable");
  CHECK(events[1] == "[DONE]");
  CHECK(stream.done());
}

TEST_CASE("n choices: one message each, chunks carry their index, [DONE] after the last",
          "[openai]") {
  json body = UserSays("hi");
  body["n"] = 3;
  CHECK(MustParse(body).request.n() == 3);

  CompletionContext ctx{"m", 1, false, /*include_usage=*/true, /*n=*/2};
  ChatCompletionBuilder reply(ctx);
  ChatCompletionStream stream(ctx);
  GenerateResponse a0 = Step("Hel");
  GenerateResponse b0 = Step("Other");
  b0.set_index(1);
  GenerateResponse b1 = Final("!", mmserve::v1::FINISH_REASON_LENGTH);
  b1.set_index(1);
  GenerateResponse a1 = Final("lo", mmserve::v1::FINISH_REASON_STOP);
  std::string events;
  for (const GenerateResponse& r : {a0, b0, b1, a1}) {
    reply.Add(r);
    CHECK_FALSE(stream.done());
    events += stream.OnResponse(r);
  }
  CHECK(reply.finished());
  CHECK(stream.done());
  const json whole = json::parse(reply.Json());
  REQUIRE(whole["choices"].size() == 2);
  CHECK(whole["choices"][0]["index"] == 0);
  CHECK(whole["choices"][0]["message"]["content"] == "Hello");
  CHECK(whole["choices"][0]["finish_reason"] == "stop");
  CHECK(whole["choices"][1]["index"] == 1);
  CHECK(whole["choices"][1]["message"]["content"] == "Other!");
  CHECK(whole["choices"][1]["finish_reason"] == "length");
  CHECK(whole["usage"]["prompt_tokens"] == 30);     // once
  CHECK(whole["usage"]["completion_tokens"] == 8);  // summed
  std::vector<std::string> chunks = absl::StrSplit(events, "\n\n", absl::SkipEmpty());
  REQUIRE(chunks.size() == 6);  // four chunks, usage, [DONE]
  std::vector<int> indices;
  for (int i = 0; i < 4; ++i) {
    const json c = json::parse(chunks[i].substr(6));
    indices.push_back(c["choices"][0]["index"].get<int>());
    // Each choice's first chunk opens with the role.
    CHECK(c["choices"][0]["delta"].contains("role") == (i < 2));
  }
  CHECK(indices == std::vector<int>{0, 1, 1, 0});
  CHECK(json::parse(chunks[4].substr(6))["usage"]["completion_tokens"] == 8);
  CHECK(chunks[5] == "data: [DONE]");
}

}  // namespace
}  // namespace mmserve::router
