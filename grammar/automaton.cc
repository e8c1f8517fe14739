#include "grammar/automaton.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace mmserve::grammar {
namespace {

constexpr int kMaxNfaStates = 200000;
constexpr int kMaxDfaStates = 50000;
constexpr size_t kMaxStackDepth = 1000;  // frames: JSON nested ~500 deep

struct NfaState {
  struct ByteEdge {
    uint8_t lo, hi;
    int to;
  };
  std::vector<ByteEdge> bytes;
  std::vector<int> eps;
  std::vector<std::pair<int, int>> calls;  // (rule, to)
};

using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;

// Code points [lo, hi] (no surrogates) as sequences of byte ranges.
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteRanges>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) Utf8Sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) Utf8Sequences(0xE000, hi, out);
    return;
  }
  for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= max && hi > max) {
      Utf8Sequences(lo, max, out);
      Utf8Sequences(max + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  AppendUtf8(lo, a);
  AppendUtf8(hi, b);
  ByteRanges seq;
  for (size_t i = 0; i < a.size(); ++i) {
    seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
  }
  out.push_back(std::move(seq));
}

class NfaBuilder {
 public:
  explicit NfaBuilder(std::vector<NfaState>& states) : states_(states) {}

  int New() {
    states_.emplace_back();
    return static_cast<int>(states_.size()) - 1;
  }
  bool too_big() const { return states_.size() > kMaxNfaStates; }

  // Builds `e` starting at `from`; returns its end state.
  int Build(const Expr& e, int from) {
    if (too_big()) return from;
    const int start = New();
    states_[from].eps.push_back(start);
    switch (e.kind) {
      case Expr::Kind::kEmpty:
        return start;
      case Expr::Kind::kBytes: {
        int cur = start;
        for (char c : e.bytes) {
          const int next = New();
          const auto b = static_cast<uint8_t>(c);
          states_[cur].bytes.push_back({b, b, next});
          cur = next;
        }
        return cur;
      }
      case Expr::Kind::kClass:
        return BuildClass(e, start);
      case Expr::Kind::kRef: {
        const int end = New();
        states_[start].calls.push_back({e.rule, end});
        return end;
      }
      case Expr::Kind::kSeq: {
        int cur = start;
        for (const Expr& kid : e.kids) cur = Build(kid, cur);
        return cur;
      }
      case Expr::Kind::kAlt: {
        const int end = New();
        for (const Expr& kid : e.kids) {
          states_[Build(kid, start)].eps.push_back(end);
        }
        return end;
      }
      case Expr::Kind::kRepeat:
        return BuildRepeat(e, start);
    }
    return start;
  }

 private:
  int BuildClass(const Expr& e, int start) {
    std::vector<std::pair<uint32_t, uint32_t>> ranges = e.ranges;
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& r : ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1) {
        merged.back().second = std::max(merged.back().second, r.second);
      } else {
        merged.push_back(r);
      }
    }
    if (e.negated) {
      std::vector<std::pair<uint32_t, uint32_t>> comp;
      uint32_t next = 0;
      for (const auto& r : merged) {
        if (r.first > next) comp.push_back({next, r.first - 1});
        next = std::max(next, r.second + 1);
      }
      if (next <= kMaxCodePoint) comp.push_back({next, kMaxCodePoint});
      merged = std::move(comp);
    }
    std::vector<ByteRanges> seqs;
    for (const auto& r : merged) {
      Utf8Sequences(r.first, std::min(r.second, kMaxCodePoint), seqs);
    }
    const int end = New();
    for (const ByteRanges& seq : seqs) {
      int cur = start;
      for (size_t i = 0; i < seq.size(); ++i) {
        const int next = i + 1 == seq.size() ? end : New();
        states_[cur].bytes.push_back({seq[i].first, seq[i].second, next});
        cur = next;
      }
    }
    return end;
  }

  int BuildRepeat(const Expr& e, int start) {
    int cur = start;
    for (int i = 0; i < e.min && !too_big(); ++i) cur = Build(e.kids[0], cur);
    if (e.max < 0) {
      const int loop = New();
      states_[cur].eps.push_back(loop);
      states_[Build(e.kids[0], loop)].eps.push_back(loop);
      return loop;
    }
    const int end = New();
    for (int i = e.min; i < e.max && !too_big(); ++i) {
      states_[cur].eps.push_back(end);
      cur = Build(e.kids[0], cur);
    }
    states_[cur].eps.push_back(end);
    return end;
  }

  std::vector<NfaState>& states_;
};

