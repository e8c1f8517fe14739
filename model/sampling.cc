#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mmserve::model {
namespace {

int32_t Argmax(absl::Span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

// log_softmax normaliser: max + log(sum(exp(x - max))).
double LogSumExp(absl::Span<const float> x) {
  float m = *std::max_element(x.begin(), x.end());
  if (!std::isfinite(m)) return m;
  double sum = 0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - m);
  return m + std::log(sum);
}

void FillLogprobs(absl::Span<const float> logits, const SamplingParams& p, SampleResult* r) {
  if (p.logprobs < 0) return;
  const double lse = LogSumExp(logits);
  r->logprob = static_cast<float>(logits[r->token] - lse);
  if (p.logprobs == 0) return;
  const int n = std::min<int>(p.logprobs, static_cast<int>(logits.size()));
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (int i = 0; i < n; ++i) {
    r->top.push_back({idx[i], static_cast<float>(logits[idx[i]] - lse)});
  }
}

}  // namespace

absl::string_view ConstraintField(grammar::ConstraintSpec::Kind kind) {
  using Kind = grammar::ConstraintSpec::Kind;
  switch (kind) {
    case Kind::kJsonObject:
      return "json_object";
    case Kind::kJsonSchema:
      return "json_schema";
    case Kind::kRegex:
      return "regex";
    case Kind::kEbnf:
      return "grammar";
  }
  return "constraint";
}

absl::Status ConstraintError(const grammar::ConstraintSpec& spec, const absl::Status& why) {
  // The grammar library names the kind first ("json_schema: ...", "ebnf:
  // ..."); the client knows the field.
  absl::string_view reason = why.message();
  if (const size_t colon = reason.find(": ");
      colon != absl::string_view::npos && colon < 16 &&
      reason.substr(0, colon).find(' ') == absl::string_view::npos) {
    reason.remove_prefix(colon + 2);
  }
  return absl::Status(why.code(),
                      absl::StrCat("constraint.", ConstraintField(spec.kind), ": ", reason));
}

absl::Status ValidateSamplingParams(const SamplingParams& p, int vocab_size) {
  auto bad = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return bad("temperature must be >= 0, got ", p.temperature);
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p must be in (0, 1], got ", p.top_p);
  if (p.top_k < 0) return bad("top_k must be >= 0 (0 disables it), got ", p.top_k);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p must be in [0, 1], got ", p.min_p);
  if (p.max_tokens < 1) return bad("max_tokens must be >= 1, got ", p.max_tokens);
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) {
    return bad("min_tokens must be in [0, max_tokens], got ", p.min_tokens);
  }
  if (p.logprobs > kMaxLogprobs || p.logprobs < -1) {
    return bad("logprobs must be in [0, ", kMaxLogprobs, "], got ", p.logprobs);
  }
  if (p.stop.size() > kMaxStopStrings) {
    return bad("at most ", kMaxStopStrings, " stop strings, got ", p.stop.size());
  }
  for (const std::string& s : p.stop) {
    if (s.empty() || s.size() > kMaxStopStringBytes) {
      return bad("stop strings must be 1 to ", kMaxStopStringBytes, " bytes");
    }
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return bad("stop_token_ids: ", id, " is outside the vocabulary [0, ", vocab_size, ")");
    }
  }
  if (!(p.presence_penalty >= -kMaxPenalty && p.presence_penalty <= kMaxPenalty)) {
    return bad("presence_penalty must be in [-2, 2], got ", p.presence_penalty);
  }
  if (!(p.frequency_penalty >= -kMaxPenalty && p.frequency_penalty <= kMaxPenalty)) {
    return bad("frequency_penalty must be in [-2, 2], got ", p.frequency_penalty);
  }
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return bad("repetition_penalty must be > 0 (1 disables it), got ", p.repetition_penalty);
  }
  if (p.logit_bias.size() > static_cast<size_t>(kMaxLogitBiasEntries)) {
    return bad("logit_bias: at most ", kMaxLogitBiasEntries, " entries, got ", p.logit_bias.size());
  }
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const TokenBias& b = p.logit_bias[i];
    if (b.token < 0 || b.token >= vocab_size) {
      return bad("logit_bias: token ", b.token, " is outside the vocabulary [0, ", vocab_size, ")");
    }
    if (!(b.bias >= -kMaxLogitBias && b.bias <= kMaxLogitBias)) {
      return bad("logit_bias: the bias of token ", b.token, " must be in [-100, 100], got ",
                 b.bias);
    }
    if (i > 0 && b.token <= p.logit_bias[i - 1].token) {
      return bad("logit_bias: tokens must be sorted and distinct");
    }
  }
  if (p.constraint.has_value()) {
    if (p.ignore_eos) {
      return bad(
          "ignore_eos cannot be combined with a constraint: a constrained output ends "
          "when it is complete");
    }
    // Parses the constraint without compiling it against a vocabulary.
    const absl::Status valid = grammar::Validate(*p.constraint);
    if (!valid.ok()) return ConstraintError(*p.constraint, valid);
  }
  return absl::OkStatus();
}

