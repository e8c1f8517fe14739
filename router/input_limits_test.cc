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
  // An unterminated string counts once its first bytes show it is text.
  CHECK(JsonTextBytesLowerBound("\"abcdef") == 6);
  CHECK(JsonTextBytesLowerBound("\"data:image/png;base64,AAAA") == 0);
  const std::string big = "{\"content\":\"" + std::string(1 << 20, 'x') + "\"}";
  CHECK(JsonTextBytesLowerBound(big) == (1 << 20) + 7);
}

TEST_CASE("the scanner gives the same bound whatever the chunking", "[limits]") {
  const std::string body =
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":)"
      R"("data:image/png;base64,QUJD"}},{"type":"text","text":"say \"hi\" \u00e9 twice"}]}]})";
  const size_t whole = JsonTextBytesLowerBound(body);
  CHECK(whole > 0);
  for (size_t step = 1; step <= 7; ++step) {
    JsonTextScanner scanner;
    for (size_t at = 0; at < body.size(); at += step) {
      scanner.Add(absl::string_view(body).substr(at, step));
    }
    INFO("step " << step);
    CHECK(scanner.lower_bound() == whole);
  }
  // A huge open string counts before it closes.
  JsonTextScanner open;
  open.Add("{\"content\":\"");
  open.Add(std::string(1000, 'x'));
  CHECK(open.lower_bound() >= 1000);
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
