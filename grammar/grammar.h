// Constrained decoding: the set of tokens a model may emit next so that its
// output matches a JSON schema, any JSON object, a regular expression or an
// EBNF grammar.
//
// Why our own engine and not a vendored one: xgrammar, llguidance and
// outlines-core are not Debian packages and the build downloads nothing, so
// they would have to be copied in with their own build systems (CMake, Cargo)
// and kept in step by hand. The matching core is small: rules become byte
// automata with call edges, a request's position is a set of stacks over them,
// and masks are computed by walking a byte trie of the vocabulary.
//
// Usage:
//   auto vocab = std::make_shared<const Vocabulary>(bytes, special, {eos_id});
//   GrammarCache cache(vocab);
//   ASSIGN_OR_RETURN(auto grammar, cache.Get({ConstraintSpec::Kind::kJsonSchema,
//                                             schema_text}));
//   Matcher matcher(grammar);                       // one per request
//   matcher.FillNextTokenBitmask(absl::MakeSpan(words));
//   ApplyBitmask(logits, words);                    // then sample `token`
//   matcher.AcceptToken(token);
//
// Thread-safety: Validate, JsonSchemaToEbnf, GrammarCache and CompiledGrammar
// are thread-safe. A Matcher belongs to one thread at a time (copy it to fork).
#ifndef MMSERVE_GRAMMAR_GRAMMAR_H_
#define MMSERVE_GRAMMAR_GRAMMAR_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "grammar/stack_set.h"
#include "grammar/token_trie.h"

namespace mmserve::grammar {

// What the client asked the output to match.
struct ConstraintSpec {
  enum class Kind { kJsonObject, kJsonSchema, kRegex, kEbnf };
  Kind kind = Kind::kJsonObject;
  // Schema JSON, regular expression or EBNF text; empty for kJsonObject.
  std::string text;
  // kJsonSchema only: OpenAI's `strict`. Objects then never take properties
  // beyond `properties`, whatever `additionalProperties` says.
  bool strict = false;
};

// Parses and converts `spec` without a vocabulary (the router validates with
// this). InvalidArgument with a reason the client can act on, prefixed by
// the kind ("json_schema: ...", "regex: ...", "ebnf: ...").
[[nodiscard]] absl::Status Validate(const ConstraintSpec& spec);

// JSON schema -> EBNF rules in the dialect of ParseEbnf. Every rule name
// starts with `prefix` and the schema's root is `<prefix>root`, so several
// schemas can live in one grammar. `any_whitespace=false` emits compact JSON
// with ", " and ": " separators (Python's json.dumps default); true allows
// any JSON whitespace between tokens. `strict` as ConstraintSpec::strict.
absl::StatusOr<std::string> JsonSchemaToEbnf(std::string_view schema_json,
                                             std::string_view prefix = "",
                                             bool any_whitespace = false, bool strict = false);

// The model's tokens as raw bytes.
class Vocabulary {
 public:
  // token_bytes[id]: the bytes the token decodes to. special[id]: never
  // allowed by a grammar (shorter than token_bytes means false). `eos` ids:
  // allowed exactly when the grammar may end, even when also marked special.
  Vocabulary(std::vector<std::string> token_bytes, std::vector<bool> special,
             std::vector<int32_t> eos);

  int size() const { return static_cast<int>(token_bytes_.size()); }
  const std::string& bytes(int32_t id) const { return token_bytes_[id]; }
  bool is_special(int32_t id) const { return special_[id]; }
  bool is_eos(int32_t id) const { return is_eos_[id]; }
  const std::vector<int32_t>& eos() const { return eos_; }
  // The ordinary tokens (not special, not eos, not empty) as a byte trie.
  const TokenTrie& trie() const { return trie_; }
  // Words in a bitmask over this vocabulary.
  int mask_words() const { return (size() + 31) / 32; }

 private:
  std::vector<std::string> token_bytes_;
  std::vector<bool> special_;
  std::vector<bool> is_eos_;
  std::vector<int32_t> eos_;
  TokenTrie trie_;
};

// A grammar compiled for one vocabulary: immutable to its users, shared
// across requests and threads (it fills internal mask caches under a lock).
class CompiledGrammar;

// Compiles a spec into a CompiledGrammar for `vocab` (no cache).
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(
    const ConstraintSpec& spec, std::shared_ptr<const Vocabulary> vocab);

// Compiles once per spec content; LRU-bounded to `capacity` grammars.
// Thread-safe; concurrent first requests for one spec may compile it twice.
class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const Vocabulary> vocab, size_t capacity = 256);

  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Get(const ConstraintSpec& spec);
  size_t size() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const CompiledGrammar>>;
  const std::shared_ptr<const Vocabulary> vocab_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
};

// One request's position in its grammar. Copyable; not thread-safe.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Bit t of words[t / 32] set <=> token t may come next. Requires
  // words.size() >= Vocabulary::mask_words(); extra words are cleared.
  void FillNextTokenBitmask(absl::Span<uint32_t> words) const;
  // Advances over `token`; false (state unchanged) when it is not allowed.
  // An accepted eos token ends the match: nothing is allowed after it.
  bool AcceptToken(int32_t token);
  // Advances over raw bytes (tests, forced prefixes); false when rejected.
  bool AcceptBytes(std::string_view bytes);
  // The output so far is complete: eos is allowed.
  bool CanTerminate() const;
  // Complete, and nothing but eos may follow (or eos was accepted).
  bool IsFinished() const;

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  StackSet stacks_;  // see automaton.h
  bool terminated_ = false;
};

// logits[t] = -inf where bit t of `words` is clear.
void ApplyBitmask(absl::Span<float> logits, absl::Span<const uint32_t> words);

}  // namespace mmserve::grammar

#endif  // MMSERVE_GRAMMAR_GRAMMAR_H_
