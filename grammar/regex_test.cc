#include <catch2/catch.hpp>
#include <string>

#include "grammar/grammar.h"
#include "grammar/grammar_testing.h"
#include "grammar/regex_parser.h"

namespace mmserve::grammar {
namespace {

using testing::Matches;
using testing::MustCompile;

std::string ErrorOf(const std::string& regex) {
  return std::string(Validate({ConstraintSpec::Kind::kRegex, regex}).message());
}

std::shared_ptr<const CompiledGrammar> Regex(const std::string& text) {
  return MustCompile({ConstraintSpec::Kind::kRegex, text});
}

TEST_CASE("regex matches the whole output") {
  auto g = Regex(R"(\d{3}-\d{4})");
  CHECK(Matches(g, "555-1234"));
  CHECK_FALSE(Matches(g, "555-12345"));
  CHECK_FALSE(Matches(g, "x555-1234"));
  CHECK(Matches(Regex("^ab+c$"), "abbbc"));
  CHECK_FALSE(Matches(Regex("^ab+c$"), "ac"));
}

TEST_CASE("regex classes, escapes, groups and quantifiers") {
  auto g = Regex(R"((?:[A-Z][a-z]*\s?)+|(?P<n>\w+)\.\*|x{2,}?|[^\d\s]{0,2}!)");
  CHECK(Matches(g, "Hello World"));
  CHECK(Matches(g, "abc_1.*"));
  CHECK(Matches(g, "xxxx"));
  CHECK(Matches(g, "é!"));
  CHECK(Matches(g, "!"));
  CHECK_FALSE(Matches(g, "x"));
  CHECK_FALSE(Matches(g, "1!"));
  CHECK_FALSE(Matches(g, "abc_1.."));
  auto dot = Regex("a.c");
  CHECK(Matches(dot,
                "a\xE6\x9D\xB1"
                "c"));  // one code point
  CHECK_FALSE(Matches(dot, "a\nc"));
  CHECK(Matches(Regex(R"([\u0041-\x43]\-\[)"), "B-["));
  CHECK(Matches(Regex("a{3}"), "aaa"));
  CHECK_FALSE(Matches(Regex("a{3}"), "aaaa"));
  CHECK(Matches(Regex("a{,2}b"), "aab"));
}

TEST_CASE("regex refusals name the construct and the offset") {
  CHECK(ErrorOf("ab(cd") == "regex: unbalanced ( at 2");
  CHECK(ErrorOf("abc)") == "regex: unbalanced ) at 3");
  CHECK(ErrorOf(R"((a)\1)") == "regex: back-references are not supported at 3");
  CHECK(ErrorOf("a(?=b)") == "regex: lookaround is not supported at 1");
  CHECK(ErrorOf("a(?<!b)") == "regex: lookaround is not supported at 1");
  CHECK(ErrorOf(R"(\bword)") == "regex: word boundaries (\\b, \\B) are not supported at 0");
  CHECK(ErrorOf("a^b") == "regex: ^ is only supported at the start at 1");
  CHECK(ErrorOf("a$b") == "regex: $ is only supported at the end at 1");
  CHECK(ErrorOf("*a") == "regex: nothing to repeat at 0");
  CHECK(ErrorOf("[abc") == "regex: unterminated character class at 0");
  CHECK(ErrorOf("[z-a]") == "regex: bad character range at 2");
  CHECK(ErrorOf("a{5,2}") == "regex: repetition {m,n} with n < m at 1");
  CHECK(ErrorOf("(?i)abc") == "regex: inline flags and other (? groups are not supported at 0");
  CHECK(ErrorOf(R"(\q)") == "regex: unknown escape \\q at 0");
  CHECK(ErrorOf("a**") == "regex: multiple repeat at 2");
}

}  // namespace
}  // namespace mmserve::grammar
