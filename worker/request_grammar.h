// Structured output in the engine: a constrained request's place in its
// grammar (RequestGrammar), the tokenizer as the grammar library's
// Vocabulary, and the helper thread that computes the next masks while the
// forward pass runs (MaskWorker).
//
//   auto vocab = GrammarVocabulary(tokenizer, config.text.vocab_size, eos_ids);
//   grammar::GrammarCache cache(vocab);
//   ASSIGN_OR_RETURN(auto compiled, cache.Get(*sampling.constraint));
//   RequestGrammar g(compiled, vocab->size());
//   // per step: masks of the requests that sample, while the forward runs
//   worker.Start({&g, ...});  model.Forward(...);  worker.Wait();
//   g.Apply(processed_row);  ... sample ...  g.Accept(token);
//
// A request's mask depends only on its own tokens, so constrained outputs
// do not depend on the batch. Each mask is computed once per accepted
// token (Apply reuses it, and computes it on the caller's thread when no
// worker did).
#ifndef MMSERVE_WORKER_REQUEST_GRAMMAR_H_
#define MMSERVE_WORKER_REQUEST_GRAMMAR_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "grammar/grammar.h"
#include "model/tokenizer.h"

namespace mmserve::worker {

// The model's ids as raw bytes: the tokenizer's tokens, its special tokens
// (never allowed by a grammar) and the model's end-of-sequence ids (allowed
// exactly when the output may end). Ids past the tokenizer, up to
// `vocab_size` (the logits row), are special.
std::shared_ptr<const grammar::Vocabulary> GrammarVocabulary(const model::Tokenizer& tokenizer,
                                                             int vocab_size,
                                                             const std::vector<int32_t>& eos_ids);

// Thread-compatible: ComputeMask may run on another thread while nothing
// else touches this object (MaskWorker's Start..Wait); everything else on
// the owner's thread.
class RequestGrammar {
 public:
  RequestGrammar(std::shared_ptr<const grammar::CompiledGrammar> compiled, int vocab_size);

  // The mask of the current state, unless already computed; returns the
  // seconds it took (0 when it was there).
  double ComputeMask();
  // Sets logits[t] = -inf for every token the grammar does not allow next
  // (computing the mask first if needed).
  void Apply(absl::Span<float> logits);
  // Advances over `token`; false (state unchanged) when not allowed.
  [[nodiscard]] bool Accept(int32_t token);
  // The output so far is complete (the end is allowed).
  bool CanTerminate() const { return matcher_.CanTerminate(); }
  // Complete, and nothing but the end may follow.
  bool IsFinished() const { return matcher_.IsFinished(); }

 private:
  grammar::Matcher matcher_;
  std::vector<uint32_t> words_;  // bit t: token t may come next
  bool mask_ready_ = false;      // words_ is the current state's
};

// One helper thread computing masks concurrently with the caller's
// forward pass. Start and Wait alternate on one thread (the engine's); the
// requests must stay alive and untouched between them.
class MaskWorker {
 public:
  MaskWorker();
  ~MaskWorker();
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;

  // Computes the masks of `grammars` on the helper thread (an empty list:
  // nothing to do). A previous Start must have been waited for.
  void Start(std::vector<RequestGrammar*> grammars);
  // Blocks until the last Start's masks are computed.
  void Wait();

  // In total: seconds spent computing masks, and seconds Wait blocked.
  double mask_seconds() const { return mask_seconds_; }
  double wait_seconds() const { return wait_seconds_; }

 private:
  void Loop();

  absl::Mutex mu_;
  std::vector<RequestGrammar*> pending_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // pending_ not yet computed
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  double computed_seconds_ ABSL_GUARDED_BY(mu_) = 0;  // the helper's total
  double mask_seconds_ = 0;                           // caller's copy, after Wait
  double wait_seconds_ = 0;
  std::thread thread_;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_REQUEST_GRAMMAR_H_
