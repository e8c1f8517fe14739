#include "router/input_limits.h"

#include <catch2/catch.hpp>
#include <string>

#include "model/tokenizer.h"

namespace mmserve::router {
namespace {

TEST_CASE("the JSON text bound counts string bytes, skips data: URLs, and never overcounts",
          "[limits]") {
  CHECK(JsonTextBytesLowerBound("") == 0);
  CHECK(JsonTextBytesLowerBound(R"({"a":"hello"})") == 6);  // "a" and "hello"
  // An image's data URL does not count.
  CHECK(JsonTextBytesLowerBound(R"({"url":"data:image/png;base64,AAAA"})") == 3);
  // Escapes count as their shortest decoding; an escaped quote does not end
  // the string.
  const std::string escaped = R"({"t":"a\"b\u0041c\\"})";
  CHECK(JsonTextBytesLowerBound(escaped) <= 1 + 6);
  // Unterminated strings end at the body's end.
  CHECK(JsonTextBytesLowerBound("\"abc") == 3);
  const std::string big = "{\"content\":\"" + std::string(1 << 20, 'x') + "\"}";
  CHECK(JsonTextBytesLowerBound(big) == (1 << 20) + 7);
}

TEST_CASE("a prompt longer than the byte bound is refused before tokenizing", "[limits]") {
  RouterOptions o;
  o.max_model_len = 100;
  o.max_prompt_bytes = MaxPromptBytes(4, o.max_model_len);
  CHECK(o.max_prompt_bytes == 1200);
  mmserve::v1::GenerateRequest r;
  auto* m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->add_content()->set_text(std::string(1200, 'a'));
  CHECK(CheckPromptBytes(o, r).ok());
  m->add_content()->set_text("b");
  absl::Status s = CheckPromptBytes(o, r);
  CHECK(absl::IsInvalidArgument(s));
  CHECK(s.message().find("100-token context") != absl::string_view::npos);
  r.clear_chat();
  r.mutable_raw()->set_text(std::string(1201, 'a'));
  CHECK(absl::IsInvalidArgument(CheckPromptBytes(o, r)));
  o.max_prompt_bytes = 0;  // off
  CHECK(CheckPromptBytes(o, r).ok());
}

TEST_CASE("the longest token bounds the bytes per token", "[limits]") {
  auto tok = model::Tokenizer::FromFile("models/shapes-demo/tokenizer.json");
  REQUIRE(tok.ok());
  const size_t longest = MaxTokenBytes(**tok);
  CHECK(longest >= 1);
  // No text of the tokenizer's encodes to fewer tokens than bytes / longest.
  CHECK(longest == 20);  // "<|vision_start|>"-like added tokens are the longest
  const std::string text = "hello world, a red circle <|im_start|> and more text";
  auto ids = (*tok)->Encode(text);
  REQUIRE(ids.ok());
  CHECK(ids->size() * longest >= text.size());
}

}  // namespace
}  // namespace mmserve::router