// One rule's DFA by subset construction; calls are symbols like bytes.
struct RuleDfa {
  std::vector<int32_t> next;  // local ids, size * 256
  std::vector<bool> accepting;
  std::vector<std::vector<std::pair<int, int>>> calls;  // (rule, local to)
  int size() const { return static_cast<int>(accepting.size()); }
};

// Epsilon closures, kept to the states that matter to a DFA state's
// identity: those with byte or call edges, and the final state.
class Closer {
 public:
  Closer(const std::vector<NfaState>& nfa, int final_state)
      : nfa_(nfa), final_(final_state), mark_(nfa.size(), 0) {}

  std::vector<int> operator()(const std::vector<int>& seeds) {
    ++stamp_;
    std::vector<int> work, out;
    for (int s : seeds) {
      if (mark_[s] != stamp_) mark_[s] = stamp_, work.push_back(s);
    }
    while (!work.empty()) {
      const int s = work.back();
      work.pop_back();
      const NfaState& n = nfa_[s];
      if (!n.bytes.empty() || !n.calls.empty() || s == final_) out.push_back(s);
      for (int t : n.eps) {
        if (mark_[t] != stamp_) mark_[t] = stamp_, work.push_back(t);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  const std::vector<NfaState>& nfa_;
  const int final_;
  std::vector<uint32_t> mark_;
  uint32_t stamp_ = 0;
};

absl::StatusOr<RuleDfa> Determinize(const std::vector<NfaState>& nfa, int start, int final_state,
                                    int& total_states) {
  RuleDfa dfa;
  Closer closure(nfa, final_state);
  std::map<std::vector<int>, int> ids;
  std::vector<std::vector<int>> sets;
  const auto intern = [&](std::vector<int> set) {
    auto [it, inserted] = ids.emplace(set, static_cast<int>(sets.size()));
    if (inserted) sets.push_back(std::move(set));
    return it->second;
  };
  intern(closure({start}));
  for (size_t i = 0; i < sets.size(); ++i) {
    if (++total_states > kMaxDfaStates) {
      return absl::InvalidArgumentError(absl::StrCat("the grammar is too large (more than ",
                                                     kMaxDfaStates, " automaton states)"));
    }
    std::vector<std::vector<int>> by_byte(256);
    std::map<int, std::vector<int>> by_call;
    bool accepting = false;
    for (int s : sets[i]) {
      accepting |= s == final_state;
      for (const auto& e : nfa[s].bytes) {
        for (int b = e.lo; b <= e.hi; ++b) by_byte[b].push_back(e.to);
      }
      for (const auto& [rule, to] : nfa[s].calls) by_call[rule].push_back(to);
    }
    std::vector<int32_t> row(256, -1);
    std::map<std::vector<int>, int32_t> memo;  // bytes often share targets
    for (int b = 0; b < 256; ++b) {
      if (by_byte[b].empty()) continue;
      auto [it, inserted] = memo.emplace(by_byte[b], -1);
      if (inserted) it->second = intern(closure(by_byte[b]));
      row[b] = it->second;
    }
    std::vector<std::pair<int, int>> calls;
    for (auto& [rule, tos] : by_call) calls.push_back({rule, intern(closure(tos))});
    dfa.next.insert(dfa.next.end(), row.begin(), row.end());
    dfa.accepting.push_back(accepting);
    dfa.calls.push_back(std::move(calls));
  }
  return dfa;
}

// Rules that may match "" (a fixpoint over call edges).
std::vector<bool> NullableRules(const std::vector<RuleDfa>& dfas) {
  std::vector<bool> nullable(dfas.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < dfas.size(); ++r) {
      if (nullable[r]) continue;
      std::vector<int> work = {0};
      std::vector<bool> seen(dfas[r].size(), false);
      seen[0] = true;
      while (!work.empty() && !nullable[r]) {
        const int s = work.back();
        work.pop_back();
        if (dfas[r].accepting[s]) nullable[r] = changed = true;
        for (const auto& [callee, to] : dfas[r].calls[s]) {
          if (nullable[callee] && !seen[to]) work.push_back(to), seen[to] = true;
        }
      }
    }
  }
  return nullable;
}

// Names a rule that reaches itself before reading a byte, or "".
std::string LeftRecursiveRule(const Grammar& g, const std::vector<RuleDfa>& dfas) {
  const std::vector<bool> nullable = NullableRules(dfas);
  std::vector<std::vector<int>> first_calls(dfas.size());
  for (size_t r = 0; r < dfas.size(); ++r) {
    std::vector<int> work = {0};
    std::vector<bool> seen(dfas[r].size(), false);
    seen[0] = true;
    while (!work.empty()) {
      const int s = work.back();
      work.pop_back();
      for (const auto& [callee, to] : dfas[r].calls[s]) {
        first_calls[r].push_back(callee);
        if (nullable[callee] && !seen[to]) work.push_back(to), seen[to] = true;
      }
    }
  }
  // Depth-first search for a cycle: 0 new, 1 on the path, 2 done.
  std::vector<int> mark(dfas.size(), 0);
  std::string found;
  std::vector<std::pair<int, size_t>> path;
  for (size_t r0 = 0; r0 < dfas.size() && found.empty(); ++r0) {
    if (mark[r0] != 0) continue;
    path.push_back({static_cast<int>(r0), 0});
    mark[r0] = 1;
    while (!path.empty() && found.empty()) {
      auto& [r, i] = path.back();
      if (i == first_calls[r].size()) {
        mark[r] = 2;
        path.pop_back();
        continue;
      }
      const int callee = first_calls[r][i++];
      if (mark[callee] == 1) found = g.rules[callee].name;
      if (mark[callee] == 0) {
        mark[callee] = 1;
        path.push_back({callee, 0});
      }
    }
  }
  return found;
}

}  // namespace

absl::StatusOr<Pda> Pda::Build(const Grammar& grammar) {
  std::vector<RuleDfa> dfas;
  int total = 0;
  for (const Rule& rule : grammar.rules) {
    std::vector<NfaState> nfa;
    NfaBuilder builder(nfa);
    const int start = builder.New();
    const int end = builder.Build(rule.body, start);
    if (builder.too_big()) {
      return absl::InvalidArgumentError(absl::StrCat("the grammar is too large (rule \"", rule.name,
                                                     "\" expands to more than ", kMaxNfaStates,
                                                     " states)"));
    }
    absl::StatusOr<RuleDfa> dfa = Determinize(nfa, start, end, total);
    if (!dfa.ok()) return dfa.status();
    dfas.push_back(*std::move(dfa));
  }
  const std::string left = LeftRecursiveRule(grammar, dfas);
  if (!left.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("rule \"", left, "\" is left-recursive"));
  }
  Pda pda;
  std::vector<int32_t> offset(dfas.size() + 1, 0);
  for (size_t r = 0; r < dfas.size(); ++r) {
    offset[r + 1] = offset[r] + dfas[r].size();
  }
  for (size_t r = 0; r < dfas.size(); ++r) {
    for (int s = 0; s < dfas[r].size(); ++s) {
      pda.rule_of_.push_back(static_cast<int32_t>(r));
      pda.accepting_.push_back(dfas[r].accepting[s]);
      for (int b = 0; b < 256; ++b) {
        const int32_t to = dfas[r].next[static_cast<size_t>(s) * 256 + b];
        pda.next_.push_back(to < 0 ? -1 : offset[r] + to);
      }
      std::vector<Call> calls;
      for (const auto& [callee, to] : dfas[r].calls[s]) {
        calls.push_back({offset[callee], offset[r] + to});
      }
      pda.calls_.push_back(std::move(calls));
    }
  }
  pda.root_start_ = offset[grammar.root];
  pda.BuildClosures();
  return pda;
}

