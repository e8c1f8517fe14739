#include "grammar/ebnf_parser.h"

#include <catch2/catch.hpp>
#include <string>

#include "grammar/grammar.h"
#include "grammar/grammar_testing.h"

namespace mmserve::grammar {
namespace {

using testing::Matches;
using testing::MustCompile;

std::string ErrorOf(const std::string& ebnf) {
  return std::string(Validate({ConstraintSpec::Kind::kEbnf, ebnf}).message());
}

std::shared_ptr<const CompiledGrammar> Ebnf(const std::string& text) {
  return MustCompile({ConstraintSpec::Kind::kEbnf, text});
}

TEST_CASE("ebnf literals, classes, groups and repetition match their text") {
  auto g = Ebnf(R"(
    # a comment
    root ::= greeting ", " name{1,3} "!"?   # trailing comment
    greeting ::= "hello" | "hi"
    name ::= [A-Z] [a-z]*
  )");
  CHECK(Matches(g, "hello, Bob"));
  CHECK(Matches(g, "hi, BobAnnCy!"));
  CHECK_FALSE(Matches(g, "hi, BobAnnCyDee"));
  CHECK_FALSE(Matches(g, "hey, Bob"));
  CHECK_FALSE(Matches(g, "hello, bob"));
  CHECK_FALSE(Matches(g, "hello, "));
}

TEST_CASE("ebnf escapes and negated classes") {
  auto g = Ebnf(R"(root ::= "\"" [^"\\\n]* "\"" "\t" "\x41" "\u00e9")");
  CHECK(Matches(g, "\"abc\"\tA\xC3\xA9"));
  CHECK_FALSE(Matches(g, "\"a\nc\"\tA\xC3\xA9"));
  CHECK_FALSE(Matches(g, "\"a\"c\"\tA\xC3\xA9"));
}

TEST_CASE("ebnf classes over code points match whole UTF-8 characters") {
  auto g = Ebnf(R"(root ::= [а-я]+ [^a-z] .)");
  CHECK(Matches(g,
                "\xD0\xB4\xD0\xB0"
                "!"
                "\xF0\x9F\x99\x82"));  // да!🙂
  CHECK_FALSE(Matches(g,
                      "\xD0\xB4\xD0\xB0"
                      "a"
                      "x"));
  CHECK_FALSE(Matches(g,
                      "\xD0\xB4\xD0"
                      "!x"));  // split character
  // A negated class never matches a surrogate or invalid UTF-8.
  CHECK_FALSE(Matches(g,
                      "\xD0\xB4"
                      "\xED\xA0\x80"
                      "x"));
  CHECK_FALSE(Matches(g,
                      "\xD0\xB4"
                      "\xFF"
                      "x"));
}

TEST_CASE("ebnf recursion and ambiguity") {
  auto g = Ebnf(R"(
    root ::= list
    list ::= "[" (item ("," item)*)? "]"
    item ::= list | "ab" | "abc" | "a"
  )");
  CHECK(Matches(g, "[]"));
  CHECK(Matches(g, "[a,ab,abc,[[a]],[]]"));
  CHECK_FALSE(Matches(g, "[abcd]"));
  CHECK_FALSE(Matches(g, "[[a]"));
}

TEST_CASE("ebnf rules that may match nothing") {
  auto g = Ebnf(R"(
    root ::= opt opt "x" opt* tail
    opt ::= "o"?
    tail ::= ""
  )");
  CHECK(Matches(g, "x"));
  CHECK(Matches(g, "ooxooo"));
  CHECK_FALSE(Matches(g, "ooo"));
}

TEST_CASE("ebnf errors say what and where") {
  CHECK(ErrorOf("root ::= \"a\" | b") == "ebnf: rule \"b\" is not defined at 1:16");
  CHECK(ErrorOf("start ::= \"a\"") == "ebnf: no rule named \"root\"");
  CHECK(ErrorOf("root \"a\"") == "ebnf: expected \"::=\" after rule name at 1:6");
  CHECK(ErrorOf("root ::= \"abc") == "ebnf: unterminated string literal at 1:14");
  CHECK(ErrorOf("root ::= [a-") == "ebnf: unterminated character class at 1:13");
  CHECK(ErrorOf("root ::= [z-a]") == "ebnf: character range out of order at 1:14");
  CHECK(ErrorOf("root ::= (\"a\"") == "ebnf: expected \")\" at 1:14");
  CHECK(ErrorOf("root ::= \"a\"{3,2}") == "ebnf: repetition {m,n} with n < m at 1:17");
  CHECK(ErrorOf("root ::= \"a\"{99999}") == "ebnf: repetition count above 10000 at 1:19");
  CHECK(ErrorOf("root ::= \"a\"\nroot ::= \"b\"") == "ebnf: rule \"root\" is defined twice at 2:1");
  CHECK(ErrorOf("root ::= \"\\q\"") == "ebnf: unknown escape \\q at 1:12");
  CHECK(ErrorOf("root ::= @") == "ebnf: unexpected character '@' at 1:10");
  CHECK(ErrorOf("root ::= \"\\ud800\"") == "ebnf: escape is not a Unicode scalar value at 1:17");
}

TEST_CASE("ebnf left recursion is refused with the rule's name") {
  CHECK(ErrorOf("root ::= root \"a\" | \"b\"") == "ebnf: rule \"root\" is left-recursive");
  CHECK(ErrorOf("root ::= x\nx ::= y? x \"a\" | \"b\"\ny ::= \"c\"") ==
        "ebnf: rule \"x\" is left-recursive");
}

TEST_CASE("ebnf grammars past the size limit are refused") {
  const std::string huge = "root ::= (\"a\" [a-z]{100} \"b\"){2000}";
  CHECK(ErrorOf(huge).rfind("ebnf: the grammar is too large", 0) == 0);
}

}  // namespace
}  // namespace mmserve::grammar
