#include "model/tokenizer.h"

#include <catch2/catch.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "model/byte_level.h"
#include "model/detokenizer.h"
#include "model/qwen2_pretokenizer.h"
#include "model/tiny_tokenizer_testing.h"

namespace mmserve::model {
namespace {

using nlohmann::json;

std::unique_ptr<Tokenizer> Tiny() {
  auto tok = MakeTinyTokenizer();
  REQUIRE(tok.ok());
  return std::move(*tok);
}

TEST_CASE("BPE applies merges by rank within each pre-token", "[tokenizer]") {
  auto tok = Tiny();
  auto ids = tok->Encode("hello world");
  REQUIRE(ids.ok());
  REQUIRE(ids->size() == 2);
  CHECK(tok->IdToToken((*ids)[0]) == "hello");
  CHECK(tok->IdToToken((*ids)[1]) == "Ġworld");
  // "hellx": "he", "ll" merge, then "hell"; no "hellx" merge.
  auto partial = tok->Encode("hellx");
  REQUIRE(partial.ok());
  REQUIRE(partial->size() == 2);
  CHECK(tok->IdToToken((*partial)[0]) == "hell");
}

TEST_CASE("special tokens in text become their ids only when parsing specials", "[tokenizer]") {
  auto tok = Tiny();
  const int32_t im_start = tok->TokenToId("<|im_start|>");
  const int32_t im_end = tok->TokenToId("<|im_end|>");
  REQUIRE(im_start > 255);
  auto ids = tok->Encode("<|im_start|>hello<|im_end|>");
  REQUIRE(ids.ok());
  CHECK(*ids == std::vector<int32_t>{im_start, tok->TokenToId("hello"), im_end});
  CHECK(tok->IsSpecial(im_end));
  CHECK_FALSE(tok->IsSpecial(tok->TokenToId("hello")));
  auto plain = tok->Encode("<|im_start|>", /*parse_special=*/false);
  REQUIRE(plain.ok());
  CHECK(plain->size() > 1);
  CHECK(*tok->Decode(*plain) == "<|im_start|>");
}

TEST_CASE("decode skips special tokens on request", "[tokenizer]") {
  auto tok = Tiny();
  auto ids = *tok->Encode("<|im_start|>hello world<|im_end|>");
  CHECK(*tok->Decode(ids) == "<|im_start|>hello world<|im_end|>");
  CHECK(*tok->Decode(ids, /*skip_special=*/true) == "hello world");
  CHECK(tok->Decode({999999}).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("any NFC text round-trips through encode and decode", "[tokenizer]") {
  auto tok = Tiny();
  const char* samples[] = {"",
                           "   leading and trailing   ",
                           "tabs\tand\r\nnewlines\n\n",
                           "日本語のテキスト",
                           "emoji 👩‍👩‍👧 and flags 🇯🇵",
                           "mixed 12345 (x) [y]"};
  for (const char* s : samples) {
    auto ids = tok->Encode(s);
    REQUIRE(ids.ok());
    CHECK(*tok->Decode(*ids) == s);
  }
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 200; ++iter) {
    std::string s;
    int n = rng() % 40;
    for (int i = 0; i < n; ++i) {
      static const char* parts[] = {"a", " ", "é", "中", "😀", "\n", "1", "'s", ".", "\t"};
      s += parts[rng() % 10];
    }
    auto ids = tok->Encode(s);
    REQUIRE(ids.ok());
    REQUIRE(*tok->Decode(*ids) == s);
  }
}

TEST_CASE("encoding normalizes to NFC first", "[tokenizer]") {
  auto tok = Tiny();
  CHECK(*tok->Encode("e\xcc\x81") == *tok->Encode("\xc3\xa9"));
}

TEST_CASE("streaming deltas never split a character and add up to the full decode",
          "[detokenizer]") {
  auto tok = Tiny();
  const std::string text = "héllo 世界 😀 world";
  auto ids = *tok->Encode(text);
  IncrementalDetokenizer detok(*tok, /*skip_special=*/false);
  std::string joined;
  int empty_deltas = 0;
  for (int32_t id : ids) {
    std::string delta = *detok.Push(id);
    CHECK(Utf8Lossy(delta) == delta);  // always complete, valid UTF-8
    empty_deltas += delta.empty();
    joined += delta;
  }
  joined += detok.Flush();
  CHECK(joined == text);
  CHECK(detok.text() == text);
  CHECK(empty_deltas > 0);  // multi-byte characters were held back at least once
}

TEST_CASE("an unfinished character at the end flushes as U+FFFD", "[detokenizer]") {
  auto tok = Tiny();
  IncrementalDetokenizer detok(*tok, false);
  // The first two bytes of "😀" (F0 9F) as byte tokens.
  CHECK(detok.Push(tok->TokenToId(BytesToByteLevel("\xf0"))).value().empty());
  CHECK(detok.Push(tok->TokenToId(BytesToByteLevel("\x9f"))).value().empty());
  CHECK(detok.Flush() == "\xef\xbf\xbd");
  CHECK_FALSE(detok.Push(-5).ok());
}

TEST_CASE("unsupported tokenizer components are refused by name", "[tokenizer]") {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* expect;
  };
  std::vector<Case> cases = {
      {"wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; }, "model WordPiece"},
      {"byte fallback", [](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback"},
      {"other regex",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; },
       "pre_tokenizer"},
      {"lowercase",
       [](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer Lowercase"},
      {"template",
       [](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"}};
       },
       "post_processor TemplateProcessing"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    json j = TinyTokenizerJson();
    c.edit(j);
    auto tok = Tokenizer::FromJson(j.dump(), "t.json");
    REQUIRE_FALSE(tok.ok());
    CHECK(tok.status().code() == absl::StatusCode::kUnimplemented);
    CHECK(tok.status().message().find(c.expect) != absl::string_view::npos);
  }
  json bad_merge = TinyTokenizerJson();
  bad_merge["model"]["merges"].push_back("zz qq");
  CHECK(Tokenizer::FromJson(bad_merge.dump(), "t").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Tokenizer::FromJson("{}", "t").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Tokenizer::FromFile("/nonexistent/tokenizer.json").status().code() ==
        absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace mmserve::model
