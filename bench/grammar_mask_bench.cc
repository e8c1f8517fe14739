// grammar_mask_bench: time to compute one request's next-token mask over
// Qwen2's 151,643-token vocabulary (grammar/testdata/qwen2_vocab.bin, from
// the dashscope wheel by tools/qwen_vocab.py) at a few positions of a JSON
// schema and of json_object: right after "{", inside a string, inside a
// number, at an array's first item, at a key and at any value.
//
// Per position, in µs per mask:
//   memset   the roofline: clearing the mask's words, nothing decided
//   naive    every token tried on a copy of the matcher
//   walk     the vocabulary trie walked with the whole stacks, no caches
//   compile  compiling the grammar (once per schema; not a mask)
//   cold     the first mask of a fresh grammar (fills the per-state caches)
//   states   per-state caches warm, no whole-mask cache (a new position)
//   cached   the whole-mask cache hit (a position seen before)
// All methods must give the same mask. Then whole documents of the schema
// on a fresh grammar (random allowed tokens, 60 steps at most): the first
// (every new state pays its per-state mask), a second with other choices,
// and the first again (positions seen before): total and worst mask time.
// Prints tables, then one JSON line.
//   bazel run --config=opt //bench:grammar_mask_bench
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "grammar/compiled_grammar.h"
#include "grammar/grammar.h"
#include "grammar/grammar_testing.h"

namespace mmserve::grammar {
namespace {

constexpr char kSchema[] = R"({"type": "object", "properties": {
  "name": {"type": "string"}, "age": {"type": "integer"},
  "email": {"type": "string", "format": "email"},
  "tags": {"type": "array", "items": {"type": "string"}},
  "address": {"type": "object", "properties": {
     "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
     "required": ["city"]}},
  "required": ["name", "age", "tags"]})";

struct Position {
  std::string name;
  ConstraintSpec spec;
  std::string prefix;  // the output so far
};

// Best µs per call of `fn` over `reps` timings of `loops` calls.
double Micros(int reps, int loops, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    Stopwatch watch;
    for (int i = 0; i < loops; ++i) fn();
    best = std::min(best, watch.ElapsedSeconds() * 1e6 / loops);
  }
  return best;
}

