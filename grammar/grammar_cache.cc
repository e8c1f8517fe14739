#include <utility>

#include "absl/strings/str_cat.h"
#include "grammar/grammar.h"

namespace mmserve::grammar {

GrammarCache::GrammarCache(std::shared_ptr<const Vocabulary> vocab, size_t capacity)
    : vocab_(std::move(vocab)), capacity_(std::max<size_t>(capacity, 1)) {}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCache::Get(
    const ConstraintSpec& spec) {
  const std::string key =
      absl::StrCat(static_cast<int>(spec.kind), ":", spec.strict ? 1 : 0, ":", spec.text);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock: other specs are served meanwhile.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> compiled = Compile(spec, vocab_);
  if (!compiled.ok()) return compiled.status();
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  lru_.emplace_front(key, *compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return *compiled;
}

size_t GrammarCache::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

}  // namespace mmserve::grammar
