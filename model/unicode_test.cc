#include "model/unicode.h"

#include <catch2/catch.hpp>
#include <string>

#include "model/byte_level.h"

namespace mmserve::model {
namespace {

TEST_CASE("character classes follow Unicode general categories", "[unicode]") {
  CHECK(IsLetter('a'));
  CHECK(IsLetter(U'é'));
  CHECK(IsLetter(U'中'));
  CHECK(IsLetter(U'ß'));
  CHECK_FALSE(IsLetter('1'));
  CHECK_FALSE(IsLetter(U'😀'));
  CHECK(IsNumber('7'));
  CHECK(IsNumber(U'٣'));  // Arabic-Indic digit (Nd)
  CHECK(IsNumber(U'½'));  // No
  CHECK(IsNumber(U'Ⅻ'));  // Nl
  CHECK(IsWhitespace(' '));
  CHECK(IsWhitespace('\n'));
  CHECK(IsWhitespace(0x3000));        // ideographic space
  CHECK(IsWhitespace(0x00a0));        // no-break space (Zs)
  CHECK(IsWhitespace(0x2028));        // line separator
  CHECK_FALSE(IsWhitespace(0x200b));  // zero-width space is Cf, not White_Space
}

TEST_CASE("NFC composes decomposed accents and keeps composed text", "[unicode]") {
  CHECK(NormalizeNfc("e\xcc\x81") == "\xc3\xa9");  // e + combining acute -> é
  CHECK(NormalizeNfc("\xc3\xa9") == "\xc3\xa9");
  CHECK(NormalizeNfc("plain ascii") == "plain ascii");
  CHECK(NormalizeNfc("\x1\xff") == "\x1\xff");  // invalid UTF-8 passes through
}

TEST_CASE("code points decode with byte offsets and invalid bytes become U+FFFD", "[unicode]") {
  std::string s = "a\xe4\xb8\xad\xf0\x9f\x98\x80\xff";
  size_t pos = 0;
  CHECK(NextCodePoint(s, &pos) == U'a');
  CHECK(NextCodePoint(s, &pos) == U'中');
  CHECK(pos == 4);
  CHECK(NextCodePoint(s, &pos) == U'😀');
  CHECK(NextCodePoint(s, &pos) == 0xfffd);
  CHECK(pos == s.size());
  std::string out;
  AppendUtf8(U'😀', &out);
  CHECK(out == "\xf0\x9f\x98\x80");
}

TEST_CASE("the byte-level alphabet maps every byte and decodes back", "[byte_level]") {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string mapped = BytesToByteLevel(all);
  std::string back;
  AppendTokenBytes(mapped, &back);
  CHECK(back == all);
  CHECK(BytesToByteLevel(" ") == "\xc4\xa0");   // "Ġ"
  CHECK(BytesToByteLevel("\n") == "\xc4\x8a");  // "Ċ"
  std::string raw;
  AppendTokenBytes("<|im end|>", &raw);  // a raw space: not byte-level, kept as is
  CHECK(raw == "<|im end|>");
}

TEST_CASE("lossy UTF-8 replaces each maximal invalid subsequence once", "[byte_level]") {
  CHECK(Utf8Lossy("ok") == "ok");
  CHECK(Utf8Lossy("\xe2\x82") == "\xef\xbf\xbd");  // truncated 3-byte: one FFFD
  CHECK(Utf8Lossy("\xe2\x82"
                  "A") ==
        "\xef\xbf\xbd"
        "A");
  CHECK(Utf8Lossy("\x80\x80") == "\xef\xbf\xbd\xef\xbf\xbd");  // stray continuations: one each
  CHECK(Utf8Lossy("\xed\xa0\x80") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate
  CHECK(Utf8Lossy("\xf0\x9f\x98\x80") == "\xf0\x9f\x98\x80");
}

TEST_CASE("an incomplete character at the end is held back, an invalid one is not",
          "[byte_level]") {
  CHECK(IncompleteUtf8Suffix("ab") == 0);
  CHECK(IncompleteUtf8Suffix("a\xf0\x9f") == 2);
  CHECK(IncompleteUtf8Suffix("a\xf0\x9f\x98") == 3);
  CHECK(IncompleteUtf8Suffix("a\xf0\x9f\x98\x80") == 0);
  CHECK(IncompleteUtf8Suffix("a\xe2") == 1);
  CHECK(IncompleteUtf8Suffix("a\xe0\x80") == 0);  // E0 80 can never be valid
  CHECK(IncompleteUtf8Suffix("a\x80\x80\x80\x80") == 0);
}

}  // namespace
}  // namespace mmserve::model