void Pda::BuildClosures() {
  state_seg_.assign(1, 0);
  seg_begin_.assign(1, 0);
  ends_.assign(num_states(), false);
  for (int32_t s = 0; s < num_states(); ++s) {
    std::vector<std::vector<int32_t>> work = {{s}};
    std::set<std::vector<int32_t>> seen = {{s}};
    while (!work.empty()) {
      std::vector<int32_t> seg = std::move(work.back());
      work.pop_back();
      const int32_t top = seg.back();
      bool reads = false;
      for (int b = 0; b < 256 && !reads; ++b) reads = Next(top, b) >= 0;
      if (reads) {
        seg_data_.insert(seg_data_.end(), seg.begin(), seg.end());
        seg_begin_.push_back(static_cast<int32_t>(seg_data_.size()));
      }
      if (accepting_[top] && seg.size() == 1) ends_[s] = true;
      if (accepting_[top] && seg.size() > 1) {
        std::vector<int32_t> popped(seg.begin(), seg.end() - 1);
        if (seen.insert(popped).second) work.push_back(std::move(popped));
      }
      if (seg.size() >= kMaxStackDepth) continue;
      for (const Call& call : calls_[top]) {
        std::vector<int32_t> pushed = seg;
        pushed.back() = call.resume;
        pushed.push_back(call.callee_start);
        if (seen.insert(pushed).second) work.push_back(std::move(pushed));
      }
    }
    state_seg_.push_back(static_cast<int32_t>(seg_begin_.size()) - 1);
  }
}

