// Validate on hostile input: deep nesting, huge repetition, random
// mutations of valid specs. Every answer is OK or InvalidArgument, and
// what validates compiles and yields masks.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/grammar_testing.h"

namespace mmserve::grammar {
namespace {

std::string ErrorOf(ConstraintSpec::Kind kind, const std::string& text) {
  return std::string(Validate({kind, text}).message());
}

TEST_CASE("nesting and size limits refuse what would exhaust the stack or memory") {
  using K = ConstraintSpec::Kind;
  CHECK(ErrorOf(K::kRegex, std::string(5000, '(') + "a" + std::string(5000, ')')) ==
        "regex: groups nested deeper than 100 at 100");
  CHECK(
      ErrorOf(K::kEbnf, "root ::= " + std::string(5000, '(') + "\"a\"" + std::string(5000, ')')) ==
      "ebnf: groups nested deeper than 100 at 1:110");
  CHECK(ErrorOf(K::kEbnf, "root ::= \"a\"*****") ==
        "ebnf: more than 4 repetition operators on one item at 1:17");
  CHECK(ErrorOf(K::kRegex, std::string(70000, 'a')) == "regex: the pattern is larger than 64 KiB");
  CHECK(ErrorOf(K::kRegex, "(a{1000}){1000}").rfind("regex: the grammar is too large", 0) == 0);
  CHECK(ErrorOf(K::kRegex, "[ab]*a[ab]{20}") ==
        "regex: the grammar is too large (more than 50000 automaton states)");
  std::string many_prefix = R"({"type": "array", "prefixItems": [)";
  for (int i = 0; i < 70; ++i) many_prefix += std::string(i ? ", " : "") + "{}";
  CHECK(ErrorOf(K::kJsonSchema, many_prefix + "]}") ==
        "json_schema: \"prefixItems\" with more than 64 schemas is not supported");
  // Many items are counted, not nested.
  CHECK(Validate({K::kJsonSchema, R"({"type": "array", "minItems": 900, "maxItems": 1000})"}).ok());
}

TEST_CASE("random mutations of valid specs validate or fail with InvalidArgument") {
  using K = ConstraintSpec::Kind;
  const std::vector<ConstraintSpec> seeds = {
      {K::kEbnf,
       "root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [a-z]+ | root | \"\\u00e9\"{2,3}"},
      {K::kRegex, R"(^(?:[A-Z]\w{2,4}|\d+\.\d*|"[^"]*")+$)"},
      {K::kJsonSchema,
       R"({"type": "object", "properties": {"a": {"type": "array", "items": {"enum": [1, "x"]},
           "maxItems": 3}, "b": {"anyOf": [{"type": "string", "pattern": "^a+$"}, {"$ref": "#"}]}},
           "required": ["a"]})"},
  };
  const std::string alphabet = "()[]{}|*+?^$\\\"':,.-#0123456789azAZ \n\xC3\xA9";
  auto vocab = testing::RandomVocabulary(1, 200);
  std::mt19937 rng(42);
  int ok = 0, refused = 0;
  for (int round = 0; round < 800; ++round) {
    ConstraintSpec spec = seeds[round % seeds.size()];
    for (int edits = 1 + rng() % 3; edits > 0; --edits) {
      const size_t at = rng() % (spec.text.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          spec.text.insert(at, 1, c);
          break;
        case 1:
          if (at < spec.text.size()) spec.text.erase(at, 1);
          break;
        default:
          if (at < spec.text.size()) spec.text[at] = c;
          break;
      }
    }
    INFO(spec.text);
    const absl::Status status = Validate(spec);
    if (!status.ok()) {
      REQUIRE(status.code() == absl::StatusCode::kInvalidArgument);
      ++refused;
      continue;
    }
    ++ok;
    auto g = Compile(spec, vocab);
    REQUIRE(g.ok());
    Matcher m(*g);
    std::vector<uint32_t> words(vocab->mask_words());
    m.FillNextTokenBitmask(absl::MakeSpan(words));
  }
  CHECK(ok > 50);
  CHECK(refused > 50);
}

}  // namespace
}  // namespace mmserve::grammar
