// A grammar as a pushdown automaton over bytes: each rule becomes a DFA whose
// edges read a byte or call another rule, and all rules' states share one
// numbering. A position in the grammar is a stack of states (bottom first):
// the top is where reading continues, each state below is where its rule
// resumes once the rule above it ends. Ambiguity (an enum's values sharing a
// prefix, a byte that may start a called rule or end the current one) is
// kept as a set of stacks.
#ifndef MMSERVE_GRAMMAR_AUTOMATON_H_
#define MMSERVE_GRAMMAR_AUTOMATON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grammar/ast.h"
#include "grammar/stack_set.h"

namespace mmserve::grammar {

struct Call {
  int32_t callee_start;  // the called rule's start state
  int32_t resume;        // where the caller continues after it
};

class Pda {
 public:
  // Refuses left recursion (a rule reaching itself before reading a byte)
  // and grammars above the size limits, with InvalidArgument.
  static absl::StatusOr<Pda> Build(const Grammar& grammar);

  int num_states() const { return static_cast<int>(rule_of_.size()); }
  int32_t root_start() const { return root_start_; }
  // The state after reading `byte` in `state`'s own rule, or -1.
  int32_t Next(int32_t state, uint8_t byte) const {
    return next_[static_cast<size_t>(state) * 256 + byte];
  }
  bool accepting(int32_t state) const { return accepting_[state]; }
  const std::vector<Call>& calls(int32_t state) const { return calls_[state]; }

  // Appends to `out` every stack reached from `stack` by reading `byte`.
  // Returns true when a path must end the bottom frame to read it (that path
  // is dropped): for a whole stack it cannot continue; for a stack cut off
  // from its context, whether it continues depends on what lies below.
  bool Step(StackView stack, uint8_t byte, StackSet& out) const;
  // Steps every stack of `stacks` over `bytes`; the result normalized.
  StackSet StepAll(const StackSet& stacks, std::string_view bytes) const;
  // Pops the top frames that can only end (so that a top state always
  // reads: masks then depend on it alone), drops stacks that can neither
  // read nor end, and removes duplicates.
  void Normalize(StackSet& stacks) const;
  // The stack may end here: every frame's rule may end where it stands.
  bool CanEnd(StackView stack) const;
  // Some byte may follow `stack`.
  bool CanContinue(StackView stack) const;

 private:
  std::vector<int32_t> rule_of_;
  std::vector<int32_t> next_;  // num_states() * 256
  std::vector<bool> accepting_;
  std::vector<std::vector<Call>> calls_;
  int32_t root_start_ = 0;
  // The configurations a frame in state s reaches without reading: stack
  // segments that replace it, each ending in a state that reads a byte,
  // stored as seg_data_[seg_begin_[i], seg_begin_[i + 1]) for segments
  // i in [state_seg_[s], state_seg_[s + 1]).
  std::vector<int32_t> state_seg_;
  std::vector<int32_t> seg_begin_;
  std::vector<int32_t> seg_data_;
  // The frame in state s may end without reading (directly or through
  // calls to rules that match "").
  std::vector<bool> ends_;

  void BuildClosures();
};

}  // namespace mmserve::grammar

#endif  // MMSERVE_GRAMMAR_AUTOMATON_H_
