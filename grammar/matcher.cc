#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar.h"

namespace mmserve::grammar {

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), stacks_(grammar_->InitialStacks()) {}

void Matcher::FillNextTokenBitmask(absl::Span<uint32_t> words) const {
  if (terminated_) {
    std::fill(words.begin(), words.end(), 0);
    return;
  }
  grammar_->FillMask(stacks_, words);
  if (CanTerminate()) {
    for (int32_t id : grammar_->vocab().eos()) {
      words[id / 32] |= 1u << (id % 32);
    }
  }
}

bool Matcher::AcceptToken(int32_t token) {
  const Vocabulary& vocab = grammar_->vocab();
  if (terminated_ || token < 0 || token >= vocab.size() || vocab.is_special(token)) {
    return false;
  }
  if (vocab.is_eos(token)) {
    if (!CanTerminate()) return false;
    terminated_ = true;
    return true;
  }
  return !vocab.bytes(token).empty() && AcceptBytes(vocab.bytes(token));
}

bool Matcher::AcceptBytes(std::string_view bytes) {
  if (terminated_) return false;
  StackSet next = grammar_->pda().StepAll(stacks_, bytes);
  if (next.empty()) return false;
  stacks_ = std::move(next);
  return true;
}

bool Matcher::CanTerminate() const {
  if (terminated_) return false;
  for (int i = 0; i < stacks_.size(); ++i) {
    if (grammar_->pda().CanEnd(stacks_[i])) return true;
  }
  return false;
}

bool Matcher::IsFinished() const {
  if (terminated_) return true;
  if (!CanTerminate()) return false;
  for (int i = 0; i < stacks_.size(); ++i) {
    if (grammar_->pda().CanContinue(stacks_[i])) return false;
  }
  return true;
}

void ApplyBitmask(absl::Span<float> logits, absl::Span<const uint32_t> words) {
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  const size_t n = std::min(logits.size(), words.size() * 32);
  for (size_t w = 0; w * 32 < n; ++w) {
    const uint32_t word = words[w];
    if (word == 0xFFFFFFFFu) continue;
    const size_t end = std::min(n, w * 32 + 32);
    for (size_t t = w * 32; t < end; ++t) {
      if (!(word >> (t % 32) & 1)) logits[t] = kMinusInf;
    }
  }
  for (size_t t = n; t < logits.size(); ++t) logits[t] = kMinusInf;
}

}  // namespace mmserve::grammar