void ApplyLogitsProcessors(absl::Span<float> logits, const SamplingParams& p,
                           absl::Span<const int32_t> prompt, absl::Span<const int32_t> output) {
  for (const TokenBias& b : p.logit_bias) logits[b.token] += b.bias;
  if (p.repetition_penalty != 1.0f) {
    const float r = p.repetition_penalty;
    absl::flat_hash_set<int32_t> seen;
    seen.reserve(prompt.size() + output.size());
    for (absl::Span<const int32_t> ids : {prompt, output}) {
      for (int32_t t : ids) {
        if (!seen.insert(t).second) continue;
        logits[t] = logits[t] > 0 ? logits[t] / r : logits[t] * r;
      }
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    // Counts in first-occurrence order, so the float updates are the same on
    // every run.
    absl::flat_hash_map<int32_t, int> count;
    std::vector<int32_t> order;
    for (int32_t t : output) {
      if (count[t]++ == 0) order.push_back(t);
    }
    for (int32_t t : order) {
      logits[t] -= static_cast<float>(count[t]) * p.frequency_penalty;
      logits[t] -= p.presence_penalty;
    }
  }
}

SampleResult Sample(absl::Span<const float> logits, const SamplingParams& p, SamplerState* state) {
  return Sample(logits, logits, p, state);
}

SampleResult Sample(absl::Span<const float> raw, absl::Span<const float> logits,
                    const SamplingParams& p, SamplerState* state) {
  SampleResult r;
  if (p.greedy()) {
    r.token = Argmax(logits);
    FillLogprobs(raw, p, &r);
    return r;
  }
  // Candidates sorted by logit (descending, ties by id), then truncated.
  const int vocab = static_cast<int>(logits.size());
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  };
  int keep = vocab;
  if (p.top_k > 0 && p.top_k < vocab) {
    keep = p.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), by_logit);
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  // Tempered probabilities of the kept candidates.
  const double inv_t = 1.0 / p.temperature;
  const double top = logits[idx[0]] * inv_t;
  std::vector<double> prob(keep);
  double sum = 0;
  for (int i = 0; i < keep; ++i) sum += prob[i] = std::exp(logits[idx[i]] * inv_t - top);
  for (double& q : prob) q /= sum;
  if (p.top_p < 1.0f) {
    double cum = 0;
    int n = 0;
    while (n < keep && cum < p.top_p) cum += prob[n++];
    keep = std::max(n, 1);
  }
  if (p.min_p > 0.0f) {
    const double floor = p.min_p * prob[0];
    int n = 1;
    while (n < keep && prob[n] >= floor) ++n;
    keep = n;
  }
  double total = 0;
  for (int i = 0; i < keep; ++i) total += prob[i];
  double u = state->Uniform() * total;
  int pick = keep - 1;
  for (int i = 0; i < keep; ++i) {
    u -= prob[i];
    if (u < 0) {
      pick = i;
      break;
    }
  }
  r.token = idx[pick];
  FillLogprobs(raw, p, &r);
  return r;
}

}  // namespace mmserve::model
