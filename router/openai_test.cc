#include "router/openai.h"

#include <stb/stb_image.h>

#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "router/openai_testing.h"

namespace mmserve::router {
namespace {

using json = nlohmann::json;
using mmserve::v1::GenerateResponse;

// A real 3x2 RGB PNG: rows red, green, blue.
const std::string& TinyPng() {
  static const std::string png(
      "\x89\x50\x4e\x47\x0d\x0a\x1a\x0a\x00\x00\x00\x0d\x49\x48\x44\x52\x00\x00\x00\x03\x00\x00"
      "\x00\x02\x08\x02\x00\x00\x00\x12\x16\xf1\x4d\x00\x00\x00\x10\x49\x44\x41\x54\x78\x9c\x63"
      "\xf8\xcf\xc0\xc0\x00\xc1\x70\x16\x00\x3b\xd8\x05\xfb\xde\x10\x37\x65\x00\x00\x00\x00\x49"
      "\x45\x4e\x44\xae\x42\x60\x82",
      73);
  return png;
}

std::string PngDataUrl() { return "data:image/png;base64," + absl::Base64Escape(TinyPng()); }

// The INVALID_ARGUMENT message for a body that must be refused.
std::string RefusalFor(const std::string& body, const OpenAiLimits& limits = TestLimits()) {
  absl::StatusOr<OpenAiChatRequest> r = ParseChatCompletionRequest(body, limits);
  INFO(body);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST_CASE("a plain chat with every sampling field maps onto GenerateRequest", "[openai]") {
  json body = {
      {"model", "shapes-demo"},
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}},
        {{"role", "user"}, {"content", "Hi"}},
        {{"role", "assistant"}, {"content", "Hello."}},
        {{"role", "user"}, {"content", "Where is the square?"}}}},
      {"temperature", 0.5},
      {"top_p", 0.9},
      {"top_k", 20},
      {"min_p", 0.05},
      {"seed", 1234},
      {"max_tokens", 64},
      {"stop", {"\n\n", "END"}},
      {"stop_token_ids", {151645, 7}},
      {"ignore_eos", true},
      {"min_tokens", 3},
      {"logprobs", true},
      {"top_logprobs", 5},
      {"skip_special_tokens", false},
  };
  OpenAiChatRequest r = MustParse(body);
  CHECK(r.model == "shapes-demo");
  CHECK_FALSE(r.stream);
  CHECK_FALSE(r.include_usage);
  const mmserve::v1::GenerateRequest& req = r.request;
  CHECK(req.model() == "shapes-demo");
  CHECK(req.request_id().empty());
  CHECK(req.stream().include_usage());
  REQUIRE(req.chat().messages_size() == 4);
  CHECK(req.chat().messages(0).role() == "system");
  CHECK(req.chat().messages(0).content(0).text() == "Be brief.");
  CHECK(req.chat().messages(2).role() == "assistant");
  CHECK(req.chat().messages(3).content(0).text() == "Where is the square?");
  CHECK_FALSE(req.chat().has_add_generation_prompt());

  const mmserve::v1::SamplingParams& s = req.sampling();
  CHECK(s.temperature() == 0.5f);
  CHECK(s.top_p() == 0.9f);
  CHECK(s.top_k() == 20);
  CHECK(s.min_p() == 0.05f);
  CHECK(s.seed() == 1234);
  CHECK(s.max_tokens() == 64);
  CHECK(std::vector<std::string>(s.stop().begin(), s.stop().end()) ==
        std::vector<std::string>{"\n\n", "END"});
  CHECK(std::vector<uint32_t>(s.stop_token_ids().begin(), s.stop_token_ids().end()) ==
        std::vector<uint32_t>{151645, 7});
  CHECK(s.ignore_eos());
  CHECK(s.min_tokens() == 3);
  CHECK(s.has_logprobs());
  CHECK(s.logprobs() == 5);
  CHECK(s.has_skip_special_tokens());
  CHECK_FALSE(s.skip_special_tokens());
}

TEST_CASE("unset fields stay unset so the model's defaults apply", "[openai]") {
  OpenAiChatRequest r = MustParse(UserSays("hi"));
  const mmserve::v1::SamplingParams& s = r.request.sampling();
  CHECK_FALSE(s.has_temperature());
  CHECK_FALSE(s.has_top_p());
  CHECK_FALSE(s.has_top_k());
  CHECK_FALSE(s.has_seed());
  CHECK_FALSE(s.has_max_tokens());
  CHECK_FALSE(s.has_logprobs());
  CHECK_FALSE(s.has_skip_special_tokens());
  CHECK(s.stop_size() == 0);

  // JSON null is "unset" too, as clients send it.
  json body = UserSays("hi");
  for (const char* key : {"temperature", "top_p", "seed", "max_tokens", "stop", "stream",
                          "stream_options", "logprobs", "tools", "n", "presence_penalty"}) {
    body[key] = nullptr;
  }
  OpenAiChatRequest with_nulls = MustParse(body);
  CHECK(with_nulls.request.sampling().ByteSizeLong() == 0);
}

