#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/grammar_testing.h"

namespace mmserve::grammar {
namespace {

using testing::Bit;
using testing::FastMask;
using testing::MustCompile;
using testing::NaiveMask;
using testing::RandomVocabulary;

// Grammars whose masks the property test compares.
const std::vector<ConstraintSpec>& Specs() {
  static const auto* const kSpecs = new std::vector<ConstraintSpec>{
      {ConstraintSpec::Kind::kJsonObject, ""},
      {ConstraintSpec::Kind::kRegex, R"([a-z]{2,5}(-\d+)?|"[^"]*"|Zoë+)"},
      {ConstraintSpec::Kind::kEbnf, R"(
        root ::= "[" (item (", " item)*)? "]"
        item ::= "true" | "tr" [a-z]* | num | root
        num ::= "-"? [0-9]+ ("." [0-9]+)?
      )"},
      {ConstraintSpec::Kind::kJsonSchema,
       R"({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 4},
            "age": {"type": "integer", "minimum": -5, "maximum": 130},
            "tags": {"type": "array", "items": {"enum": ["a", "ab", "b\n"]}}},
           "required": ["name"], "additionalProperties": false})"},
  };
  return *kSpecs;
}

TEST_CASE("the mask equals trying every token, on random states") {
  auto vocab = RandomVocabulary(7, 400);
  std::mt19937 rng(11);
  for (const ConstraintSpec& spec : Specs()) {
    INFO(spec.text);
    auto g = MustCompile(spec, vocab);
    for (int walk = 0; walk < 8; ++walk) {
      Matcher m(g);
      for (int step = 0; step < 30; ++step) {
        const std::vector<uint32_t> fast = FastMask(m, *vocab);
        REQUIRE(fast == NaiveMask(m, *vocab));
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vocab->size(); ++t) {
          if (Bit(fast, t) && !vocab->is_eos(t)) allowed.push_back(t);
        }
        if (allowed.empty()) break;
        REQUIRE(m.AcceptToken(allowed[rng() % allowed.size()]));
      }
    }
  }
}

TEST_CASE("eos is allowed exactly when the grammar may end") {
  auto vocab = testing::ByteVocabulary();
  auto g = MustCompile({ConstraintSpec::Kind::kRegex, "ab|abc"}, vocab);
  const int32_t eos = 256, special = 257;
  Matcher m(g);
  CHECK_FALSE(m.CanTerminate());
  CHECK_FALSE(Bit(FastMask(m, *vocab), eos));
  CHECK_FALSE(m.AcceptToken(eos));
  CHECK(m.AcceptToken('a'));
  CHECK(m.AcceptToken('b'));
  CHECK(m.CanTerminate());
  CHECK_FALSE(m.IsFinished());  // "c" may follow
  CHECK(Bit(FastMask(m, *vocab), eos));
  CHECK(Bit(FastMask(m, *vocab), 'c'));
  CHECK_FALSE(Bit(FastMask(m, *vocab), special));
  CHECK_FALSE(m.AcceptToken(special));
  Matcher done = m;
  CHECK(done.AcceptToken('c'));
  CHECK(done.IsFinished());
  CHECK(FastMask(done, *vocab) == [&] {
    std::vector<uint32_t> w(vocab->mask_words(), 0);
    w[eos / 32] |= 1u << (eos % 32);
    return w;
  }());
  CHECK(m.AcceptToken(eos));
  CHECK(m.IsFinished());
  CHECK_FALSE(m.AcceptToken('c'));
  CHECK_FALSE(m.CanTerminate());
  for (uint32_t w : FastMask(m, *vocab)) CHECK(w == 0);
}

TEST_CASE("an eos id also marked special is still eos") {
  std::vector<std::string> bytes = {"a", "b", "<|im_end|>", "<|im_start|>"};
  auto vocab = std::make_shared<const Vocabulary>(
      bytes, std::vector<bool>{false, false, true, true}, std::vector<int32_t>{2});
  CHECK(vocab->is_eos(2));
  CHECK_FALSE(vocab->is_special(2));
  Matcher m(MustCompile({ConstraintSpec::Kind::kRegex, "ab"}, vocab));
  CHECK(m.AcceptToken(0));
  CHECK_FALSE(m.AcceptToken(3));
  CHECK(m.AcceptToken(1));
  CHECK(m.AcceptToken(2));
  CHECK(m.IsFinished());
}

TEST_CASE("a rejected token leaves the matcher where it was") {
  auto vocab = RandomVocabulary(3, 200);
  auto g = MustCompile({ConstraintSpec::Kind::kRegex, "Zoë!"}, vocab);
  Matcher m(g);
  REQUIRE(m.AcceptBytes("Zo"));
  const std::vector<uint32_t> before = FastMask(m, *vocab);
  CHECK_FALSE(m.AcceptBytes("\xC3\xA8"));  // è, not ë
  CHECK_FALSE(m.AcceptToken(-1));
  CHECK_FALSE(m.AcceptToken(vocab->size()));
  CHECK(FastMask(m, *vocab) == before);
  CHECK(m.AcceptBytes("\xC3"));  // half of ë: tokens may split characters
  CHECK(m.AcceptBytes("\xAB!"));
  CHECK(m.CanTerminate());
}

TEST_CASE("ApplyBitmask sets disallowed logits to -inf") {
  std::vector<float> logits(40, 1.0f);
  std::vector<uint32_t> words = {0x0000000Fu, 0x1u};
  ApplyBitmask(absl::MakeSpan(logits), words);
  for (int t = 0; t < 40; ++t) {
    const bool allowed = t < 4 || t == 32;
    CHECK((allowed ? logits[t] == 1.0f : std::isinf(logits[t])));
  }
}

TEST_CASE(
    "the grammar cache compiles once per content and evicts the "
    "least recently used") {
  GrammarCache cache(testing::ByteVocabulary(), 2);
  const ConstraintSpec a{ConstraintSpec::Kind::kRegex, "a+"};
  const ConstraintSpec b{ConstraintSpec::Kind::kRegex, "b+"};
  const ConstraintSpec c{ConstraintSpec::Kind::kEbnf, "root ::= \"c\""};
  auto ga = cache.Get(a);
  REQUIRE(ga.ok());
  CHECK(*cache.Get(a) == *ga);
  REQUIRE(cache.Get(b).ok());
  CHECK(*cache.Get(a) == *ga);  // a is now the most recent
  REQUIRE(cache.Get(c).ok());   // evicts b
  CHECK(cache.size() == 2);
  CHECK(*cache.Get(a) == *ga);
  ConstraintSpec strict_b = b;
  strict_b.strict = true;
  CHECK(*cache.Get(strict_b) != *cache.Get(b));
  const auto bad = cache.Get({ConstraintSpec::Kind::kRegex, "(("});
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mmserve::grammar
