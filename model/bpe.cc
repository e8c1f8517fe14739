#include "model/bpe.h"

#include <queue>

#include "absl/strings/str_cat.h"
#include "model/unicode.h"

namespace mmserve::model {

absl::StatusOr<BpeModel> BpeModel::Create(
    absl::flat_hash_map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges) {
  BpeModel m;
  m.vocab_ = std::move(vocab);
  m.ignore_merges_ = ignore_merges;
  m.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    int32_t ia = m.TokenToId(a), ib = m.TokenToId(b), ir = m.TokenToId(a + b);
    if (ia < 0 || ib < 0 || ir < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("merge ", rank, " \"", a, " ", b, "\" uses a token missing from the vocab"));
    }
    // A repeated pair keeps its first (lowest) rank.
    m.merges_.try_emplace(PairKey(ia, ib), Merge{static_cast<int32_t>(rank), ir});
  }
  return m;
}

int32_t BpeModel::TokenToId(absl::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

absl::Status BpeModel::Encode(absl::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return absl::OkStatus();
  if (ignore_merges_) {
    if (int32_t id = TokenToId(word); id >= 0) {
      out->push_back(id);
      return absl::OkStatus();
    }
  }
  // Symbols as a doubly linked list over a vector; merged-away ones have
  // id -1. A min-heap of candidate pairs, validated lazily when popped.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> syms;
  size_t pos = 0;
  while (pos < word.size()) {
    size_t start = pos;
    NextCodePoint(word, &pos);
    int32_t id = TokenToId(word.substr(start, pos - start));
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("character \"", word.substr(start, pos - start), "\" has no token"));
    }
    int32_t i = static_cast<int32_t>(syms.size());
    syms.push_back({id, i - 1, i + 1});
  }
  syms.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t left;  // index of the left symbol
    int32_t left_id, right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;  // leftmost first on ties
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = syms[left].next;
    if (right < 0) return;
    auto it = merges_.find(PairKey(syms[left].id, syms[right].id));
    if (it != merges_.end()) heap.push({it->second.rank, left, syms[left].id, syms[right].id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);

  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    Symbol& left = syms[c.left];
    if (left.id != c.left_id || left.next < 0 || syms[left.next].id != c.right_id) continue;
    const int32_t right_index = left.next;
    Symbol& right = syms[right_index];
    left.id = merges_.find(PairKey(c.left_id, c.right_id))->second.result;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = c.left;
    right.id = -1;
    push(left.prev);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out->push_back(syms[i].id);
  return absl::OkStatus();
}

}  // namespace mmserve::model
