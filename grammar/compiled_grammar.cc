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

absl::StatusOr<Grammar> BuildGrammar(const ConstraintSpec& spec) {
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
constexpr size_t kFullMaskCacheBytes = 16 << 20;

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
  std::fill(words.begin(), words.end(), 0);
  for (int i = 0; i < stacks.size(); ++i) {
    const StackView stack = stacks[i];
    const std::shared_ptr<const TopMask> top = TopMaskFor(stack.back());
    for (size_t w = 0; w < n; ++w) words[w] |= top->accepted[w];
    // At the bottom frame nothing lies below: uncertain tokens fail.
    if (stack.size() > 1) CheckTokens(stack, top->uncertain, words);
  }
  absl::MutexLock lock(&mu_);
  if ((full_masks_.size() + 1) * n * sizeof(uint32_t) > kFullMaskCacheBytes) {
    full_masks_.clear();
  }
  full_masks_.emplace(key, std::vector<uint32_t>(words.begin(), words.begin() + n));
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
  const auto add_tokens = [&](const TokenTrie::Node& node, std::vector<int32_t>& out) {
    out.insert(out.end(), trie.token_ids().begin() + node.first_token,
               trie.token_ids().begin() + node.first_token + node.num_tokens);
  };
  // levels[d]: the stacks after the first d bytes of the current node;
  // uncertain[d]: some path to them needed the frame below.
  std::vector<StackSet> levels(trie.max_depth() + 1);
  std::vector<bool> uncertain(trie.max_depth() + 1, false);
  levels[0] = StackSet(StackView(&state, 1));
  std::vector<int32_t> accepted;
  for (size_t k = 1; k < nodes.size();) {
    const TokenTrie::Node& node = nodes[k];
    const int d = node.depth;
    StackSet& next = levels[d];
    next.Clear();
    bool below = false;
    for (int i = 0; i < levels[d - 1].size(); ++i) {
      below |= pda_.Step(levels[d - 1][i], node.byte, next);
    }
    uncertain[d] = uncertain[d - 1] || below;
    if (next.empty()) {
      if (uncertain[d]) {
        for (size_t j = k; j < static_cast<size_t>(node.end); ++j) {
          add_tokens(nodes[j], mask.uncertain);
        }
      }
      k = node.end;
      continue;
    }
    next.Dedupe();
    accepted.clear();
    add_tokens(node, accepted);
    for (int32_t id : accepted) SetBit(absl::MakeSpan(mask.accepted), id);
    ++k;
  }
  return mask;
}

void CompiledGrammar::CheckTokens(StackView stack, const std::vector<int32_t>& tokens,
                                  absl::Span<uint32_t> words) const {
  std::vector<StackSet> levels(vocab_->trie().max_depth() + 1);
  levels[0] = StackSet(stack);
  size_t valid = 0;  // levels[0..valid] hold the prefix of `prev`
  const std::string* prev = nullptr;
  for (int32_t id : tokens) {
    const std::string& bytes = vocab_->bytes(id);
    size_t d = 0;
    if (prev != nullptr) {
      while (d < valid && d < bytes.size() && (*prev)[d] == bytes[d]) ++d;
    }
    valid = d;
    prev = &bytes;
    bool alive = !levels[d].empty();
    for (; alive && d < bytes.size(); ++d) {
      StackSet& next = levels[d + 1];
      next.Clear();
      for (int i = 0; i < levels[d].size(); ++i) {
        pda_.Step(levels[d][i], static_cast<uint8_t>(bytes[d]), next);
      }
      next.Dedupe();
      valid = d + 1;
      alive = !next.empty();
    }
    if (alive) SetBit(words, id);
  }
}

void CompiledGrammar::FillMaskByWalk(const StackSet& stacks, absl::Span<uint32_t> words) const {
  std::fill(words.begin(), words.end(), 0);
  const TokenTrie& trie = vocab_->trie();
  const auto& nodes = trie.nodes();
  std::vector<StackSet> levels(trie.max_depth() + 1);
  levels[0] = stacks;
  for (size_t k = 1; k < nodes.size();) {
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

}  // namespace mmserve::grammar
