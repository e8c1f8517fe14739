#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grammar/ebnf_parser.h"
#include "grammar/regex_parser.h"

namespace mmserve::grammar {
namespace {

absl::Status Prefixed(std::string_view kind, const absl::Status& status) {
  const std::string message(status.message());
  const std::string prefix = absl::StrCat(std::string(kind), ": ");
  if (message.rfind(prefix, 0) == 0) return status;
  return absl::Status(status.code(), prefix + message);
}

constexpr size_t kMaxTextBytes = 64 * 1024;

absl::StatusOr<Grammar> BuildGrammar(const ConstraintSpec& spec) {
  if (spec.text.size() > kMaxTextBytes && spec.kind != ConstraintSpec::Kind::kJsonSchema) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.kind == ConstraintSpec::Kind::kRegex ? "regex: the pattern" : "ebnf: the grammar",
        " is larger than 64 KiB"));
  }
  switch (spec.kind) {
    case ConstraintSpec::Kind::kJsonObject:
    case ConstraintSpec::Kind::kJsonSchema: {
      const bool object = spec.kind == ConstraintSpec::Kind::kJsonObject;
      absl::StatusOr<std::string> ebnf = JsonSchemaToEbnf(
          object ? R"({"type": "object"})" : spec.text, "", false, !object && spec.strict);
      if (!ebnf.ok()) return ebnf.status();
      absl::StatusOr<Grammar> grammar = ParseEbnf(*ebnf);
      if (!grammar.ok()) return Prefixed("json_schema", grammar.status());
      return grammar;
    }
    case ConstraintSpec::Kind::kRegex:
      return RegexGrammar(spec.text);
    case ConstraintSpec::Kind::kEbnf:
      return ParseEbnf(spec.text);
  }
  return absl::InvalidArgumentError("unknown constraint kind");
}

std::string_view KindName(ConstraintSpec::Kind kind) {
  switch (kind) {
    case ConstraintSpec::Kind::kJsonObject:
      return "json_object";
    case ConstraintSpec::Kind::kJsonSchema:
      return "json_schema";
    case ConstraintSpec::Kind::kRegex:
      return "regex";
    case ConstraintSpec::Kind::kEbnf:
      return "ebnf";
  }
  return "constraint";
}

}  // namespace

absl::StatusOr<Pda> BuildPda(const ConstraintSpec& spec) {
  absl::StatusOr<Grammar> grammar = BuildGrammar(spec);
  if (!grammar.ok()) return grammar.status();
  absl::StatusOr<Pda> pda = Pda::Build(*grammar);
  if (!pda.ok()) return Prefixed(KindName(spec.kind), pda.status());
  return pda;
}

absl::Status Validate(const ConstraintSpec& spec) { return BuildPda(spec).status(); }

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(
    const ConstraintSpec& spec, std::shared_ptr<const Vocabulary> vocab) {
  absl::StatusOr<Pda> pda = BuildPda(spec);
  if (!pda.ok()) return pda.status();
  return std::make_shared<const CompiledGrammar>(*std::move(pda), std::move(vocab));
}

namespace {

// Whole masks cached per grammar, at most this many bytes of them.
constexpr size_t kFullMaskCacheBytes = 2 << 20;

std::string StacksKey(const StackSet& stacks) {
  std::string key(reinterpret_cast<const char*>(stacks.data().data()),
                  stacks.data().size() * sizeof(int32_t));
  key.append(reinterpret_cast<const char*>(stacks.begins().data()),
             stacks.begins().size() * sizeof(uint32_t));
  return key;
}

inline void SetBit(absl::Span<uint32_t> words, int32_t id) { words[id / 32] |= 1u << (id % 32); }

}  // namespace

CompiledGrammar::CompiledGrammar(Pda pda, std::shared_ptr<const Vocabulary> vocab)
    : pda_(std::move(pda)), vocab_(std::move(vocab)), root_start_(pda_.root_start()) {}

void CompiledGrammar::FillMask(const StackSet& stacks, absl::Span<uint32_t> words) const {
  const std::string key = StacksKey(stacks);
  const size_t n = vocab_->mask_words();
  {
    absl::MutexLock lock(&mu_);
    if (auto it = full_masks_.find(key); it != full_masks_.end()) {
      std::copy(it->second.begin(), it->second.end(), words.begin());
      std::fill(words.begin() + n, words.end(), 0);
      return;
    }
  }
  FillMaskFromTopMasks(stacks, words);
  absl::MutexLock lock(&mu_);
  if ((full_masks_.size() + 1) * n * sizeof(uint32_t) > kFullMaskCacheBytes) {
    full_masks_.clear();
  }
  full_masks_.emplace(key, std::vector<uint32_t>(words.begin(), words.begin() + n));
}

void CompiledGrammar::FillMaskFromTopMasks(const StackSet& stacks,
                                           absl::Span<uint32_t> words) const {
  const size_t n = vocab_->mask_words();
  std::fill(words.begin(), words.end(), 0);
  for (int i = 0; i < stacks.size(); ++i) {
    const StackView stack = stacks[i];
    const std::shared_ptr<const TopMask> top = TopMaskFor(stack.back());
    if (top->accepted.empty()) {
      for (int32_t id : top->accepted_ids) SetBit(words, id);
    } else {
      for (size_t w = 0; w < n; ++w) words[w] |= top->accepted[w];
    }
    // At the bottom frame nothing lies below: uncertain tokens fail.
    if (stack.size() > 1) CheckSubtrees(stack, top->uncertain, words);
  }
}

std::shared_ptr<const CompiledGrammar::TopMask> CompiledGrammar::TopMaskFor(int32_t state) const {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = top_masks_.find(state); it != top_masks_.end()) {
      return it->second;
    }
  }
  auto mask = std::make_shared<const TopMask>(ComputeTopMask(state));
  absl::MutexLock lock(&mu_);
  return top_masks_.emplace(state, std::move(mask)).first->second;
}

