#include "grammar/grammar_testing.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <utility>

namespace mmserve::grammar::testing {

std::shared_ptr<const Vocabulary> ByteVocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  bytes.push_back("</s>");
  bytes.push_back("<|special|>");
  std::vector<bool> special(bytes.size(), false);
  special.back() = true;
  return std::make_shared<const Vocabulary>(std::move(bytes), special, std::vector<int32_t>{256});
}

std::shared_ptr<const Vocabulary> RandomVocabulary(uint32_t seed, int extra) {
  static const std::string kText =
      R"({"name": "Zoë", "age": 42, "tags": ["a", "b\n"], "x": -1.5e+3, )"
      R"("ok": true, "none": null, "city": "Łódź 東京 🙂", "id": )"
      R"("123e4567-e89b-12d3-a456-426614174000", "d": "2024-02-29T12:30:00Z"})"
      R"(0123456789 {"" [] {} "\u00e9\"\\", , ": " true false)";
  std::mt19937 rng(seed);
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  for (int i = 0; i < extra; ++i) {
    const size_t len = 2 + rng() % 6;
    const size_t at = rng() % (kText.size() - len);
    bytes.push_back(kText.substr(at, len));
  }
  bytes.push_back("</s>");
  bytes.push_back("<|special|>");
  std::vector<bool> special(bytes.size(), false);
  special.back() = true;
  const int32_t eos = static_cast<int32_t>(bytes.size()) - 2;
  return std::make_shared<const Vocabulary>(std::move(bytes), special, std::vector<int32_t>{eos});
}

std::shared_ptr<const Vocabulary> QwenVocabulary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() < 12 || data.compare(0, 8, "MMVOCAB1") != 0) {
    std::cerr << "cannot read the vocabulary " << path << "\n";
    std::abort();
  }
  uint32_t count = 0;
  std::memcpy(&count, data.data() + 8, 4);
  std::vector<std::string> bytes;
  size_t pos = 12;
  for (uint32_t i = 0; i < count && pos < data.size(); ++i) {
    const size_t len = static_cast<uint8_t>(data[pos]);
    bytes.push_back(data.substr(pos + 1, len));
    pos += 1 + len;
  }
  if (bytes.size() != count || pos != data.size()) {
    std::cerr << "truncated vocabulary " << path << "\n";
    std::abort();
  }
  const int32_t first_special = static_cast<int32_t>(bytes.size());
  for (int i = 0; i < 22; ++i) bytes.push_back("<|special_" + std::to_string(i) + "|>");
  std::vector<bool> special(bytes.size(), false);
  for (size_t i = first_special; i < bytes.size(); ++i) special[i] = true;
  special[first_special] = special[first_special + 2] = false;  // the eos ids
  return std::make_shared<const Vocabulary>(std::move(bytes), std::move(special),
                                            std::vector<int32_t>{first_special, first_special + 2});
}

std::shared_ptr<const CompiledGrammar> MustCompile(const ConstraintSpec& spec,
                                                   std::shared_ptr<const Vocabulary> vocab) {
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = Compile(spec, std::move(vocab));
  if (!g.ok()) {
    std::cerr << "compile failed: " << g.status() << "\n" << spec.text << "\n";
    std::abort();
  }
  return *g;
}

bool Matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  Matcher m(g);
  return m.AcceptBytes(text) && m.CanTerminate();
}

std::vector<uint32_t> NaiveMask(const Matcher& m, const Vocabulary& vocab) {
  std::vector<uint32_t> words(vocab.mask_words(), 0);
  for (int32_t t = 0; t < vocab.size(); ++t) {
    Matcher copy = m;
    if (copy.AcceptToken(t)) words[t / 32] |= 1u << (t % 32);
  }
  return words;
}

std::vector<uint32_t> FastMask(const Matcher& m, const Vocabulary& vocab) {
  std::vector<uint32_t> words(vocab.mask_words(), 0xDEADBEEF);
  m.FillNextTokenBitmask(absl::MakeSpan(words));
  return words;
}

std::optional<std::string> RandomWalk(Matcher m, const Vocabulary& vocab, std::mt19937& rng,
                                      int max_tokens, double eos_bias) {
  std::string out;
  for (int step = 0; step < max_tokens; ++step) {
    if (m.IsFinished()) return out;
    const std::vector<uint32_t> mask = FastMask(m, vocab);
    std::vector<int32_t> allowed;
    bool eos_allowed = false;
    for (int32_t t = 0; t < vocab.size(); ++t) {
      if (!Bit(mask, t)) continue;
      if (vocab.is_eos(t)) {
        eos_allowed = true;
      } else {
        allowed.push_back(t);
      }
    }
    if (eos_allowed &&
        (allowed.empty() || std::uniform_real_distribution<double>(0, 1)(rng) < eos_bias)) {
      return out;
    }
    if (allowed.empty()) return std::nullopt;  // a dead end: a bug
    const int32_t t = allowed[rng() % allowed.size()];
    if (!m.AcceptToken(t)) return std::nullopt;
    out += vocab.bytes(t);
  }
  return std::nullopt;
}

}  // namespace mmserve::grammar::testing
