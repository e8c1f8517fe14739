#include "router/openai_completions.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace mmserve::router {
namespace {

using json = nlohmann::json;
using mmserve::v1::GenerateResponse;

OpenAiCompletionRequest MustParse(const json& body) {
  absl::StatusOr<OpenAiCompletionRequest> r = ParseCompletionRequest(body.dump(), OpenAiLimits());
  INFO(body.dump());
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *std::move(r);
}

std::string RefusalFor(const json& body) {
  absl::StatusOr<OpenAiCompletionRequest> r = ParseCompletionRequest(body.dump(), OpenAiLimits());
  INFO(body.dump());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

json Prompt(json prompt) { return {{"model", "m"}, {"prompt", std::move(prompt)}}; }

TEST_CASE("a text prompt with sampling fields maps onto a raw GenerateRequest", "[openai]") {
  json body = Prompt("Once upon a time");
  body["temperature"] = 0.7;
  body["top_p"] = 0.9;
  body["seed"] = 3;
  body["stop"] = {"\n"};
  body["presence_penalty"] = 0.5;
  body["frequency_penalty"] = 0.25;
  body["logit_bias"] = {{"42", -100}};
  body["logprobs"] = 3;
  body["user"] = "alice";  // ignored
  body["priority"] = -3;
  OpenAiCompletionRequest r = MustParse(body);
  CHECK(r.model == "m");
  CHECK(r.request.model() == "m");
  CHECK(r.request.raw().text() == "Once upon a time");
  CHECK(r.request.raw().token_ids_size() == 0);
  CHECK(r.request.priority() == -3);
  CHECK_FALSE(r.request.has_chat());
  const mmserve::v1::SamplingParams& s = r.request.sampling();
  CHECK(s.temperature() == 0.7f);
  CHECK(s.seed() == 3);
  CHECK(s.stop(0) == "\n");
  CHECK(s.presence_penalty() == 0.5f);
  CHECK(s.frequency_penalty() == 0.25f);
  REQUIRE(s.logit_bias_size() == 1);
  CHECK(s.logit_bias(0).token_id() == 42);
  CHECK(s.logit_bias(0).bias() == -100.0f);
  CHECK(s.logprobs() == 3);
  CHECK(s.max_tokens() == 16);  // OpenAI's default for completions
  CHECK(r.request.stream().include_usage());
  CHECK(r.echo.empty());
  CHECK_FALSE(r.stream);
}

TEST_CASE("prompts as token ids and one-element lists; echo of a text prompt", "[openai]") {
  OpenAiCompletionRequest ids = MustParse(Prompt({1, 2, 3}));
  CHECK(std::vector<uint32_t>(ids.request.raw().token_ids().begin(),
                              ids.request.raw().token_ids().end()) ==
        std::vector<uint32_t>{1, 2, 3});
  CHECK(ids.request.raw().text().empty());
  CHECK(MustParse(Prompt(json::array({{7, 8}}))).request.raw().token_ids_size() == 2);
  CHECK(MustParse(Prompt(json::array({"hi"}))).request.raw().text() == "hi");

  json echo = Prompt("Say it:");
  echo["echo"] = true;
  echo["max_tokens"] = 4;
  echo["stream"] = true;
  echo["stream_options"] = {{"include_usage", true}};
  OpenAiCompletionRequest e = MustParse(echo);
  CHECK(e.echo == "Say it:");
  CHECK(e.stream);
  CHECK(e.include_usage);
  CHECK(e.request.sampling().max_tokens() == 4);
  json neutral = Prompt("x");
  neutral["suffix"] = "";
  neutral["n"] = 1;
  neutral["best_of"] = 1;
  neutral["echo"] = false;
  CHECK(MustParse(neutral).echo.empty());
}

TEST_CASE("completions refusals name the field", "[openai]") {
  auto with = [](const char* key, json value) {
    json b = Prompt("hi");
    b[key] = std::move(value);
    return b;
  };
  const std::vector<std::pair<json, std::string>> cases = {
      {json{{"model", "m"}}, "prompt: missing"},
      {Prompt(""), "prompt: is empty"},
      {Prompt(json::array()), "prompt: is empty"},
      {Prompt(5), "prompt: must be a string or a list of token ids"},
      {Prompt({"a", "b"}), "prompt: one prompt per request is supported, got 2"},
      {Prompt(json::array({{1}, {2}})), "prompt: one prompt per request"},
      {Prompt({1, -2}), "prompt[1]: must be at least 0"},
      {Prompt({1, "x"}), "prompt[1]: must be an integer"},
      {with("suffix", "the end"), "suffix: is not supported (no fill-in-the-middle)"},
      {with("n", 0), "n: must be at least 1"},
      {with("n", 1000), "n: must be at most 128"},
      {with("best_of", 3), "best_of: only 1 is supported"},
      {with("logprobs", true), "logprobs: must be an integer"},
      {with("logprobs", -1), "logprobs: must be at least 0"},
      {with("echo", "yes"), "echo: must be a boolean"},
      {with("stream_options", {{"include_usage", true}}), "stream_options: only allowed with"},
      {with("presence_penalty", "x"), "presence_penalty: must be a number"},
      {with("logit_bias", {{"x", 1}}), "logit_bias[\"x\"]: the key must be a token id"},
      {with("use_beam_search", true), "use_beam_search: is not supported"},
  };
  for (const auto& [body, reason] : cases) {
    const std::string message = RefusalFor(body);
    INFO(message);
    CHECK(absl::StrContains(message, reason));
  }
  json echo_ids = Prompt({1, 2});
  echo_ids["echo"] = true;
  CHECK(absl::StrContains(RefusalFor(echo_ids), "echo: needs a text prompt"));
  json echo_logprobs = Prompt("hi");
  echo_logprobs["echo"] = true;
  echo_logprobs["logprobs"] = 1;
  CHECK(absl::StrContains(RefusalFor(echo_logprobs), "echo: with logprobs"));
  CHECK(ParseCompletionRequest("[1]", OpenAiLimits()).status().message() ==
        "request body must be a JSON object");
}

GenerateResponse Step(const std::string& text, int32_t token, float logprob) {
  GenerateResponse r;
  r.set_request_id("r7");
  r.set_text(text);
  mmserve::v1::PositionLogprobs* p = r.add_logprobs();
  p->mutable_sampled()->set_token_id(token);
  p->mutable_sampled()->set_text(text);
  p->mutable_sampled()->set_logprob(logprob);
  mmserve::v1::TokenLogprob* alt = p->add_top();
  alt->set_text("zz");
  alt->set_logprob(-2.5f);
  return r;
}

GenerateResponse Final(GenerateResponse r) {
  r.set_finish_reason(mmserve::v1::FINISH_REASON_LENGTH);
  r.mutable_usage()->set_prompt_tokens(5);
  r.mutable_usage()->set_completion_tokens(2);
  return r;
}

TEST_CASE("a text_completion body with echo and the legacy logprobs shape", "[openai]") {
  CompletionContext ctx{"served", 1700000000, /*logprobs=*/true, /*include_usage=*/false};
  TextCompletionBuilder b(ctx, "Hi:");
  b.Add(Step(" a", 10, -0.5f));
  b.Add(Final(Step("bc", 11, -1.0f)));
  const json j = json::parse(b.Json());
  CHECK(j["id"] == "cmpl-r7");
  CHECK(j["object"] == "text_completion");
  CHECK(j["created"] == 1700000000);
  CHECK(j["model"] == "served");
  REQUIRE(j["choices"].size() == 1);
  const json& c = j["choices"][0];
  CHECK(c["index"] == 0);
  CHECK(c["text"] == "Hi: abc");
  CHECK(c["finish_reason"] == "length");
  CHECK(c["logprobs"]["tokens"] == json({" a", "bc"}));
  CHECK(c["logprobs"]["token_logprobs"] == json({-0.5, -1.0}));
  CHECK(c["logprobs"]["text_offset"] == json({3, 5}));  // after the echo
  CHECK(c["logprobs"]["top_logprobs"][0]["zz"] == -2.5);
  CHECK(j["usage"]["prompt_tokens"] == 5);
  CHECK(j["usage"]["completion_tokens"] == 2);
  CHECK(j["usage"]["total_tokens"] == 7);

  CompletionContext plain{"served", 1, false, false};
  TextCompletionBuilder p(plain, "");
  p.Add(Final(Step("x", 1, 0)));
  CHECK(json::parse(p.Json())["choices"][0]["logprobs"].is_null());
}

TEST_CASE("text_completion SSE: echo first, finish, usage chunk, [DONE]", "[openai]") {
  CompletionContext ctx{"served", 1, /*logprobs=*/false, /*include_usage=*/true};
  TextCompletionStream sse(ctx, "Q:");
  std::string out = sse.OnResponse(Step(" yes", 3, 0));
  GenerateResponse empty;
  empty.set_request_id("r7");
  out += sse.OnResponse(empty);  // nothing to say: no event
  out += sse.OnResponse(Final(Step("!", 4, 0)));
  CHECK(sse.done());
  CHECK(sse.OnResponse(Step("late", 5, 0)).empty());
  std::vector<std::string> events = absl::StrSplit(out, "\n\n", absl::SkipEmpty());
  REQUIRE(events.size() == 4);
  CHECK(events[3] == "data: [DONE]");
  const json first = json::parse(events[0].substr(6));
  CHECK(first["object"] == "text_completion");
  CHECK(first["choices"][0]["text"] == "Q: yes");
  CHECK(first["choices"][0]["finish_reason"].is_null());
  CHECK(first["usage"].is_null());
  const json last = json::parse(events[1].substr(6));
  CHECK(last["choices"][0]["text"] == "!");
  CHECK(last["choices"][0]["finish_reason"] == "length");
  const json usage = json::parse(events[2].substr(6));
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"]["completion_tokens"] == 2);

  TextCompletionStream failing(ctx, "");
  const std::string error = failing.OnError(absl::UnavailableError("gone"));
  CHECK(absl::StrContains(error, "\"gone\""));
  CHECK(absl::EndsWith(error, "data: [DONE]\n\n"));
}

TEST_CASE("n text completions: one choice each, usage summed, [DONE] after the last", "[openai]") {
  json body = Prompt("x");
  body["n"] = 2;
  CHECK(MustParse(body).request.n() == 2);

  CompletionContext ctx{"served", 1, false, /*include_usage=*/true, /*n=*/2};
  TextCompletionBuilder b(ctx, "E:");
  TextCompletionStream sse(ctx, "E:");
  std::string out;
  GenerateResponse second = Final(Step("b", 2, 0));
  second.set_index(1);  // choice 1 finishes first
  for (const GenerateResponse& r : {Step("a", 1, 0), second, Final(Step("c", 3, 0))}) {
    b.Add(r);
    out += sse.OnResponse(r);
  }
  const json j = json::parse(b.Json());
  REQUIRE(j["choices"].size() == 2);
  CHECK(j["choices"][0]["index"] == 0);
  CHECK(j["choices"][0]["text"] == "E:ac");
  CHECK(j["choices"][1]["index"] == 1);
  CHECK(j["choices"][1]["text"] == "E:b");
  CHECK(j["usage"]["completion_tokens"] == 4);
  CHECK(j["usage"]["prompt_tokens"] == 5);
  std::vector<std::string> events = absl::StrSplit(out, "\n\n", absl::SkipEmpty());
  REQUIRE(events.size() == 5);  // three chunks, usage, [DONE]
  CHECK(json::parse(events[1].substr(6))["choices"][0]["index"] == 1);
  CHECK(json::parse(events[1].substr(6))["choices"][0]["text"] == "E:b");  // its own echo
  CHECK(json::parse(events[2].substr(6))["choices"][0]["text"] == "c");
  CHECK(json::parse(events[3].substr(6))["usage"]["completion_tokens"] == 4);
  CHECK(events[4] == "data: [DONE]");
  CHECK(sse.done());
}

}  // namespace
}  // namespace mmserve::router