CompiledGrammar::TopMask CompiledGrammar::ComputeTopMask(int32_t state) const {
  TopMask mask;
  mask.accepted.assign(vocab_->mask_words(), 0);
  const TokenTrie& trie = vocab_->trie();
  const auto& nodes = trie.nodes();
  // The walk meets few distinct sets of stacks (inside a string: a handful),
  // so each set gets an id and each (set, byte) step is computed once.
  std::vector<StackSet> sets(1, StackSet(StackView(&state, 1)));
  absl::flat_hash_map<std::string, int32_t> set_ids = {{StacksKey(sets[0]), 0}};
  struct Transition {
    int32_t to = -2;     // -1: no stack survives; -2: not computed yet
    bool below = false;  // some path needed the frame below
  };
  std::vector<Transition> steps(256);  // [set id * 256 + byte]
  const auto step = [&](int32_t from, uint8_t byte) {
    Transition& t = steps[static_cast<size_t>(from) * 256 + byte];
    if (t.to != -2) return t;
    StackSet next;
    bool below = false;
    for (int i = 0; i < sets[from].size(); ++i) below |= pda_.Step(sets[from][i], byte, next);
    next.Dedupe();
    Transition out{-1, below};
    if (!next.empty()) {
      auto [it, inserted] = set_ids.emplace(StacksKey(next), static_cast<int32_t>(sets.size()));
      if (inserted) {
        sets.push_back(std::move(next));
        steps.resize(sets.size() * 256);
      }
      out.to = it->second;
    }
    steps[static_cast<size_t>(from) * 256 + byte] = out;
    return out;
  };
  // level[d]: the set after the first d bytes of the current node;
  // uncertain[d]: some path to it needed the frame below.
  std::vector<int32_t> level(trie.max_depth() + 1, 0);
  std::vector<bool> uncertain(trie.max_depth() + 1, false);
  for (size_t k = 1; k < nodes.size();) {
    const TokenTrie::Node& node = nodes[k];
    const int d = node.depth;
    const Transition t = step(level[d - 1], node.byte);
    uncertain[d] = uncertain[d - 1] || t.below;
    if (t.to < 0) {
      if (uncertain[d]) mask.uncertain.push_back(static_cast<int32_t>(k));
      k = node.end;
      continue;
    }
    level[d] = t.to;
    for (int32_t i = 0; i < node.num_tokens; ++i) {
      SetBit(absl::MakeSpan(mask.accepted), trie.token_ids()[node.first_token + i]);
    }
    ++k;
  }
  // A bitmask is 4 bytes per 32 tokens; ids take 4 bytes each.
  size_t count = 0;
  for (uint32_t w : mask.accepted) count += __builtin_popcount(w);
  if (count < mask.accepted.size()) {
    for (size_t w = 0; w < mask.accepted.size(); ++w) {
      for (uint32_t bits = mask.accepted[w]; bits != 0; bits &= bits - 1) {
        mask.accepted_ids.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(bits)));
      }
    }
    mask.accepted = {};
  }
  return mask;
}

void CompiledGrammar::WalkSubtree(int32_t root, std::vector<StackSet>& levels,
                                  absl::Span<uint32_t> words) const {
  const TokenTrie& trie = vocab_->trie();
  const auto& nodes = trie.nodes();
  for (int32_t k = root == 0 ? 1 : root; k < nodes[root].end;) {
    const TokenTrie::Node& node = nodes[k];
    StackSet& next = levels[node.depth];
    next.Clear();
    for (int i = 0; i < levels[node.depth - 1].size(); ++i) {
      pda_.Step(levels[node.depth - 1][i], node.byte, next);
    }
    if (next.empty()) {
      k = node.end;
      continue;
    }
    next.Dedupe();
    for (int32_t i = 0; i < node.num_tokens; ++i) {
      SetBit(words, trie.token_ids()[node.first_token + i]);
    }
    ++k;
  }
}

void CompiledGrammar::CheckSubtrees(StackView stack, const std::vector<int32_t>& roots,
                                    absl::Span<uint32_t> words) const {
  const auto& nodes = vocab_->trie().nodes();
  std::vector<StackSet> levels(vocab_->trie().max_depth() + 1);
  levels[0] = StackSet(stack);
  // path[i]: the node at depth i + 1 whose stacks levels[i + 1] holds.
  std::vector<int32_t> path, ancestors;
  for (int32_t root : roots) {
    ancestors.clear();
    for (int32_t a = nodes[root].parent; a > 0; a = nodes[a].parent) ancestors.push_back(a);
    std::reverse(ancestors.begin(), ancestors.end());
    size_t d = 0;
    while (d < path.size() && d < ancestors.size() && path[d] == ancestors[d]) ++d;
    path.resize(d);
    bool alive = !levels[d].empty();
    for (; alive && d < ancestors.size(); ++d) {
      StackSet& next = levels[d + 1];
      next.Clear();
      for (int i = 0; i < levels[d].size(); ++i) {
        pda_.Step(levels[d][i], nodes[ancestors[d]].byte, next);
      }
      next.Dedupe();
      path.push_back(ancestors[d]);
      alive = !next.empty();
    }
    if (alive) WalkSubtree(root, levels, words);
  }
}

void CompiledGrammar::FillMaskByWalk(const StackSet& stacks, absl::Span<uint32_t> words) const {
  std::fill(words.begin(), words.end(), 0);
  std::vector<StackSet> levels(vocab_->trie().max_depth() + 1);
  levels[0] = stacks;
  WalkSubtree(0, levels, words);
}

}  // namespace mmserve::grammar
