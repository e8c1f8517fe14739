// A grammar's automaton bound to a vocabulary, with the mask computation.
//
// A mask is the union over the position's stacks. For one stack, the
// tokens split by its top state alone (computed once per state, then
// cached): accepted (read within the top frame, whatever lies below),
// rejected (die within it), and uncertain (need the top rule to end and the
// frames below to continue). Uncertain tokens come as whole subtrees of the
// vocabulary trie, which are walked with the whole stack. Whole masks are also cached per position
// (set of stacks), since decoding inside a long string revisits the same one.
#ifndef MMSERVE_GRAMMAR_COMPILED_GRAMMAR_H_
#define MMSERVE_GRAMMAR_COMPILED_GRAMMAR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "grammar/automaton.h"
#include "grammar/grammar.h"

namespace mmserve::grammar {

// The automaton `spec` describes (no vocabulary needed), errors prefixed
// with the spec's kind.
absl::StatusOr<Pda> BuildPda(const ConstraintSpec& spec);

class CompiledGrammar {
 public:
  CompiledGrammar(Pda pda, std::shared_ptr<const Vocabulary> vocab);

  const Pda& pda() const { return pda_; }
  const Vocabulary& vocab() const { return *vocab_; }
  StackSet InitialStacks() const { return StackSet(StackView(&root_start_, 1)); }

  // Sets the bit of every ordinary token that `stacks` may read next and
  // clears all others (eos included: the caller adds it). Thread-safe.
  void FillMask(const StackSet& stacks, absl::Span<uint32_t> words) const;
  // The same without the whole-mask cache (per-state caches only).
  void FillMaskFromTopMasks(const StackSet& stacks, absl::Span<uint32_t> words) const;
  // The same by walking the whole trie with the whole stacks, no caches
  // (the benchmark's and the tests' reference).
  void FillMaskByWalk(const StackSet& stacks, absl::Span<uint32_t> words) const;

 private:
  struct TopMask {
    // Accepted tokens: a bitmask, or (when they are few) their ids.
    std::vector<uint32_t> accepted;
    std::vector<int32_t> accepted_ids;
    std::vector<int32_t> uncertain;  // trie nodes, roots of subtrees, in preorder
  };

  std::shared_ptr<const TopMask> TopMaskFor(int32_t state) const;
  TopMask ComputeTopMask(int32_t state) const;
  // Sets the bits of the tokens in the subtrees under `roots` (in
  // preorder) that `stack` may read.
  void CheckSubtrees(StackView stack, const std::vector<int32_t>& roots,
                     absl::Span<uint32_t> words) const;

  // Walks the trie under `root` (the root's node included; 0: the whole
  // trie) from levels[depth of root - 1], setting the tokens that stay alive.
  void WalkSubtree(int32_t root, std::vector<StackSet>& levels, absl::Span<uint32_t> words) const;

  const Pda pda_;
  const std::shared_ptr<const Vocabulary> vocab_;
  const int32_t root_start_;

  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<int32_t, std::shared_ptr<const TopMask>> top_masks_
      ABSL_GUARDED_BY(mu_);
  mutable absl::flat_hash_map<std::string, std::vector<uint32_t>> full_masks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mmserve::grammar

#endif  // MMSERVE_GRAMMAR_COMPILED_GRAMMAR_H_
