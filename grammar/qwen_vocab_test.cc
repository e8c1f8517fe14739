// Masks over Qwen2's real 151,643-token vocabulary (byte-level BPE tokens
// that split UTF-8 characters, join quotes with letters, ...) against the
// uncached trie walk and against trying every token.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar.h"
#include "grammar/grammar_testing.h"
#include "grammar/schema_corpus.h"

namespace mmserve::grammar {
namespace {

using testing::Bit;

std::vector<uint32_t> WalkMask(const CompiledGrammar& g, const std::string& prefix) {
  std::vector<uint32_t> words(g.vocab().mask_words());
  g.FillMaskByWalk(g.pda().StepAll(g.InitialStacks(), prefix), absl::MakeSpan(words));
  return words;
}

std::shared_ptr<const Vocabulary> Qwen() {
  static const auto* const kVocab =
      new std::shared_ptr<const Vocabulary>(testing::QwenVocabulary(testing::kQwenVocabPath));
  return *kVocab;
}

TEST_CASE("Qwen2 vocabulary: masks along random walks equal the uncached walk") {
  auto vocab = Qwen();
  REQUIRE(vocab->size() == 151665);
  std::mt19937 rng(1);
  int checked = 0;
  for (const testing::SchemaCase& c : testing::LoadSchemaCorpus(testing::kCorpusPath)) {
    INFO(c.name);
    auto g = testing::MustCompile({ConstraintSpec::Kind::kJsonSchema, c.schema, c.strict}, vocab);
    Matcher m(g);
    std::string text;
    for (int step = 0; step < 6 && !m.IsFinished(); ++step) {
      const std::vector<uint32_t> mask = testing::FastMask(m, *vocab);
      std::vector<uint32_t> expected = WalkMask(*g, text);
      if (m.CanTerminate()) {
        for (int32_t eos : vocab->eos()) expected[eos / 32] |= 1u << (eos % 32);
      }
      INFO(text);
      REQUIRE(mask == expected);
      ++checked;
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab->size(); ++t) {
        if (Bit(mask, t) && !vocab->is_eos(t)) allowed.push_back(t);
      }
      if (allowed.empty()) break;
      const int32_t t = allowed[rng() % allowed.size()];
      REQUIRE(m.AcceptToken(t));
      text += vocab->bytes(t);
    }
  }
  CHECK(checked > 80);
}

TEST_CASE("Qwen2 vocabulary: the mask inside a JSON string equals trying every token") {
  auto vocab = Qwen();
  auto g = testing::MustCompile(
      {ConstraintSpec::Kind::kJsonSchema,
       R"({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]})", true},
      vocab);
  Matcher m(g);
  REQUIRE(m.AcceptBytes(R"({"s": "ab)"));
  const std::vector<uint32_t> mask = testing::FastMask(m, *vocab);
  CHECK(mask == testing::NaiveMask(m, *vocab));
  // Tokens that close the string and the object at once are allowed; those
  // that close it and go on with a comma are not (no other property).
  int32_t close = -1, comma = -1;
  for (int32_t t = 0; t < vocab->size(); ++t) {
    if (vocab->bytes(t) == "\"}") close = t;
    if (vocab->bytes(t) == "\",") comma = t;
  }
  REQUIRE(close >= 0);
  REQUIRE(comma >= 0);
  CHECK(Bit(mask, close));
  CHECK_FALSE(Bit(mask, comma));
}

TEST_CASE("Qwen2 vocabulary: one grammar's masks from several threads agree") {
  auto vocab = Qwen();
  auto g = testing::MustCompile({ConstraintSpec::Kind::kJsonObject, ""}, vocab);
  const std::vector<std::string> prefixes = {"{", R"({"a)", R"({"a": [1, )", R"({"a": "x\)",
                                             R"({"a": tr)"};
  std::vector<std::vector<uint32_t>> expected;
  for (const std::string& p : prefixes) expected.push_back(WalkMask(*g, p));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 3; ++round) {
        for (size_t p = 0; p < prefixes.size(); ++p) {
          Matcher m(g);
          m.AcceptBytes(prefixes[(p + i) % prefixes.size()]);
          std::vector<uint32_t> mask = testing::FastMask(m, *vocab);
          for (int32_t eos : vocab->eos()) mask[eos / 32] &= ~(1u << (eos % 32));
          mismatches[i] += mask != expected[(p + i) % prefixes.size()];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

}  // namespace
}  // namespace mmserve::grammar
