#include "worker/request_grammar.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/clock.h"

namespace mmserve::worker {

std::shared_ptr<const grammar::Vocabulary> GrammarVocabulary(const model::Tokenizer& tokenizer,
                                                             int vocab_size,
                                                             const std::vector<int32_t>& eos_ids) {
  const int n = std::max(vocab_size, static_cast<int>(tokenizer.vocab_size()));
  std::vector<std::string> bytes(n);
  std::vector<bool> special(n, true);
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.IsSpecial(id)) continue;
    special[id] = !tokenizer.AppendTokenBytes(id, &bytes[id]);
  }
  return std::make_shared<const grammar::Vocabulary>(std::move(bytes), std::move(special), eos_ids);
}

RequestGrammar::RequestGrammar(std::shared_ptr<const grammar::CompiledGrammar> compiled,
                               int vocab_size)
    : matcher_(std::move(compiled)), words_((vocab_size + 31) / 32) {}

double RequestGrammar::ComputeMask() {
  if (mask_ready_) return 0;
  Stopwatch clock;
  matcher_.FillNextTokenBitmask(absl::MakeSpan(words_));
  mask_ready_ = true;
  return clock.ElapsedSeconds();
}

void RequestGrammar::Apply(absl::Span<float> logits) {
  ComputeMask();
  grammar::ApplyBitmask(logits, words_);
}

bool RequestGrammar::Accept(int32_t token) {
  if (!matcher_.AcceptToken(token)) return false;
  mask_ready_ = false;
  return true;
}

MaskWorker::MaskWorker() : thread_([this] { Loop(); }) {}

MaskWorker::~MaskWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void MaskWorker::Start(std::vector<RequestGrammar*> grammars) {
  if (grammars.empty()) return;
  absl::MutexLock lock(&mu_);
  pending_ = std::move(grammars);
  busy_ = true;
}

void MaskWorker::Wait() {
  Stopwatch clock;
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* busy) { return !*busy; }, &busy_));
  wait_seconds_ += clock.ElapsedSeconds();
  mask_seconds_ = computed_seconds_;
}

void MaskWorker::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](MaskWorker* w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->busy_ || w->stop_; }, this));
    if (stop_) return;
    std::vector<RequestGrammar*> work = std::move(pending_);
    pending_.clear();
    mu_.Unlock();
    double seconds = 0;
    for (RequestGrammar* g : work) seconds += g->ComputeMask();
    mu_.Lock();
    computed_seconds_ += seconds;
    busy_ = false;
  }
}

}  // namespace mmserve::worker