int Main() {
  auto vocab = testing::QwenVocabulary(testing::kQwenVocabPath);
  const ConstraintSpec schema{ConstraintSpec::Kind::kJsonSchema, kSchema, true};
  const ConstraintSpec object{ConstraintSpec::Kind::kJsonObject, ""};
  const std::vector<Position> positions = {
      {"schema_after_brace", schema, "{"},
      {"schema_in_string", schema, R"({"name": "Jo)"},
      {"schema_in_number", schema, R"({"name": "Jo", "age": 4)"},
      {"schema_array_item", schema, R"({"name": "Jo", "age": 42, "tags": [)"},
      {"object_in_key", object, R"({"na)"},
      {"object_any_value", object, R"({"a": [1, {"b": )"},
  };
  printf("vocabulary: Qwen2, %d tokens (%zu trie nodes)\n", vocab->size(),
         vocab->trie().nodes().size());
  printf("%-20s %8s %9s %9s %9s %9s %8s %8s %6s\n", "position", "memset", "naive", "walk",
         "compile", "cold", "states", "cached", "stacks");
  std::string json = "{\"bench\":\"grammar_mask\",\"vocab\":" + std::to_string(vocab->size()) +
                     ",\"unit\":\"us_per_mask\",\"positions\":[";
  bool agree = true;
  const size_t n = vocab->mask_words();
  for (size_t p = 0; p < positions.size(); ++p) {
    const Position& pos = positions[p];
    auto g = testing::MustCompile(pos.spec, vocab);
    const StackSet stacks = g->pda().StepAll(g->InitialStacks(), pos.prefix);
    if (stacks.empty()) {
      fprintf(stderr, "%s: the prefix does not match\n", pos.name.c_str());
      return 1;
    }
    std::vector<uint32_t> memset_mask(n), naive(n, 0), walk(n), cold(n), states(n), cached(n);
    const double us_memset =
        Micros(5, 2000, [&] { std::memset(memset_mask.data(), 0, n * sizeof(uint32_t)); });
    Matcher m(g);
    m.AcceptBytes(pos.prefix);
    const double us_naive = Micros(1, 1, [&] {
      for (int32_t t = 0; t < vocab->size(); ++t) {
        Matcher copy = m;
        if (!vocab->is_eos(t) && copy.AcceptToken(t)) naive[t / 32] |= 1u << (t % 32);
      }
    });
    const double us_walk = Micros(3, 3, [&] { g->FillMaskByWalk(stacks, absl::MakeSpan(walk)); });
    std::shared_ptr<const CompiledGrammar> fresh;
    const double us_compile = Micros(1, 1, [&] { fresh = testing::MustCompile(pos.spec, vocab); });
    const double us_cold =
        Micros(1, 1, [&] { fresh->FillMaskFromTopMasks(stacks, absl::MakeSpan(cold)); });
    const double us_states =
        Micros(5, 20, [&] { g->FillMaskFromTopMasks(stacks, absl::MakeSpan(states)); });
    g->FillMask(stacks, absl::MakeSpan(cached));
    const double us_cached = Micros(5, 200, [&] { g->FillMask(stacks, absl::MakeSpan(cached)); });
    agree &= naive == walk && walk == cold && cold == states && states == cached;
    int allowed = 0;
    for (uint32_t w : states) allowed += __builtin_popcount(w);
    printf("%-20s %8.2f %9.0f %9.1f %9.0f %9.0f %8.2f %8.2f %6d  (%d allowed)\n", pos.name.c_str(),
           us_memset, us_naive, us_walk, us_compile, us_cold, us_states, us_cached, stacks.size(),
           allowed);
    absl::StrAppendFormat(
        &json,
        "%s{\"position\":\"%s\",\"memset\":%.3f,\"naive\":%.1f,\"walk\":%.1f,"
        "\"compile\":%.1f,\"cold\":%.1f,\"states\":%.3f,\"cached\":%.3f,\"allowed\":%d}",
        p ? "," : "", pos.name, us_memset, us_naive, us_walk, us_compile, us_cold, us_states,
        us_cached, allowed);
  }
  printf("masks agree across methods: %s\n", agree ? "yes" : "NO");
  absl::StrAppend(&json, "],\"documents\":[");
  printf("\n%-24s %6s %10s %10s\n", "document (fresh grammar)", "masks", "total_ms", "worst_ms");
  auto g = testing::MustCompile(schema, vocab);
  const char* names[] = {"first", "second", "first_again"};
  for (int run = 0; run < 3; ++run) {
    std::mt19937 rng(run == 1 ? 2 : 1);
    Matcher m(g);
    std::vector<uint32_t> mask(n);
    double total = 0, worst = 0;
    int masks = 0;
    for (; masks < 60 && !m.IsFinished(); ++masks) {
      Stopwatch watch;
      m.FillNextTokenBitmask(absl::MakeSpan(mask));
      const double ms = watch.ElapsedSeconds() * 1e3;
      total += ms;
      worst = std::max(worst, ms);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab->size(); ++t) {
        if (mask[t / 32] >> (t % 32) & 1) allowed.push_back(t);
      }
      if (allowed.empty()) break;
      const int32_t t = allowed[rng() % allowed.size()];
      if (vocab->is_eos(t) || !m.AcceptToken(t)) break;
    }
    printf("%-24s %6d %10.2f %10.2f\n", names[run], masks, total, worst);
    absl::StrAppendFormat(&json,
                          "%s{\"run\":\"%s\",\"masks\":%d,\"total_ms\":%.3f,\"worst_ms\":%.3f}",
                          run ? "," : "", names[run], masks, total, worst);
  }
  printf("%s],\"agree\":%s}\n", json.c_str(), agree ? "true" : "false");
  return agree ? 0 : 1;
}

}  // namespace
}  // namespace mmserve::grammar

int main() { return mmserve::grammar::Main(); }