TEST_CASE("an image part round-trips a real PNG through base64", "[openai]") {
  json body = {
      {"messages",
       {{{"role", "user"},
         {"content",
          {{{"type", "text"}, {"text", "What colour is the top row?"}},
           {{"type", "image_url"}, {"image_url", {{"url", PngDataUrl()}, {"detail", "auto"}}}},
           {{"type", "text"}, {"text", "Answer in one word."}}}}}}},
  };
  OpenAiChatRequest r = MustParse(body);
  CHECK(r.model.empty());
  CHECK(r.request.model().empty());
  const mmserve::v1::ChatMessage& m = r.request.chat().messages(0);
  REQUIRE(m.content_size() == 3);
  CHECK(m.content(0).text() == "What colour is the top row?");
  REQUIRE(m.content(1).has_image());
  CHECK(m.content(1).image().mime_type() == "image/png");
  CHECK(m.content(1).image().data() == TinyPng());
  CHECK(m.content(2).text() == "Answer in one word.");

  // The bytes decode to the picture that was sent.
  const std::string& data = m.content(1).image().data();
  int w = 0, h = 0, channels = 0;
  unsigned char* pixels =
      stbi_load_from_memory(reinterpret_cast<const unsigned char*>(data.data()),
                            static_cast<int>(data.size()), &w, &h, &channels, 3);
  REQUIRE(pixels != nullptr);
  CHECK(w == 3);
  CHECK(h == 2);
  CHECK((pixels[0] == 255 && pixels[1] == 0 && pixels[2] == 0));  // red
  CHECK((pixels[3] == 0 && pixels[4] == 255 && pixels[5] == 0));  // green
  CHECK((pixels[6] == 0 && pixels[7] == 0 && pixels[8] == 255));  // blue
  stbi_image_free(pixels);

  // image_url given directly as a string is accepted too.
  json short_form = {
      {"messages",
       {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", PngDataUrl()}}}}}}}};
  CHECK(MustParse(short_form).request.chat().messages(0).content(0).image().data() == TinyPng());
}

TEST_CASE("penalties and logit_bias map onto SamplingParams", "[openai]") {
  json body = UserSays("hi");
  body["presence_penalty"] = 0.5;
  body["frequency_penalty"] = -1;
  body["repetition_penalty"] = 1.1;
  body["logit_bias"] = {{"151645", -100}, {"7", 2.5}, {"0", 100}};
  OpenAiChatRequest r = MustParse(body);
  const mmserve::v1::SamplingParams& s = r.request.sampling();
  CHECK(s.presence_penalty() == 0.5f);
  CHECK(s.frequency_penalty() == -1.0f);
  CHECK(s.repetition_penalty() == 1.1f);
  REQUIRE(s.logit_bias_size() == 3);
  std::map<uint32_t, float> bias;
  for (const mmserve::v1::LogitBias& b : s.logit_bias()) bias[b.token_id()] = b.bias();
  CHECK(bias == std::map<uint32_t, float>{{0, 100.0f}, {7, 2.5f}, {151645, -100.0f}});

  // Out-of-range values pass the parser: the router's SamplingParams
  // validation refuses them with the same reasons as on gRPC.
  json wide = UserSays("hi");
  wide["presence_penalty"] = 5;
  wide["logit_bias"] = {{"3", 1000}};
  OpenAiChatRequest w = MustParse(wide);
  CHECK(w.request.sampling().presence_penalty() == 5.0f);
  REQUIRE(w.request.sampling().logit_bias_size() == 1);
  CHECK(w.request.sampling().logit_bias(0).token_id() == 3);
  CHECK(w.request.sampling().logit_bias(0).bias() == 1000.0f);

  // Neutral values are values like any other.
  json neutral = UserSays("hi");
  neutral["presence_penalty"] = 0;
  neutral["repetition_penalty"] = 1.0;
  CHECK(MustParse(neutral).request.sampling().has_presence_penalty());
}

TEST_CASE("streaming flags, vLLM conventions and neutral fields", "[openai]") {
  json body = UserSays("hi");
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["max_tokens"] = 10;
  body["max_completion_tokens"] = 20;  // the current name wins
  body["top_k"] = -1;                  // vLLM's "off"
  body["stop"] = "STOP";
  body["seed"] = 18446744073709551615ULL;
  body["logprobs"] = true;  // no top_logprobs: the sampled token only
  body["add_generation_prompt"] = false;
  // Accepted at their neutral values; the rest are ignored like vLLM does.
  body["n"] = 1;
  body["logit_bias"] = json::object();
  body["tools"] = json::array();
  body["tool_choice"] = "none";
  body["response_format"] = {{"type", "text"}};
  body["user"] = "alice";
  body["metadata"] = {{"k", "v"}};
  body["parallel_tool_calls"] = false;
  body["some_future_field"] = 3;
  body["messages"].push_back({{"role", "developer"}, {"content", "be nice"}});
  body["messages"].push_back({{"role", "assistant"}, {"content", nullptr}});

  OpenAiChatRequest r = MustParse(body);
  CHECK(r.stream);
  CHECK(r.include_usage);
  const mmserve::v1::SamplingParams& s = r.request.sampling();
  CHECK(s.max_tokens() == 20);
  CHECK_FALSE(s.has_top_k());
  CHECK(s.stop_size() == 1);
  CHECK(s.stop(0) == "STOP");
  CHECK(s.seed() == 18446744073709551615ULL);
  CHECK(s.has_logprobs());
  CHECK(s.logprobs() == 0);
  CHECK(r.request.chat().has_add_generation_prompt());
  CHECK_FALSE(r.request.chat().add_generation_prompt());
  CHECK(r.request.chat().messages(1).role() == "system");
  CHECK(r.request.chat().messages(2).role() == "assistant");
  CHECK(r.request.chat().messages(2).content_size() == 0);

  // Integral floats count as integers.
  json floats = UserSays("hi");
  floats["max_tokens"] = 8.0;
  CHECK(MustParse(floats).request.sampling().max_tokens() == 8);
}

TEST_CASE("every malformed or unsupported request is INVALID_ARGUMENT naming the field",
          "[openai]") {
  const std::string png = PngDataUrl();
  auto with = [](const std::string& key, const json& value) {
    json body = UserSays("hi");
    body[key] = value;
    return body.dump();
  };
  auto user_content = [](const json& content) {
    return json{{"messages", {{{"role", "user"}, {"content", content}}}}}.dump();
  };
  auto image = [](const std::string& url) {
    return json{{"type", "image_url"}, {"image_url", {{"url", url}}}};
  };
  struct Case {
    std::string body;
    std::string reason;  // substring of the message
  };
  std::vector<Case> cases = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "must be a JSON object"},
      {"{}", "messages: missing"},
      {R"({"messages": []})", "messages: must not be empty"},
      {R"({"messages": "hi"})", "messages: must be a list"},
      {R"({"messages": [3]})", "messages[0]: must be an object"},
      {R"({"messages": [{"content": "hi"}]})", "messages[0].role: missing"},
      {R"({"messages": [{"role": 1, "content": "hi"}]})", "messages[0].role: must be a string"},
      {R"({"messages": [{"role": "robot", "content": "hi"}]})",
       "messages[0].role: unknown role \"robot\""},
      {R"({"messages": [{"role": "tool", "content": "42"}]})", "messages[0].tool_call_id: missing"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content: missing"},
      {R"({"messages": [{"role": "user", "content": 5}]})",
       "messages[0].content: must be a string or a list"},
      {R"({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]})",
       "messages[0].tool_calls[0].type: missing"},
      {user_content({"hi"}), "messages[0].content[0]: must be an object"},
      {user_content({{{"text", "hi"}}}), "messages[0].content[0].type: missing"},
      {user_content({{{"type", "input_audio"}}}),
       "content part type \"input_audio\" is not supported"},
      {user_content({{{"type", "text"}}}), "messages[0].content[0].text: missing"},
      {user_content({{{"type", "text"}, {"text", 7}}}),
       "messages[0].content[0].text: must be a string"},
      {user_content({{{"type", "image_url"}}}), "image_url part without"},
      {user_content({{{"type", "image_url"}, {"image_url", json::object()}}}),
       "messages[0].content[0].image_url.url: missing"},
      {user_content(json::array({image("https://user:pw@example.com/cat.png")})),
       "messages[0].content[0].image_url.url: credentials in the URL are not allowed"},
      {user_content(json::array({image("HTTP://exa mple.com/cat.png")})), "holds spaces"},
      {user_content(json::array({image("file:///etc/passwd")})), "not a data: URL"},
      {user_content(json::array({image("data:image/png;base64,iVBOR!!!")})),
       "invalid base64 character"},
      {user_content(json::array({image("data:text/plain;base64,aGk=")})), "is not an image"},
      {user_content(json::array({image("data:image/png,rawbytes")})), "must be base64"},
      {user_content(json::array({image("data:image/png;base64,")})), "empty image"},
      {user_content(json::array({image(png), image(png), image(png)})),
       "messages[0].content[2]: too many images: at most 2"},
      {user_content(json::array(
           {image("data:image/png;base64," + absl::Base64Escape(std::string(1001, 'x')))})),
       "exceeds the limit of 1000"},
      {json{{"messages", {{{"role", "assistant"}, {"content", json::array({image(png)})}}}}}.dump(),
       "assistant messages may not hold images"},
      {with("model", 5), "model: must be a string"},
      {with("stream", "yes"), "stream: must be a boolean"},
      {with("stream_options", {{"include_usage", true}}), "stream_options: only allowed with"},
      {with("temperature", "hot"), "temperature: must be a number"},
      {with("top_p", json::array()), "top_p: must be a number"},
      {with("top_k", 1.5), "top_k: must be an integer"},
      {with("top_k", 1LL << 40), "top_k: must be at most"},
      {with("min_p", true), "min_p: must be a number"},
      {with("seed", -1), "seed: must be a non-negative integer"},
      {with("seed", "42"), "seed: must be an integer"},
      {with("max_tokens", -1), "max_tokens: must be at least 0"},
      {with("max_tokens", "10"), "max_tokens: must be an integer"},
      {with("max_completion_tokens", 1LL << 33), "max_completion_tokens: must be at most"},
      {with("stop", 5), "stop: must be a string or a list of strings"},
      {with("stop", {"a", 1}), "stop[1]: must be a string"},
      {with("stop_token_ids", 3), "stop_token_ids: must be a list of integers"},
      {with("stop_token_ids", {1, -2}), "stop_token_ids[1]: must be at least 0"},
      {with("ignore_eos", "true"), "ignore_eos: must be a boolean"},
      {with("min_tokens", -3), "min_tokens: must be at least 0"},
      {with("skip_special_tokens", 1), "skip_special_tokens: must be a boolean"},
      {with("logprobs", 1), "logprobs: must be a boolean"},
      {with("top_logprobs", 3), "top_logprobs: requires \"logprobs\": true"},
      {with("add_generation_prompt", "no"), "add_generation_prompt: must be a boolean"},
      {with("n", 0), "n: must be at least 1"},
      {with("n", 1.5), "n: must be an integer"},
      {with("best_of", 3), "best_of: only 1 is supported"},
      {with("presence_penalty", "high"), "presence_penalty: must be a number"},
      {with("frequency_penalty", json::array()), "frequency_penalty: must be a number"},
      {with("repetition_penalty", true), "repetition_penalty: must be a number"},
      {with("logit_bias", {1, 2}), "logit_bias: must be an object of token ids"},
      {with("logit_bias", {{"abc", 5}}), "logit_bias[\"abc\"]: the key must be a token id"},
      {with("logit_bias", {{"-3", 5}}), "logit_bias[\"-3\"]: the key must be a token id"},
      {with("logit_bias", {{"99999999999", 5}}), "logit_bias[\"99999999999\"]: the key must"},
      {with("logit_bias", {{"7", "up"}}), "logit_bias[\"7\"]: must be a number"},
      {with("tools", {{{"type", "function"}}}), "tools[0].function: missing"},
      {with("tool_choice", "required"), "tool_choice: \"required\" needs tools"},
      {with("response_format", {{"type", "xml"}}), "response_format.type: must be"},
      {with("use_beam_search", true), "use_beam_search: is not supported"},
      {with("modalities", {"text", "audio"}), "modalities: only \"text\""},
      {with("audio", {{"voice", "alloy"}}), "audio: is not supported"},
  };
  for (const Case& c : cases) {
    std::string message = RefusalFor(c.body);
    INFO(c.body);
    INFO(message);
    CHECK(absl::StrContains(message, c.reason));
  }

  // The body limit applies before parsing.
  OpenAiLimits tiny = TestLimits();
  tiny.max_body_bytes = 10;
  CHECK(RefusalFor(UserSays("hello there").dump(), tiny) ==
        absl::StrCat("request body of ", UserSays("hello there").dump().size(),
                     " bytes exceeds the limit of 10"));
}

TEST_CASE("priority (vLLM's extension) maps onto the request's priority", "[openai]") {
  json body = UserSays("hi");
  CHECK(MustParse(body).request.priority() == 0);
  body["priority"] = -3;
  CHECK(MustParse(body).request.priority() == -3);
  for (const json& bad : {json("high"), json(1.5), json(4294967296LL)}) {
    body["priority"] = bad;
    absl::StatusOr<OpenAiChatRequest> r = ParseChatCompletionRequest(body.dump(), {});
    INFO(bad.dump());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(r.status().message().find("priority") != absl::string_view::npos);
  }
}

}  // namespace
}  // namespace mmserve::router
