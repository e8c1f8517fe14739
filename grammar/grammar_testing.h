// Helpers of the grammar tests: vocabularies, whole-text matching, the
// naive mask (every token tried on a copy of the matcher), random walks.
#ifndef MMSERVE_GRAMMAR_GRAMMAR_TESTING_H_
#define MMSERVE_GRAMMAR_GRAMMAR_TESTING_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace mmserve::grammar::testing {

// Token i < 256 is byte i; then eos, then one special token.
std::shared_ptr<const Vocabulary> ByteVocabulary();

// All 256 single bytes, then `extra` tokens cut at random from JSON-like
// text with multi-byte UTF-8 (so some tokens split a character), then eos
// and a special token.
std::shared_ptr<const Vocabulary> RandomVocabulary(uint32_t seed, int extra);

// Qwen2's vocabulary from tools/qwen_vocab.py's file (151,643 ordinary
// tokens), then 22 special tokens of which <|endoftext|> (151643) and
// <|im_end|> (151645) are eos. Aborts when the file cannot be read.
std::shared_ptr<const Vocabulary> QwenVocabulary(const std::string& path);
inline constexpr char kQwenVocabPath[] = "grammar/testdata/qwen2_vocab.bin";

// The compiled grammar of `spec`; fails the test when it does not compile.
std::shared_ptr<const CompiledGrammar> MustCompile(
    const ConstraintSpec& spec, std::shared_ptr<const Vocabulary> vocab = ByteVocabulary());

// `text` read byte by byte leaves a matcher that may end.
bool Matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text);

// The mask by trying every token on a copy of `m`.
std::vector<uint32_t> NaiveMask(const Matcher& m, const Vocabulary& vocab);
std::vector<uint32_t> FastMask(const Matcher& m, const Vocabulary& vocab);

// Picks random allowed tokens until eos is picked or `m` is finished; the
// bytes written, or nullopt past `max_tokens`. eos is picked with
// probability `eos_bias` whenever allowed.
std::optional<std::string> RandomWalk(Matcher m, const Vocabulary& vocab, std::mt19937& rng,
                                      int max_tokens, double eos_bias = 0.3);

inline bool Bit(const std::vector<uint32_t>& words, int32_t t) {
  return (words[t / 32] >> (t % 32)) & 1;
}

}  // namespace mmserve::grammar::testing

#endif  // MMSERVE_GRAMMAR_GRAMMAR_TESTING_H_