bool Pda::Step(StackView stack, uint8_t byte, StackSet& out) const {
  // Read from the top frame's closure; where the frame may end, also from
  // the frame below it, and so on down.
  for (size_t depth = stack.size(); depth > 0; --depth) {
    const int32_t top = stack[depth - 1];
    const StackView prefix = stack.subspan(0, depth - 1);
    for (int32_t i = state_seg_[top]; i < state_seg_[top + 1]; ++i) {
      const StackView seg(seg_data_.data() + seg_begin_[i], seg_begin_[i + 1] - seg_begin_[i]);
      const int32_t to = Next(seg.back(), byte);
      // Past the depth limit, nesting stops (a document nested that deep is refused).
      if (to >= 0 && prefix.size() + seg.size() <= kMaxStackDepth) {
        out.Push(prefix, seg.subspan(0, seg.size() - 1), to);
      }
    }
    if (!ends_[top]) return false;
  }
  return true;
}

StackSet Pda::StepAll(const StackSet& stacks, std::string_view bytes) const {
  StackSet cur = stacks, next;
  for (char c : bytes) {
    next.Clear();
    for (int i = 0; i < cur.size(); ++i) {
      Step(cur[i], static_cast<uint8_t>(c), next);
    }
    Normalize(next);
    std::swap(cur, next);
    if (cur.empty()) break;
  }
  return cur;
}

void Pda::Normalize(StackSet& stacks) const {
  StackSet out;
  for (int i = 0; i < stacks.size(); ++i) {
    StackView stack = stacks[i];
    const auto reads = [&](int32_t s) { return state_seg_[s + 1] > state_seg_[s]; };
    while (stack.size() > 1 && !reads(stack.back()) && ends_[stack.back()]) {
      stack.remove_suffix(1);
    }
    if (reads(stack.back()) || ends_[stack.back()]) out.Push(stack);
  }
  out.Dedupe();
  stacks = std::move(out);
}

bool Pda::CanEnd(StackView stack) const {
  for (int32_t s : stack) {
    if (!ends_[s]) return false;
  }
  return true;
}

bool Pda::CanContinue(StackView stack) const {
  for (size_t depth = stack.size(); depth > 0; --depth) {
    const int32_t top = stack[depth - 1];
    if (state_seg_[top + 1] > state_seg_[top]) return true;
    if (!ends_[top]) return false;
  }
  return false;
}

}  // namespace mmserve::grammar
