// Token sampling for one request's logits: penalties and logit bias, then
// greedy, temperature, top-k, top-p (nucleus), min-p, with a per-request
// seeded generator so the same seed gives the same tokens whatever else
// shares the batch.
//
//   SamplingParams p;  p.temperature = 0.7f;  p.top_p = 0.9f;  p.seed = 42;
//   RETURN_IF_ERROR(ValidateSamplingParams(p, vocab_size));
//   SamplerState state(p.seed);
//   SampleResult r = Sample(logits, p, &state);   // r.token, r.logprob
//   // with penalties: process a copy, report log probabilities from the raw row
//   std::vector<float> processed(logits.begin(), logits.end());
//   ApplyLogitsProcessors(absl::MakeSpan(processed), p, prompt_ids, output_ids);
//   SampleResult r2 = Sample(logits, processed, p, &state);
//
// Processing and filters apply in vLLM's order: logit_bias, repetition
// penalty, frequency and presence penalties, then temperature, then top-k,
// top-p and min-p on the tempered distribution. Log probabilities are
// reported from the raw logits (log_softmax before any processing), as vLLM
// does by default. A `constraint` (structured output) is carried here and
// checked by ValidateSamplingParams; the engine compiles it and masks the
// processed row (worker/request_grammar.h). Every step reads only its own request's row and tokens,
// so results do not depend on the batch. Thread-safe (pure functions over the
// caller's state).
#ifndef MMSERVE_MODEL_SAMPLING_H_
#define MMSERVE_MODEL_SAMPLING_H_

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "grammar/grammar.h"

namespace mmserve::model {

// One logit_bias entry.
struct TokenBias {
  int32_t token = 0;
  float bias = 0.0f;  // [-100, 100]
};

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]; 1 = off
  int top_k = 0;             // 0 = off
  float min_p = 0.0f;        // [0, 1]; 0 = off
  uint64_t seed = 0;
  int max_tokens = 16;
  int min_tokens = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = -1;  // -1: none; 0: the sampled token's only; n: plus top n
  bool skip_special_tokens = true;
  float presence_penalty = 0.0f;      // [-2, 2]; over generated tokens
  float frequency_penalty = 0.0f;     // [-2, 2]; over generated tokens, per occurrence
  float repetition_penalty = 1.0f;    // > 0; over prompt and generated tokens
  std::vector<TokenBias> logit_bias;  // sorted by token, each token once
  // Structured output: what the generated text must match (unset: free
  // text). The request ends (stop) once the output is complete and nothing
  // but the end may follow. min_tokens holds back the end only while the
  // output is incomplete: a complete output may end before min_tokens.
  // Not with ignore_eos.
  std::optional<grammar::ConstraintSpec> constraint;

  bool greedy() const { return temperature == 0.0f || top_k == 1; }
  // Whether ApplyLogitsProcessors changes anything.
  bool processes_logits() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f ||
           !logit_bias.empty();
  }
};

// Limits checked at the service edge.
inline constexpr int kMaxLogprobs = 20;
inline constexpr int kMaxStopStrings = 16;
inline constexpr int kMaxStopStringBytes = 256;
inline constexpr float kMaxPenalty = 2.0f;  // presence and frequency, either sign
inline constexpr float kMaxLogitBias = 100.0f;
inline constexpr int kMaxLogitBiasEntries = 1024;

// InvalidArgument naming the field and its allowed range. A constraint is
// parsed (grammar::Validate), not compiled.
[[nodiscard]] absl::Status ValidateSamplingParams(const SamplingParams& p, int vocab_size);

// The public API's field for a constraint kind ("json_schema", "regex",
// "grammar" for EBNF, "json_object").
absl::string_view ConstraintField(grammar::ConstraintSpec::Kind kind);
// `why` (a grammar library error, which names the kind first) as
// "constraint.<field>: <reason>", same code.
absl::Status ConstraintError(const grammar::ConstraintSpec& spec, const absl::Status& why);

// A request's random stream. Copyable so a request can move between
// processes (prefill -> decode) with its position.
class SamplerState {
 public:
  explicit SamplerState(uint64_t seed) : rng_(seed) {}
  // Uniform in [0, 1).
  double Uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

 private:
  std::mt19937_64 rng_;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;           // of `token` (when logprobs >= 0)
  std::vector<TokenLogprob> top;  // `logprobs` most likely, most likely first
};

// Samples one token from `logits` (length vocab). Greedy picks the lowest id
// among equal maxima, as torch.argmax does.
SampleResult Sample(absl::Span<const float> logits, const SamplingParams& p, SamplerState* state);

// Samples from `processed` (the row after ApplyLogitsProcessors) and reports
// log probabilities from `raw` (the model's row); same length.
SampleResult Sample(absl::Span<const float> raw, absl::Span<const float> processed,
                    const SamplingParams& p, SamplerState* state);

// Applies p's logit_bias and penalties to one row of logits, in vLLM's order:
//   logits[t] += bias[t]
//   for each distinct t in prompt + output (transformers'
//   RepetitionPenaltyLogitsProcessor):
//     logits[t] = logits[t] > 0 ? logits[t] / repetition_penalty
//                               : logits[t] * repetition_penalty
//   for each distinct t in output, generated c times (OpenAI):
//     logits[t] -= c * frequency_penalty + presence_penalty
// Token ids must lie in the row (ValidateSamplingParams checks the bias's;
// the caller's token ids are the model's own).
void ApplyLogitsProcessors(absl::Span<float> logits, const SamplingParams& p,
                           absl::Span<const int32_t> prompt, absl::Span<const int32_t> output);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_SAMPLING_H_
