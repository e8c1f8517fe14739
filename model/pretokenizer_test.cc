#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "model/qwen2_pretokenizer.h"

namespace mmserve::model {
namespace {

std::vector<std::string> Split(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view p : SplitQwen2(text)) out.emplace_back(p);
  return out;
}

using V = std::vector<std::string>;

TEST_CASE("words keep their leading space and contractions split off", "[pretokenizer]") {
  CHECK(Split("Hello world") == V{"Hello", " world"});
  CHECK(Split("don't") == V{"don", "'t"});
  CHECK(Split("I'M here") == V{"I", "'M", " here"});
  CHECK(Split("they'll we've you're") == V{"they", "'ll", " we", "'ve", " you", "'re"});
  CHECK(Split("'there") == V{"'t", "here"});  // the regex's own quirk
}

TEST_CASE("digits are single pieces and punctuation runs group", "[pretokenizer]") {
  CHECK(Split("abc 123") == V{"abc", " ", "1", "2", "3"});
  CHECK(Split("x=1;") == V{"x", "=", "1", ";"});
  CHECK(Split("(hello)") == V{"(hello", ")"});
  CHECK(Split("a ... b") == V{"a", " ...", " b"});
  CHECK(Split("end.\n\nNext") == V{"end", ".\n\n", "Next"});
}

TEST_CASE("whitespace runs leave their last space to the next word", "[pretokenizer]") {
  CHECK(Split("a   b") == V{"a", "  ", " b"});
  CHECK(Split("a   ") == V{"a", "   "});
  CHECK(Split("a \n  b") == V{"a", " \n", " ", " b"});
  CHECK(Split("\n\n\n") == V{"\n\n\n"});
  CHECK(Split("a\t\tb") == V{"a", "\t", "\tb"});
  CHECK(Split(" 1") == V{" ", "1"});
}

TEST_CASE("non-ASCII letters, CJK and emoji split by category", "[pretokenizer]") {
  CHECK(Split("héllo wörld") == V{"héllo", " wörld"});
  CHECK(Split("你好世界") == V{"你好世界"});
  CHECK(Split("日本語 テスト") == V{"日本語", " テスト"});
  CHECK(Split("hi 😀!") == V{"hi", " 😀!"});
  CHECK(Split("😀😀 x") == V{"😀😀", " x"});
}

TEST_CASE("pieces always cover the input exactly", "[pretokenizer]") {
  const std::string inputs[] = {"", " ", "a", "\r\n", "x \xe2\x80\x83y", "’s 'S", "\xff\xfe bad"};
  for (const std::string& in : inputs) {
    std::string joined;
    for (const std::string& p : Split(in)) {
      CHECK_FALSE(p.empty());
      joined += p;
    }
    CHECK(joined == in);
  }
}

}  // namespace
}  // namespace mmserve::model
